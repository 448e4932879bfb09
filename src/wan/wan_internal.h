/* Pieces of the single-process layer (wan_layer.c) that its MPI form
 * (wan_mpi.c, in libfxattn_wan_mpi: hence FXA_INTERNAL) shares: the
 * descriptor checks, activation sizes by the layer's dtype, x rounded to
 * bf16 for a bf16 layer fed fp32 x, and the projections' descriptors and
 * plans. */
#ifndef FXA_WAN_INTERNAL_H
#define FXA_WAN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal_api.h"
#include "fxattn_wan.h"

/* First sizes of the versioned structs (base/struct_size.h's policy).
 * 0.1: fxa_wan_desc and fxa_wan_load_params before dtype; fxa_wan_stats
 * and fxa_wan_grid as they are. */
#define FXA_WAN_DESC_SIZE_0_1 offsetof(fxa_wan_desc, dtype)
#define FXA_WAN_LOAD_PARAMS_SIZE_0_1 offsetof(fxa_wan_load_params, dtype)
#define FXA_WAN_STATS_SIZE_0_1 offsetof(fxa_wan_stats, compute)
#define FXA_WAN_GRID_SIZE_0_1 sizeof(fxa_wan_grid)
#define FXA_WAN_ARGS_SIZE_0_3 sizeof(fxa_wan_args)

/* The descriptor checks of fxa_wan_plan_create (struct_size, grid, heads,
 * head_dim, x_format, dtype), with d copied into *full (the current size,
 * defaults past the caller's struct_size). */
FXA_INTERNAL fxa_status fxa_wan_check_desc(const fxa_wan_desc *d, fxa_wan_desc *full, char *err,
                                           size_t errlen);

/* Bytes (a multiple of 64) of one activation [tokens][heads][head_dim] of
 * d->dtype. */
FXA_INTERNAL size_t fxa_wan_act_bytes(const fxa_wan_desc *d, int64_t tokens, int64_t heads);

/* Bytes (a multiple of 64) of x's bf16 copy of `tokens` tokens and the
 * rounding's per-item results after it: 0 unless d->dtype is FXA_BF16 and
 * d->x_format FXA_PROJ_X_F32. */
FXA_INTERNAL size_t fxa_wan_x16_bytes(const fxa_wan_desc *d, int64_t tokens);

/* buf (fxa_wan_x16_bytes, starting with x16) = x [tokens][hidden] rounded
 * to bf16 (nearest even), on ctx's pool. FXA_ERR_INVALID_ARG naming the
 * first value whose bf16 is not finite (a non-finite x, or one beyond
 * bf16's range). Allocates nothing. */
FXA_INTERNAL fxa_status fxa_wan_round_x(fxa_ctx *ctx, const fxa_wan_desc *d, const float *x,
                                        int64_t tokens, void *buf, char *err, size_t errlen);

/* The fused QKV projection of `tokens` tokens onto `heads` heads with
 * weights of `format` (x in d->x_format, or bf16 bits for a bf16 layer fed
 * fp32 x); its arguments from the weights w and the token's RoPE rows. */
FXA_INTERNAL void fxa_wan_qkv_desc(const fxa_wan_desc *d, fxa_proj_w format, int64_t heads,
                                   int64_t tokens, fxa_proj_desc *pd);
FXA_INTERNAL void fxa_wan_qkv_args(const fxa_wan_weights *w, const void *x, const float *cs,
                                   const float *sn, void *q, void *k, void *v, fxa_proj_args *pa);

/* The output projection of `tokens` tokens of `heads` heads' attention
 * output (d->dtype) onto the hidden channels, weights of `format`. */
FXA_INTERNAL void fxa_wan_out_desc(const fxa_wan_desc *d, fxa_proj_w format, int64_t heads,
                                   int64_t tokens, fxa_proj_desc *pd);

/* Run out (an fxa_wan_out_desc plan) on o's weights: y = a o.w^T (+ bias);
 * stats as fxa_proj_run_stats'. */
FXA_INTERNAL fxa_status fxa_wan_out_run(fxa_proj_plan *out, const fxa_wan_linear *o, const void *a,
                                        float *y, void *workspace, fxa_proj_stats *stats);

#define FXA_WAN_FORMATS 3 /* FXA_PROJ_W_F32, _BF16, _E4M3: a plan for each */

#endif
