/* Context: thread pool, kernel table and the last error message. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../base/alloc.h"
#include "ctx_internal.h"
#include "../kernels/dispatch.h"
#include "../base/struct_size.h"

void fxa_ctx_params_init(fxa_ctx_params *p)
{
    if (!p)
        return;
    p->struct_size = sizeof *p;
    p->n_threads = 0;
}

/* dst = the environment variable name, truncated to cap - 1 bytes ("" when
 * unset): the context reads the environment once, at its creation. */
static void copy_env(char *dst, size_t cap, const char *name)
{
    const char *v = getenv(name);
    snprintf(dst, cap, "%s", v ? v : "");
}

/* Why the last fxa_ctx_create on this thread failed (no context to hold it). */
static _Thread_local char g_create_error[256];

const char *fxa_ctx_create_error(void)
{
    return g_create_error;
}

/* FXA_AUTO_COMPUTE: "fp32" or "bf16" pin the automatic compute of bf16
 * inputs; unset or "" measure it. Anything else is refused. */
static fxa_status read_auto_compute(fxa_compute *out)
{
    const char *v = getenv("FXA_AUTO_COMPUTE");
    *out = FXA_COMPUTE_AUTO;
    if (!v || !*v)
        return FXA_OK;
    if (strcmp(v, "fp32") == 0) {
        *out = FXA_COMPUTE_FP32;
        return FXA_OK;
    }
    if (strcmp(v, "bf16") == 0) {
        *out = FXA_COMPUTE_BF16;
        return FXA_OK;
    }
    snprintf(g_create_error, sizeof g_create_error,
             "FXA_AUTO_COMPUTE=%.64s: choose fp32 or bf16 (unset: measured)", v);
    return FXA_ERR_INVALID_ARG;
}

fxa_status fxa_ctx_create(const fxa_ctx_params *p, fxa_ctx **ctx_out)
{
    fxa_ctx_params defaults;
    fxa_status st;
    const struct fxa_kernels *kernels = NULL;
    g_create_error[0] = '\0';
    if (!ctx_out) {
        snprintf(g_create_error, sizeof g_create_error, "ctx_out is NULL");
        return FXA_ERR_INVALID_ARG;
    }
    *ctx_out = NULL;
    fxa_ctx_params_init(&defaults);
    if (p) {
        st = fxa_struct_in(&defaults, sizeof defaults, p, FXA_CTX_PARAMS_SIZE_0_1, "fxa_ctx_params",
                           g_create_error, sizeof g_create_error);
        if (st != FXA_OK)
            return st;
    }
    p = &defaults;
    if (p->n_threads < 0 || p->n_threads > 1024) {
        snprintf(g_create_error, sizeof g_create_error,
                 "n_threads %d is outside 0..1024 (0 = the CPUs this process may use)",
                 p->n_threads);
        return FXA_ERR_INVALID_ARG;
    }
    st = fxa_kernels_select(getenv("FXA_ISA"), &kernels, g_create_error, sizeof g_create_error);
    if (st != FXA_OK)
        return st;
    fxa_compute auto_compute;
    if ((st = read_auto_compute(&auto_compute)) != FXA_OK)
        return st;
    fxa_ctx *ctx = fxa_calloc_aligned(sizeof *ctx);
    if (!ctx) {
        snprintf(g_create_error, sizeof g_create_error, "out of memory for the context");
        return FXA_ERR_NO_MEMORY;
    }
    ctx->kernels = kernels;
    ctx->auto_compute = auto_compute;
    copy_env(ctx->proj_gemm, sizeof ctx->proj_gemm, "FXA_PROJ_GEMM");
    const int threads = p->n_threads == 0 ? fxa_available_cpus() : p->n_threads;
    st = fxa_pool_init(&ctx->pool, threads);
    if (st != FXA_OK) {
        snprintf(g_create_error, sizeof g_create_error,
                 "could not start the context's %d threads (%s)", threads, fxa_status_str(st));
        goto out_free_ctx;
    }
    if (getenv("FXA_VERBOSE"))
        fprintf(stderr, "fxattn: kernels %s: %s; %d threads\n", fxa_kernels_isa(kernels),
                fxa_kernels_info(kernels), ctx->pool.n_threads);
    *ctx_out = ctx;
    return FXA_OK;
out_free_ctx:
    fxa_free_aligned(ctx);
    return st;
}

void fxa_ctx_destroy(fxa_ctx *ctx)
{
    if (!ctx)
        return;
    fxa_pool_destroy(&ctx->pool);
    fxa_free_aligned(ctx);
}

int fxa_ctx_threads(const fxa_ctx *ctx)
{
    return ctx ? ctx->pool.n_threads : 0;
}

const char *fxa_ctx_isa(const fxa_ctx *ctx)
{
    return ctx ? fxa_kernels_isa(ctx->kernels) : "";
}

const char *fxa_ctx_kernel_info(const fxa_ctx *ctx)
{
    return ctx ? fxa_kernels_info(ctx->kernels) : "";
}

/* The calling thread's copy of a context's last error. */
static _Thread_local char g_last_error[sizeof((fxa_ctx *)0)->last_error];

const char *fxa_ctx_last_error(const fxa_ctx *ctx)
{
    if (!ctx)
        return "";
    fxa_ctx *c = (fxa_ctx *)ctx; /* its lock; the message is only read */
    fxa_pool_enter(&c->pool);
    memcpy(g_last_error, c->last_error, sizeof g_last_error);
    fxa_pool_leave(&c->pool);
    return g_last_error;
}

void fxa_ctx_begin(fxa_ctx *ctx)
{
    fxa_pool_enter(&ctx->pool);
    ctx->last_error[0] = '\0';
}

void fxa_ctx_end(fxa_ctx *ctx)
{
    fxa_pool_leave(&ctx->pool);
}

fxa_status fxa_ctx_enter(fxa_ctx *ctx)
{
    if (!ctx)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(ctx);
    return FXA_OK;
}

fxa_status fxa_ctx_end_with(fxa_ctx *ctx, fxa_status st)
{
    fxa_ctx_end(ctx);
    return st;
}

fxa_status fxa_ctx_fail(fxa_ctx *ctx, fxa_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->last_error, sizeof ctx->last_error, fmt, ap);
    va_end(ap);
    return st;
}

void fxa_ctx_clear_error(fxa_ctx *ctx)
{
    ctx->last_error[0] = '\0';
}

fxa_pool *fxa_ctx_pool(fxa_ctx *ctx)
{
    return &ctx->pool;
}

const char *fxa_ctx_proj_gemm(const fxa_ctx *ctx)
{
    return ctx->proj_gemm;
}

void fxa_ctx_pack_kt(const fxa_ctx *ctx, const void *const *rows, size_t n, size_t d, size_t panel,
                     void *kt)
{
    fxa_kernels_pack_kt(ctx->kernels, rows, n, d, panel, kt);
}
