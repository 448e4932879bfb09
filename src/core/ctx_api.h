/*
 * The context as fxattn's other libraries use it (declared internal API,
 * FXA_INTERNAL: exported from libfxattn.so, not public): call brackets and
 * errors, the thread pool, the GEMM choice read at creation, and the kernel
 * set's K^T packing. The struct itself stays private (ctx_internal.h).
 */
#ifndef FXA_CTX_API_H
#define FXA_CTX_API_H

#include "../base/internal_api.h"

#include <stddef.h>

#include "fxattn.h"
#include "pool.h"

/* Start a call on the context: wait until no other thread is inside one
 * (one call at a time per context; the same thread may nest), rebuild the
 * pool in a forked child, and forget the last error. Every public function
 * that uses the context brackets its work with fxa_ctx_begin / fxa_ctx_end. */
FXA_INTERNAL void fxa_ctx_begin(fxa_ctx *ctx);
FXA_INTERNAL void fxa_ctx_end(fxa_ctx *ctx);

/* Start a call on ctx (fxa_ctx_begin) and return FXA_OK; for a NULL ctx
 * start nothing and return FXA_ERR_INVALID_ARG. */
FXA_INTERNAL fxa_status fxa_ctx_enter(fxa_ctx *ctx);

/* End a call (fxa_ctx_end) and return its status st, so that a public
 * function reads `fxa_ctx_begin(ctx); return fxa_ctx_end_with(ctx, work(...));`. */
FXA_INTERNAL fxa_status fxa_ctx_end_with(fxa_ctx *ctx, fxa_status st);

/* Record a printf-style message for fxa_ctx_last_error and return st. */
FXA_INTERNAL fxa_status fxa_ctx_fail(fxa_ctx *ctx, fxa_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Forget the last error (called at the start of each fallible call). */
FXA_INTERNAL void fxa_ctx_clear_error(fxa_ctx *ctx);

/* The context's thread pool (fxa_pool_run; its n_threads is
 * fxa_ctx_threads). */
FXA_INTERNAL fxa_pool *fxa_ctx_pool(fxa_ctx *ctx);

/* FXA_PROJ_GEMM as it was at fxa_ctx_create ("" when unset). */
FXA_INTERNAL const char *fxa_ctx_proj_gemm(const fxa_ctx *ctx);

/* The context's kernel set's K^T packing (the fxa_pack_kt_fn contract of
 * kernels/kernels.h): word c of rows[j] to panel j / panel ... for n rows
 * of d 32-bit words. */
FXA_INTERNAL void fxa_ctx_pack_kt(const fxa_ctx *ctx, const void *const *rows, size_t n, size_t d,
                                  size_t panel, void *kt);

#endif
