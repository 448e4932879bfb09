/*
 * Attention masks and causal (fxa_attn_desc.mask_kind, causal) as biases of
 * the base-2 scores: 0 where a key takes part, -INFINITY where it is masked,
 * and an additive mask's value x times log2(e) plus the row's offset
 * (rounded once to fp32). The offset is 0 unless every finite x of the row
 * lies below -FLT_MAX / log2(e) (about -2.36e38, e.g. finfo(float32).min
 * padding): then FXA_MASK_LOW_OFFSET, which brings the row's biases back
 * into fp32 at the same magnitude (scores are still absorbed by them, as in
 * fp32 and fp64 SDPA) and which the row's lse takes back. Elsewhere a bias
 * below -FLT_MAX is -INFINITY: its key's weight next to the row's largest
 * bias (at least 2^103 larger, the spacing of fp32 there) is exactly 0. The
 * tiles add a tile's bias to z (fxa_attn_tile.bias); the row setup takes
 * each row's largest finite bias for its shift (bound.c).
 */
#ifndef FXA_MASK_H
#define FXA_MASK_H

#include <stddef.h>
#include <stdint.h>

#include "attn_internal.h"

/* Largest additive mask value accepted: 2^120 (larger ones could push
 * scores past fp32). */
#define FXA_MASK_ADD_MAX 0x1p120

/* The base-2 offset of a row whose finite biases all lie below -FLT_MAX
 * (see above): 2^127 maps [-FLT_MAX log2(e), -FLT_MAX) into
 * [-3.2e38, -1.7e38]. */
#define FXA_MASK_LOW_OFFSET 0x1p127

/* Element offset of mask element (b, h, i, j). */
static inline int64_t fxa_mask_at(const fxa_attn_plan *p, int64_t b, int64_t h, int64_t i,
                                  int64_t j)
{
    const fxa_mask_strides *s = &p->d.mask_strides;
    return b * s->batch + h * s->head + i * s->query + j * s->key;
}

/* Additive mask element `at` (FXA_MASK_ADD or FXA_MASK_ADD_F64) in double. */
static inline double fxa_mask_value(const fxa_attn_plan *p, const void *mask, int64_t at)
{
    return p->d.mask_kind == FXA_MASK_ADD_F64 ? ((const double *)mask)[at]
                                              : (double)((const float *)mask)[at];
}

/* A run's mask, before any output is written: present when the plan has
 * one, and for FXA_MASK_ADD and FXA_MASK_ADD_F64 every element (each read once however it
 * broadcasts) not NaN and at most FXA_MASK_ADD_MAX (-INFINITY masks).
 * FXA_ERR_INVALID_ARG naming the first bad element. */
fxa_status fxa_mask_check(const fxa_attn_plan *p, const void *mask);

/* For query rows i0 + r of head (b, h), r < n: off[r] = the row's offset (0
 * or FXA_MASK_LOW_OFFSET) and out[r] = its largest finite bias with it
 * (-INFINITY when every key is masked). Causal: 0 and 0. */
void fxa_mask_row_max(const fxa_attn_plan *p, const void *mask, int64_t b, int64_t h, int64_t i0,
                      size_t n, float *out, float *off);

/* How a kv tile meets a block of query rows. */
typedef enum fxa_tile_use {
    FXA_TILE_SKIP = 0,  /* every key masked for every row: adds nothing, skipped */
    FXA_TILE_PLAIN = 1, /* no key masked and no bias: run without one */
    FXA_TILE_BIAS = 2   /* run with the bias written */
} fxa_tile_use;

/* The bias of rows [i0, i0 + n) x keys [j0, j0 + n_kv) of head (b, h) for
 * a mask (not causal), with the rows' offsets off[r] (fxa_mask_row_max), at
 * bias[r * ld + j]; the caller uses it only when the result is
 * FXA_TILE_BIAS. */
fxa_tile_use fxa_mask_tile(const fxa_attn_plan *p, const void *mask, int64_t b, int64_t h,
                           int64_t i0, size_t n, const float *off, int64_t j0, size_t n_kv,
                           size_t ld, float *bias);

/* Causal (row i sees keys j <= i): the bias of rows [i0, i0 + n) x keys
 * [j0, j0 + n_kv), 0 or -INFINITY, at bias[r * ld + j]. Lower-right
 * alignment passes i0 + fxa_causal_shift(p). */
void fxa_causal_bias(int64_t i0, size_t n, int64_t j0, size_t n_kv, size_t ld, float *bias);

#endif
