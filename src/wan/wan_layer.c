/* The Wan2.2 self-attention layer in one process, and its pieces
 * (fxattn_wan.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fxattn_wan.h"
#include "wan_fail.h"
#include "wan_internal.h"
#include "base/clock.h"
#include "base/convert_inline.h"
#include "core/ctx_api.h"
#include "base/spans.h"
#include "base/struct_size.h"

struct fxa_wan_plan {
    fxa_ctx *ctx;
    fxa_wan_desc d;
    int64_t tokens, hidden;
    fxa_attn_plan *attn;
    /* The projections, one plan per weight format (the weights come with
     * each run): QKV and output. */
    fxa_proj_plan *qkv[FXA_WAN_FORMATS], *out[FXA_WAN_FORMATS];
    size_t x16_bytes;  /* x rounded to bf16 (dtype bf16, fp32 x), after Q, K, V, A */
    size_t attn_bytes; /* the attention plan's workspace, after x16 */
    size_t proj_bytes; /* the projections' workspace, after the attention's */
    size_t total;      /* the workspace */
    float *cs, *sn;    /* RoPE tables [S][head_dim] */
};

void fxa_wan_desc_init(fxa_wan_desc *d)
{
    memset(d, 0, sizeof *d);
    d->struct_size = sizeof *d;
    d->head_dim = 128;
    d->x_format = FXA_PROJ_X_F32;
    d->dtype = FXA_F32;
}

size_t fxa_wan_act_bytes(const fxa_wan_desc *d, int64_t tokens, int64_t heads)
{
    const size_t elem = d->dtype == FXA_BF16 ? sizeof(uint16_t) : sizeof(float);
    return ((size_t)(tokens * heads * d->head_dim) * elem + 63) & ~(size_t)63;
}

/* Rounding x to bf16 in items of ROUND_ROWS tokens; bad[item]: the first
 * element whose rounding is not finite (of a finite or a non-finite x), or
 * -1. */
#define ROUND_ROWS 64

size_t fxa_wan_x16_bytes(const fxa_wan_desc *d, int64_t tokens)
{
    const int rounds_x = d->dtype == FXA_BF16 && d->x_format == FXA_PROJ_X_F32;
    const size_t items = (size_t)((tokens + ROUND_ROWS - 1) / ROUND_ROWS);
    /* a bf16 activation, then the per-item results */
    return rounds_x ? fxa_wan_act_bytes(d, tokens, d->heads) +
                          (((items + 1) * sizeof(int64_t) + 63) & ~(size_t)63)
                    : 0;
}

typedef struct round_job {
    const float *x;
    uint16_t *x16;
    int64_t tokens, n;
    int64_t *bad;
} round_job;

static void round_item(void *arg, int64_t item, int thread_id)
{
    const round_job *j = arg;
    const int64_t i0 = item * ROUND_ROWS * j->n;
    const int64_t r1 = (item + 1) * ROUND_ROWS < j->tokens ? (item + 1) * ROUND_ROWS : j->tokens;
    const int64_t i1 = r1 * j->n;
    uint32_t any = 0;
    (void)thread_id;
    for (int64_t i = i0; i < i1; i++) {
        const uint16_t h = fxa_f32_to_bf16_bits(j->x[i]);
        j->x16[i] = h;
        any |= (h & 0x7f80u) == 0x7f80u;
    }
    j->bad[item] = -1;
    for (int64_t i = i0; any && i < i1; i++)
        if ((j->x16[i] & 0x7f80u) == 0x7f80u) {
            j->bad[item] = i;
            break;
        }
}

fxa_status fxa_wan_round_x(fxa_ctx *ctx, const fxa_wan_desc *d, const float *x, int64_t tokens,
                           void *buf, char *err, size_t errlen)
{
    const int64_t n = d->heads * d->head_dim;
    const int64_t items = (tokens + ROUND_ROWS - 1) / ROUND_ROWS;
    uint16_t *x16 = buf;
    int64_t *bad = (int64_t *)((char *)buf + fxa_wan_act_bytes(d, tokens, d->heads));
    round_job j = {x, x16, tokens, n, bad};
    fxa_pool_run(fxa_ctx_pool(ctx), round_item, &j, items);
    int64_t first = -1;
    for (int64_t i = 0; i < items && first < 0; i++)
        first = bad[i];
    if (first < 0)
        return FXA_OK;
    return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG,
                         "x has a value (%g) at token %lld, feature %lld that is not finite in "
                         "bf16",
                         (double)x[first], (long long)(first / n), (long long)(first % n));
}

/* frames * height * width, or 0 when a side is below 1 or the product
 * overflows int64. */
static int64_t grid_tokens(const fxa_wan_desc *d)
{
    if (d->frames < 1 || d->height < 1 || d->width < 1 || d->frames > INT64_MAX / d->height ||
        d->frames * d->height > INT64_MAX / d->width)
        return 0;
    return d->frames * d->height * d->width;
}

static fxa_status check_desc(const fxa_wan_desc *d, char *err, size_t errlen)
{
    if (grid_tokens(d) == 0)
        return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG,
                             "the latent grid %lld x %lld x %lld is not positive or "
                             "overflows",
                             (long long)d->frames, (long long)d->height, (long long)d->width);
    if (d->heads < 1)
        return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG, "heads must be positive, not %lld",
                             (long long)d->heads);
    if (d->head_dim % 2 || d->head_dim < 6 || d->head_dim > FXA_MAX_HEAD_DIM)
        return fxa_wan_failf(
            err, errlen, FXA_ERR_INVALID_ARG,
            "head_dim %lld (hidden / heads) must be even and in 6..%d for Wan's RoPE",
            (long long)d->head_dim, FXA_MAX_HEAD_DIM);
    /* The four fp32 activations [S][heads][head_dim] must be addressable. */
    const int64_t tokens = grid_tokens(d);
    const int64_t lim = (int64_t)(PTRDIFF_MAX / (16 * FXA_MAX_HEAD_DIM));
    if (d->heads > lim || tokens > lim / d->heads)
        return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG,
                             "the layer's sizes overflow: %lld tokens x %lld heads x %lld",
                             (long long)tokens, (long long)d->heads, (long long)d->head_dim);
    if (d->x_format != FXA_PROJ_X_F32 && d->x_format != FXA_PROJ_X_BF16 &&
        d->x_format != FXA_PROJ_X_E4M3_ROWS)
        return fxa_wan_failf(
            err, errlen, FXA_ERR_INVALID_ARG,
            "x_format must be FXA_PROJ_X_F32, FXA_PROJ_X_BF16 or FXA_PROJ_X_E4M3_ROWS");
    if (d->dtype != FXA_F32 && d->dtype != FXA_BF16)
        return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG,
                             "dtype must be FXA_F32 or FXA_BF16, not %d", (int)d->dtype);
    return FXA_OK;
}

fxa_status fxa_wan_check_desc(const fxa_wan_desc *d, fxa_wan_desc *full, char *err, size_t errlen)
{
    fxa_wan_desc_init(full);
    const fxa_status st =
        fxa_struct_in(full, sizeof *full, d, FXA_WAN_DESC_SIZE_0_1, "fxa_wan_desc", err, errlen);
    return st != FXA_OK ? st : check_desc(full, err, errlen);
}

/* The projections' plans (one per weight format) of `tokens` tokens onto
 * `heads` heads: *bytes the largest workspace among them. */
static fxa_status plan_projs(fxa_ctx *ctx, const fxa_wan_desc *d, int64_t tokens, int64_t heads,
                             fxa_proj_plan *qkv[FXA_WAN_FORMATS],
                             fxa_proj_plan *out[FXA_WAN_FORMATS], size_t *bytes)
{
    static const fxa_proj_w formats[FXA_WAN_FORMATS] = {FXA_PROJ_W_F32, FXA_PROJ_W_BF16,
                                                        FXA_PROJ_W_E4M3};
    *bytes = 0;
    for (int f = 0; f < FXA_WAN_FORMATS; f++) {
        fxa_proj_desc pd;
        size_t b = 0;
        fxa_wan_qkv_desc(d, formats[f], heads, tokens, &pd);
        fxa_status st = fxa_proj_plan_create(ctx, &pd, &qkv[f], &b);
        *bytes = b > *bytes ? b : *bytes;
        fxa_wan_out_desc(d, formats[f], heads, tokens, &pd);
        if (st == FXA_OK)
            st = fxa_proj_plan_create(ctx, &pd, &out[f], &b);
        *bytes = b > *bytes ? b : *bytes;
        if (st != FXA_OK)
            return st;
    }
    *bytes = (*bytes + 63) & ~(size_t)63;
    return FXA_OK;
}

fxa_status fxa_wan_plan_create(fxa_ctx *ctx, const fxa_wan_desc *d_in, fxa_wan_plan **plan_out,
                               size_t *workspace_bytes)
{
    if (!ctx)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(ctx);
    fxa_wan_plan *p = NULL;
    fxa_wan_desc d;
    char why[400] = "";
    fxa_status st = FXA_OK;
    if (!d_in || !plan_out || !workspace_bytes)
        st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "fxa_wan_plan_create: NULL argument");
    else if ((st = fxa_wan_check_desc(d_in, &d, why, sizeof why)) != FXA_OK)
        fxa_ctx_fail(ctx, st, "%s", why);
    else if (!(p = calloc(1, sizeof *p)))
        st = fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory for the layer's plan");
    if (plan_out)
        *plan_out = NULL;
    if (st == FXA_OK) {
        p->ctx = ctx;
        p->d = d;
        p->tokens = d.frames * d.height * d.width;
        p->hidden = d.heads * d.head_dim;
        const size_t table = (size_t)(p->tokens * d.head_dim) * sizeof(float);
        p->cs = malloc(table);
        p->sn = malloc(table);
        if (!p->cs || !p->sn)
            st = fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory for the RoPE tables");
    }
    if (st == FXA_OK && (st = fxa_wan_rope(&d, p->cs, p->sn)) != FXA_OK)
        fxa_ctx_fail(ctx, st, "cannot build the RoPE tables: %s", fxa_status_str(st));
    if (st == FXA_OK) {
        fxa_attn_desc ad;
        fxa_wan_attn_desc(&d, d.heads, &ad);
        st = fxa_attn_plan_create(ctx, &ad, &p->attn, &p->attn_bytes);
        if (st != FXA_OK)
            fxa_ctx_fail(ctx, st, "attention: %s", fxa_ctx_last_error(ctx));
    }
    if (st == FXA_OK &&
        (st = plan_projs(ctx, &d, p->tokens, d.heads, p->qkv, p->out, &p->proj_bytes)) != FXA_OK)
        fxa_ctx_fail(ctx, st, "projection: %s", fxa_ctx_last_error(ctx));
    if (st == FXA_OK) {
        p->attn_bytes = (p->attn_bytes + 63) & ~(size_t)63;
        p->x16_bytes = fxa_wan_x16_bytes(&d, p->tokens);
        p->total = 4 * fxa_wan_act_bytes(&d, p->tokens, d.heads) + p->x16_bytes + p->attn_bytes +
                   p->proj_bytes;
        *workspace_bytes = p->total;
        *plan_out = p;
    } else {
        fxa_wan_plan_destroy(p);
    }
    fxa_ctx_end(ctx);
    return st;
}

void fxa_wan_plan_destroy(fxa_wan_plan *p)
{
    if (!p)
        return;
    fxa_attn_plan_destroy(p->attn);
    for (int f = 0; f < FXA_WAN_FORMATS; f++) {
        fxa_proj_plan_destroy(p->qkv[f]);
        fxa_proj_plan_destroy(p->out[f]);
    }
    free(p->cs);
    free(p->sn);
    free(p);
}

/* w holds the whole layer of p, in the shapes fxa_wan_weights describes. */
static fxa_status check_weights(const fxa_wan_plan *p, const fxa_wan_weights *w)
{
    const int64_t h = p->hidden;
    const int ok = w->hidden == h && w->heads == p->d.heads && w->head_dim == p->d.head_dim &&
                   w->head_begin == 0 && w->head_count == p->d.heads && w->qkv.rows == 3 * h &&
                   w->qkv.cols == h && w->o.rows == h && w->o.cols == h && w->qkv.w && w->o.w &&
                   w->gamma_q && w->gamma_k;
    const int formats =
        (unsigned)w->qkv.format <= FXA_PROJ_W_E4M3 && (unsigned)w->o.format <= FXA_PROJ_W_E4M3;
    if (ok && !formats)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "the weights' formats (qkv %d, o %d) are not FXA_PROJ_W_F32, "
                            "FXA_PROJ_W_BF16 or FXA_PROJ_W_E4M3",
                            (int)w->qkv.format, (int)w->o.format);
    if (!ok)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "the weights (hidden %lld, heads [%lld, +%lld) of %lld) are not the "
                            "whole layer of the plan (%lld heads x %lld)",
                            (long long)w->hidden, (long long)w->head_begin,
                            (long long)w->head_count, (long long)w->heads, (long long)p->d.heads,
                            (long long)p->d.head_dim);
    return FXA_OK;
}

/* The layer on caller memory (fxa_wan_layer_run, inside the context's call). */
static fxa_status run(const fxa_wan_plan *p, const fxa_wan_weights *w, const void *x, float *y,
                      void *workspace, fxa_wan_stats *stats)
{
    fxa_ctx *ctx = p->ctx;
    if (!w || !x || !y || !workspace)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "the layer's weights, x, y and workspace must not be NULL");
    char why[400];
    if (stats &&
        fxa_struct_size_check(fxa_struct_size_of(stats), FXA_WAN_STATS_SIZE_0_1,
                              sizeof(fxa_wan_stats), "fxa_wan_stats", why, sizeof why) != FXA_OK)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s", why);
    fxa_status st = check_weights(p, w);
    if (st != FXA_OK)
        return st;
    const size_t act = fxa_wan_act_bytes(&p->d, p->tokens, p->d.heads);
    const fxa_span y_span = {"y", y, (size_t)(p->tokens * p->hidden) * sizeof(float)};
    const fxa_span ws_span = {"workspace", workspace, p->total};
    if (fxa_spans_overlap(&y_span, &ws_span))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "y and the workspace overlap");
    char *q = workspace, *k = q + act, *v = k + act, *a = v + act;
    void *x16 = p->x16_bytes ? a + act : NULL;
    void *attn_ws = a + act + p->x16_bytes;
    void *proj_ws = (char *)attn_ws + p->attn_bytes;
    const double t0 = fxa_now_seconds();
    if (x16 && (st = fxa_wan_round_x(ctx, &p->d, x, p->tokens, x16, why, sizeof why)) != FXA_OK)
        return fxa_ctx_fail(ctx, st, "%s", why);
    fxa_proj_args pa;
    fxa_wan_qkv_args(w, x16 ? x16 : x, p->cs, p->sn, q, k, v, &pa);
    fxa_proj_stats ps[2] = {{.struct_size = sizeof ps[0]}, {.struct_size = sizeof ps[1]}};
    if ((st = fxa_proj_run_stats(p->qkv[w->qkv.format], &pa, proj_ws, &ps[0])) != FXA_OK)
        return fxa_ctx_fail(ctx, st, "QKV projection: %s", fxa_ctx_last_error(ctx));
    const double t1 = fxa_now_seconds();
    const fxa_attn_args aa = {.struct_size = sizeof aa, .q = q, .k = k, .v = v, .out = a};
    fxa_attn_stats ast = {.struct_size = sizeof ast};
    if ((st = fxa_attn_run(p->attn, &aa, attn_ws, &ast)) != FXA_OK)
        return st; /* its message is the context's */
    const double t2 = fxa_now_seconds();
    if ((st = fxa_wan_out_run(p->out[w->o.format], &w->o, a, y, proj_ws, &ps[1])) != FXA_OK)
        return fxa_ctx_fail(ctx, st, "output projection: %s", fxa_ctx_last_error(ctx));
    const fxa_wan_stats full = {.struct_size = sizeof full,
                                .qkv_seconds = t1 - t0,
                                .attention_seconds = t2 - t1,
                                .out_seconds = fxa_now_seconds() - t2,
                                .rows = ast.rows,
                                .fallback_rows = ast.fallback_rows,
                                .compute = ast.compute,
                                .qkv_gemm = ps[0].gemm,
                                .out_gemm = ps[1].gemm};
    if (stats)
        fxa_struct_out(stats, &full, sizeof full);
    return FXA_OK;
}

fxa_status fxa_wan_layer_run(const fxa_wan_plan *p, const fxa_wan_args *args, void *workspace,
                             fxa_wan_stats *stats)
{
    if (!p)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(p->ctx);
    fxa_wan_args a = {0};
    char why[200];
    fxa_status st;
    if (!args)
        st = fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG, "fxa_wan_layer_run: NULL args");
    else if (fxa_struct_in(&a, sizeof a, args, FXA_WAN_ARGS_SIZE_0_3, "fxa_wan_args", why,
                           sizeof why) != FXA_OK)
        st = fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG, "%s", why);
    else
        st = run(p, a.weights, a.x, a.y, workspace, stats);
    fxa_ctx_end(p->ctx);
    return st;
}

fxa_status fxa_wan_run(fxa_wan_plan *p, const fxa_wan_weights *w, const void *x, float *y,
                       void *workspace, fxa_wan_stats *stats)
{
    const fxa_wan_args a = {sizeof a, w, x, y};
    return fxa_wan_layer_run(p, &a, workspace, stats);
}

void fxa_wan_qkv_desc(const fxa_wan_desc *d, fxa_proj_w format, int64_t heads, int64_t tokens,
                      fxa_proj_desc *pd)
{
    fxa_proj_desc_init(pd);
    pd->tokens = tokens;
    pd->in_features = d->heads * d->head_dim;
    pd->heads_q = pd->heads_kv = heads;
    pd->head_dim = d->head_dim;
    pd->x_format =
        d->dtype == FXA_BF16 && d->x_format == FXA_PROJ_X_F32 ? FXA_PROJ_X_BF16 : d->x_format;
    pd->w_format = format;
    pd->norm = 1;
    pd->eps = FXA_WAN_EPS;
    pd->rope = 1;
    pd->out_dtype = d->dtype;
}

void fxa_wan_qkv_args(const fxa_wan_weights *w, const void *x, const float *cs, const float *sn,
                      void *q, void *k, void *v, fxa_proj_args *pa)
{
    *pa = (fxa_proj_args){.struct_size = sizeof *pa,
                          .x = x,
                          .w = w->qkv.w,
                          .w_scales = w->qkv.scales,
                          .bias = w->qkv.bias,
                          .gamma_q = w->gamma_q,
                          .gamma_k = w->gamma_k,
                          .rope_cos = cs,
                          .rope_sin = sn,
                          .q_out = q,
                          .k_out = k,
                          .v_out = v};
}

void fxa_wan_out_desc(const fxa_wan_desc *d, fxa_proj_w format, int64_t heads, int64_t tokens,
                      fxa_proj_desc *pd)
{
    fxa_proj_desc_init(pd);
    pd->tokens = tokens;
    pd->in_features = heads * d->head_dim;
    pd->heads_q = d->heads; /* out = heads * head_dim = hidden channels */
    pd->head_dim = d->head_dim;
    pd->x_format = d->dtype == FXA_BF16 ? FXA_PROJ_X_BF16 : FXA_PROJ_X_F32;
    pd->w_format = format;
}

fxa_status fxa_wan_out_run(fxa_proj_plan *out, const fxa_wan_linear *o, const void *a, float *y,
                           void *workspace, fxa_proj_stats *stats)
{
    const fxa_proj_args args = {.struct_size = sizeof args,
                                .x = a,
                                .w = o->w,
                                .w_scales = o->scales,
                                .bias = o->bias,
                                .q_out = y};
    return fxa_proj_run_stats(out, &args, workspace, stats);
}

void fxa_wan_attn_desc(const fxa_wan_desc *d, int64_t heads, fxa_attn_desc *ad)
{
    fxa_attn_desc_init(ad);
    ad->batch = 1;
    ad->heads_q = ad->heads_kv = heads;
    ad->seq_q = ad->seq_kv = grid_tokens(d); /* 0 (refused by the plan) for a bad grid */
    ad->head_dim = d->head_dim;
    if (d->dtype == FXA_BF16) {
        ad->dtype = ad->out_dtype = FXA_BF16;
        ad->compute = FXA_COMPUTE_AUTO; /* the faster on this machine */
    }
}

fxa_status fxa_wan_rope(const fxa_wan_desc *d, float *cos_out, float *sin_out)
{
    return fxa_wan_rope_tables(d->frames, d->height, d->width, d->head_dim, FXA_WAN_ROPE_THETA,
                               cos_out, sin_out);
}

double fxa_wan_flops(const fxa_wan_desc *d)
{
    if (!d)
        return 0.0;
    const double s = (double)d->frames * (double)d->height * (double)d->width;
    const double h = (double)d->heads * (double)d->head_dim;
    return 8.0 * s * h * h + 4.0 * s * s * h; /* projections, then attention */
}
