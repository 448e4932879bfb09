/*
 * The QKV projection (fxattn_proj.h): Y = X W^T, then a threaded epilogue
 * per token: scales and bias, RMSNorm across the heads of the Q and of the
 * K segment, rotate-half RoPE with the inverse RMS folded into the cos/sin
 * products, and the store in the requested layout.
 * The GEMM is oneDNN's bf16 matmul when both operands are 16- or 8-bit
 * (every E4M3 value is a bf16 value), else an fp32 GEMM: OpenBLAS sgemm, or
 * oneDNN's fp32 matmul where OpenBLAS lacks AVX-512 kernels for an AVX-512
 * CPU (gemm_f32_on_onednn).
 * Operands in another format are decoded exactly (FP8 scales kept for the
 * epilogue); a weight is decoded one block of output channels at a time,
 * each block multiplied as soon as it is decoded, so the decoded copy is
 * one block and an FP8 weight never exists whole in 16 or 32 bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../base/clock.h"
#include "../base/struct_size.h"
#include "../core/ctx_api.h"
#include "proj_internal.h"

/* st; on success the stats of a run whose GEMM ran from t0 to t1 (and
 * its epilogue from t1 to now) into *stats (NULL: none). */
static fxa_status report(fxa_status st, fxa_proj_stats *full, double t0, double t1,
                         fxa_proj_stats *stats)
{
    if (st != FXA_OK || !stats)
        return st;
    const double t2 = fxa_now_seconds();
    full->compute = full->gemm == FXA_PROJ_GEMM_ONEDNN_BF16 || full->gemm == FXA_PROJ_GEMM_AMX
                        ? FXA_COMPUTE_BF16
                        : FXA_COMPUTE_FP32;
    full->seconds = t2 - t0;
    full->gemm_seconds = t1 - t0;
    full->epilogue_seconds = t2 - t1;
    fxa_struct_out(stats, full, sizeof *full);
    return st;
}

/* Local work up to the reduction; then (after the reduce of a tensor-
 * parallel plan) phases B and C. */
static fxa_status run(const fxa_proj_plan *p, const fxa_proj_args *args, unsigned char *ws,
                      fxa_proj_stats *stats)
{
    fxa_ctx *ctx = p->ctx;
    const fxa_proj_desc *d = &p->d;
    const proj_ws *l = &p->l;
    fxa_proj_args a = {0};
    char msg[200];
    fxa_status st = FXA_OK;
    if (!args)
        st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "projection args missing");
    else if (fxa_struct_in(&a, sizeof a, args, FXA_PROJ_ARGS_SIZE_0_3, "fxa_proj_args", msg,
                           sizeof msg) != FXA_OK)
        st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s", msg);
    if (st == FXA_OK && fxa_struct_out_check(stats, FXA_PROJ_STATS_SIZE_0_3, sizeof(fxa_proj_stats),
                                             "fxa_proj_stats", msg, sizeof msg) != FXA_OK)
        st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s", msg);
    if (st == FXA_OK)
        st = fxa_proj_check_args(p, &a, ws);
    fxa_proj_stats full = {.struct_size = sizeof full,
                           .flops = 2.0 * (double)d->tokens * (double)d->in_features *
                                    (double)fxa_proj_out_features(d)};
    const double t0 = fxa_now_seconds();
    const int64_t n_out = fxa_proj_out_features(d);
    float *x32 = l->x32 ? (float *)(ws + l->x32) : NULL;
    uint16_t *x16 = l->x16 ? (uint16_t *)(ws + l->x16) : NULL;
    float *xs = st == FXA_OK ? (float *)(ws + l->xs) : NULL;
    float *y = st == FXA_OK ? (float *)(ws + l->y) : NULL;
    double *sums = st == FXA_OK ? (double *)(ws + l->sums) : NULL;
    int64_t *bad = st == FXA_OK ? (int64_t *)(ws + l->bad) : NULL;
    const size_t s = (size_t)d->tokens;
    const void *xg = NULL; /* what the GEMM reads */
    if (st == FXA_OK)
        st = fxa_proj_stage_x(p, ws, a.x, x32, x16, xs, &xg, 0);
    for (int64_t i = 0; st == FXA_OK && d->w_format == FXA_PROJ_W_E4M3 && i < n_out; i++)
        if (!isfinite(a.w_scales[i]) || a.w_scales[i] < 0.0f)
            st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "w_scales[%lld] is %g", (long long)i,
                              (double)a.w_scales[i]);
    epi_job job = {d, &a, y, xs, sums, 0.0, 0.0, 16, bad};
    if (st == FXA_OK)
        st = fxa_proj_multiply(p, ws, xg, a.w, y, &full.gemm);
    const double t1 = fxa_now_seconds();
    job.n_q = (double)(p->has_tp ? p->tp.norm_features_q : d->heads_q * d->head_dim);
    job.n_k = (double)(p->has_tp ? p->tp.norm_features_k : d->heads_kv * d->head_dim);
    const int64_t n_items = (d->tokens + 15) / 16;
    /* Phase A for every token before any output is written: a failure
     * found there leaves the outputs untouched. */
    if (st == FXA_OK)
        st = fxa_proj_phase_a(p, ws, &job, n_items);
    if (!p->has_tp) {
        if (st == FXA_OK)
            st = fxa_proj_phase_bc(ctx, &job, n_items);
        return report(st, &full, t0, t1, stats);
    }
    /* Every rank reaches the reduction, failed or not, so none waits
     * forever; the last element counts the ranks that failed. */
    double fail_only[3] = {0.0, 0.0, 1.0};
    double *buf = st == FXA_OK ? sums : fail_only;
    const int64_t n_tok = st == FXA_OK ? d->tokens : 1;
    if (st == FXA_OK) {
        if (!d->norm)
            memset(sums, 0, 2 * s * sizeof(double));
        sums[2 * s] = 0.0;
    }
    const fxa_status rs = p->tp.reduce(buf, 2 * n_tok + 1, p->tp.arg);
    if (st == FXA_OK && rs != FXA_OK)
        st = fxa_ctx_fail(ctx, rs, "the tensor-parallel reduction failed");
    else if (st == FXA_OK && buf[2 * n_tok] != 0.0)
        st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "another tensor-parallel rank failed");
    if (st == FXA_OK)
        st = fxa_proj_phase_bc(ctx, &job, n_items);
    return report(st, &full, t0, t1, stats);
}

fxa_status fxa_proj_run_stats(const fxa_proj_plan *p, const fxa_proj_args *args, void *workspace,
                              fxa_proj_stats *stats)
{
    if (!p)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(p->ctx); /* one call at a time per context */
    return fxa_ctx_end_with(p->ctx, run(p, args, workspace, stats));
}

const char *fxa_proj_gemm_name(fxa_proj_gemm gemm)
{
    switch (gemm) {
    case FXA_PROJ_GEMM_OPENBLAS: return "openblas";
    case FXA_PROJ_GEMM_ONEDNN_F32: return "onednn_f32";
    case FXA_PROJ_GEMM_ONEDNN_BF16: return "onednn_bf16";
    case FXA_PROJ_GEMM_AMX: return "amx";
    }
    return "";
}

fxa_status fxa_proj_run(const fxa_proj_plan *p, const fxa_proj_args *args, void *workspace)
{
    return fxa_proj_run_stats(p, args, workspace, NULL);
}

static fxa_status plan_build(fxa_ctx *ctx, const fxa_proj_desc *d, const fxa_proj_tp *tp,
                             fxa_proj_plan **out, size_t *workspace_bytes)
{
    if (!d || !out || !workspace_bytes)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "fxa_proj_plan_create: NULL argument");
    *out = NULL;
    fxa_proj_desc full;
    fxa_proj_desc_init(&full);
    char msg[200];
    if (fxa_struct_in(&full, sizeof full, d, FXA_PROJ_DESC_SIZE_0_1, "fxa_proj_desc", msg,
                      sizeof msg) != FXA_OK)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s", msg);
    fxa_status st = fxa_proj_check_desc(ctx, &full);
    if (st != FXA_OK)
        return st;
    fxa_proj_tp tp_full = {.struct_size = sizeof tp_full};
    if (tp && fxa_struct_in(&tp_full, sizeof tp_full, tp, FXA_PROJ_TP_SIZE_0_1, "fxa_proj_tp", msg,
                            sizeof msg) != FXA_OK)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s", msg);
    if (tp && (!tp_full.reduce || tp_full.norm_features_q < 1 || tp_full.norm_features_k < 0))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "tensor-parallel settings missing or bad");
    fxa_proj_plan *p = calloc(1, sizeof *p);
    if (!p)
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory for the projection's plan");
    p->ctx = ctx;
    p->d = full;
    p->has_tp = tp != NULL;
    p->tp = tp_full;
    p->n_threads = fxa_ctx_threads(ctx);
    int bf16_gemm = 0;
    if ((st = fxa_proj_bf16_gemm_faster(ctx, p->d.head_dim, &bf16_gemm)) != FXA_OK) {
        fxa_proj_plan_destroy(p);
        return st;
    }
    fxa_proj_ws_layout(&p->d, p->n_threads, bf16_gemm, &p->l);
    if ((st = fxa_proj_plan_gemm(p)) != FXA_OK) {
        fxa_proj_plan_destroy(p);
        return st;
    }
    *workspace_bytes = p->l.total;
    *out = p;
    return FXA_OK;
}

fxa_status fxa_proj_plan_create(fxa_ctx *ctx, const fxa_proj_desc *d, fxa_proj_plan **plan,
                                size_t *workspace_bytes)
{
    const fxa_status st = fxa_ctx_enter(ctx);
    return st != FXA_OK ? st
                        : fxa_ctx_end_with(ctx, plan_build(ctx, d, NULL, plan, workspace_bytes));
}

fxa_status fxa_proj_plan_create_tp(fxa_ctx *ctx, const fxa_proj_desc *d, const fxa_proj_tp *tp,
                                   fxa_proj_plan **plan, size_t *workspace_bytes)
{
    if (!ctx)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(ctx);
    const fxa_status st =
        tp ? plan_build(ctx, d, tp, plan, workspace_bytes)
           : fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                          "fxa_proj_plan_create_tp: NULL tensor-parallel settings");
    fxa_ctx_end(ctx);
    return st;
}

void fxa_proj_plan_destroy(fxa_proj_plan *p)
{
    if (!p)
        return;
    fxa_gemm_onednn_destroy(p->g);
    free(p);
}
