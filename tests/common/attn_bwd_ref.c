/* The fp64 reference of the attention backward and the backward tests'
 * scaffolding (attn_bwd_ref.h). */
#include "attn_bwd_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define LOG2E 1.4426950408889634

void fxt_ref_bias(const fxa_attn_desc *d, const void *mask, double *bias)
{
    const fxa_mask_strides *ms = &d->mask_strides;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads_q; h++)
            for (int64_t i = 0; i < d->seq_q; i++)
                for (int64_t j = 0; j < d->seq_kv; j++) {
                    const int64_t at = b * ms->batch + h * ms->head + i * ms->query + j * ms->key;
                    double x = 0.0;
                    if (d->mask_kind == FXA_MASK_BOOL)
                        x = ((const uint8_t *)mask)[at] ? 0.0 : -INFINITY;
                    else if (d->mask_kind == FXA_MASK_ADD)
                        x = ((const float *)mask)[at];
                    if (d->causal && j > i)
                        x = -INFINITY;
                    bias[((b * d->heads_q + h) * d->seq_q + i) * d->seq_kv + j] = x;
                }
}

void fxt_ref_attn_fwd(const fxt_bwd_shape *s, const double *q, const double *k, const double *v,
                      const double *bias, double *out, double *lse)
{
    const int64_t g = s->hq / s->hkv;
    double *z = malloc((size_t)s->skv * sizeof *z);
    for (int64_t b = 0; b < s->b; b++)
        for (int64_t h = 0; h < s->hq; h++)
            for (int64_t i = 0; i < s->sq; i++) {
                const int64_t row = (b * s->hq + h) * s->sq + i;
                const double *qi = q + row * s->d;
                const double *kh = k + (b * s->hkv + h / g) * s->skv * s->d;
                const double *vh = v + (b * s->hkv + h / g) * s->skv * s->d;
                double m = -INFINITY, l = 0.0;
                for (int64_t j = 0; j < s->skv; j++) {
                    double dot = 0.0;
                    for (int64_t c = 0; c < s->d; c++)
                        dot += qi[c] * kh[j * s->d + c];
                    z[j] = s->tau * dot + (bias ? bias[row * s->skv + j] : 0.0);
                    m = fmax(m, z[j]);
                }
                double *o = out + row * s->d;
                memset(o, 0, (size_t)s->d * sizeof *o);
                if (m == -INFINITY) {
                    lse[row] = -INFINITY;
                    continue;
                }
                for (int64_t j = 0; j < s->skv; j++) {
                    const double p = exp(z[j] - m);
                    l += p;
                    for (int64_t c = 0; c < s->d; c++)
                        o[c] += p * vh[j * s->d + c];
                }
                for (int64_t c = 0; c < s->d; c++)
                    o[c] /= l;
                lse[row] = m + log(l);
            }
    free(z);
}

void fxt_ref_attn_bwd(const fxt_bwd_shape *s, fxt_bf16_rounding br, const double *q,
                      const double *k, const double *v, const double *bias, const double *out,
                      const double *dout, const double *lse, double *const grad[3],
                      double *const env[3])
{
    const int64_t g = s->hq / s->hkv, d = s->d;
    const double u = 0x1p-24, tau = s->tau, lambda = tau * LOG2E;
    const double ub = br.on ? 0x1p-8 : 0.0, r_do = br.dout_rounded ? 1.0 : 0.0;
    const size_t n[3] = {(size_t)(s->b * s->hq * s->sq * d), (size_t)(s->b * s->hkv * s->skv * d),
                         (size_t)(s->b * s->hkv * s->skv * d)};
    for (int w = 0; w < 3; w++) {
        memset(grad[w], 0, n[w] * sizeof(double));
        if (env)
            memset(env[w], 0, n[w] * sizeof(double));
    }
    const double n_kv_terms = (double)(g * s->sq), n_q_terms = (double)s->skv;
    for (int64_t b = 0; b < s->b; b++)
        for (int64_t h = 0; h < s->hq; h++)
            for (int64_t i = 0; i < s->sq; i++) {
                const int64_t row = (b * s->hq + h) * s->sq + i;
                if (lse[row] == -INFINITY)
                    continue; /* every key masked: a constant row */
                const double *qi = q + row * d, *oi = out + row * d, *doi = dout + row * d;
                double delta = 0.0;
                for (int64_t c = 0; c < d; c++)
                    delta += doi[c] * oi[c];
                const double lse2 = lse[row] * LOG2E;
                for (int64_t j = 0; j < s->skv; j++) {
                    const double bij = bias ? bias[row * s->skv + j] : 0.0;
                    if (bij == -INFINITY)
                        continue;
                    const int64_t krow = (b * s->hkv + h / g) * s->skv + j;
                    const double *kj = k + krow * d, *vj = v + krow * d;
                    double dot = 0.0, dp = 0.0, A = 0.0, B = 0.0;
                    for (int64_t c = 0; c < d; c++) {
                        dot += qi[c] * kj[c];
                        dp += doi[c] * vj[c];
                        A += fabs(qi[c] * kj[c]);
                        B += fabs(doi[c] * vj[c]);
                    }
                    const double p = exp(tau * dot + bij - lse[row]);
                    const double ds = p * (dp - delta);
                    for (int64_t c = 0; c < d; c++) {
                        grad[2][krow * d + c] += p * doi[c];
                        grad[1][krow * d + c] += tau * ds * qi[c];
                        grad[0][row * d + c] += tau * ds * kj[c];
                    }
                    if (!env)
                        continue;
                    const double b2 = bij * LOG2E;
                    const double x = lambda * dot + b2 - lse2;
                    double a = lambda * (double)(d + 2) * u * A + u * fabs(lse2);
                    if (bias) { /* the base-2 bias and lse2 - bias2 rounded */
                        a += u * fabs(b2);
                        a += u * fabs(lse2 - b2);
                    }
                    a += u * fabs(x);
                    const double eps = 0.6931471805599453 * a + 3 * u;
                    const double e_ds = p * ((eps + 2 * u) * fabs(dp - delta) +
                                             ((double)d * u + r_do * ub) * B + u * fabs(delta)) +
                                        ub * fabs(ds);
                    for (int64_t c = 0; c < d; c++) {
                        env[2][krow * d + c] +=
                            (eps + u + ub * (1 + r_do) + n_kv_terms * u) * p * fabs(doi[c]);
                        env[1][krow * d + c] +=
                            tau * (e_ds + (1 + n_kv_terms) * u * fabs(ds)) * fabs(qi[c]);
                        env[0][row * d + c] +=
                            tau * (e_ds + (1 + n_q_terms) * u * fabs(ds)) * fabs(kj[c]);
                    }
                }
            }
    if (env)
        for (int w = 0; w < 2; w++)
            for (size_t x = 0; x < n[w]; x++)
                env[w][x] += 2 * u * fabs(grad[w][x]);
}

double fxt_ref_fd_error(const fxt_bwd_shape *s, double *q, double *k, double *v, const double *bias,
                        const double *dout, double *const grad[3])
{
    const size_t rows = (size_t)(s->b * s->hq * s->sq), nq = rows * (size_t)s->d;
    const size_t nkv = (size_t)(s->b * s->hkv * s->skv * s->d);
    double *out = malloc(nq * sizeof *out), *lse = malloc(rows * sizeof *lse);
    fxt_ref_attn_fwd(s, q, k, v, bias, out, lse);
    fxt_ref_attn_bwd(s, (fxt_bf16_rounding){0, 0}, q, k, v, bias, out, dout, lse, grad, NULL);
    double *const xs[3] = {q, k, v};
    const size_t ns[3] = {nq, nkv, nkv};
    const double hstep = 1e-5;
    double worst = 0.0;
    for (int t = 0; t < 3; t++)
        for (size_t x = 0; x < ns[t]; x++) {
            double lo = 0.0, hi = 0.0;
            const double keep = xs[t][x];
            xs[t][x] = keep + hstep;
            fxt_ref_attn_fwd(s, q, k, v, bias, out, lse);
            for (size_t y = 0; y < nq; y++)
                hi += dout[y] * out[y];
            xs[t][x] = keep - hstep;
            fxt_ref_attn_fwd(s, q, k, v, bias, out, lse);
            for (size_t y = 0; y < nq; y++)
                lo += dout[y] * out[y];
            xs[t][x] = keep;
            worst = fmax(worst, fabs((hi - lo) / (2 * hstep) - grad[t][x]));
        }
    free(out);
    free(lse);
    return worst;
}

void fxt_fwd_checked(const char *label, const fxa_attn_desc *d, const fxa_attn_args *a)
{
    fxa_ctx *ctx = NULL;
    fxa_ctx_create(NULL, &ctx);
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    fxa_status st = fxa_attn_plan_create(ctx, d, &plan, &ws_bytes);
    void *ws = aligned_alloc(64, (ws_bytes + 127) / 64 * 64);
    if (st == FXA_OK)
        st = fxa_attn_run(plan, a, ws, NULL);
    CHECK(st == FXA_OK, "[%s] forward: %s", label, fxa_ctx_last_error(ctx));
    free(ws);
    fxa_attn_plan_destroy(plan);
    fxa_ctx_destroy(ctx);
}

fxa_status fxt_bwd_once(const fxa_attn_desc *d, int n_threads, const fxa_attn_bwd_args *a,
                        fxa_attn_bwd_stats *stats, char *msg, size_t cap)
{
    fxa_ctx_params cp;
    fxa_ctx_params_init(&cp);
    cp.n_threads = n_threads;
    fxa_ctx *ctx = NULL;
    if (fxa_ctx_create(&cp, &ctx) != FXA_OK) {
        if (msg)
            snprintf(msg, cap, "no context of %d threads", n_threads);
        return FXA_ERR_INTERNAL;
    }
    fxa_attn_bwd_plan *plan = NULL;
    size_t ws_bytes = 0;
    fxa_status st = fxa_attn_bwd_plan_create(ctx, d, &plan, &ws_bytes);
    if (st == FXA_OK) {
        void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64);
        st = fxa_attn_bwd_run(plan, a, ws, stats);
        free(ws);
    }
    if (msg)
        snprintf(msg, cap, "%s", fxa_ctx_last_error(ctx));
    fxa_attn_bwd_plan_destroy(plan);
    fxa_ctx_destroy(ctx);
    return st;
}

void fxt_bwd_compare(const char *label, const char *name, const double *got, const double *ref,
                     const double *env, size_t n)
{
    double worst = 0.0, err_max = 0.0, mag = 0.0;
    size_t worst_at = 0, zero_env_nonzero = 0;
    for (size_t x = 0; x < n; x++) {
        const double err = fabs(got[x] - ref[x]);
        const double ratio = err / (2.0 * env[x] + 1e-300);
        if (ratio > worst || !(err == err)) {
            worst = ratio;
            worst_at = x;
        }
        zero_env_nonzero += env[x] == 0.0 && got[x] != 0.0;
        err_max = fmax(err_max, err);
        mag = fmax(mag, fabs(ref[x]));
    }
    CHECK(worst <= 1.0, "[%s] %s[%zu] = %.9g, fp64 %.9g: error %.3g over 2x the envelope %.3g",
          label, name, worst_at, got[worst_at], ref[worst_at], fabs(got[worst_at] - ref[worst_at]),
          env[worst_at]);
    CHECK(zero_env_nonzero == 0, "[%s] %s: %zu elements nonzero where no term reaches them", label,
          name, zero_env_nonzero);
    printf("[%s] %s: max err %.3g (max |g| %.3g), at most %.3f of 2x the envelope\n", label, name,
           err_max, mag, worst);
}

void fxt_bwd_check_threads(const char *label, fxt_bwd_runner run, void *arg, float *const grads[3],
                           float *const keep[3], const size_t n[3])
{
    for (int w = 0; w < 3; w++)
        memcpy(keep[w], grads[w], n[w] * sizeof(float));
    for (int threads = 1; threads <= 3; threads += 2) {
        for (int w = 0; w < 3; w++)
            memset(grads[w], 0xff, n[w] * sizeof(float));
        CHECK(run(arg, threads) == FXA_OK, "[%s] %d threads", label, threads);
        int same = 1;
        for (int w = 0; w < 3; w++)
            same &= memcmp(keep[w], grads[w], n[w] * sizeof(float)) == 0;
        CHECK(same, "[%s] gradients on %d threads differ from 2 threads'", label, threads);
    }
}
