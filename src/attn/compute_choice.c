/*
 * FXA_COMPUTE_AUTO: the compute a context runs for bf16 inputs, chosen by
 * the measured rates of its two tiles (fxa_ctx_compute_choice in fxattn.h).
 *
 * Both tiles run, in turn, on the same synthetic block (96 query rows
 * against one kv tile of keys at the plan's head dim, fixed-shift rows, the
 * layouts the run packs), one warm-up call each and then 5 timed calls
 * each on the calling thread; each tile's best time gives its rate. The
 * rates of the two kinds of core differ by far more than timing noise: a
 * vdpbf16ps tile runs at about 0.55x the fp32 tile on Intel cores whose
 * vdpbf16ps issues at half the FMA rate, about 1.7x on AMD Zen 4 and 5,
 * and an AMX tile at several times it; the 1.25x threshold sits between.
 * A kernel set whose bf16 tile is the portable reference (no AVX512-BF16)
 * is known to be slower and measures nothing. FXA_AUTO_COMPUTE (fp32, bf16),
 * read when the context is created, pins the choice instead. The context
 * keeps each head dim's choice, so that every plan on it agrees.
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "../base/alloc.h"
#include "../base/convert_inline.h"
#include "../base/struct_size.h"
#include "../kernels/kernels.h"
#include "attn_internal.h"

#define PROBE_ROWS 96
#define PROBE_RUNS 5
/* bf16 compute where its tile is at least this much faster. */
#define BF16_MIN_SPEEDUP 1.25

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* A small deterministic value in [-0.25, 0.25) for element i. */
static float probe_value(size_t i)
{
    return (float)((i * 2654435761u) % 1024u) / 2048.0f - 0.25f;
}

/* Buffers of the synthetic block: fp32 and bf16 layouts of one q block and
 * one kv tile, the row state and the scratch. */
typedef struct probe {
    size_t n_kv, d, pairs, ldv;
    float *q, *kt, *v, *o, *m, *l, *center, *scores;
    uint16_t *q16, *kp, *vp, *p16;
    uint8_t *online;
    void *mem;
} probe;

static int probe_alloc(probe *pr, const fxa_kernels *k, size_t d)
{
    pr->n_kv = k->kv_tile;
    pr->d = d;
    pr->pairs = (d + 1) / 2;
    pr->ldv = d;
    const size_t n_kv = pr->n_kv;
    const size_t f32s[] = {
        PROBE_ROWS * d,           /* q */
        n_kv * d,                 /* kt */
        n_kv * d,                 /* v */
        PROBE_ROWS * d,           /* o */
        PROBE_ROWS,               /* m */
        PROBE_ROWS,               /* l */
        PROBE_ROWS,               /* center */
        PROBE_ROWS * n_kv,        /* scores */
        PROBE_ROWS * pr->pairs,   /* q16 (as words) */
        n_kv * pr->pairs,         /* kp (as words) */
        (n_kv / 2 + 1) * pr->ldv, /* vp (as words) */
        PROBE_ROWS * n_kv / 2,    /* p16 (as words) */
        PROBE_ROWS / 4,           /* online */
    };
    size_t total = 0;
    for (size_t i = 0; i < sizeof f32s / sizeof f32s[0]; i++)
        total += (f32s[i] + 15) / 16 * 16;
    float *base = fxa_calloc_aligned(total * sizeof(float));
    if (!base)
        return 0;
    pr->mem = base;
    float **f[] = {&pr->q, &pr->kt, &pr->v, &pr->o, &pr->m, &pr->l, &pr->center, &pr->scores};
    size_t at = 0;
    for (size_t i = 0; i < 8; i++) {
        *f[i] = base + at;
        at += (f32s[i] + 15) / 16 * 16;
    }
    uint16_t **h[] = {&pr->q16, &pr->kp, &pr->vp, &pr->p16};
    for (size_t i = 0; i < 4; i++) {
        *h[i] = (uint16_t *)(base + at);
        at += (f32s[8 + i] + 15) / 16 * 16;
    }
    pr->online = (uint8_t *)(base + at); /* calloc: FXA_ROW_FIXED */
    return 1;
}

/* Fill both layouts with the same values (bf16: their rounding). */
static void probe_fill(probe *pr, const fxa_kernels *k)
{
    const size_t d = pr->d, n_kv = pr->n_kv;
    for (size_t i = 0; i < PROBE_ROWS * d; i++) {
        pr->q[(i / d) * d + i % d] = probe_value(i);
        pr->q16[(i / d) * 2 * pr->pairs + i % d] = fxa_f32_to_bf16_bits(probe_value(i));
    }
    const void *rows[1];
    for (size_t j = 0; j < n_kv; j++) {
        float krow[FXA_MAX_HEAD_DIM];
        uint16_t krow16[FXA_MAX_HEAD_DIM + 1] = {0};
        for (size_t c = 0; c < d; c++) {
            krow[c] = probe_value(7 + j * d + c);
            krow16[c] = fxa_f32_to_bf16_bits(krow[c]);
            pr->v[j * pr->ldv + c] = probe_value(11 + j * d + c);
            pr->vp[2 * ((j / 2) * pr->ldv + c) + j % 2] =
                fxa_f32_to_bf16_bits(pr->v[j * pr->ldv + c]);
        }
        rows[0] = krow;
        k->pack_kt(rows, 1, d, k->kt_panel, pr->kt + fxa_kt_offset(k->kt_panel, d, 0, j));
        rows[0] = krow16;
        k->pack_kt(rows, 1, pr->pairs, k->kt_panel,
                   (uint32_t *)pr->kp + fxa_kt_offset(k->kt_panel, pr->pairs, 0, j));
    }
}

/* Seconds of one call of the fp32 (bf16 0) or bf16 tile on the block. */
static double probe_run(probe *pr, const fxa_kernels *k, int bf16)
{
    for (size_t i = 0; i < PROBE_ROWS; i++) {
        pr->m[i] = 4.0f; /* above every z: |z| <= lambda d / 16 < 2.2 */
        pr->l[i] = 0.0f;
    }
    memset(pr->o, 0, PROBE_ROWS * pr->d * sizeof *pr->o);
    const float lambda = 1.4426950408889634f / 11.0f;
    const double t0 = now_seconds();
    if (bf16) {
        const fxa_attn_tile_bf16 t = {.n_q = PROBE_ROWS,
                                      .n_kv = pr->n_kv,
                                      .d = pr->d,
                                      .lambda = lambda,
                                      .qk_center = pr->center,
                                      .online = pr->online,
                                      .m = pr->m,
                                      .l = pr->l,
                                      .o = pr->o,
                                      .ldo = pr->d,
                                      .scores = pr->scores,
                                      .ld_scores = pr->n_kv,
                                      .q = pr->q16,
                                      .ldq = 2 * pr->pairs,
                                      .kp = pr->kp,
                                      .kp_panel = k->kt_panel,
                                      .vp = pr->vp,
                                      .ldvp = pr->ldv,
                                      .p16 = pr->p16};
        k->attn_tile_bf16(&t);
    } else {
        const fxa_attn_tile t = {.n_q = PROBE_ROWS,
                                 .n_kv = pr->n_kv,
                                 .d = pr->d,
                                 .lambda = lambda,
                                 .qk_center = pr->center,
                                 .online = pr->online,
                                 .m = pr->m,
                                 .l = pr->l,
                                 .o = pr->o,
                                 .ldo = pr->d,
                                 .scores = pr->scores,
                                 .ld_scores = pr->n_kv,
                                 .q = pr->q,
                                 .ldq = pr->d,
                                 .kt = pr->kt,
                                 .kt_panel = k->kt_panel,
                                 .v = pr->v,
                                 .ldv = pr->ldv};
        k->attn_tile(&t);
    }
    return now_seconds() - t0;
}

/* Measure both tiles at head dim d into *c. */
static fxa_status measure(fxa_ctx *ctx, size_t d, fxa_compute_choice *c)
{
    const fxa_kernels *k = ctx->kernels;
    probe pr;
    if (!probe_alloc(&pr, k, d))
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory measuring the tiles' rates");
    probe_fill(&pr, k);
    double best[2] = {1e30, 1e30};
    for (int r = -1; r < PROBE_RUNS; r++) /* r = -1: the warm-up calls */
        for (int bf16 = 0; bf16 < 2; bf16++) {
            const double s = probe_run(&pr, k, bf16);
            if (r >= 0 && s < best[bf16])
                best[bf16] = s;
        }
    fxa_free_aligned(pr.mem);
    const double flops = 4.0 * PROBE_ROWS * (double)pr.n_kv * (double)d;
    c->fp32_gflops = flops / (best[0] > 0.0 ? best[0] : 1e-9) * 1e-9;
    c->bf16_gflops = flops / (best[1] > 0.0 ? best[1] : 1e-9) * 1e-9;
    c->compute =
        c->bf16_gflops >= BF16_MIN_SPEEDUP * c->fp32_gflops ? FXA_COMPUTE_BF16 : FXA_COMPUTE_FP32;
    return FXA_OK;
}

/* The choice for dtype at head_dim on ctx (inside a call on ctx). */
static fxa_status choose(fxa_ctx *ctx, fxa_dtype dtype, int64_t head_dim, fxa_compute_choice *c)
{
    memset(c, 0, sizeof *c);
    c->struct_size = sizeof *c;
    c->compute = dtype == FXA_F64 ? FXA_COMPUTE_FP64 : FXA_COMPUTE_FP32;
    if (dtype != FXA_BF16)
        return FXA_OK;
    if (ctx->auto_compute != FXA_COMPUTE_AUTO) { /* pinned by FXA_AUTO_COMPUTE */
        c->compute = ctx->auto_compute;
        return FXA_OK;
    }
    if (ctx->kernels->attn_tile_bf16 == fxa_bf16_tile__ref)
        return FXA_OK;
    for (int i = 0; i < ctx->n_compute_memo; i++)
        if (ctx->compute_memo[i].head_dim == head_dim) {
            *c = ctx->compute_memo[i].choice;
            return FXA_OK;
        }
    const fxa_status st = measure(ctx, (size_t)head_dim, c);
    if (st != FXA_OK)
        return st;
    const int n = (int)(sizeof ctx->compute_memo / sizeof ctx->compute_memo[0]);
    const int slot = ctx->n_compute_memo < n ? ctx->n_compute_memo++ : (int)(head_dim % n);
    ctx->compute_memo[slot].head_dim = head_dim;
    ctx->compute_memo[slot].choice = *c;
    return FXA_OK;
}

fxa_status fxa_compute_resolve(fxa_ctx *ctx, fxa_attn_desc *d)
{
    if (d->compute != FXA_COMPUTE_AUTO)
        return FXA_OK;
    fxa_compute_choice c;
    const fxa_status st = choose(ctx, d->dtype, d->head_dim, &c);
    d->compute = c.compute;
    return st;
}

static fxa_status compute_choice(fxa_ctx *ctx, fxa_dtype dtype, int64_t head_dim,
                                 fxa_compute_choice *out)
{
    fxa_status st =
        fxa_struct_out_check(out, FXA_COMPUTE_CHOICE_SIZE_0_3, sizeof *out, "fxa_compute_choice",
                             ctx->last_error, sizeof ctx->last_error);
    if (st != FXA_OK)
        return st;
    if (dtype != FXA_F32 && dtype != FXA_BF16 && dtype != FXA_F16 && dtype != FXA_F64)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "unknown dtype %d", (int)dtype);
    if (head_dim < 1 || head_dim > FXA_MAX_HEAD_DIM)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "head_dim %lld is outside 1..%d",
                            (long long)head_dim, FXA_MAX_HEAD_DIM);
    fxa_compute_choice c;
    if ((st = choose(ctx, dtype, head_dim, &c)) == FXA_OK)
        fxa_struct_out(out, &c, sizeof c);
    return st;
}

fxa_status fxa_ctx_compute_choice(fxa_ctx *ctx, fxa_dtype dtype, int64_t head_dim,
                                  fxa_compute_choice *out)
{
    const fxa_status st = fxa_ctx_enter(ctx);
    if (st != FXA_OK)
        return st;
    if (!out)
        return fxa_ctx_end_with(ctx,
                                fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "NULL fxa_compute_choice"));
    return fxa_ctx_end_with(ctx, compute_choice(ctx, dtype, head_dim, out));
}
