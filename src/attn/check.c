/*
 * The check report (fxattn_diag.h): a plan of two bound passes (centring
 * on and off) and a workspace laid out for the fp64 statistics, then runs
 * in named steps: check the arguments, run the bound passes, the key
 * statistics per (batch, kv head), the report per query head, and the copy
 * out. A run allocates nothing.
 */
#include <string.h>

#include "fxattn_diag.h"
#include "../base/alloc.h"
#include "../base/struct_size.h"
#include "check_internal.h"
#include "steps.h"

void fxa_check_desc_init(fxa_check_desc *d)
{
    if (!d)
        return;
    memset(d, 0, sizeof *d);
    d->struct_size = sizeof *d;
    d->has_v = 1;
}

/* a * b, or SIZE_MAX when that overflows size_t. */
static size_t mul_sat(size_t a, size_t b)
{
    return b && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

/* Reserve `bytes` (64-byte aligned) at *off; returns where they start, or
 * SIZE_MAX once the layout has overflowed. */
static size_t take(size_t *off, size_t bytes)
{
    const size_t at = *off;
    if (at == SIZE_MAX || bytes > SIZE_MAX - FXA_ALIGN || fxa_align_up(bytes) > SIZE_MAX - at) {
        *off = SIZE_MAX;
        return SIZE_MAX;
    }
    *off = at + fxa_align_up(bytes);
    return at;
}

/* The workspace layout of plan (attn_bytes: the bound passes' workspace);
 * plan->ws_total is SIZE_MAX when it overflows size_t. */
static void layout_workspace(fxa_check_plan *plan, size_t attn_bytes)
{
    const fxa_attn_desc *d = &plan->centred->d;
    const size_t rows = (size_t)(d->batch * d->heads_q * d->seq_q);
    const size_t n_kv = (size_t)(d->batch * d->heads_kv);
    const size_t dim = (size_t)d->head_dim;
    const size_t threads = (size_t)plan->ctx->pool.n_threads;
    size_t off = 0;
    plan->scratch_len = fxa_check_scratch_len(d, plan->samples);
    plan->ws_attn = take(&off, attn_bytes);
    plan->ws_zero_v = take(&off, plan->has_v ? 0 : ((size_t)d->batch + dim) * sizeof(float));
    plan->ws_bound_c = take(&off, mul_sat(rows, sizeof(float)));
    plan->ws_bound_r = take(&off, mul_sat(rows, sizeof(float)));
    plan->ws_fb_c = take(&off, rows);
    plan->ws_fb_r = take(&off, rows);
    plan->ws_kbar = take(&off, mul_sat(n_kv, dim * sizeof(double)));
    plan->ws_keys = take(&off, mul_sat(n_kv, sizeof(fxa_check_keys)));
    plan->ws_scratch = take(&off, mul_sat(mul_sat(plan->scratch_len, threads), sizeof(double)));
    plan->ws_rows = take(&off, mul_sat(threads, 2 * dim * sizeof(float)));
    plan->ws_heads = take(&off, mul_sat((size_t)d->heads_q, sizeof(fxa_check_head)));
    plan->ws_total = off;
}

/* The two bound-pass plans of attn (auto mode, centring on and off);
 * without V, first a plan of the caller's descriptor (which checks its V
 * strides), then V strides that read one zero row per batch. */
static fxa_status plan_passes(fxa_check_plan *plan, const fxa_attn_desc *attn, size_t *attn_bytes)
{
    fxa_attn_desc full;
    fxa_status st = fxa_attn_desc_in(plan->ctx, attn, &full);
    if (st != FXA_OK)
        return st;
    if (full.causal || full.mask_kind != FXA_MASK_NONE)
        return fxa_ctx_fail(plan->ctx, FXA_ERR_UNSUPPORTED,
                            "the check report takes no attention mask and no causal");
    if (full.dropout_p != 0.0)
        return fxa_ctx_fail(plan->ctx, FXA_ERR_UNSUPPORTED, "the check report takes no dropout");
    if (full.dtype == FXA_F64)
        return fxa_ctx_fail(plan->ctx, FXA_ERR_UNSUPPORTED,
                            "the check report is for fp32 and bf16 plans, not fp64");
    full.mode = FXA_MODE_AUTO;
    full.center = 1;
    size_t ws_c = 0, ws_r = 0;
    if ((st = fxa_attn_plan_create(plan->ctx, &full, &plan->centred, &ws_c)) != FXA_OK)
        return st;
    if (!plan->has_v) {
        fxa_attn_plan_destroy(plan->centred);
        plan->centred = NULL;
        full.v_strides = (fxa_attn_strides){.batch = 1, .token = 0, .head = 0};
        if ((st = fxa_attn_plan_create(plan->ctx, &full, &plan->centred, &ws_c)) != FXA_OK)
            return st;
    }
    full.center = 0;
    if ((st = fxa_attn_plan_create(plan->ctx, &full, &plan->raw, &ws_r)) != FXA_OK)
        return st;
    *attn_bytes = ws_c > ws_r ? ws_c : ws_r;
    return FXA_OK;
}

static fxa_status plan_create(fxa_ctx *ctx, const fxa_check_desc *d, fxa_check_plan **plan_out,
                              size_t *workspace_bytes_out)
{
    if (!d || !plan_out || !workspace_bytes_out)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "NULL argument to fxa_check_plan_create");
    fxa_check_desc full;
    fxa_check_desc_init(&full);
    fxa_status st = fxa_struct_in(&full, sizeof full, d, FXA_CHECK_DESC_SIZE_0_3, "fxa_check_desc",
                                  ctx->last_error, sizeof ctx->last_error);
    if (st != FXA_OK)
        return st;
    if (!full.attn)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "fxa_check_desc.attn is NULL: it must point to the tensors' "
                            "fxa_attn_desc");
    if (full.sample_rows < 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "sample_rows is %d: it must be >= 0 (0 means %d)", full.sample_rows,
                            FXA_CHECK_SAMPLE_ROWS);
    if (full.has_v != 0 && full.has_v != 1)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "has_v must be 0 or 1, not %d", full.has_v);
    fxa_check_plan *plan = fxa_calloc_aligned(sizeof *plan);
    if (!plan)
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory for the check plan");
    plan->ctx = ctx;
    plan->has_v = full.has_v;
    size_t attn_bytes = 0;
    if ((st = plan_passes(plan, full.attn, &attn_bytes)) != FXA_OK) {
        fxa_check_plan_destroy(plan);
        return st;
    }
    const int64_t want = full.sample_rows ? full.sample_rows : FXA_CHECK_SAMPLE_ROWS;
    const int64_t seq_q = plan->centred->d.seq_q;
    plan->samples = seq_q < want ? seq_q : want;
    layout_workspace(plan, attn_bytes);
    const uint64_t avail = fxa_available_memory();
    if (plan->ws_total == SIZE_MAX || (uint64_t)plan->ws_total > avail) {
        const double need = (double)plan->ws_total;
        fxa_check_plan_destroy(plan);
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY,
                            "the check needs %.1f GiB of workspace, %.1f GiB available",
                            need / 1073741824.0, (double)avail / 1073741824.0);
    }
    *workspace_bytes_out = plan->ws_total;
    *plan_out = plan;
    return FXA_OK;
}

fxa_status fxa_check_plan_create(fxa_ctx *ctx, const fxa_check_desc *d, fxa_check_plan **plan_out,
                                 size_t *workspace_bytes_out)
{
    if (plan_out)
        *plan_out = NULL;
    if (!ctx)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(ctx);
    return fxa_ctx_end_with(ctx, plan_create(ctx, d, plan_out, workspace_bytes_out));
}

void fxa_check_plan_destroy(fxa_check_plan *plan)
{
    if (!plan)
        return;
    fxa_attn_plan_destroy(plan->centred);
    fxa_attn_plan_destroy(plan->raw);
    fxa_free_aligned(plan);
}

/* Step 1: the arguments, copied into *a (v: the workspace's zeros when the
 * plan has no V), and the memory they span. */
static fxa_status check_args(const fxa_check_plan *plan, const fxa_attn_args *args,
                             unsigned char *ws, const fxa_check_head *heads_out,
                             size_t head_struct_size, fxa_attn_args *a)
{
    fxa_ctx *ctx = plan->ctx;
    if (!args || !heads_out)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "fxa_check_run: args and heads_out must not be NULL");
    *a = (fxa_attn_args){.struct_size = sizeof *a};
    fxa_status st = fxa_struct_in(a, sizeof *a, args, FXA_ATTN_ARGS_SIZE_0_1, "fxa_attn_args",
                                  ctx->last_error, sizeof ctx->last_error);
    if (st != FXA_OK)
        return st;
    st = fxa_struct_size_check(head_struct_size, FXA_CHECK_HEAD_SIZE_0_2, sizeof(fxa_check_head),
                               "fxa_check_head", ctx->last_error, sizeof ctx->last_error);
    if (st != FXA_OK)
        return st;
    if (!a->q || !a->k)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "fxa_check_run: q and k must not be NULL");
    if (plan->has_v != (a->v != NULL))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            plan->has_v ? "fxa_check_run: v is NULL, and the plan has V"
                                        : "fxa_check_run: v is set, and the plan has no V "
                                          "(fxa_check_desc.has_v 0)");
    if (!ws)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "workspace of %zu bytes is missing",
                            plan->ws_total);
    if ((uintptr_t)ws % FXA_ALIGN != 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "workspace must be 64-byte aligned");
    const fxa_attn_plan *p = plan->centred;
    const fxa_span in[3] = {
        {"Q", a->q, (size_t)p->q_extent * p->in_elem},
        {"K", a->k, (size_t)p->kv_extent[0] * p->in_elem},
        {"V", a->v, (size_t)p->kv_extent[1] * p->in_elem},
    };
    const fxa_span out[2] = {
        {"heads_out", heads_out, (size_t)p->d.heads_q * head_struct_size},
        {"workspace", ws, plan->ws_total},
    };
    if ((st = fxa_spans_disjoint(ctx, out, 2, in, 3)) != FXA_OK)
        return st;
    if (!plan->has_v) {
        float *zeros = (float *)(ws + plan->ws_zero_v);
        memset(zeros, 0, ((size_t)p->d.batch + (size_t)p->d.head_dim) * sizeof(float));
        a->v = zeros;
    }
    return FXA_OK;
}

/* Step 2: the bound pass of both plans, its row bounds and flags into the
 * workspace. */
static fxa_status bound_passes(const fxa_check_plan *plan, const fxa_attn_args *in,
                               unsigned char *ws)
{
    fxa_attn_args a = *in;
    a.out = NULL;
    a.lse = NULL;
    a.row_bound = (float *)(ws + plan->ws_bound_c);
    a.row_fallback = ws + plan->ws_fb_c;
    fxa_status st = fxa_attn_bounds(plan->centred, &a, ws + plan->ws_attn, NULL);
    if (st != FXA_OK)
        return st;
    a.row_bound = (float *)(ws + plan->ws_bound_r);
    a.row_fallback = ws + plan->ws_fb_r;
    return fxa_attn_bounds(plan->raw, &a, ws + plan->ws_attn, NULL);
}

/* Steps 3 and 4: the key statistics, then each head's report. */
static void report(const fxa_check_plan *plan, const fxa_attn_args *a, unsigned char *ws)
{
    const fxa_attn_desc *d = &plan->centred->d;
    fxa_check_job job = {
        .plan = plan,
        .q = a->q,
        .k = a->k,
        .v = plan->has_v ? a->v : NULL,
        .bound_c = (const float *)(ws + plan->ws_bound_c),
        .bound_r = (const float *)(ws + plan->ws_bound_r),
        .fb_c = ws + plan->ws_fb_c,
        .fb_r = ws + plan->ws_fb_r,
        .kbar = (double *)(ws + plan->ws_kbar),
        .keys = (fxa_check_keys *)(ws + plan->ws_keys),
        .scratch = (double *)(ws + plan->ws_scratch),
        .rows = (float *)(ws + plan->ws_rows),
        .heads = (fxa_check_head *)(ws + plan->ws_heads),
    };
    fxa_pool_run(&plan->ctx->pool, fxa_check_keys_item, &job, d->batch * d->heads_kv);
    fxa_pool_run(&plan->ctx->pool, fxa_check_head_item, &job, d->heads_q);
}

/* Step 5: each head's fields that fit in head_struct_size. */
static void write_heads(const fxa_check_plan *plan, const unsigned char *ws,
                        fxa_check_head *heads_out, size_t head_struct_size)
{
    const fxa_check_head *heads = (const fxa_check_head *)(ws + plan->ws_heads);
    for (int64_t h = 0; h < plan->centred->d.heads_q; h++) {
        fxa_check_head r = heads[h];
        r.struct_size = head_struct_size;
        memcpy((unsigned char *)heads_out + (size_t)h * head_struct_size, &r, head_struct_size);
    }
}

static fxa_status run(const fxa_check_plan *plan, const fxa_attn_args *args, void *workspace,
                      fxa_check_head *heads_out, size_t head_struct_size)
{
    unsigned char *ws = workspace;
    fxa_attn_args a;
    fxa_status st = check_args(plan, args, ws, heads_out, head_struct_size, &a);
    if (st == FXA_OK)
        st = bound_passes(plan, &a, ws);
    if (st != FXA_OK)
        return st;
    report(plan, &a, ws);
    write_heads(plan, ws, heads_out, head_struct_size);
    return FXA_OK;
}

fxa_status fxa_check_run(const fxa_check_plan *plan, const fxa_attn_args *args, void *workspace,
                         fxa_check_head *heads_out, size_t head_struct_size)
{
    if (!plan)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(plan->ctx);
    return fxa_ctx_end_with(plan->ctx, run(plan, args, workspace, heads_out, head_struct_size));
}

/* fxa_attn_check: plan, workspace, run and destroy. */
static fxa_status check_once(fxa_ctx *ctx, const fxa_attn_desc *d, const void *q, const void *k,
                             const void *v, int sample_rows, fxa_check_head *heads_out,
                             size_t head_struct_size)
{
    fxa_check_desc cd;
    fxa_check_desc_init(&cd);
    cd.attn = d;
    cd.sample_rows = sample_rows;
    cd.has_v = v != NULL;
    fxa_check_plan *plan = NULL;
    size_t bytes = 0;
    fxa_status st = fxa_check_plan_create(ctx, &cd, &plan, &bytes);
    if (st != FXA_OK)
        return st;
    void *ws = fxa_malloc_aligned(bytes);
    if (!ws) {
        fxa_check_plan_destroy(plan);
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY,
                            "out of memory for the check's workspace (%zu bytes)", bytes);
    }
    const fxa_attn_args a = {.struct_size = sizeof a, .q = q, .k = k, .v = v};
    st = fxa_check_run(plan, &a, ws, heads_out, head_struct_size);
    fxa_free_aligned(ws);
    fxa_check_plan_destroy(plan);
    return st;
}

fxa_status fxa_attn_check(fxa_ctx *ctx, const fxa_attn_desc *d, const void *q, const void *k,
                          const void *v, int sample_rows, fxa_check_head *heads_out,
                          size_t head_struct_size)
{
    if (!ctx)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(ctx);
    return fxa_ctx_end_with(ctx,
                            check_once(ctx, d, q, k, v, sample_rows, heads_out, head_struct_size));
}
