/* The context behind the opaque fxa_ctx handle. */
#ifndef FXA_CTX_INTERNAL_H
#define FXA_CTX_INTERNAL_H

#include "internal_api.h"

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

/* Start a call on the context: wait until no other thread is inside one
 * (one call at a time per context; the same thread may nest), rebuild the
 * pool in a forked child, and forget the last error. Every public function
 * that uses the context brackets its work with fxa_ctx_begin / fxa_ctx_end. */
FXA_INTERNAL void fxa_ctx_begin(fxa_ctx *ctx);
FXA_INTERNAL void fxa_ctx_end(fxa_ctx *ctx);

/* Record a printf-style message for fxa_ctx_last_error and return st. */
FXA_INTERNAL fxa_status fxa_ctx_fail(fxa_ctx *ctx, fxa_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Forget the last error (called at the start of each fallible call). */
FXA_INTERNAL void fxa_ctx_clear_error(fxa_ctx *ctx);

#endif
