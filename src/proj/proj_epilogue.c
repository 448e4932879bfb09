/* The QKV projection's epilogue per token: FP8 scales and bias (phase A),
 * RMSNorm across heads and RoPE (B), the store in the requested layout (C). */
#include <math.h>
#include <string.h>

#include "../base/convert_inline.h"
#include "../core/ctx_api.h"
#include "proj_internal.h"

/* Store head h's head_dim values of token s of a segment of `heads` heads
 * in d's layout and output dtype. */
static void store_row(const fxa_proj_desc *d, void *base, int64_t heads, int64_t s, int64_t h,
                      const float *v)
{
    const int64_t row = d->out_layout == FXA_PROJ_TOKEN_MAJOR ? s * heads + h : h * d->tokens + s;
    if (d->out_dtype == FXA_F32) {
        memcpy((float *)base + row * d->head_dim, v, (size_t)d->head_dim * sizeof(float));
        return;
    }
    uint16_t *o = (uint16_t *)base + row * d->head_dim;
    for (int64_t i = 0; i < d->head_dim; i++)
        o[i] = fxa_f32_to_bf16_bits(v[i]);
}

/* Sum of y^2 in double, in index order. */
static double sum_squares(const float *y, int64_t n)
{
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)y[i] * (double)y[i];
    return sum;
}

/* 1 / sqrt(mean + eps): the mean rounded to fp32, then 1.0f / sqrtf in fp32.
 * A mean of squares at or above 2^126 (every y finite, but y^2 past fp32)
 * is normalised by a power of two instead: *shift = e with the mean scaled
 * by 2^-2e into [2^-2, 2) (eps, below 2^-100 of it, does not change the
 * fp32 sum), and the caller scales y by 2^-e first (exact), so y 2^-e *
 * (r gamma) equals what an fp32 with a wider exponent would give; *shift =
 * 0 otherwise, with the ordinary bits. */
static float inv_rms(double sum, double n, double eps, int *shift)
{
    const double mean_d = sum / n;
    *shift = 0;
    if (mean_d >= 0x1p126) {
        int ex;
        frexp(mean_d, &ex); /* mean_d = f 2^ex, f in [0.5, 1) */
        *shift = ex / 2;
        return 1.0f / sqrtf((float)ldexp(mean_d, -2 * *shift));
    }
    const float mean = (float)mean_d;
    return 1.0f / sqrtf(mean + (float)eps);
}

/* 1 when v is finite and stays finite in d's output dtype (a value past
 * bf16's largest finite rounds to Inf there). */
static int out_finite(const fxa_proj_desc *d, float v)
{
    if (d->out_dtype == FXA_F32)
        return isfinite(v);
    return (fxa_f32_to_bf16_bits(v) & 0x7f80u) != 0x7f80u;
}

/* Normalise (r; 1 without norm) and rotate one segment of one token in
 * place. Returns 0 when some result is not finite in the output dtype. */
static int finish_segment(const fxa_proj_desc *d, float *y, int64_t heads, const float *gamma,
                          const float *cs, const float *sn, float r, int shift)
{
    const int64_t dim = d->head_dim;
    const int64_t half = dim / 2;
    float ys[FXA_MAX_HEAD_DIM], o[FXA_MAX_HEAD_DIM];
    int ok = 1;
    for (int64_t h = 0; h < heads; h++) {
        float *yh_out = y + h * dim;
        const float *yh = yh_out;
        if (shift) { /* inv_rms's power of two: exact for these large y */
            for (int64_t i = 0; i < dim; i++)
                ys[i] = ldexpf(yh[i], -shift);
            yh = ys;
        }
        const float *g = d->norm ? gamma + h * dim : NULL;
        if (!d->rope) {
            for (int64_t i = 0; i < dim; i++)
                o[i] = d->norm ? yh[i] * (r * g[i]) : yh[i];
        } else {
            float t[FXA_MAX_HEAD_DIM];
            for (int64_t i = 0; i < dim; i++)
                t[i] = d->norm ? yh[i] * g[i] : yh[i];
            for (int64_t i = 0; i < dim; i++) {
                const float rc = r * cs[i];
                const float rs = r * sn[i];
                o[i] = i < half ? t[i] * rc - t[i + half] * rs : t[i] * rc + t[i - half] * rs;
            }
        }
        for (int64_t i = 0; i < dim; i++)
            ok &= out_finite(d, o[i]);
        memcpy(yh_out, o, (size_t)dim * sizeof(float));
    }
    return ok;
}

/* Phase A of token s: y = acc * x_scale * w_scale + b in place, and the
 * segments' sums of squares. Returns 0 when some y is not finite (a non-
 * finite fp32 operand poisons its whole row or column, so this also catches
 * those without scanning the inputs on every call). */
static int dequantise_token(const epi_job *job, int64_t s)
{
    const fxa_proj_desc *d = job->d;
    const fxa_proj_args *a = job->a;
    const int64_t n_out = fxa_proj_out_features(d);
    float *y = job->y + s * n_out;
    for (int64_t i = 0; i < n_out; i++) {
        float v = y[i] * job->xs[s];
        if (d->w_format == FXA_PROJ_W_E4M3)
            v *= a->w_scales[i];
        y[i] = a->bias ? v + a->bias[i] : v;
    }
    uint32_t any = 0;
    for (int64_t i = 0; i < n_out; i++) {
        uint32_t b;
        memcpy(&b, y + i, sizeof b);
        any |= (b & 0x7f800000u) == 0x7f800000u;
    }
    if (!d->norm)
        return !any;
    const int64_t qn = d->heads_q * d->head_dim;
    job->sums[2 * s] = sum_squares(y, qn);
    job->sums[2 * s + 1] = d->heads_kv > 0 ? sum_squares(y + qn, d->heads_kv * d->head_dim) : 0.0;
    return !any;
}

/* Phase B of token s: normalise and rotate Q and K in place. Returns 0
 * when some output value (V's too) is not finite in the output dtype. */
static int finish_token(const epi_job *job, int64_t s)
{
    const fxa_proj_desc *d = job->d;
    const fxa_proj_args *a = job->a;
    float *y = job->y + s * fxa_proj_out_features(d);
    const int64_t qn = d->heads_q * d->head_dim;
    const int64_t kn = d->heads_kv * d->head_dim;
    const float *cs = d->rope ? a->rope_cos + s * d->head_dim : NULL;
    const float *sn = d->rope ? a->rope_sin + s * d->head_dim : NULL;
    int shift = 0;
    const float rq = d->norm ? inv_rms(job->sums[2 * s], job->n_q, d->eps, &shift) : 1.0f;
    int ok = finish_segment(d, y, d->heads_q, a->gamma_q, cs, sn, rq, shift);
    if (d->heads_kv == 0)
        return ok;
    shift = 0;
    const float rk = d->norm ? inv_rms(job->sums[2 * s + 1], job->n_k, d->eps, &shift) : 1.0f;
    ok &= finish_segment(d, y + qn, d->heads_kv, a->gamma_k, cs, sn, rk, shift);
    for (int64_t i = 0; i < kn; i++)
        ok &= out_finite(d, y[qn + kn + i]);
    return ok;
}

/* Phase C of token s: store every segment. */
static void store_token(const epi_job *job, int64_t s)
{
    const fxa_proj_desc *d = job->d;
    const fxa_proj_args *a = job->a;
    const float *y = job->y + s * fxa_proj_out_features(d);
    const int64_t dim = d->head_dim;
    for (int64_t h = 0; h < d->heads_q; h++)
        store_row(d, a->q_out, d->heads_q, s, h, y + h * dim);
    y += d->heads_q * dim;
    for (int64_t h = 0; h < d->heads_kv; h++)
        store_row(d, a->k_out, d->heads_kv, s, h, y + h * dim);
    y += d->heads_kv * dim;
    for (int64_t h = 0; h < d->heads_kv; h++)
        store_row(d, a->v_out, d->heads_kv, s, h, y + h * dim);
}

/* Items of tokens_per_item tokens: phase A (dequantise, sums, checks),
 * phase B (normalise, rotate, checks) or phase C (store); every token
 * passes A and B before any is stored, so that a failure leaves the outputs
 * untouched and a reduction can sit between A and B. */
enum { PHASE_A = 1, PHASE_B = 2, PHASE_C = 4 };

typedef struct phase_job {
    const epi_job *job;
    int phases;
} phase_job;

static void phase_item(void *arg, int64_t item, int thread_id)
{
    const phase_job *pj = arg;
    const epi_job *job = pj->job;
    const int64_t s0 = item * job->tokens_per_item;
    const int64_t s1 =
        s0 + job->tokens_per_item < job->d->tokens ? s0 + job->tokens_per_item : job->d->tokens;
    (void)thread_id;
    if (pj->phases & (PHASE_A | PHASE_B))
        job->bad[item] = -1;
    for (int64_t s = s0; s < s1; s++) {
        if ((pj->phases & PHASE_A) && !dequantise_token(job, s) && job->bad[item] < 0)
            job->bad[item] = s;
        if ((pj->phases & PHASE_B) && !finish_token(job, s) && job->bad[item] < 0)
            job->bad[item] = s;
        if (pj->phases & PHASE_C)
            store_token(job, s);
    }
}

/* The first token an A or B pass marked bad, or -1. */
static int64_t first_bad(const epi_job *job, int64_t n_items)
{
    int64_t first = -1;
    for (int64_t i = 0; i < n_items && first < 0; i++)
        first = job->bad[i];
    return first;
}

/* Phases B and C: normalise and rotate every token, then store them all,
 * or refuse (nothing stored) when an output value overflows. */
fxa_status fxa_proj_phase_bc(fxa_ctx *ctx, epi_job *job, int64_t n_items)
{
    fxa_pool *pool = fxa_ctx_pool(ctx);
    const phase_job pb = {job, PHASE_B};
    fxa_pool_run(pool, phase_item, (void *)&pb, n_items);
    const int64_t first = first_bad(job, n_items);
    if (first >= 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "the projection's output for token %lld overflows %s (RMSNorm gamma or "
                            "RoPE tables too large)",
                            (long long)first, job->d->out_dtype == FXA_F32 ? "fp32" : "bf16");
    const phase_job pc = {job, PHASE_C};
    fxa_pool_run(pool, phase_item, (void *)&pc, n_items);
    return FXA_OK;
}

/* Phase A over all tokens; a non-finite y is traced back to its cause:
 * a non-finite fp32 operand (found by scanning them now), else overflow. */
fxa_status fxa_proj_phase_a(const fxa_proj_plan *p, unsigned char *ws, epi_job *job,
                            int64_t n_items)
{
    const fxa_proj_desc *d = job->d;
    const phase_job pj = {job, PHASE_A};
    fxa_pool_run(fxa_ctx_pool(p->ctx), phase_item, (void *)&pj, n_items);
    const int64_t first = first_bad(job, n_items);
    if (first < 0)
        return FXA_OK;
    const void *unused;
    fxa_status st = fxa_proj_stage_x(p, ws, job->a->x, NULL, NULL, job->xs, &unused, 1);
    if (st == FXA_OK)
        st =
            fxa_proj_stage_w(p, ws, job->a->w, 0, fxa_proj_out_features(d), NULL, NULL, &unused, 1);
    if (st != FXA_OK)
        return st;
    return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                        "the projection of token %lld overflows fp32 (inputs too large)",
                        (long long)first);
}
