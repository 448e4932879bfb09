/* Test support (see testutil.h). */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fp64_attn.h"

int g_checks;
int g_failures;

#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FXT_BUILT_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FXT_BUILT_SANITIZED 1
#endif

int fxt_sanitized(void)
{
#ifdef FXT_BUILT_SANITIZED
    return 1;
#else
    return 0;
#endif
}

int fxt_skip_under_sanitizer(int64_t work, const char *label)
{
    if (!fxt_sanitized() || work <= FXT_SANITIZED_MAX_WORK)
        return 0;
    printf("  %s: skipped in this sanitizer build (work %lld > %d; the plain build runs it)\n",
           label, (long long)work, FXT_SANITIZED_MAX_WORK);
    return 1;
}

int test_summary(const char *name)
{
    if (g_failures) {
        printf("%s: FAILED %d of %d checks\n", name, g_failures, g_checks);
        return 1;
    }
    if (g_checks == 0) {
        printf("%s: no checks ran\n", name);
        return 1;
    }
    printf("%s: ok %d checks\n", name, g_checks);
    return 0;
}

void test_require_isa(const char *name)
{
    fxa_ctx *ctx = NULL;
    fxa_ctx_params p;
    fxa_ctx_params_init(&p);
    p.n_threads = 1;
    if (fxa_ctx_create(&p, &ctx) == FXA_ERR_UNSUPPORTED) {
        printf("%s: skipped: %s\n", name, fxa_ctx_create_error());
        exit(TEST_SKIPPED);
    }
    fxa_ctx_destroy(ctx);
}

fxa_ctx *fxt_ctx(int n_threads)
{
    fxa_ctx_params p;
    fxa_ctx_params_init(&p);
    p.n_threads = n_threads;
    fxa_ctx *ctx = NULL;
    if (fxa_ctx_create(&p, &ctx) != FXA_OK) {
        fprintf(stderr, "context of %d threads: %s\n", n_threads, fxa_ctx_create_error());
        return NULL;
    }
    return ctx;
}

void fxt_attn_desc(fxa_attn_desc *d, int64_t batch, int64_t heads_q, int64_t heads_kv,
                   int64_t seq_q, int64_t seq_kv, int64_t head_dim)
{
    fxa_attn_desc_init(d);
    d->batch = batch;
    d->heads_q = heads_q;
    d->heads_kv = heads_kv;
    d->seq_q = seq_q;
    d->seq_kv = seq_kv;
    d->head_dim = head_dim;
}

void fxt_expect_plan_refused(fxa_ctx *ctx, const fxa_attn_desc *d, const char *word,
                             const char *label)
{
    fxa_attn_plan *plan = NULL;
    size_t bytes = 0;
    CHECK(fxa_attn_plan_create(ctx, d, &plan, &bytes) == FXA_ERR_INVALID_ARG && !plan,
          "%s accepted", label);
    CHECK(strstr(fxa_ctx_last_error(ctx), word) != NULL, "%s: message '%s'", label,
          fxa_ctx_last_error(ctx));
    fxa_attn_plan_destroy(plan);
}

fxa_attn_bwd_args fxt_bwd_args(const void *q, const void *k, const void *v, const void *out,
                               const void *dout, const float *lse, void *dq, void *dk, void *dv)
{
    const fxa_attn_bwd_args a = {.struct_size = sizeof a,
                                 .q = q,
                                 .k = k,
                                 .v = v,
                                 .out = out,
                                 .dout = dout,
                                 .lse = lse,
                                 .dq = dq,
                                 .dk = dk,
                                 .dv = dv};
    return a;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        exit(2);
    }
    return p;
}

void tcase_init(tcase *t, const fxa_attn_desc *d)
{
    memset(t, 0, sizeof *t);
    t->d = *d;
    t->nq = d->batch * d->heads_q * d->seq_q * d->head_dim;
    t->nkv = d->batch * d->heads_kv * d->seq_kv * d->head_dim;
    t->q = xcalloc((size_t)t->nq, sizeof(float));
    t->k = xcalloc((size_t)t->nkv, sizeof(float));
    t->v = xcalloc((size_t)t->nkv, sizeof(float));
    t->q16 = xcalloc((size_t)t->nq, sizeof(uint16_t));
    t->k16 = xcalloc((size_t)t->nkv, sizeof(uint16_t));
    t->v16 = xcalloc((size_t)t->nkv, sizeof(uint16_t));
}

void tcase_free(tcase *t)
{
    free(t->q);
    free(t->k);
    free(t->v);
    free(t->q16);
    free(t->k16);
    free(t->v16);
    memset(t, 0, sizeof *t);
}

static void round_array(float *x, uint16_t *h, int64_t n, fxa_dtype dtype)
{
    for (int64_t i = 0; i < n; i++) {
        if (dtype == FXA_BF16) {
            h[i] = fxa_f32_to_bf16(x[i]);
            x[i] = fxa_bf16_to_f32(h[i]);
        } else if (dtype == FXA_F16) {
            h[i] = fxa_f32_to_f16(x[i]);
            x[i] = fxa_f16_to_f32(h[i]);
        }
    }
}

void tcase_round(tcase *t)
{
    round_array(t->q, t->q16, t->nq, t->d.dtype);
    round_array(t->k, t->k16, t->nkv, t->d.dtype);
    round_array(t->v, t->v16, t->nkv, t->d.dtype);
}

int64_t tcase_q_off(const tcase *t, int64_t b, int64_t h, int64_t s)
{
    return fxt_row_offset(&t->d, t->d.heads_q, t->d.seq_q, b, h, s);
}

int64_t tcase_kv_off(const tcase *t, int64_t b, int64_t h, int64_t s)
{
    return fxt_row_offset(&t->d, t->d.heads_kv, t->d.seq_kv, b, h, s);
}

/* tcase_run with every output: lse_parts (parts) too. */
static fxa_status run_all(const tcase *t, fxa_ctx *ctx, fxa_mode mode,
                          const fxa_attn_desc *override, float *out, float *lse, uint8_t *fb,
                          float *bound, float *parts, fxa_attn_stats *st)
{
    fxa_attn_desc d = override ? *override : t->d;
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    d.mode = mode;
    fxa_status s = fxa_attn_plan_create(ctx, &d, &plan, &ws_bytes);
    if (s != FXA_OK)
        return s;
    void *ws = ws_bytes ? aligned_alloc(64, (ws_bytes + 63) & ~(size_t)63) : NULL;
    const int wide = d.dtype != FXA_F32;
    fxa_attn_args a = {
        .struct_size = sizeof a,
        .q = wide ? (const void *)t->q16 : (const void *)t->q,
        .k = wide ? (const void *)t->k16 : (const void *)t->k,
        .v = wide ? (const void *)t->v16 : (const void *)t->v,
        .out = out,
        .lse = lse,
        .row_fallback = fb,
        .row_bound = bound,
        .lse_parts = parts,
    };
    if (st) /* a full-size stats struct: the caller's may be uninitialised */
        st->struct_size = sizeof *st;
    s = fxa_attn_run(plan, &a, ws, st);
    free(ws);
    fxa_attn_plan_destroy(plan);
    return s;
}

fxa_status tcase_run(const tcase *t, fxa_ctx *ctx, fxa_mode mode, const fxa_attn_desc *override,
                     float *out, float *lse, uint8_t *fb, float *bound, fxa_attn_stats *st)
{
    return run_all(t, ctx, mode, override, out, lse, fb, bound, NULL, st);
}

fxa_status tcase_run_parts(const tcase *t, fxa_ctx *ctx, float *out, float *lse, uint8_t *fb,
                           float *parts, fxa_attn_stats *st)
{
    return run_all(t, ctx, t->d.mode, NULL, out, lse, fb, NULL, parts, st);
}

/* Independent fp32 online softmax (classic streaming form, natural exp). */
static void online32_row(const tcase *t, int64_t b, int64_t h, int64_t i, float *out, float *lse)
{
    const fxa_attn_desc *d = &t->d;
    const int64_t dim = d->head_dim;
    const int64_t kvh = h / (d->heads_q / d->heads_kv);
    const float tau = (float)(d->scale != 0.0 ? d->scale : 1.0 / sqrt((double)dim));
    const float *qi = t->q + tcase_q_off(t, b, h, i);
    float m = -INFINITY;
    float l = 0.0f;
    for (int64_t c = 0; c < dim; c++)
        out[c] = 0.0f;
    for (int64_t j = 0; j < d->seq_kv; j++) {
        const float *kj = t->k + tcase_kv_off(t, b, kvh, j);
        const float *vj = t->v + tcase_kv_off(t, b, kvh, j);
        float s = 0.0f;
        for (int64_t c = 0; c < dim; c++)
            s += qi[c] * kj[c];
        s *= tau;
        if (s > m) {
            const float a = expf(m - s);
            l *= a;
            for (int64_t c = 0; c < dim; c++)
                out[c] *= a;
            m = s;
        }
        const float p = expf(s - m);
        l += p;
        for (int64_t c = 0; c < dim; c++)
            out[c] += p * vj[c];
    }
    for (int64_t c = 0; c < dim; c++)
        out[c] /= l;
    *lse = m + logf(l);
}

/* Rows checked for a query sequence of length n: all when small, else the
 * first and last 24 and 48 spread between. */
static int row_selected(int64_t i, int64_t n)
{
    if (n <= 128 || i < 24 || i >= n - 24)
        return 1;
    return (i % (n / 48)) == 0;
}

void tcase_errors(const tcase *t, const float *out, const float *lse, terr *e)
{
    const fxa_attn_desc *d = &t->d;
    const int64_t dim = d->head_dim;
    double ref[FXA_MAX_HEAD_DIM];
    float on[FXA_MAX_HEAD_DIM];
    memset(e, 0, sizeof *e);
    for (int64_t i = 0; i < t->nkv; i++)
        e->vmax = fmax(e->vmax, fabs((double)t->v[i]));
    for (int64_t b = 0; b < d->batch; b++) {
        for (int64_t h = 0; h < d->heads_q; h++) {
            for (int64_t i = 0; i < d->seq_q; i++) {
                if (!row_selected(i, d->seq_q))
                    continue;
                double ref_lse;
                float on_lse;
                const int64_t off = tcase_q_off(t, b, h, i);
                const int64_t lse_i = (b * d->heads_q + h) * d->seq_q + i;
                fxt_fp64_attn_row(d, t->q, t->k, t->v, b, h, i, ref, &ref_lse);
                online32_row(t, b, h, i, on, &on_lse);
                for (int64_t c = 0; c < dim; c++) {
                    double err = fabs((double)out[off + c] - ref[c]);
                    e->out_fxa = isnan(err) ? INFINITY : fmax(e->out_fxa, err);
                    e->out_on32 = fmax(e->out_on32, fabs((double)on[c] - ref[c]));
                }
                if (lse) {
                    double err = fabs((double)lse[lse_i] - ref_lse);
                    e->lse_fxa = isnan(err) ? INFINITY : fmax(e->lse_fxa, err);
                }
                e->lse_on32 = fmax(e->lse_on32, fabs((double)on_lse - ref_lse));
                e->lse_mag = fmax(e->lse_mag, fabs(ref_lse));
                e->rows++;
            }
        }
    }
}

int terr_within_envelope(const terr *e)
{
    const double out_tol = 1.5 * e->out_on32 + 0x1p-22 * e->vmax;
    const double lse_tol = 1.5 * e->lse_on32 + 0x1p-21 * fmax(1.0, e->lse_mag);
    return e->out_fxa <= out_tol && e->lse_fxa <= lse_tol;
}

void terr_print(const char *label, const terr *e)
{
    printf("  %-44s rows %6lld  out err %.3g (online32 %.3g)  lse err %.3g (online32 %.3g)\n",
           label, (long long)e->rows, e->out_fxa, e->out_on32, e->lse_fxa, e->lse_on32);
}

fxa_status fxt_proj_once(fxa_ctx *ctx, const fxa_proj_desc *d, const fxa_proj_args *a)
{
    fxa_proj_plan *plan = NULL;
    size_t bytes = 0;
    fxa_status st = fxa_proj_plan_create(ctx, d, &plan, &bytes);
    if (st != FXA_OK)
        return st;
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    st = ws ? fxa_proj_run(plan, a, ws) : FXA_ERR_NO_MEMORY;
    free(ws);
    fxa_proj_plan_destroy(plan);
    return st;
}
