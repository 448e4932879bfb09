/* The context behind the opaque fxa_ctx handle. */
#ifndef FXA_CTX_INTERNAL_H
#define FXA_CTX_INTERNAL_H

#include "ctx_api.h"

#include "fxattn.h"
#include "pool.h"

struct fxa_kernels; /* a kernel set (kernels/kernels.h), chosen by kernels/dispatch.h */

struct fxa_ctx {
    fxa_pool pool;
    const struct fxa_kernels *kernels;
    /* FXA_PROJ_GEMM as it was at fxa_ctx_create ("" when unset): the fp32
     * GEMM library of libfxattn_proj's projections on this context. */
    char proj_gemm[64];
    char last_error[512];
    /* FXA_AUTO_COMPUTE as it was at fxa_ctx_create: FXA_COMPUTE_FP32 or
     * FXA_COMPUTE_BF16 where it pins what FXA_COMPUTE_AUTO runs for bf16
     * inputs, FXA_COMPUTE_AUTO (unset) to measure. */
    fxa_compute auto_compute;
    /* The choices of FXA_COMPUTE_AUTO for bf16 inputs made so far, one per
     * head dim (attn/compute_choice.c measures and fills them). */
    struct fxa_compute_memo {
        int64_t head_dim;
        fxa_compute_choice choice;
    } compute_memo[8];
    int n_compute_memo;
};

#endif
