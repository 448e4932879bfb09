/*
 * fp64 plans (dtype FXA_F64, FXA_COMPUTE_FP64): attention and its backward
 * in double on the portable fp64 kernels (fxa_attn_tile_f64,
 * fxa_attn_bwd_tile_f64), with the fixed-max bound and gates derived for
 * fp64 (docs/numerics.md "fp64 inputs"): natural-log scores
 *     z_ij = tau (q_i . k_j - c_i) + bias_ij,  c_i = q_i . kbar (centring),
 * the bound U_i = |tau| ||q_i|| max_j ||k_j - kbar|| (plus the rounding of
 * the dot products), the shift m_i = U_i + the row's largest finite bias.
 * A row runs fixed-max when 2 U_i <= FXA_F64_GATE nats (every row), or
 * U_i <= FXA_F64_GATE (centred rows without a mask, whose largest score is
 * at least their mean, 0): its largest term is then at least
 * exp(-FXA_F64_GATE - 1), and the terms that fall below fp64's normal range
 * (exp(-708)) are each under 2^-150 of it. Other rows run online softmax.
 */
#ifndef FXA_F64_H
#define FXA_F64_H

#include "attn_internal.h"
#include "mask.h"

#define FXA_F64_GATE 600.0

/* Keys per fp64 tile, forward and backward. */
#define FXA_F64_KV_TILE 64

/* Largest |tau| max ||q|| max ||k|| and Skv max |v| an fp64 plan takes:
 * scores, sums and outputs stay finite (FXA_ERR_UNSUPPORTED past them). */
#define FXA_F64_LIMIT 0x1p1000

/* The forward's workspace bytes for n_threads threads. */
size_t fxa_f64_workspace(const fxa_attn_plan *p, int n_threads);

/* fxa_attn_run on an fp64 plan, after run_common's checks of the
 * arguments, the mask and the spans. */
fxa_status fxa_f64_run(const fxa_attn_plan *p, const fxa_attn_args *a, unsigned char *ws,
                       fxa_attn_stats *stats);

/* The backward's workspace bytes. */
size_t fxa_f64_bwd_workspace(const fxa_attn_plan *p, int n_threads);

/* fxa_attn_bwd_run on an fp64 plan (workspace ws of ws_bytes), after the
 * checks of the arguments' struct, the stats struct, the NULL tensors and
 * the workspace. */
fxa_status fxa_f64_bwd_run(const fxa_attn_plan *p, const fxa_attn_bwd_args *a, unsigned char *ws,
                           size_t ws_bytes, fxa_attn_bwd_stats *stats);

/* FXA_ERR_INVALID_ARG naming the first non-finite element of the [B,
 * heads, seq, D] tensor x (strides s) as "<name> has a non-finite value
 * (v) at batch b, token t, head h, dim c" (lowest batch, head, token, dim). */
fxa_status fxa_f64_check_finite(const fxa_attn_plan *p, const char *name, const double *x,
                                const fxa_strides *s, int64_t heads, int64_t seq);

/* Natural-log bias of rows [i0, i0 + n) x keys [j0, j0 + n_kv) of head (b,
 * h) (0 or -INFINITY for causal and boolean masks, an additive mask's
 * value) at bias[r ld + j]; the caller uses it only when the result is
 * FXA_TILE_BIAS. */
fxa_tile_use fxa_f64_tile_bias(const fxa_attn_plan *p, const void *mask, int64_t b, int64_t h,
                               int64_t i0, size_t n, int64_t j0, size_t n_kv, size_t ld,
                               double *bias);

/* Keys [0, end) that rows [i0, i0 + n) can attend (causal: up to the last
 * row's diagonal; all keys otherwise). */
int64_t fxa_f64_keys_end(const fxa_attn_plan *p, int64_t i0, size_t n);

/* Rows [i0, i0 + n) of query head h (batch b) through tile t (its rows,
 * state and scratch set; ld_bias FXA_F64_KV_TILE) over every key they
 * attend, FXA_F64_KV_TILE keys at a time in order, with the mask's or
 * causal bias (in bias, [n][FXA_F64_KV_TILE]); tiles every row masks are
 * skipped. */
void fxa_f64_rows_over_keys(const fxa_attn_plan *p, const void *k, const void *v, const void *mask,
                            int64_t b, int64_t h, int64_t i0, size_t n, fxa_attn_tile_f64 *t,
                            double *bias);

/* Where row (b, h, s) of a tensor with strides st starts. */
static inline int64_t fxa_f64_row(const fxa_strides *st, int64_t b, int64_t h, int64_t s)
{
    return b * st->batch + h * st->head + s * st->token;
}

#endif
