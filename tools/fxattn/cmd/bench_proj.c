/*
 * `fxattn bench --proj`: the fused QKV projection of a Wan-like layer
 * (tokens --seq, hidden = --heads x --dim, I = 3 hidden), in one process,
 * medians of --repeats runs after a warm-up:
 *   sgemm      the bare OpenBLAS GEMM on fp32 operands (the floor);
 *   separate   sgemm, then bias, RMSNorm and RoPE as separate passes (what a
 *              user of a BLAS writes);
 *   fxattn     fxa_proj_run_stats with norm and RoPE, fp32 / bf16 / FP8
 *              operands (the last two multiply as bf16 where the context's
 *              bf16 products are the faster, else in fp32); each row names
 *              the GEMM the run reports.
 * GFLOP/s count 2 S H I; the fp32 and bf16 peaks are measured in the same
 * process, and each way is reported against the peak of the compute its
 * GEMM ran.
 */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_proj.h"
#include "cli.h"
#include "fxattn_proj.h"
#include "peak.h"
#include "stats.h"

#define N_WAYS 5

typedef struct proj_bench {
    int64_t s, h, i, dim, heads;
    float *x, *w, *y, *bias, *gq, *gk, *cs, *sn, *q, *k, *v, *ws;
    uint16_t *x16, *w16;
    uint8_t *x8, *w8;
    fxa_proj_plan *plan[N_WAYS];  /* ways 2-4, planned once (as an engine would) */
    fxa_proj_stats stats[N_WAYS]; /* ways 2-4: what their last run reported */
    void *work;                   /* their workspace, reused by every run */
    size_t work_bytes;
} proj_bench;

/* The separate passes: bias, RMSNorm across the Q and K segments, RoPE. */
static void separate_passes(const proj_bench *b)
{
    const int64_t hd = b->heads * b->dim;
    for (int64_t s = 0; s < b->s; s++) {
        float *y = b->y + s * b->i;
        for (int64_t c = 0; c < b->i; c++)
            y[c] += b->bias[c];
    }
    for (int64_t s = 0; s < b->s; s++)
        for (int seg = 0; seg < 2; seg++) {
            float *y = b->y + s * b->i + seg * hd;
            const float *g = seg ? b->gk : b->gq;
            double sum = 0.0;
            for (int64_t c = 0; c < hd; c++)
                sum += (double)y[c] * y[c];
            const float r = 1.0f / sqrtf((float)(sum / (double)hd) + 1e-6f);
            for (int64_t c = 0; c < hd; c++)
                y[c] = y[c] * (r * g[c]);
        }
    const int64_t half = b->dim / 2;
    for (int64_t s = 0; s < b->s; s++)
        for (int64_t h = 0; h < 2 * b->heads; h++) {
            float *x = b->y + s * b->i + h * b->dim;
            const float *c = b->cs + s * b->dim;
            const float *sn = b->sn + s * b->dim;
            float t[FXA_MAX_HEAD_DIM];
            memcpy(t, x, (size_t)b->dim * sizeof(float));
            for (int64_t j = 0; j < b->dim; j++)
                x[j] = j < half ? t[j] * c[j] - t[j + half] * sn[j]
                                : t[j] * c[j] + t[j - half] * sn[j];
        }
}

static int run_way(fxa_ctx *ctx, proj_bench *b, int way, int threads)
{
    if (way <= 1) {
        openblas_set_num_threads(threads);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)b->s, (int)b->i, (int)b->h, 1.0f,
                    b->x, (int)b->h, b->w, (int)b->h, 0.0f, b->y, (int)b->i);
        if (way == 1)
            separate_passes(b);
        return 0;
    }
    const fxa_proj_args a = {
        .struct_size = sizeof a,
        .x = way == 2   ? (const void *)b->x
             : way == 3 ? (const void *)b->x16
                        : (const void *)b->x8,
        .w = way == 2   ? (const void *)b->w
             : way == 3 ? (const void *)b->w16
                        : (const void *)b->w8,
        .w_scales = b->ws,
        .bias = b->bias,
        .gamma_q = b->gq,
        .gamma_k = b->gk,
        .rope_cos = b->cs,
        .rope_sin = b->sn,
        .q_out = b->q,
        .k_out = b->k,
        .v_out = b->v,
    };
    b->stats[way].struct_size = sizeof b->stats[way];
    if (fxa_proj_run_stats(b->plan[way], &a, b->work, &b->stats[way]) != FXA_OK)
        return fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_last_error(ctx));
    return 0;
}

/* The plans of ways 2-4 (fp32, bf16, FP8 operands, norm and RoPE) and
 * one workspace for them all. */
static int plan_ways(fxa_ctx *ctx, proj_bench *b)
{
    for (int way = 2; way < N_WAYS; way++) {
        fxa_proj_desc d;
        fxa_proj_desc_init(&d);
        d.tokens = b->s;
        d.in_features = b->h;
        d.heads_q = b->heads;
        d.heads_kv = b->heads;
        d.head_dim = b->dim;
        d.norm = 1;
        d.rope = 1;
        d.x_format = way == 2 ? FXA_PROJ_X_F32 : way == 3 ? FXA_PROJ_X_BF16 : FXA_PROJ_X_E4M3_ROWS;
        d.w_format = way == 2 ? FXA_PROJ_W_F32 : way == 3 ? FXA_PROJ_W_BF16 : FXA_PROJ_W_E4M3;
        size_t bytes = 0;
        if (fxa_proj_plan_create(ctx, &d, &b->plan[way], &bytes) != FXA_OK)
            return fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_last_error(ctx));
        b->work_bytes = bytes > b->work_bytes ? bytes : b->work_bytes;
    }
    if (!(b->work = aligned_alloc(64, (b->work_bytes + 63) / 64 * 64)))
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for the workspace");
    return 0;
}

int fxt_bench_proj(const bench_args *ba)
{
    proj_bench b = {0};
    b.s = ba->seq;
    b.heads = ba->heads;
    b.dim = ba->dim;
    b.h = ba->heads * ba->dim;
    b.i = 3 * b.h;
    fxa_ctx_params cp;
    fxa_ctx_params_init(&cp);
    cp.n_threads = (int)ba->threads;
    fxa_ctx *ctx = NULL;
    if (fxa_ctx_create(&cp, &ctx) != FXA_OK)
        return fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_create_error());
    const int threads = fxa_ctx_threads(ctx);
    const size_t sx = (size_t)(b.s * b.h), sw = (size_t)(b.i * b.h), sy = (size_t)(b.s * b.i);
    const size_t so = (size_t)(b.s * b.h);
    int code = 0;
    b.x = malloc(sx * 4);
    b.w = malloc(sw * 4);
    b.y = malloc(sy * 4);
    b.q = malloc(so * 4);
    b.k = malloc(so * 4);
    b.v = malloc(so * 4);
    b.bias = malloc((size_t)b.i * 4);
    b.ws = malloc((size_t)b.i * 4);
    b.gq = malloc((size_t)b.h * 4);
    b.gk = malloc((size_t)b.h * 4);
    b.cs = malloc((size_t)(b.s * b.dim) * 4);
    b.sn = malloc((size_t)(b.s * b.dim) * 4);
    b.x16 = malloc(sx * 2);
    b.w16 = malloc(sw * 2);
    b.x8 = malloc((size_t)(b.s * (b.h + 4)));
    b.w8 = malloc(sw);
    if (!b.x || !b.w || !b.y || !b.q || !b.k || !b.v || !b.bias || !b.ws || !b.gq || !b.gk ||
        !b.cs || !b.sn || !b.x16 || !b.w16 || !b.x8 || !b.w8) {
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory");
        goto done;
    }
    uint64_t st = 88172645463325252ull;
    for (size_t n = 0; n < sx + sw; n++) { /* xorshift uniforms in [-1, 1) */
        st ^= st << 13;
        st ^= st >> 7;
        st ^= st << 17;
        const float u = (float)((double)(st >> 11) * 0x1p-52 - 1.0);
        if (n < sx)
            b.x[n] = u;
        else
            b.w[n - sx] = u / sqrtf((float)b.h);
    }
    for (int64_t c = 0; c < b.i; c++)
        b.bias[c] = 0.01f * (float)(c % 7);
    for (int64_t c = 0; c < b.h; c++)
        b.gq[c] = b.gk[c] = 1.0f + 0.01f * (float)(c % 5);
    if (fxa_wan_rope_tables(1, 1, b.s, b.dim, 1e4, b.cs, b.sn) != FXA_OK ||
        fxa_e4m3_quantize_rows(b.x, b.s, b.h, b.x8) != FXA_OK ||
        fxa_e4m3_quantize_weights(b.w, b.i, b.h, b.w8, b.ws) != FXA_OK ||
        fxa_convert_f32(b.x, FXA_BF16, b.x16, sx) != FXA_OK ||
        fxa_convert_f32(b.w, FXA_BF16, b.w16, sw) != FXA_OK) {
        code = fxt_fail(FXT_EXIT_FAILURE, "cannot prepare the operands");
        goto done;
    }
    if ((code = plan_ways(ctx, &b)))
        goto done;
    static const char *const names[N_WAYS] = {"sgemm (bare)", "sgemm + separate passes",
                                              "fxattn f32", "fxattn bf16", "fxattn fp8"};
    const size_t w_bytes[N_WAYS] = {sw * 4, sw * 4, sw * 4, sw * 2, sw + (size_t)b.i * 4};
    double secs[N_WAYS][FXT_MAX_REPEATS];
    const int reps = (int)ba->repeats;
    for (int rep = -1; rep < reps; rep++)
        for (int way = 0; way < N_WAYS; way++) {
            const double t0 = fxt_now();
            if ((code = run_way(ctx, &b, way, threads)))
                goto done;
            if (rep >= 0)
                secs[way][rep] = fxt_now() - t0;
        }
    const char *peak_isa = NULL;
    const char *peak16_isa = NULL;
    const double peak = fxt_peak_gflops(FXT_PEAK_F32_FMA, threads, &peak_isa);
    /* oneDNN runs bf16 matmuls on AMX wherever the CPU and OS allow it. */
    double peak16 = fxt_peak_gflops(FXT_PEAK_BF16_AMX, threads, &peak16_isa);
    if (peak16 == 0.0)
        peak16 = fxt_peak_gflops(FXT_PEAK_BF16_DOT, threads, &peak16_isa);
    const double gflop = 2.0 * (double)b.s * (double)b.h * (double)b.i * 1e-9;
    double med[N_WAYS];
    for (int way = 0; way < N_WAYS; way++) {
        med[way] = fxt_median(secs[way], (size_t)reps);
    }
    if (!ba->json)
        printf("fxattn bench --proj: S=%lld H=%lld I=%lld (%lld heads x %lld), %d threads, "
               "median of %d runs; peaks: fp32 %.1f GFLOP/s (%s), bf16 %.1f GFLOP/s (%s)\n",
               (long long)b.s, (long long)b.h, (long long)b.i, (long long)b.heads, (long long)b.dim,
               threads, reps, peak, peak_isa, peak16, peak16_isa);
    for (int way = 0; way < N_WAYS; way++) {
        const double gf = gflop / med[way];
        const int bf16 = way >= 2 && b.stats[way].compute == FXA_COMPUTE_BF16;
        const double pk = bf16 ? peak16 : peak;
        const char *gemm = way >= 2 ? fxa_proj_gemm_name(b.stats[way].gemm) : "openblas";
        if (ba->json)
            fxt_json_printf(
                "{\"proj\": \"%s\", \"seq\": %lld, \"hidden\": %lld, \"out\": %lld, "
                "\"threads\": %d, \"seconds\": %.6f, \"gflops\": %.3f, \"fraction_of_peak\": "
                "%.4f, \"peak\": \"%s\", \"gemm\": \"%s\", \"over_bare_sgemm\": %.4f, "
                "\"weight_bytes\": %zu}\n",
                names[way], (long long)b.s, (long long)b.h, (long long)b.i, threads, med[way], gf,
                pk > 0 ? gf / pk : 0.0, bf16 ? "bf16" : "fp32", gemm, med[way] / med[0],
                w_bytes[way]);
        else
            printf("%-24s %8.3f s  %8.2f GFLOP/s  %5.1f%% of %s peak  %.3fx bare sgemm time  "
                   "weights %zu MB  (%s)\n",
                   names[way], med[way], gf, pk > 0 ? 100 * gf / pk : 0.0, bf16 ? "bf16" : "fp32",
                   med[way] / med[0], w_bytes[way] >> 20, gemm);
    }
done:
    free(b.x);
    free(b.w);
    free(b.y);
    free(b.q);
    free(b.k);
    free(b.v);
    free(b.bias);
    free(b.ws);
    free(b.gq);
    free(b.gk);
    free(b.cs);
    free(b.sn);
    free(b.x16);
    free(b.w16);
    free(b.x8);
    free(b.w8);
    free(b.work);
    for (int way = 0; way < N_WAYS; way++)
        fxa_proj_plan_destroy(b.plan[way]);
    fxa_ctx_destroy(ctx);
    return code;
}
