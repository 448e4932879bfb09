/* The QKV projection's checks: the descriptor's (plan) and the arguments' (run). */
#include <float.h>
#include <math.h>

#include "../base/alloc.h"
#include "../base/spans.h"
#include "../core/ctx_api.h"
#include "proj_internal.h"

void fxa_proj_desc_init(fxa_proj_desc *d)
{
    *d = (fxa_proj_desc){0};
    d->struct_size = sizeof *d;
    d->x_format = FXA_PROJ_X_F32;
    d->w_format = FXA_PROJ_W_F32;
    d->eps = 1e-6;
    d->out_layout = FXA_PROJ_TOKEN_MAJOR;
    d->out_dtype = FXA_F32;
}

int64_t fxa_proj_out_features(const fxa_proj_desc *d)
{
    return (d->heads_q + 2 * d->heads_kv) * d->head_dim;
}

/* Positive sizes, an even head_dim within FXA_MAX_HEAD_DIM. */
static int shape_ok(const fxa_proj_desc *d)
{
    return d->tokens >= 1 && d->in_features >= 1 && d->heads_q >= 1 && d->heads_kv >= 0 &&
           d->head_dim >= 2 && d->head_dim % 2 == 0 && d->head_dim <= FXA_MAX_HEAD_DIM;
}

/* For a shape_ok d: every buffer is addressable and every GEMM dimension
 * fits the libraries' int. */
static int sizes_fit(const fxa_proj_desc *d)
{
    if (d->heads_q > INT32_MAX || d->heads_kv > INT32_MAX) /* out_features fits int64 */
        return 0;
    const double elems = (double)d->tokens * (double)(fxa_proj_out_features(d) > d->in_features
                                                          ? fxa_proj_out_features(d)
                                                          : d->in_features);
    return elems * 4.0 <= (double)PTRDIFF_MAX / 2 &&
           (double)fxa_proj_out_features(d) * (double)d->in_features * 4.0 <=
               (double)PTRDIFF_MAX / 2 &&
           d->in_features <= INT32_MAX && fxa_proj_out_features(d) <= INT32_MAX &&
           d->tokens <= INT32_MAX;
}

/* Known formats, layout, output dtype and 0/1 flags. */
static int flags_ok(const fxa_proj_desc *d)
{
    return (unsigned)d->x_format <= FXA_PROJ_X_E4M3_ROWS &&
           (unsigned)d->w_format <= FXA_PROJ_W_E4M3 &&
           (unsigned)d->out_layout <= FXA_PROJ_HEAD_MAJOR &&
           (d->out_dtype == FXA_F32 || d->out_dtype == FXA_BF16) &&
           (d->norm == 0 || d->norm == 1) && (d->rope == 0 || d->rope == 1);
}

/* Outputs that share a byte with each other or with the workspace. Inputs
 * may alias the outputs: every input is read before any output is stored. */
static fxa_status check_output_spans(fxa_ctx *ctx, const fxa_proj_desc *d, const fxa_proj_args *a,
                                     const void *ws, size_t ws_bytes)
{
    const size_t elem = d->out_dtype == FXA_F32 ? sizeof(float) : sizeof(uint16_t);
    const size_t q_bytes = (size_t)(d->tokens * d->heads_q * d->head_dim) * elem;
    const size_t kv_bytes = (size_t)(d->tokens * d->heads_kv * d->head_dim) * elem;
    const fxa_span span[4] = {{"q_out", a->q_out, q_bytes},
                              {"k_out", a->k_out, kv_bytes},
                              {"v_out", a->v_out, kv_bytes},
                              {"workspace", ws, ws_bytes}};
    const fxa_span *x, *y;
    if (fxa_spans_clash(span, 4, NULL, 0, &x, &y))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s and %s overlap", x->name, y->name);
    return FXA_OK;
}

/* The plan's checks of d (already copied in). */
fxa_status fxa_proj_check_desc(fxa_ctx *ctx, const fxa_proj_desc *d)
{
    if (!shape_ok(d))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "projection shape: tokens %lld, in_features %lld, heads %lld/%lld, "
                            "head_dim %lld (even, 2..%d)",
                            (long long)d->tokens, (long long)d->in_features, (long long)d->heads_q,
                            (long long)d->heads_kv, (long long)d->head_dim, FXA_MAX_HEAD_DIM);
    if (!sizes_fit(d))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "projection sizes overflow");
    if (!flags_ok(d))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "unknown projection format, layout, output dtype or flag");
    if (d->norm && !(d->eps >= FLT_TRUE_MIN && d->eps <= FLT_MAX))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "RMSNorm eps %g is outside fp32's positive range (%g..%g)", d->eps,
                            (double)FLT_TRUE_MIN, (double)FLT_MAX);
    return FXA_OK;
}

/* The run's checks of a (copied in) and the workspace. */
fxa_status fxa_proj_check_args(const fxa_proj_plan *p, const fxa_proj_args *a, const void *ws)
{
    fxa_ctx *ctx = p->ctx;
    const fxa_proj_desc *d = &p->d;
    if (!ws)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "the projection needs its workspace (%zu bytes, the plan's)",
                            p->l.total);
    if (((uintptr_t)ws % FXA_ALIGN) != 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "workspace must be 64-byte aligned");
    if (!a->x || !a->w || !a->q_out || (d->heads_kv > 0 && (!a->k_out || !a->v_out)))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "x, w and the outputs must not be NULL");
    if (d->w_format == FXA_PROJ_W_E4M3 && !a->w_scales)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "FP8 weights need w_scales");
    if (d->norm && (!a->gamma_q || (d->heads_kv > 0 && !a->gamma_k)))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "RMSNorm needs gamma_q (and gamma_k)");
    if (d->rope && (!a->rope_cos || !a->rope_sin))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "RoPE needs rope_cos and rope_sin");
    if (check_output_spans(ctx, d, a, ws, p->l.total) != FXA_OK)
        return FXA_ERR_INVALID_ARG;
    const int64_t qn = d->heads_q * d->head_dim;
    const int64_t kn = d->heads_kv * d->head_dim;
    const int64_t rope_n = d->tokens * d->head_dim;
    const struct {
        const float *p;
        int64_t n;
        const char *name;
    } vec[] = {{a->bias, fxa_proj_out_features(d), "bias"},
               {d->norm ? a->gamma_q : NULL, qn, "gamma_q"},
               {d->norm ? a->gamma_k : NULL, kn, "gamma_k"},
               {d->rope ? a->rope_cos : NULL, rope_n, "rope_cos"},
               {d->rope ? a->rope_sin : NULL, rope_n, "rope_sin"}};
    for (size_t v = 0; v < sizeof vec / sizeof vec[0]; v++)
        for (int64_t i = 0; vec[v].p && i < vec[v].n; i++)
            if (!isfinite(vec[v].p[i]))
                return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s[%lld] is not finite", vec[v].name,
                                    (long long)i);
    return FXA_OK;
}
