/* Fixtures of the unit tests that plan and run: workspaces, the forward's arguments, and
 * contexts made under an environment variable (a kernel set, a GEMM). */
#ifndef FXA_UNIT_FIXTURES_H
#define FXA_UNIT_FIXTURES_H

#include <stdlib.h>

#include "testutil.h"

/* A 64-byte aligned workspace of at least bytes (whole lines and one spare, so never a
 * zero-size request); release it with free(). */
static inline void *unit_ws_alloc(size_t bytes)
{
    return aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
}

/* The forward's arguments (struct_size set; every other field 0), the counterpart of
 * fxt_bwd_args. */
static inline fxa_attn_args unit_attn_args(const void *q, const void *k, const void *v, void *out,
                                           float *lse)
{
    fxa_attn_args a = {.struct_size = sizeof a, .q = q, .k = k, .v = v};
    a.out = out;
    a.lse = lse;
    return a;
}

/* fxt_ctx(n_threads) made while the environment variable name holds value (value NULL: name
 * unset), which the context reads when it is made; name is unset again on return. name NULL:
 * the environment as it is. */
static inline fxa_ctx *unit_ctx_with_env(const char *name, const char *value, int n_threads)
{
    if (!name)
        return fxt_ctx(n_threads);
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    fxa_ctx *ctx = fxt_ctx(n_threads);
    unsetenv(name);
    return ctx;
}

#endif
