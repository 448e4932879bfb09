/* Backward plans: validate a descriptor for the backward and lay out its
 * workspace. The forward plan inside does the shared validation. */
#include <stdlib.h>

#include "../base/alloc.h"
#include "bwd_internal.h"
#include "dropout.h"
#include "f64.h"

/* Query rows per tile: P and dS (and dK, dV's accumulators) stay in L2,
 * and each dK, dV block sums 256 query rows (128 bf16 row pairs) between
 * its accumulators' load and store. */
#define BWD_BLOCK_Q 256
#define BWD_BLOCK_KV 128 /* keys per tile and per dK/dV work item */
/* bf16 compute: twice the keys (P and dS in bf16 take the same bytes), so
 * the one-pass schedule sweeps each head's dQ accumulator half as often. */
#define BWD_BLOCK_KV_BF16 256
/* K, V, Q and dO of one chunk of kv heads stay within this many bytes
 * (unless one kv head needs more, or the threads need more heads for one
 * pass: chunk_kv_heads). */
#define BWD_CHUNK_BYTES ((size_t)64 << 20)

double fxa_attn_bwd_flops(const fxa_attn_desc *d)
{
    return 2.5 * fxa_attn_flops(d);
}

/* Bytes of the chunk areas per kv head. */
static size_t head_bytes(const fxa_attn_bwd_plan *bp)
{
    const fxa_attn_plan *p = bp->fwd;
    const size_t q_rows = (size_t)p->group * (size_t)p->d.seq_q;
    return 3 * fxa_align_up(bp->kv_pad * bp->dim * sizeof(float)) +
           3 * fxa_align_up(q_rows * bp->dim * sizeof(float)) +
           2 * fxa_align_up(q_rows * sizeof(float));
}

/* Heads per wave of the one-pass schedule that a chunk of k kv heads keeps
 * busy on n_threads threads: k / (ceil(k / n) n), compared as a fraction. */
static int busier(int64_t a, int64_t b, int64_t n)
{
    const int64_t wa = (a + n - 1) / n * n, wb = (b + n - 1) / n * n;
    return a * wb > b * wa;
}

/* The divisor of Hkv whose chunk fits the budget and keeps the most of the
 * threads busy in the one-pass schedule (one item per kv head: 5 heads on
 * 2 threads leave one idle a third of the time, 4 none), the largest of
 * those (at least 1); when that chunk leaves n_threads threads to the two
 * passes, the smallest
 * larger divisor of at most one kv head per thread that runs one pass
 * (fxa_bwd_one_pass: 10 units of work per head instead of 14) and fits in
 * half the available memory, avail bytes. Long sequences need it: one kv head's K, V,
 * Q and dO pass the budget from S ~ 11k (D 128), and a chunk of one head
 * on two threads would run two passes. */
static int64_t chunk_kv_heads(const fxa_attn_bwd_plan *bp, int n_threads, uint64_t avail)
{
    const int64_t hkv = bp->fwd->d.heads_kv;
    const size_t per = head_bytes(bp);
    int64_t best = 1;
    for (int64_t k = 2; k <= hkv; k++) {
        if (hkv % k == 0 && (size_t)k * per <= BWD_CHUNK_BYTES && !busier(best, k, n_threads))
            best = k;
    }
    if (fxa_bwd_one_pass(best, n_threads))
        return best;
    for (int64_t k = best + 1; k <= hkv && k <= n_threads; k++) {
        if (hkv % k == 0 && fxa_bwd_one_pass(k, n_threads) && (uint64_t)k * per <= avail / 2)
            return k;
    }
    return best;
}

/* The offset *off of a region of n bytes, *off moved past it (64-byte aligned). */
static size_t take(size_t *off, size_t n)
{
    const size_t at = *off;
    *off += fxa_align_up(n);
    return at;
}

static void layout_workspace(fxa_attn_bwd_plan *bp, int n_threads)
{
    const fxa_attn_plan *p = bp->fwd;
    const size_t chunk = (size_t)bp->chunk_kv_heads;
    const size_t heads_q = chunk * (size_t)p->group;
    const size_t q_rows = heads_q * (size_t)p->d.seq_q;
    const size_t grad_rows = bp->block_q > bp->block_kv ? bp->block_q : bp->block_kv;
    /* fp32: K^T, V^T, K, Q, dO in floats; bf16: in bf16 (K as key pairs,
     * Q and dO rows of d16, then their row pairs) */
    const size_t kt_bytes = chunk * bp->kv_pad * (bp->bf16 ? bp->d16 * 2 : bp->dim * 4);
    const size_t k_bytes = chunk * bp->kv_pad * bp->dim * (bp->bf16 ? 2 : 4);
    const size_t q_bytes = q_rows * (bp->bf16 ? bp->d16 * 2 : bp->dim * 4);
    const size_t qp_bytes =
        bp->bf16 ? heads_q * (size_t)((p->d.seq_q + 1) / 2) * 2 * bp->dim * 2 : 0;
    size_t off = 0;
    bp->ws_zero_vt = take(&off, fxa_attn_dropout(p) ? bp->block_kv * bp->d16 * sizeof(float) : 0);
    bp->ws_kt = take(&off, kt_bytes);
    bp->ws_vt = take(&off, kt_bytes);
    bp->ws_k = take(&off, k_bytes);
    bp->ws_q = take(&off, q_bytes);
    bp->ws_do = take(&off, q_bytes);
    bp->ws_qp = take(&off, qp_bytes);
    bp->ws_dop = take(&off, qp_bytes);
    bp->ws_lse2 = take(&off, q_rows * sizeof(float));
    bp->ws_inv_sum = take(&off, q_rows * sizeof(float));
    bp->ws_center = take(&off, q_rows * sizeof(float));
    bp->ws_off = take(&off, fxa_attn_masked(p) ? q_rows * sizeof(float) : 0);
    bp->ws_delta = take(&off, q_rows * sizeof(float));
    bp->ws_dq = take(&off, q_rows * bp->dim * sizeof(float));
    bp->ws_threads = off;
    bp->thread_bytes =
        2 * fxa_align_up(bp->block_q * bp->block_kv * sizeof(float)) +
        2 * fxa_align_up(grad_rows * bp->dim * sizeof(float)) +
        fxa_align_up(bp->block_kv * sizeof(void *)) +
        (fxa_attn_masked(p) ? fxa_align_up(bp->block_q * bp->block_kv * sizeof(float)) : 0) +
        (fxa_attn_dropout(p) ? fxa_align_up(bp->block_q * bp->block_kv * sizeof(float)) +
                                   fxa_align_up(bp->block_kv * bp->dim * sizeof(float))
                             : 0) +
        fxa_align_up(sizeof(fxa_bwd_bad_p));
    off += (size_t)n_threads * bp->thread_bytes;
    bp->ws_total = off;
}

static fxa_status check_bwd(fxa_ctx *ctx, const fxa_attn_plan *p)
{
    const struct {
        const char *name;
        const fxa_strides *s;
        int64_t heads, seq;
    } t[3] = {{"q", &p->q_strides, p->d.heads_q, p->d.seq_q},
              {"k", &p->k_strides, p->d.heads_kv, p->d.seq_kv},
              {"v", &p->v_strides, p->d.heads_kv, p->d.seq_kv}};
    for (int i = 0; i < 3; i++) {
        if (!fxa_strides_nested(t[i].s, p->d.batch, t[i].heads, t[i].seq, p->d.head_dim))
            return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                                "%s_strides {batch %lld, token %lld, head %lld} make distinct "
                                "elements of d%s alias (the backward writes d%s with %s's "
                                "strides)",
                                t[i].name, (long long)t[i].s->batch, (long long)t[i].s->token,
                                (long long)t[i].s->head, t[i].name, t[i].name, t[i].name);
    }
    return FXA_OK;
}

static fxa_status bwd_plan_create(fxa_ctx *ctx, const fxa_attn_desc *d,
                                  fxa_attn_bwd_plan **plan_out, size_t *workspace_bytes_out)
{
    if (!d || !plan_out || !workspace_bytes_out)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "NULL argument to fxa_attn_bwd_plan_create");
    fxa_attn_plan *fwd = NULL;
    size_t fwd_ws = 0;
    fxa_status st = fxa_attn_plan_create(ctx, d, &fwd, &fwd_ws);
    if (st != FXA_OK)
        return st;
    if ((st = check_bwd(ctx, fwd)) != FXA_OK) {
        fxa_attn_plan_destroy(fwd);
        return st;
    }
    fxa_attn_bwd_plan *bp = fxa_calloc_aligned(sizeof *bp);
    if (!bp) {
        fxa_attn_plan_destroy(fwd);
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory for the backward plan");
    }
    bp->fwd = fwd;
    bp->ctx = ctx;
    bp->dim = (size_t)fwd->d.head_dim;
    if (fwd->d.dtype == FXA_F64) {
        bp->ws_total = fxa_f64_bwd_workspace(fwd, ctx->pool.n_threads);
        *plan_out = bp;
        *workspace_bytes_out = bp->ws_total;
        return FXA_OK;
    }
    bp->panel = ctx->kernels->bwd_kt_panel;
    bp->block_kv = (fwd->d.compute == FXA_COMPUTE_BF16 ? BWD_BLOCK_KV_BF16 : BWD_BLOCK_KV) /
                   bp->panel * bp->panel;
    bp->block_q = BWD_BLOCK_Q;
    bp->n_q_blocks = (fwd->d.seq_q + (int64_t)bp->block_q - 1) / (int64_t)bp->block_q;
    bp->n_kv_blocks = (fwd->d.seq_kv + (int64_t)bp->block_kv - 1) / (int64_t)bp->block_kv;
    bp->kv_pad = (size_t)bp->n_kv_blocks * bp->block_kv;
    bp->bf16 = fwd->d.compute == FXA_COMPUTE_BF16;
    bp->d16 = (bp->dim + 1) / 2 * 2;
    const uint64_t avail = fxa_available_memory();
    bp->chunk_kv_heads = chunk_kv_heads(bp, ctx->pool.n_threads, avail);
    layout_workspace(bp, ctx->pool.n_threads);
    if ((uint64_t)bp->ws_total > avail) {
        const double need = (double)bp->ws_total / 1073741824.0;
        fxa_attn_bwd_plan_destroy(bp);
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY,
                            "needs %.1f GiB, %.1f GiB available (the backward's workspace)", need,
                            (double)avail / 1073741824.0);
    }
    *plan_out = bp;
    *workspace_bytes_out = bp->ws_total;
    return FXA_OK;
}

fxa_status fxa_attn_bwd_plan_create(fxa_ctx *ctx, const fxa_attn_desc *d,
                                    fxa_attn_bwd_plan **plan_out, size_t *workspace_bytes_out)
{
    if (plan_out)
        *plan_out = NULL;
    const fxa_status st = fxa_ctx_enter(ctx);
    return st != FXA_OK
               ? st
               : fxa_ctx_end_with(ctx, bwd_plan_create(ctx, d, plan_out, workspace_bytes_out));
}

void fxa_attn_bwd_plan_destroy(fxa_attn_bwd_plan *plan)
{
    if (!plan)
        return;
    fxa_attn_plan_destroy(plan->fwd);
    fxa_free_aligned(plan);
}
