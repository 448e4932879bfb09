/*
 * Blockwise attention (fxattn.h, "Blockwise attention"): the query rows'
 * unnormalised state (m, l, o, centring term, row kind, bound) lives in
 * the accumulator for the whole pass; each block is packed chunk by chunk of
 * kv heads like fxa_attn_run does, and work items (head tile, query block)
 * run the block's tiles straight on that state. A row's tiles run in block
 * order, then tile order, in one item at a time, so results do not depend on
 * the thread count.
 */
#include <float.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "fxattn_diag.h"
#include "../base/alloc.h"
#include "../base/struct_size.h"
#include "acc_api.h"
#include "attn_internal.h"
#include "load.h"
#include "scan.h"
#include "steps.h"
#include "summary.h"
#include "base/clock.h"

struct fxa_attn_acc {
    const fxa_attn_plan *p;
    unsigned char *ws; /* the plan's workspace layout */
    const void *q;
    int64_t n_rows; /* B * Hq * Sq */
    float *m;
    float *l;
    float *qk_center;
    float *bound;
    uint8_t *online;
    float *o; /* [n_rows][D] */
    int begun;
    /* The blocks of the pass: a copy of begin's summaries and, per block,
     * whether it was added (room for blocks_cap blocks, allocated by create
     * and fxa_attn_acc_reserve). A block to add is summarised again (into
     * block_summary, with the plan's kv_scratch) and must equal one not yet
     * added:
     * summaries are bit-exact on every kernel set, so a summarised block
     * always matches, and anything else (a block added twice, changed since,
     * never summarised, or with keys or values outside the bound its
     * summary gave) is refused before it touches the rows. */
    double *summaries;
    uint8_t *added;
    int64_t n_blocks;
    int64_t blocks_cap;
    double *block_summary;
    int64_t keys_expected; /* per head, from the summaries */
    int64_t keys_added;
    int64_t fallback_rows;
    fxa_bad_value *bad; /* [B * Hq * n_q_blocks]: what begin found per item */
    double *qq;         /* [B * Hq * n_q_blocks]: each item's max ||q||^2 */
    double t_begin;
    void (*progress)(void *);
    void *progress_arg;
};

typedef struct acc_job {
    fxa_attn_acc *acc;
    const void *k;
    const void *v;
    int64_t n_kv;
    int64_t n_tiles;
    fxa_strides k_strides;
    fxa_strides v_strides;
    int64_t batch;
    int64_t chunk_kv0;
    int64_t item0; /* first item of this wave */
    const fxa_attn_args *args;
} acc_job;

/* The strides of a block of n_kv keys of K (v: of V): the descriptor's
 * when it set them, else the layout's for n_kv tokens. */
static fxa_strides block_strides(const fxa_attn_plan *p, int64_t n_kv, int v)
{
    if (v ? p->v_set : p->k_set)
        return v ? p->v_strides : p->k_strides;
    return fxa_attn_layout_strides(p->d.layout, p->d.heads_kv, n_kv, p->d.head_dim);
}

/* The accumulator rows of (b, h) from token i0 on. */
static fxa_rows state_rows(const fxa_attn_acc *acc, int64_t b, int64_t h, int64_t i0)
{
    const fxa_attn_plan *p = acc->p;
    const int64_t r = (b * p->d.heads_q + h) * p->d.seq_q + i0;
    return (fxa_rows){
        .m = acc->m + r,
        .l = acc->l + r,
        .o = acc->o + (size_t)r * (size_t)p->d.head_dim,
        .qk_center = acc->qk_center + r,
        .online = acc->online + r,
    };
}

static fxa_thread_scratch *scratch(const fxa_attn_acc *acc, int thread_id)
{
    return (fxa_thread_scratch *)(acc->ws + acc->p->ws_threads) + thread_id;
}

/* Room in the block table for passes of up to n_blocks blocks. */
static fxa_status reserve(fxa_attn_acc *acc, int64_t n_blocks)
{
    if (n_blocks <= acc->blocks_cap)
        return FXA_OK;
    const size_t len = fxa_kv_summary_len(acc->p);
    if ((uint64_t)n_blocks > SIZE_MAX / sizeof(double) / (len ? len : 1))
        return fxa_ctx_fail(acc->p->ctx, FXA_ERR_NO_MEMORY,
                            "%lld block summaries overflow the address space", (long long)n_blocks);
    double *s = fxa_malloc_aligned((size_t)n_blocks * len * sizeof(double));
    uint8_t *added = fxa_malloc_aligned((size_t)n_blocks);
    if (!s || !added) {
        fxa_free_aligned(s);
        fxa_free_aligned(added);
        return fxa_ctx_fail(acc->p->ctx, FXA_ERR_NO_MEMORY,
                            "out of memory for %lld block summaries", (long long)n_blocks);
    }
    fxa_free_aligned(acc->summaries);
    fxa_free_aligned(acc->added);
    acc->summaries = s;
    acc->added = added;
    acc->blocks_cap = n_blocks;
    return FXA_OK;
}

static fxa_status acc_create(const fxa_attn_plan *plan, fxa_attn_acc **acc_out)
{
    if (!acc_out)
        return fxa_ctx_fail(plan->ctx, FXA_ERR_INVALID_ARG, "NULL argument to fxa_attn_acc_create");
    if (plan->d.dtype == FXA_F64)
        return fxa_ctx_fail(plan->ctx, FXA_ERR_UNSUPPORTED,
                            "blockwise attention (fxa_attn_acc_*) is for fp32 and bf16 plans, "
                            "not fp64");
    if (plan->d.dropout_p > 0.0)
        return fxa_ctx_fail(plan->ctx, FXA_ERR_UNSUPPORTED,
                            "blockwise attention (fxa_attn_acc_*) takes no dropout");
    if (fxa_attn_masked(plan))
        return fxa_ctx_fail(plan->ctx, FXA_ERR_UNSUPPORTED,
                            "blockwise attention (fxa_attn_acc_*) takes no mask and no causal: "
                            "the plan has %s",
                            plan->d.causal ? "causal set" : "a mask");
    const fxa_attn_plan *p = plan;
    const size_t n_rows = (size_t)(p->d.batch * p->d.heads_q * p->d.seq_q);
    const size_t dim = (size_t)p->d.head_dim;
    const size_t state = 4 * fxa_align_up(n_rows * sizeof(float)) + fxa_align_up(n_rows) +
                         fxa_align_up(n_rows * dim * sizeof(float));
    const size_t n_items = (size_t)(p->d.batch * p->d.heads_q * p->n_q_blocks);
    fxa_attn_acc *acc = fxa_calloc_aligned(sizeof *acc);
    unsigned char *mem = fxa_malloc_aligned(state);
    unsigned char *ws = fxa_malloc_aligned(p->ws_total);
    fxa_bad_value *bad = fxa_malloc_aligned(n_items * sizeof *bad);
    double *qq = fxa_malloc_aligned(n_items * sizeof *qq);
    double *block_summary = fxa_malloc_aligned(fxa_kv_summary_len(p) * sizeof(double));
    if (!acc || !mem || !ws || !bad || !qq || !block_summary) {
        fxa_free_aligned(acc);
        fxa_free_aligned(mem);
        fxa_free_aligned(ws);
        fxa_free_aligned(bad);
        fxa_free_aligned(qq);
        fxa_free_aligned(block_summary);
        return fxa_ctx_fail(p->ctx, FXA_ERR_NO_MEMORY,
                            "out of memory for the accumulator (%zu bytes)", state + p->ws_total);
    }
    acc->p = p;
    acc->ws = ws;
    acc->bad = bad;
    acc->qq = qq;
    acc->block_summary = block_summary;
    acc->n_rows = (int64_t)n_rows;
    acc->m = (float *)mem;
    acc->l = (float *)(mem + fxa_align_up(n_rows * sizeof(float)));
    acc->qk_center = (float *)(mem + 2 * fxa_align_up(n_rows * sizeof(float)));
    acc->bound = (float *)(mem + 3 * fxa_align_up(n_rows * sizeof(float)));
    acc->online = mem + 4 * fxa_align_up(n_rows * sizeof(float));
    acc->o = (float *)(mem + 4 * fxa_align_up(n_rows * sizeof(float)) + fxa_align_up(n_rows));
    for (int t = 0; t < p->ctx->pool.n_threads; t++)
        fxa_thread_scratch_carve(p, ws, t);
    const fxa_status st = reserve(acc, 1);
    if (st != FXA_OK) {
        fxa_attn_acc_destroy(acc);
        return st;
    }
    *acc_out = acc;
    return FXA_OK;
}

/* The public calls: one at a time per context (fxa_ctx_begin). */
fxa_status fxa_attn_acc_create(const fxa_attn_plan *plan, fxa_attn_acc **acc_out)
{
    if (acc_out)
        *acc_out = NULL;
    if (!plan)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(plan->ctx);
    return fxa_ctx_end_with(plan->ctx, acc_create(plan, acc_out));
}

static fxa_status acc_reserve(fxa_attn_acc *acc, int64_t max_blocks)
{
    if (max_blocks < 1)
        return fxa_ctx_fail(acc->p->ctx, FXA_ERR_INVALID_ARG,
                            "fxa_attn_acc_reserve: max_blocks is %lld, it must be >= 1",
                            (long long)max_blocks);
    return reserve(acc, max_blocks);
}

fxa_status fxa_attn_acc_reserve(fxa_attn_acc *acc, int64_t max_blocks)
{
    if (!acc)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(acc->p->ctx);
    return fxa_ctx_end_with(acc->p->ctx, acc_reserve(acc, max_blocks));
}

void fxa_attn_acc_destroy(fxa_attn_acc *acc)
{
    if (!acc)
        return;
    fxa_free_aligned(acc->m);
    fxa_free_aligned(acc->ws);
    fxa_free_aligned(acc->bad);
    fxa_free_aligned(acc->qq);
    fxa_free_aligned(acc->block_summary);
    fxa_free_aligned(acc->summaries);
    fxa_free_aligned(acc->added);
    fxa_free_aligned(acc);
}

void fxa_attn_acc_set_progress(fxa_attn_acc *acc, void (*fn)(void *arg), void *arg)
{
    if (!acc)
        return;
    acc->progress = fn;
    acc->progress_arg = arg;
}

size_t fxa_kv_summary_len(const fxa_attn_plan *plan)
{
    return plan ? (size_t)(plan->d.batch * plan->d.heads_kv) * fxa_summary_head_len(plan) : 0;
}

static fxa_status kv_summarize(const fxa_attn_plan *plan, const void *k, const void *v,
                               int64_t n_kv, double *summary_out)
{
    if (!summary_out || (n_kv > 0 && (!k || !v)))
        return fxa_ctx_fail(plan->ctx, FXA_ERR_INVALID_ARG, "NULL argument to fxa_kv_summarize");
    if (plan->d.dtype == FXA_F64)
        return fxa_ctx_fail(plan->ctx, FXA_ERR_UNSUPPORTED,
                            "blockwise attention (fxa_kv_summarize) is for fp32 and bf16 plans, "
                            "not fp64");
    if (n_kv < 0 || n_kv > plan->d.seq_kv)
        return fxa_ctx_fail(plan->ctx, FXA_ERR_INVALID_ARG,
                            "block of %lld keys is outside 0..%lld (the plan's seq_kv)",
                            (long long)n_kv, (long long)plan->d.seq_kv);
    return fxa_scan_kv(plan, k, v, n_kv, block_strides(plan, n_kv, 0), block_strides(plan, n_kv, 1),
                       summary_out, plan->kv_scratch);
}

fxa_status fxa_kv_summarize(const fxa_attn_plan *plan, const void *k, const void *v, int64_t n_kv,
                            double *summary_out)
{
    if (!plan)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(plan->ctx);
    return fxa_ctx_end_with(plan->ctx, kv_summarize(plan, k, v, n_kv, summary_out));
}

/* Item (b * Hq + h, query block) of a job: its accumulator, batch b, head
 * h, first row i0, row count n and the offset of its first row of Q. */
typedef struct acc_item {
    fxa_attn_acc *acc;
    int64_t b;
    int64_t h;
    int64_t i0;
    size_t n;
    int64_t q_off;
} acc_item;

static acc_item item_at(const acc_job *job, int64_t item)
{
    const fxa_attn_plan *p = job->acc->p;
    const int64_t bh = item / p->n_q_blocks;
    const int64_t b = bh / p->d.heads_q;
    const int64_t h = bh % p->d.heads_q;
    const int64_t i0 = item % p->n_q_blocks * p->d.block_q;
    return (acc_item){
        .acc = job->acc,
        .b = b,
        .h = h,
        .i0 = i0,
        .n = (size_t)(p->d.seq_q - i0 < p->d.block_q ? p->d.seq_q - i0 : p->d.block_q),
        .q_off = b * p->q_strides.batch + h * p->q_strides.head + i0 * p->q_strides.token,
    };
}

/* Item (b * Hq + h, query block): check its rows and note their largest
 * ||q||^2 (for the prescaling), row by row as the single-process scan does
 * (fxa_check_block), so that the largest over all rows is the same number
 * however the rows are split. */
static void check_item(void *arg, int64_t item, int thread_id)
{
    const acc_item it = item_at(arg, item);
    const fxa_attn_plan *p = it.acc->p;
    const fxa_row_block blk = {.off = it.q_off,
                               .head_stride = p->q_strides.head,
                               .token_stride = p->q_strides.token,
                               .n_tokens = (int64_t)it.n,
                               .n_heads = 1};
    (void)thread_id;
    fxa_bad_value *bad = it.acc->bad + item;
    fxa_check_block(p, it.acc->q, &blk, bad, it.acc->qq + item);
    if (bad->bad_row >= 0)
        bad->bad_row += it.i0;
}

/* Item (b * Hq + h, query block): load the rows and decide their shifts. */
static void begin_item(void *arg, int64_t item, int thread_id)
{
    const acc_item it = item_at(arg, item);
    fxa_attn_acc *acc = it.acc;
    const fxa_attn_plan *p = acc->p;
    const int64_t bh = it.b * p->d.heads_q + it.h;
    const int64_t kv_item = it.b * p->d.heads_kv + it.h / p->group;
    const fxa_head_bound *hb = (const fxa_head_bound *)(acc->ws + p->ws_bounds) + kv_item;
    const float *kbar =
        (const float *)(acc->ws + p->ws_kbar) + (size_t)kv_item * (size_t)p->d.head_dim;
    fxa_thread_scratch *s = scratch(acc, thread_id);
    fxa_rows rows = state_rows(acc, it.b, it.h, it.i0);
    rows.q = s->q;
    rows.q16 = s->q16;
    fxa_load_q(p, acc->q, it.q_off, p->q_strides.token, it.n, s->q, s->q16);
    s->fallback_rows +=
        fxa_rows_decide(p, hb, kbar, &rows, it.n, acc->bound + (bh * p->d.seq_q + it.i0));
}

/* Keep a copy of the pass's n_blocks summaries, none of them added yet
 * (the table grows only past its reserved blocks). */
static fxa_status keep_summaries(fxa_attn_acc *acc, const double *summaries, int64_t n_blocks)
{
    const size_t len = fxa_kv_summary_len(acc->p);
    const fxa_status st = reserve(acc, n_blocks);
    if (st != FXA_OK)
        return st;
    memcpy(acc->summaries, summaries, (size_t)n_blocks * len * sizeof(double));
    memset(acc->added, 0, (size_t)n_blocks);
    acc->n_blocks = n_blocks;
    return FXA_OK;
}

/* Begin a pass; qmax (NULL: from q) gives each (batch, kv head)'s largest
 * ||q|| over every rank's queries (fxa_attn_acc_begin_global). */
static fxa_status acc_begin(fxa_attn_acc *acc, const void *q, const double *summaries,
                            int64_t n_blocks, const double *qmax)
{
    const fxa_attn_plan *p = acc->p;
    acc->begun = 0;
    if (!q || !summaries || n_blocks < 1)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "fxa_attn_acc_begin needs q, summaries and n_blocks >= 1");
    const size_t len = fxa_summary_head_len(p);
    const int64_t n_heads = p->d.batch * p->d.heads_kv;
    const size_t stride = (size_t)n_heads * len;
    fxa_head_bound *hb = (fxa_head_bound *)(acc->ws + p->ws_bounds);
    float *kbar = (float *)(acc->ws + p->ws_kbar);
    int64_t keys = -1;
    for (int64_t i = 0; i < n_heads; i++) {
        double n = 0.0;
        for (int64_t blk = 0; blk < n_blocks; blk++) {
            const double *s = summaries + (size_t)blk * stride + (size_t)i * len;
            for (size_t c = 0; c < len; c++) {
                if (!isfinite(s[c]))
                    return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                                        "summary of block %lld is not finite", (long long)blk);
            }
            if (s[0] < 0.0 || s[0] > 0x1p52 || s[0] != floor(s[0]) || s[1] < 0.0 || s[2] < 0.0 ||
                s[3] < 0.0)
                return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                                    "summary of block %lld is malformed", (long long)blk);
            n += s[0];
        }
        if (!fxa_summary_merge(p, summaries + (size_t)i * len, stride, n_blocks, hb + i,
                               kbar + (size_t)i * (size_t)p->d.head_dim))
            return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG, "the blocks hold no keys");
        if (keys >= 0 && (int64_t)n != keys)
            return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                                "summaries disagree on the key count across heads");
        keys = (int64_t)n;
    }
    const fxa_status kept = keep_summaries(acc, summaries, n_blocks);
    if (kept != FXA_OK)
        return kept;
    const double t0 = fxa_now_seconds();
    acc->q = q;
    for (int t = 0; t < p->ctx->pool.n_threads; t++)
        scratch(acc, t)->fallback_rows = 0;
    acc_job job = {.acc = acc};
    const int64_t n_items = p->d.batch * p->d.heads_q * p->n_q_blocks;
    fxa_pool_run(&p->ctx->pool, check_item, &job, n_items);
    for (int64_t i = 0; i < n_items; i++) { /* the lowest (batch, head, token) wins */
        const fxa_bad_value *bad = acc->bad + i;
        if (bad->bad_row >= 0)
            return fxa_ctx_fail(
                p->ctx, FXA_ERR_INVALID_ARG,
                "Q has a non-finite value (%g) at batch %lld, token %lld, head "
                "%lld, dim %lld",
                (double)bad->bad_value, (long long)(i / p->n_q_blocks / p->d.heads_q),
                (long long)bad->bad_row, (long long)(i / p->n_q_blocks % p->d.heads_q),
                (long long)bad->bad_col);
    }
    for (int64_t i = 0; i < n_items; i++) {
        fxa_head_bound *h = hb + i / p->n_q_blocks / p->group;
        const double qn = sqrt(acc->qq[i]);
        h->qmax = qn > h->qmax ? qn : h->qmax;
    }
    for (int64_t i = 0; qmax && i < n_heads; i++) {
        if (!(qmax[i] >= hb[i].qmax && isfinite(qmax[i])))
            return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                                "the largest ||q|| given for head %lld (%g) is below this "
                                "block's own (%g)",
                                (long long)i, qmax[i], hb[i].qmax);
        hb[i].qmax = qmax[i];
    }
    for (int64_t i = 0; i < n_heads; i++) {
        const fxa_status st = fxa_head_prescale(p, hb + i, i);
        if (st != FXA_OK)
            return st;
    }
    fxa_pool_run(&p->ctx->pool, begin_item, &job, n_items);
    acc->fallback_rows = 0;
    for (int t = 0; t < p->ctx->pool.n_threads; t++)
        acc->fallback_rows += scratch(acc, t)->fallback_rows;
    acc->keys_expected = keys;
    acc->keys_added = 0;
    acc->t_begin = t0;
    acc->begun = 1;
    return FXA_OK;
}

fxa_status fxa_attn_acc_begin(fxa_attn_acc *acc, const void *q, const double *summaries,
                              int64_t n_blocks)
{
    if (!acc)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(acc->p->ctx);
    return fxa_ctx_end_with(acc->p->ctx, acc_begin(acc, q, summaries, n_blocks, NULL));
}

fxa_status fxa_attn_acc_begin_global(fxa_attn_acc *acc, const void *q, const double *summaries,
                                     int64_t n_blocks, const double *qmax)
{
    if (!acc || !qmax)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(acc->p->ctx);
    return fxa_ctx_end_with(acc->p->ctx, acc_begin(acc, q, summaries, n_blocks, qmax));
}

/* The largest ||q|| of each (batch, kv head) over its query heads' rows. */
static void q_norm_max(const fxa_attn_acc *acc, double *qmax)
{
    const fxa_attn_plan *p = acc->p;
    const int64_t n_items = p->d.batch * p->d.heads_q * p->n_q_blocks;
    memset(qmax, 0, (size_t)(p->d.batch * p->d.heads_kv) * sizeof(double));
    for (int64_t i = 0; i < n_items; i++) {
        double *h = qmax + i / p->n_q_blocks / p->group;
        const double qn = sqrt(acc->qq[i]);
        *h = qn > *h ? qn : *h;
    }
}

static fxa_status acc_q_norm(fxa_attn_acc *acc, const void *q, double *qmax)
{
    const fxa_attn_plan *p = acc->p;
    if (!q || !qmax)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG, "fxa_attn_acc_q_norm needs q and qmax");
    acc->q = q;
    acc_job job = {.acc = acc};
    const int64_t n_items = p->d.batch * p->d.heads_q * p->n_q_blocks;
    fxa_pool_run(&p->ctx->pool, check_item, &job, n_items);
    for (int64_t i = 0; i < n_items; i++)
        if (acc->bad[i].bad_row >= 0)
            acc->qq[i] = 0.0; /* begin refuses these rows, naming the value */
    q_norm_max(acc, qmax);
    return FXA_OK;
}

fxa_status fxa_attn_acc_q_norm(fxa_attn_acc *acc, const void *q, double *qmax)
{
    if (!acc)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(acc->p->ctx);
    return fxa_ctx_end_with(acc->p->ctx, acc_q_norm(acc, q, qmax));
}

/* Where kv tile `tile` of chunk slot `slot` is packed, in elements of fp32
 * from the start of the packed K (or V) area. */
static size_t packed_offset(const fxa_attn_plan *p, size_t slot, size_t tile)
{
    return slot * p->packed_head_floats + tile * p->kv_tile * p->packed_ld;
}

/* Pack item (kv head of the chunk, tile of the block). */
static void pack_item(void *arg, int64_t item, int thread_id)
{
    const acc_job *job = arg;
    const fxa_attn_plan *p = job->acc->p;
    const int64_t slot = item / job->n_tiles;
    const int64_t tile = item % job->n_tiles;
    const int64_t j0 = tile * (int64_t)p->kv_tile;
    const size_t n_kv =
        (size_t)(job->n_kv - j0 < (int64_t)p->kv_tile ? job->n_kv - j0 : (int64_t)p->kv_tile);
    const int64_t kv_head = job->chunk_kv0 + slot;
    const fxa_strides *ks = &job->k_strides, *vs = &job->v_strides;
    const fxa_row_at k_at = {job->batch * ks->batch + kv_head * ks->head + j0 * ks->token,
                             ks->token};
    const fxa_row_at v_at = {job->batch * vs->batch + kv_head * vs->head + j0 * vs->token,
                             vs->token};
    const size_t at = packed_offset(p, (size_t)slot, (size_t)tile);
    const fxa_head_bound *hb = (const fxa_head_bound *)(job->acc->ws + p->ws_bounds) +
                               job->batch * p->d.heads_kv + kv_head;
    (void)thread_id;
    fxa_pack_kv_tile(p, job->k, k_at, job->v, v_at, n_kv, hb->kshift,
                     (float *)(job->acc->ws + p->ws_packed_k) + at,
                     (float *)(job->acc->ws + p->ws_packed_v) + at);
}

/* Item (head tile of the chunk, query block): every tile of the block into
 * the rows' state. */
static void add_item(void *arg, int64_t wave_item, int thread_id)
{
    const acc_job *job = arg;
    const fxa_attn_acc *acc = job->acc;
    const fxa_attn_plan *p = acc->p;
    const int64_t item = job->item0 + wave_item;
    const int64_t hpt = p->d.heads_per_tile;
    const int64_t h0 = job->chunk_kv0 * p->group + item / p->n_q_blocks * hpt;
    const int64_t i0 = item % p->n_q_blocks * p->d.block_q;
    const size_t n = (size_t)(p->d.seq_q - i0 < p->d.block_q ? p->d.seq_q - i0 : p->d.block_q);
    const size_t dim = (size_t)p->d.head_dim;
    fxa_thread_scratch *s = scratch(acc, thread_id);
    for (int64_t slot = 0; slot < hpt; slot++) {
        const int64_t h = h0 + slot;
        const size_t r = (size_t)slot * (size_t)p->d.block_q;
        fxa_load_q(p, acc->q,
                   job->batch * p->q_strides.batch + h * p->q_strides.head +
                       i0 * p->q_strides.token,
                   p->q_strides.token, n, s->q + r * dim, s->q16 + r * fxa_q16_stride(p));
    }
    for (int64_t tile = 0; tile < job->n_tiles; tile++) {
        const int64_t j0 = tile * (int64_t)p->kv_tile;
        const size_t n_kv =
            (size_t)(job->n_kv - j0 < (int64_t)p->kv_tile ? job->n_kv - j0 : (int64_t)p->kv_tile);
        for (int64_t slot = 0; slot < hpt; slot++) {
            const size_t r = (size_t)slot * (size_t)p->d.block_q;
            const size_t kv_slot = (size_t)((h0 + slot) / p->group - job->chunk_kv0);
            const size_t at = packed_offset(p, kv_slot, (size_t)tile);
            fxa_rows rows = state_rows(acc, job->batch, h0 + slot, i0);
            rows.q = s->q + r * dim;
            rows.q16 = s->q16 + r * fxa_q16_stride(p);
            const fxa_head_bound *hb = (const fxa_head_bound *)(acc->ws + p->ws_bounds) +
                                       job->batch * p->d.heads_kv + (h0 + slot) / p->group;
            fxa_rows_run_tile(p, hb, &rows, n, (const float *)(acc->ws + p->ws_packed_k) + at,
                              (const float *)(acc->ws + p->ws_packed_v) + at, n_kv, s->scores,
                              s->p16, NULL);
        }
    }
}

/* The summarised block, not yet added, whose summary equals the block's
 * (acc->block_summary); -1 when none does. *added_before: some block
 * already added matches. */
static int64_t matching_block(const fxa_attn_acc *acc, int *added_before)
{
    const size_t len = fxa_kv_summary_len(acc->p);
    *added_before = 0;
    for (int64_t b = 0; b < acc->n_blocks; b++) {
        const double *s = acc->summaries + (size_t)b * len;
        size_t c = 0;
        while (c < len && s[c] == acc->block_summary[c])
            c++;
        if (c < len)
            continue;
        if (!acc->added[b])
            return b;
        *added_before = 1;
    }
    return -1;
}

/* Summarise the block to add and find it among the pass's blocks: FXA_OK
 * with *block set, or a refusal (non-finite values, a block added before or
 * never summarised) with nothing added. */
static fxa_status identify_block(const fxa_attn_acc *acc, const void *k, const void *v,
                                 int64_t n_kv, fxa_strides ks, fxa_strides vs, int64_t *block)
{
    const fxa_attn_plan *p = acc->p;
    const fxa_status st = fxa_scan_kv(p, k, v, n_kv, ks, vs, acc->block_summary, p->kv_scratch);
    if (st != FXA_OK)
        return st;
    int added_before;
    *block = matching_block(acc, &added_before);
    if (*block >= 0)
        return FXA_OK;
    if (added_before)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "this block of %lld keys was added already: each summarised block is "
                            "added once",
                            (long long)n_kv);
    return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                        "this block of %lld keys is none of the summarised blocks: its keys or "
                        "values differ from every block given to fxa_attn_acc_begin (add each "
                        "block as fxa_kv_summarize saw it)",
                        (long long)n_kv);
}

static void progress(const fxa_attn_acc *acc)
{
    if (acc->progress)
        acc->progress(acc->progress_arg);
}

static fxa_status acc_add(fxa_attn_acc *acc, const void *k, const void *v, int64_t n_kv)
{
    const fxa_attn_plan *p = acc->p;
    if (!acc->begun)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "fxa_attn_acc_add before a successful begin");
    if (n_kv < 0 || n_kv > p->d.seq_kv || (n_kv > 0 && (!k || !v)))
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "block of %lld keys is outside 0..%lld or has NULL k/v",
                            (long long)n_kv, (long long)p->d.seq_kv);
    if (acc->keys_added + n_kv > acc->keys_expected)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "blocks add up to more keys (%lld) than were summarised (%lld)",
                            (long long)(acc->keys_added + n_kv), (long long)acc->keys_expected);
    if (n_kv == 0)
        return FXA_OK;
    acc_job job = {
        .acc = acc,
        .k = k,
        .v = v,
        .n_kv = n_kv,
        .n_tiles = (n_kv + (int64_t)p->kv_tile - 1) / (int64_t)p->kv_tile,
        .k_strides = block_strides(p, n_kv, 0),
        .v_strides = block_strides(p, n_kv, 1),
    };
    int64_t block;
    const fxa_status st = identify_block(acc, k, v, n_kv, job.k_strides, job.v_strides, &block);
    if (st != FXA_OK)
        return st;
    acc->added[block] = 1;
    acc->keys_added += n_kv;
    const int64_t chunk_items = p->chunk_kv_heads * p->group / p->d.heads_per_tile * p->n_q_blocks;
    /* Waves of a few items per thread keep progress calls milliseconds apart. */
    const int64_t wave = 2 * (int64_t)p->ctx->pool.n_threads;
    for (job.batch = 0; job.batch < p->d.batch; job.batch++) {
        for (job.chunk_kv0 = 0; job.chunk_kv0 < p->d.heads_kv; job.chunk_kv0 += p->chunk_kv_heads) {
            fxa_pool_run(&p->ctx->pool, pack_item, &job, p->chunk_kv_heads * job.n_tiles);
            progress(acc);
            for (job.item0 = 0; job.item0 < chunk_items; job.item0 += wave) {
                const int64_t n = chunk_items - job.item0 < wave ? chunk_items - job.item0 : wave;
                fxa_pool_run(&p->ctx->pool, add_item, &job, n);
                progress(acc);
            }
        }
    }
    return FXA_OK;
}

fxa_status fxa_attn_acc_add(fxa_attn_acc *acc, const void *k, const void *v, int64_t n_kv)
{
    if (!acc)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(acc->p->ctx);
    return fxa_ctx_end_with(acc->p->ctx, acc_add(acc, k, v, n_kv));
}

/* Item (b * Hq + h, query block): normalise into out / lse / diagnostics. */
static void finish_item(void *arg, int64_t item, int thread_id)
{
    const acc_job *job = arg;
    const fxa_attn_acc *acc = job->acc;
    const fxa_attn_plan *p = acc->p;
    const fxa_attn_args *a = job->args;
    const int64_t bh = item / p->n_q_blocks;
    const int64_t b = bh / p->d.heads_q;
    const int64_t h = bh % p->d.heads_q;
    const int64_t i0 = item % p->n_q_blocks * p->d.block_q;
    const size_t n = (size_t)(p->d.seq_q - i0 < p->d.block_q ? p->d.seq_q - i0 : p->d.block_q);
    const int64_t diag = bh * p->d.seq_q + i0;
    const fxa_rows rows = state_rows(acc, b, h, i0);
    const fxa_head_bound *hb =
        (const fxa_head_bound *)(acc->ws + p->ws_bounds) + b * p->d.heads_kv + h / p->group;
    (void)thread_id;
    fxa_rows_finish(p, hb, &rows, n, a->out,
                    b * p->o_strides.batch + h * p->o_strides.head + i0 * p->o_strides.token,
                    p->o_strides.token, a->lse ? a->lse + diag : NULL,
                    a->lse_parts ? a->lse_parts + 3 * diag : NULL);
    if (a->row_bound)
        memcpy(a->row_bound + diag, acc->bound + diag, n * sizeof(float));
    if (a->row_fallback)
        for (size_t i = 0; i < n; i++)
            a->row_fallback[diag + (int64_t)i] = acc->online[diag + (int64_t)i] == FXA_ROW_ONLINE;
}

/* Refuse outputs that overlap Q (the pass's input) or each other. */
static fxa_status check_spans(const fxa_attn_acc *acc, const fxa_attn_args *a)
{
    const fxa_attn_plan *p = acc->p;
    const size_t rows = (size_t)acc->n_rows;
    const fxa_span in[1] = {{"Q", acc->q, (size_t)p->q_extent * p->in_elem}};
    const fxa_span out[5] = {
        {"out", a->out, (size_t)p->o_extent * p->out_elem},
        {"lse", a->lse, rows * sizeof(float)},
        {"lse_parts", a->lse_parts, 3 * rows * sizeof(float)},
        {"row_fallback", a->row_fallback, rows},
        {"row_bound", a->row_bound, rows * sizeof(float)},
    };
    return fxa_spans_disjoint(p->ctx, out, 5, in, 1);
}

static fxa_status acc_finish(fxa_attn_acc *acc, const fxa_attn_args *args,
                             fxa_attn_stats *stats_out)
{
    const fxa_attn_plan *p = acc->p;
    if (!acc->begun)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "fxa_attn_acc_finish before a successful begin");
    fxa_attn_args a_full = {0};
    fxa_status st =
        fxa_args_in(p->ctx, &a_full, sizeof a_full, args, FXA_ATTN_ARGS_SIZE_0_1, "fxa_attn_args");
    if (st != FXA_OK)
        return st;
    args = &a_full;
    if ((st = fxa_struct_out_check(stats_out, FXA_ATTN_STATS_SIZE_0_1, sizeof(fxa_attn_stats),
                                   "fxa_attn_stats", p->ctx->last_error,
                                   sizeof p->ctx->last_error)) != FXA_OK)
        return st;
    if (!args->out)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG, "attention args: out is NULL");
    if ((st = check_spans(acc, args)) != FXA_OK)
        return st;
    if (acc->keys_added != acc->keys_expected)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "blocks added hold %lld keys, the summaries %lld",
                            (long long)acc->keys_added, (long long)acc->keys_expected);
    if (args->lse) {
        st = fxa_lse_check(p, (const fxa_head_bound *)(acc->ws + p->ws_bounds),
                           p->d.batch * p->d.heads_kv, acc->keys_expected);
        if (st != FXA_OK)
            return st;
    }
    st = fxa_out_range_check(p, (const fxa_head_bound *)(acc->ws + p->ws_bounds),
                             p->d.batch * p->d.heads_kv);
    if (st != FXA_OK)
        return st;
    acc_job job = {.acc = acc, .args = args};
    fxa_pool_run(&p->ctx->pool, finish_item, &job, p->d.batch * p->d.heads_q * p->n_q_blocks);
    acc->begun = 0;
    if (!stats_out)
        return FXA_OK;
    const fxa_head_bound *hb = (const fxa_head_bound *)(acc->ws + p->ws_bounds);
    int c_min = hb[0].c;
    double vmax = 0.0;
    for (int64_t i = 0; i < p->d.batch * p->d.heads_kv; i++) {
        c_min = hb[i].c < c_min ? hb[i].c : c_min;
        vmax = hb[i].vmax > vmax ? hb[i].vmax : vmax;
    }
    double max_bound = 0.0;
    for (int64_t r = 0; r < acc->n_rows; r++)
        max_bound = acc->bound[r] > max_bound ? acc->bound[r] : max_bound;
    const fxa_attn_stats full = {
        .struct_size = sizeof full,
        .rows = acc->n_rows,
        .fallback_rows = acc->fallback_rows,
        .c_min = c_min,
        .gate_strict = fxa_fixed_m_gate_strict(c_min),
        .gate_centered = p->d.center ? fxa_fixed_m_gate_centered(c_min, acc->keys_expected) : 0,
        .vmax = vmax,
        .max_bound = max_bound,
        .seconds = fxa_now_seconds() - acc->t_begin,
        .keys = acc->keys_expected,
    };
    fxa_struct_out(stats_out, &full, sizeof full);
    return FXA_OK;
}

fxa_status fxa_attn_acc_finish(fxa_attn_acc *acc, const fxa_attn_args *args,
                               fxa_attn_stats *stats_out)
{
    if (!acc)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(acc->p->ctx);
    return fxa_ctx_end_with(acc->p->ctx, acc_finish(acc, args, stats_out));
}
