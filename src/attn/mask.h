/*
 * Attention masks and causal (fxa_attn_desc.mask_kind, causal) as biases of
 * the base-2 scores: 0 where a key takes part, -INFINITY where it is masked,
 * and an additive mask's value times log2(e) (rounded once to fp32). The
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

/* A run's mask, before any output is written: present when the plan has
 * one, and for FXA_MASK_ADD every element (each read once however it
 * broadcasts) not NaN and at most FXA_MASK_ADD_MAX (-INFINITY masks).
 * FXA_ERR_INVALID_ARG naming the first bad element. */
fxa_status fxa_mask_check(const fxa_attn_plan *p, const void *mask);

/* out[r] = the largest finite bias of query row i0 + r of head (b, h), r <
 * n (-INFINITY when every key is masked). */
void fxa_mask_row_max(const fxa_attn_plan *p, const void *mask, int64_t b, int64_t h, int64_t i0,
                      size_t n, float *out);

/* How a kv tile meets a block of query rows. */
typedef enum fxa_tile_use {
    FXA_TILE_SKIP = 0,  /* every key masked for every row: adds nothing, skipped */
    FXA_TILE_PLAIN = 1, /* no key masked and no bias: run without one */
    FXA_TILE_BIAS = 2   /* run with the bias written */
} fxa_tile_use;

/* The bias of rows [i0, i0 + n) x keys [j0, j0 + n_kv) of head (b, h) for
 * a mask (not causal), at bias[r * ld + j]; the caller uses it only when
 * the result is FXA_TILE_BIAS. */
fxa_tile_use fxa_mask_tile(const fxa_attn_plan *p, const void *mask, int64_t b, int64_t h,
                           int64_t i0, size_t n, int64_t j0, size_t n_kv, size_t ld, float *bias);

/* Causal (row i sees keys j <= i): the bias of rows [i0, i0 + n) x keys
 * [j0, j0 + n_kv), 0 or -INFINITY, at bias[r * ld + j]. */
void fxa_causal_bias(int64_t i0, size_t n, int64_t j0, size_t n_kv, size_t ld, float *bias);

#endif
