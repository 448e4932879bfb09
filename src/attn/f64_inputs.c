/* What the fp64 forward and backward share: the finite check of an input
 * and the biases of masks and causal in natural-log units (f64.h). */
#include <math.h>

#include "f64.h"

fxa_status fxa_f64_check_finite(const fxa_attn_plan *p, const char *name, const double *x,
                                const fxa_strides *s, int64_t heads, int64_t seq)
{
    const int64_t d = p->d.head_dim;
    for (int64_t b = 0; b < p->d.batch; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t t = 0; t < seq; t++) {
                const double *row = x + fxa_f64_row(s, b, h, t);
                double sum = 0.0; /* NaN exactly when some element is not finite */
                for (int64_t c = 0; c < d; c++)
                    sum += row[c] * 0.0;
                if (sum == 0.0)
                    continue;
                for (int64_t c = 0; c < d; c++)
                    if (!isfinite(row[c]))
                        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                                            "%s has a non-finite value (%g) at batch %lld, token "
                                            "%lld, head %lld, dim %lld",
                                            name, row[c], (long long)b, (long long)t, (long long)h,
                                            (long long)c);
            }
    return FXA_OK;
}

int64_t fxa_f64_keys_end(const fxa_attn_plan *p, int64_t i0, size_t n)
{
    if (!p->d.causal)
        return p->d.seq_kv;
    const int64_t end = i0 + (int64_t)n + fxa_causal_shift(p);
    return end < p->d.seq_kv ? end : p->d.seq_kv;
}

void fxa_f64_rows_over_keys(const fxa_attn_plan *p, const void *k, const void *v, const void *mask,
                            int64_t b, int64_t h, int64_t i0, size_t n, fxa_attn_tile_f64 *t,
                            double *bias)
{
    const int64_t g = h / p->group, end = fxa_f64_keys_end(p, i0, n);
    for (int64_t j0 = 0; j0 < end; j0 += FXA_F64_KV_TILE) {
        t->n_kv = (size_t)(p->d.seq_kv - j0 < FXA_F64_KV_TILE ? p->d.seq_kv - j0 : FXA_F64_KV_TILE);
        t->bias = NULL;
        if (fxa_attn_masked(p)) {
            const fxa_tile_use use =
                fxa_f64_tile_bias(p, mask, b, h, i0, n, j0, t->n_kv, FXA_F64_KV_TILE, bias);
            if (use == FXA_TILE_SKIP)
                continue;
            t->bias = use == FXA_TILE_BIAS ? bias : NULL;
        }
        t->k = (const double *)k + fxa_f64_row(&p->k_strides, b, g, j0);
        t->v = (const double *)v + fxa_f64_row(&p->v_strides, b, g, j0);
        p->ctx->kernels->attn_tile_f64(t);
    }
}

/* Element (at) of the plan's mask as a natural-log bias. */
static double bias_of(const fxa_attn_plan *p, const void *mask, int64_t at)
{
    if (p->d.mask_kind == FXA_MASK_BOOL)
        return ((const uint8_t *)mask)[at] ? 0.0 : -INFINITY;
    return fxa_mask_value(p, mask, at);
}

fxa_tile_use fxa_f64_tile_bias(const fxa_attn_plan *p, const void *mask, int64_t b, int64_t h,
                               int64_t i0, size_t n, int64_t j0, size_t n_kv, size_t ld,
                               double *bias)
{
    size_t n_masked = 0;
    int biased = 0;
    const int64_t shift = fxa_causal_shift(p);
    for (size_t r = 0; r < n; r++) {
        const int64_t i = i0 + (int64_t)r;
        const int64_t at = p->d.causal ? 0 : fxa_mask_at(p, b, h, i, j0);
        for (size_t j = 0; j < n_kv; j++) {
            const double x = p->d.causal
                                 ? (j0 + (int64_t)j <= i + shift ? 0.0 : -INFINITY)
                                 : bias_of(p, mask, at + (int64_t)j * p->d.mask_strides.key);
            bias[r * ld + j] = x;
            n_masked += x == -INFINITY;
            biased |= x != 0.0;
        }
    }
    if (n_masked == n * n_kv)
        return FXA_TILE_SKIP;
    return biased ? FXA_TILE_BIAS : FXA_TILE_PLAIN;
}
