/* Masks and causal as biases of the base-2 scores (see mask.h). */
#include "mask.h"

#include <float.h>
#include <math.h>

#define LOG2E 1.4426950408889634

/* Element (at) in base 2, unrounded: 0 or -INFINITY for a boolean mask,
 * x log2(e) in double for an additive one. */
static double bias2_of(const fxa_attn_plan *p, const void *mask, int64_t at)
{
    if (p->d.mask_kind == FXA_MASK_BOOL)
        return ((const uint8_t *)mask)[at] ? 0.0 : -INFINITY;
    return fxa_mask_value(p, mask, at) * LOG2E;
}

/* Element (at) as the bias of a row with offset off (0 or
 * FXA_MASK_LOW_OFFSET): bias2_of + off rounded once to fp32, -INFINITY
 * below -FLT_MAX (such a key's weight is 0 next to the row's largest). */
static float bias_of(const fxa_attn_plan *p, const void *mask, int64_t at, double off)
{
    const double b = bias2_of(p, mask, at) + off;
    return b < -(double)FLT_MAX ? -INFINITY : (float)b;
}

fxa_status fxa_mask_check(const fxa_attn_plan *p, const void *mask)
{
    if (p->d.mask_kind == FXA_MASK_NONE)
        return FXA_OK;
    if (!mask)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "the plan has a %s mask but args->mask is NULL",
                            p->d.mask_kind == FXA_MASK_BOOL ? "boolean" : "additive");
    if (p->d.mask_kind == FXA_MASK_BOOL)
        return FXA_OK;
    const fxa_mask_strides *s = &p->d.mask_strides;
    /* Each distinct element once: a broadcast (stride 0) axis has one index. */
    const int64_t nb = s->batch ? p->d.batch : 1, nh = s->head ? p->d.heads_q : 1;
    const int64_t ni = s->query ? p->d.seq_q : 1, nj = s->key ? p->d.seq_kv : 1;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = 0; i < ni; i++)
                for (int64_t j = 0; j < nj; j++) {
                    const double x = fxa_mask_value(p, mask, fxa_mask_at(p, b, h, i, j));
                    if (isnan(x) || x > FXA_MASK_ADD_MAX)
                        return fxa_ctx_fail(
                            p->ctx, FXA_ERR_INVALID_ARG,
                            "the additive mask holds %g at batch %lld, head %lld, query %lld, "
                            "key %lld: its values must be numbers up to 2^120 (-inf masks a key)",
                            x, (long long)b, (long long)h, (long long)i, (long long)j);
                }
    return FXA_OK;
}

void fxa_mask_row_max(const fxa_attn_plan *p, const void *mask, int64_t b, int64_t h, int64_t i0,
                      size_t n, float *out, float *off)
{
    for (size_t r = 0; r < n; r++) {
        /* causal: key 0 takes part in every row that attends any key */
        double mx = p->d.causal && i0 + (int64_t)r + fxa_causal_shift(p) >= 0 ? 0.0 : -INFINITY;
        if (!p->d.causal) {
            const int64_t at = fxa_mask_at(p, b, h, i0 + (int64_t)r, 0);
            for (int64_t j = 0; j < p->d.seq_kv; j++) {
                const double x = bias2_of(p, mask, at + j * p->d.mask_strides.key);
                mx = x > mx ? x : mx;
            }
        }
        off[r] = mx > -INFINITY && mx < -(double)FLT_MAX ? (float)FXA_MASK_LOW_OFFSET : 0.0f;
        out[r] = mx == -INFINITY ? -INFINITY : (float)(mx + (double)off[r]);
    }
}

fxa_tile_use fxa_mask_tile(const fxa_attn_plan *p, const void *mask, int64_t b, int64_t h,
                           int64_t i0, size_t n, const float *off, int64_t j0, size_t n_kv,
                           size_t ld, float *bias)
{
    size_t n_masked = 0;
    int biased = 0;
    for (size_t r = 0; r < n; r++) {
        const int64_t at = fxa_mask_at(p, b, h, i0 + (int64_t)r, j0);
        for (size_t j = 0; j < n_kv; j++) {
            const float x = bias_of(p, mask, at + (int64_t)j * p->d.mask_strides.key, off[r]);
            bias[r * ld + j] = x;
            n_masked += x == -INFINITY;
            biased |= x != 0.0f;
        }
    }
    if (n_masked == n * n_kv)
        return FXA_TILE_SKIP;
    return biased ? FXA_TILE_BIAS : FXA_TILE_PLAIN;
}

void fxa_causal_bias(int64_t i0, size_t n, int64_t j0, size_t n_kv, size_t ld, float *bias)
{
    for (size_t r = 0; r < n; r++)
        for (size_t j = 0; j < n_kv; j++)
            bias[r * ld + j] = j0 + (int64_t)j <= i0 + (int64_t)r ? 0.0f : -INFINITY;
}
