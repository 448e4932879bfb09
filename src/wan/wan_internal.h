/* Pieces of the single-process layer (wan_layer.c) that its MPI form
 * (wan_mpi.c, in libfxattn_wan_mpi: hence FXA_INTERNAL) shares: the
 * descriptor checks, activation sizes by the layer's dtype, and x rounded
 * to bf16 for a bf16 layer fed fp32 x. */
#ifndef FXA_WAN_INTERNAL_H
#define FXA_WAN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "core/internal_api.h"
#include "fxattn_wan.h"

/* The descriptor checks of fxa_wan_plan_create (struct_size, grid, heads,
 * head_dim, x_format, dtype). */
FXA_INTERNAL fxa_status fxa_wan_check_desc(const fxa_wan_desc *d, char *err, size_t errlen);

/* Bytes (a multiple of 64) of one activation [tokens][heads][head_dim] of
 * d->dtype. */
FXA_INTERNAL size_t fxa_wan_act_bytes(const fxa_wan_desc *d, int64_t tokens, int64_t heads);

/* Bytes (a multiple of 64) of x's bf16 copy of `tokens` tokens: 0 unless
 * d->dtype is FXA_BF16 and d->x_format FXA_PROJ_X_F32. */
FXA_INTERNAL size_t fxa_wan_x16_bytes(const fxa_wan_desc *d, int64_t tokens);

/* x16 = x [tokens][hidden] rounded to bf16 (nearest even), on ctx's pool.
 * FXA_ERR_INVALID_ARG naming the first value whose bf16 is not finite (a
 * non-finite x, or one beyond bf16's range). */
FXA_INTERNAL fxa_status fxa_wan_round_x(fxa_ctx *ctx, const fxa_wan_desc *d, const float *x,
                                        int64_t tokens, uint16_t *x16, char *err, size_t errlen);

#endif
