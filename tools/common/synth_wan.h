/*
 * synth_wan: Wan2.2-like synthetic self-attention inputs, without a model.
 *
 * Q and K come from a low-rank, slowly varying function of the latent-grid
 * position plus noise plus a common offset (large for K), then a Wan-style
 * RMSNorm across all heads of a token with a per-channel gain (some heads
 * hotter than others), then Wan's 3-D RoPE per head. V is Gaussian-like with
 * a per-channel scale. All randomness comes from a local PRNG, so a seed gives
 * the same bits on every platform up to the last-bit rounding of libm's
 * cos/sin/exp/pow, which are used only for per-axis tables and parameters.
 * Cost is linear in the number of tokens.
 */
#ifndef FXT_SYNTH_WAN_H
#define FXT_SYNTH_WAN_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"

typedef struct fxt_wan_synth {
    int frames, height, width; /* latent grid; tokens S = frames*height*width */
    int heads;                 /* e.g. 40 */
    int head_dim;              /* even, >= 6, e.g. 128 */
    uint64_t seed;
} fxt_wan_synth;

/* 4x32x32 grid (S = 4096), 40 heads, head_dim 128, seed 1. */
void fxt_wan_synth_defaults(fxt_wan_synth *p);

/*
 * Fill q, k, v, each [S, heads, head_dim] fp32 (token-major, token index
 * (f*height + h)*width + w), caller-allocated. Deterministic for a seed.
 * FXA_ERR_INVALID_ARG: NULL pointer, non-positive size, odd head_dim or
 * head_dim < 6, or a tensor too large for size_t. FXA_ERR_NO_MEMORY if the
 * small internal tables cannot be allocated.
 */
fxa_status fxt_wan_synth_qkv(const fxt_wan_synth *p, float *q, float *k, float *v);

/*
 * RMSNorm of one row of n = heads*head_dim values: sum of x^2 accumulated in
 * double in index order, mean = (float)(sum / n), r = 1.0f / sqrtf(mean + eps),
 * y[i] = x[i] * (r * gamma[i]) in fp32 (that association order). y may be x.
 */
void fxt_rmsnorm_row(const float *x, const float *gamma, size_t n, float eps, float *y);

/*
 * Wan's RoPE band split of head_dim d: P = d/2 pairs, h = w = P/3,
 * t = P - 2*(P/3); order [t | h | w] along the pairs. d = 128: 22/21/21.
 */
void fxt_wan_rope_bands(int head_dim, int *t_pairs, int *h_pairs, int *w_pairs);

/*
 * Wan 3-D RoPE of one head vector x[head_dim], in place. Pair i is
 * (x[2i], x[2i+1]); pair j of a band of n pairs on axis position p turns by
 * angle p * 1e4^(-j/n), computed in double, cos/sin rounded to float:
 * (x0, x1) -> (x0*c - x1*s, x0*s + x1*c).
 */
void fxt_wan_rope_apply(float *x, int head_dim, int pos_t, int pos_h, int pos_w);

#endif /* FXT_SYNTH_WAN_H */
