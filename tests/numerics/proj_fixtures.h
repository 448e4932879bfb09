/*
 * The plain fused projection that test_proj_fork and test_proj_threads run
 * from several contexts: q, k and v of x [tokens][in] times
 * w [3 * heads * dim][in]^T, without bias, norm or RoPE.
 */
#ifndef FXT_PROJ_FIXTURES_H
#define FXT_PROJ_FIXTURES_H

#include <stdlib.h>

#include "fxattn_proj.h"
#include "testutil.h"

typedef struct qkv_shape {
    int64_t tokens, in, heads, dim;
} qkv_shape;

/* x [tokens][in] uniform in [-1, 1) and w [3 * heads * dim][in] uniform in
 * [-0.1, 0.1), drawn in that order from seed (both malloc'd). */
static inline void qkv_operands(const qkv_shape *s, uint64_t seed, float **x, float **w)
{
    const size_t nx = (size_t)(s->tokens * s->in), nw = (size_t)(3 * s->heads * s->dim * s->in);
    fxt_rng rng;
    fxt_rng_seed(&rng, seed);
    *x = malloc(nx * sizeof **x);
    *w = malloc(nw * sizeof **w);
    for (size_t i = 0; i < nx; i++)
        (*x)[i] = (float)(2.0 * fxt_rng_uniform(&rng) - 1.0);
    for (size_t i = 0; i < nw; i++)
        (*w)[i] = (float)(0.2 * fxt_rng_uniform(&rng) - 0.1);
}

/* The projection of x by w (bf16 operands when bf16, else fp32) on ctx into
 * out [3][tokens][heads * dim] (q, k, v); the status. */
static inline fxa_status qkv_project(fxa_ctx *ctx, const qkv_shape *s, int bf16, const void *x,
                                     const void *w, float *out)
{
    fxa_proj_desc d;
    fxa_proj_desc_init(&d);
    d.tokens = s->tokens;
    d.in_features = s->in;
    d.heads_q = d.heads_kv = s->heads;
    d.head_dim = s->dim;
    d.x_format = bf16 ? FXA_PROJ_X_BF16 : FXA_PROJ_X_F32;
    d.w_format = bf16 ? FXA_PROJ_W_BF16 : FXA_PROJ_W_F32;
    const size_t n = (size_t)(s->tokens * s->heads * s->dim);
    const fxa_proj_args a = {.struct_size = sizeof a,
                             .x = x,
                             .w = w,
                             .q_out = out,
                             .k_out = out + n,
                             .v_out = out + 2 * n};
    return fxt_proj_once(ctx, &d, &a);
}

#endif
