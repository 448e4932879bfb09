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
};

#endif
