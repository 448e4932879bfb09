/* The bound pass (see scan.h). Work items are (batch, token block, group of
 * heads): a token block of all heads is one contiguous run of memory in a
 * token-major layout, read at full bandwidth. Token blocks depend on the
 * sequence length alone (reproducible plans: the canonical groups) and their
 * partial sums add in block order, so the results never depend on the
 * thread count; head groups only spread the work. Each head reports
 * its first non-finite element (K before V) and the lowest (batch, head)
 * wins. */
#include "scan.h"

#include <math.h>
#include <string.h>

#include "../base/alloc.h"
#include "steps.h"
#include "summary.h"

#define SCAN_MIN_TOKENS 256 /* tokens per block, at least (unless the sequence is shorter) */
#define SCAN_MAX_BLOCKS 32  /* blocks per sequence, at most */

/* Tokens per scan block for a sequence of seq tokens (0 when seq is 0):
 * reproducible plans scan canonical groups (FXA_CANONICAL_KEYS from token
 * 0), others at least SCAN_MIN_TOKENS in at most SCAN_MAX_BLOCKS blocks. */
static int64_t block_tokens(const fxa_attn_plan *p, int64_t seq)
{
    if (p->d.reproducible)
        return seq < FXA_CANONICAL_KEYS ? seq : FXA_CANONICAL_KEYS;
    int64_t n_blocks = (seq + SCAN_MIN_TOKENS - 1) / SCAN_MIN_TOKENS;
    n_blocks = n_blocks < SCAN_MAX_BLOCKS ? n_blocks : SCAN_MAX_BLOCKS;
    return n_blocks ? (seq + n_blocks - 1) / n_blocks : 0;
}

static int64_t n_blocks_of(const fxa_attn_plan *p, int64_t seq)
{
    const int64_t t = block_tokens(p, seq);
    return t ? (seq + t - 1) / t : 0;
}

typedef struct scan_job {
    const fxa_attn_plan *p;
    const void *x; /* Q, or K */
    const void *v;
    int64_t seq;
    fxa_strides strides;
    fxa_strides v_strides; /* of v (K/V) */
    int64_t heads;         /* of x */
    int64_t block_tokens;
    int64_t n_blocks;
    int64_t heads_per_item;
    double *partials;   /* [n_blocks][B heads][part_len] (K/V) */
    fxa_bad_value *bad; /* [n_blocks][B heads][2] (K/V) or [n_blocks][B heads] (Q) */
    double *qq;         /* [n_blocks][B heads]: max ||q||^2 (Q) */
    const float *means; /* the radius pass's centres: [B heads][D], or with
                           group_means [n_blocks][B heads][D] */
    int group_means;    /* each group's radius around its own mean (reproducible) */
} scan_job;

/* Enough items for about two per thread: heads are split into groups when
 * batch x token blocks is smaller. */
static void plan_items(scan_job *job)
{
    const fxa_attn_plan *p = job->p;
    const int64_t want = 2 * (int64_t)p->ctx->pool.n_threads;
    const int64_t have = p->d.batch * job->n_blocks;
    int64_t groups = have == 0 || have >= want ? 1 : (want + have - 1) / have;
    groups = groups < job->heads ? groups : job->heads;
    job->heads_per_item = (job->heads + groups - 1) / groups;
}

static int64_t n_items(const scan_job *job)
{
    const int64_t groups = (job->heads + job->heads_per_item - 1) / job->heads_per_item;
    return job->p->d.batch * job->n_blocks * groups;
}

/* Item (batch, block, head group): its rows (of x, or of v with v_rows),
 * and its first (batch, head) and block. */
static fxa_row_block item_rows_of(const scan_job *job, int64_t item, int64_t *bh, int64_t *block,
                                  int v_rows)
{
    const fxa_strides *s = v_rows ? &job->v_strides : &job->strides;
    const int64_t groups = (job->heads + job->heads_per_item - 1) / job->heads_per_item;
    const int64_t b = item / (job->n_blocks * groups);
    const int64_t h0 = item % groups * job->heads_per_item;
    const int64_t j0 = item / groups % job->n_blocks * job->block_tokens;
    *bh = b * job->heads + h0;
    *block = j0 / job->block_tokens;
    return (fxa_row_block){
        .off = b * s->batch + h0 * s->head + j0 * s->token,
        .head_stride = s->head,
        .token_stride = s->token,
        .n_tokens = job->seq - j0 < job->block_tokens ? job->seq - j0 : job->block_tokens,
        .n_heads = job->heads - h0 < job->heads_per_item ? job->heads - h0 : job->heads_per_item,
    };
}

static fxa_row_block item_rows(const scan_job *job, int64_t item, int64_t *bh, int64_t *block)
{
    return item_rows_of(job, item, bh, block, 0);
}

static size_t partial_index(const scan_job *job, int64_t block, int64_t bh)
{
    return (size_t)(block * job->p->d.batch * job->heads + bh);
}

static void summarize_item(void *arg, int64_t item, int thread_id)
{
    const scan_job *job = arg;
    int64_t bh, block;
    const fxa_row_block blk = item_rows(job, item, &bh, &block);
    const fxa_row_block vblk = item_rows_of(job, item, &bh, &block, 1);
    const size_t at = partial_index(job, block, bh);
    (void)thread_id;
    fxa_summarize_block(job->p, job->x, job->v, &blk, &vblk,
                        job->partials + at * fxa_summary_part_len(job->p), job->bad + 2 * at);
}

static void radius_item(void *arg, int64_t item, int thread_id)
{
    const scan_job *job = arg;
    int64_t bh, block;
    const fxa_row_block blk = item_rows(job, item, &bh, &block);
    (void)thread_id;
    const size_t centre = job->group_means ? partial_index(job, block, bh) : (size_t)bh;
    fxa_radius_block(job->p, job->x, &blk, job->means + centre * (size_t)job->p->d.head_dim,
                     job->partials + partial_index(job, block, bh) * fxa_summary_part_len(job->p));
}

static void check_item(void *arg, int64_t item, int thread_id)
{
    const scan_job *job = arg;
    int64_t bh, block;
    const fxa_row_block blk = item_rows(job, item, &bh, &block);
    (void)thread_id;
    fxa_check_block(job->p, job->x, &blk, job->bad + partial_index(job, block, bh),
                    job->qq + partial_index(job, block, bh));
}

/* The first bad value of (batch, head) bh over the blocks (slot `slot` of
 * `slots` per block entry), its token made absolute; bad_row -1 if none. */
static fxa_bad_value first_bad(const scan_job *job, int64_t bh, int slots, int slot)
{
    for (int64_t block = 0; block < job->n_blocks; block++) {
        fxa_bad_value b = job->bad[(size_t)slots * partial_index(job, block, bh) + (size_t)slot];
        if (b.bad_row >= 0) {
            b.bad_row += block * job->block_tokens;
            return b;
        }
    }
    return (fxa_bad_value){.bad_row = -1};
}

static fxa_status report_bad(const fxa_attn_plan *p, const fxa_bad_value *b, int64_t bh,
                             int64_t heads)
{
    return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                        "%c has a non-finite value (%g) at batch %lld, token %lld, head %lld, "
                        "dim %lld",
                        b->tensor, (double)b->bad_value, (long long)(bh / heads),
                        (long long)b->bad_row, (long long)(bh % heads), (long long)b->bad_col);
}

size_t fxa_scan_kv_scratch_bytes(const fxa_attn_plan *p, int64_t seq_kv)
{
    const size_t n = (size_t)(n_blocks_of(p, seq_kv) * p->d.batch * p->d.heads_kv);
    const size_t centres = p->d.reproducible ? n : (size_t)(p->d.batch * p->d.heads_kv);
    return fxa_align_up(n * fxa_summary_part_len(p) * sizeof(double)) +
           fxa_align_up(2 * n * sizeof(fxa_bad_value)) +
           fxa_align_up(centres * (size_t)p->d.head_dim * sizeof(float));
}

size_t fxa_scan_q_scratch_bytes(const fxa_attn_plan *p)
{
    const size_t n = (size_t)(n_blocks_of(p, p->d.seq_q) * p->d.batch * p->d.heads_q);
    return fxa_align_up(n * sizeof(fxa_bad_value)) + fxa_align_up(n * sizeof(double));
}

/* Reproducible plans: each group's radius around its own fp32 mean, and
 * the head's section of groups [n_g, radius_g, key sum_g] (summary.h); the
 * head's radius s[2] is then the groups' union around the head's mean. */
static void group_radii(const fxa_attn_plan *p, scan_job *job, float *means, double *summaries)
{
    const size_t len = fxa_summary_head_len(p);
    const size_t part_len = fxa_summary_part_len(p);
    const size_t dim = (size_t)p->d.head_dim;
    const int64_t heads = p->d.batch * job->heads;
    for (int64_t block = 0; block < job->n_blocks; block++) {
        for (int64_t bh = 0; bh < heads; bh++) {
            const size_t at = partial_index(job, block, bh);
            const double *part = job->partials + at * part_len;
            fxa_fp32_mean(part + FXA_SUMMARY_FIXED, part[0], dim, means + at * dim);
        }
    }
    job->means = means;
    job->group_means = 1;
    fxa_pool_run(&p->ctx->pool, radius_item, job, n_items(job));
    for (int64_t bh = 0; bh < heads; bh++) {
        double *s = summaries + (size_t)bh * len;
        double *g = s + FXA_SUMMARY_FIXED + dim;
        for (int64_t block = 0; block < job->n_blocks; block++, g += FXA_GROUP_FIXED + dim) {
            const double *part = job->partials + partial_index(job, block, bh) * part_len;
            g[0] = part[0];
            g[1] = sqrt(part[2]);
            memcpy(g + FXA_GROUP_FIXED, part + FXA_SUMMARY_FIXED, dim * sizeof(double));
        }
        float mean[FXA_MAX_HEAD_DIM];
        fxa_fp32_mean(s + FXA_SUMMARY_FIXED, s[0], dim, mean);
        s[2] = fxa_groups_radius(p, s, 1, len, mean);
    }
}

fxa_status fxa_scan_kv(const fxa_attn_plan *p, const void *k, const void *v, int64_t seq_kv,
                       fxa_strides k_strides, fxa_strides v_strides, double *summaries,
                       void *scratch)
{
    const size_t len = fxa_summary_head_len(p);
    const size_t part_len = fxa_summary_part_len(p);
    const size_t dim = (size_t)p->d.head_dim;
    const int64_t heads = p->d.batch * p->d.heads_kv;
    scan_job job = {.p = p,
                    .x = k,
                    .v = v,
                    .seq = seq_kv,
                    .strides = k_strides,
                    .v_strides = v_strides,
                    .heads = p->d.heads_kv,
                    .block_tokens = block_tokens(p, seq_kv),
                    .n_blocks = n_blocks_of(p, seq_kv)};
    const size_t n = (size_t)(job.n_blocks * heads);
    unsigned char *at = scratch;
    job.partials = (double *)at;
    at += fxa_align_up(n * part_len * sizeof(double));
    job.bad = (fxa_bad_value *)at;
    at += fxa_align_up(2 * n * sizeof(fxa_bad_value));
    float *means = (float *)at;
    job.means = means;
    plan_items(&job);
    fxa_pool_run(&p->ctx->pool, summarize_item, &job, n_items(&job));

    /* Each head: K's first bad value, else V's. */
    for (int64_t bh = 0; bh < heads; bh++) {
        fxa_bad_value b = first_bad(&job, bh, 2, 0);
        if (b.bad_row < 0)
            b = first_bad(&job, bh, 2, 1);
        if (b.bad_row >= 0)
            return report_bad(p, &b, bh, p->d.heads_kv);
    }
    /* Add the groups in order: counts and key sums add, maxima merge. */
    for (int64_t bh = 0; bh < heads; bh++) {
        double *s = summaries + (size_t)bh * len;
        memset(s, 0, len * sizeof(double));
        for (int64_t block = 0; block < job.n_blocks; block++) {
            const double *part = job.partials + partial_index(&job, block, bh) * part_len;
            s[0] += part[0];
            s[1] = part[1] > s[1] ? part[1] : s[1];
            s[3] = part[3] > s[3] ? part[3] : s[3];
            for (size_t c = 0; c < dim; c++)
                s[FXA_SUMMARY_FIXED + c] += part[FXA_SUMMARY_FIXED + c];
        }
        s[1] = sqrt(s[1]);
        s[2] = s[1];
        if (s[0] >= 1.0 && !p->d.reproducible)
            fxa_fp32_mean(s + FXA_SUMMARY_FIXED, s[0], dim, means + (size_t)bh * dim);
    }
    if (!p->d.center || seq_kv == 0)
        return FXA_OK;
    if (p->d.reproducible) {
        group_radii(p, &job, means, summaries);
        return FXA_OK;
    }
    /* The radius around the fp32 mean the kernels subtract: the bound and
     * the scores must use the same keys. */
    fxa_pool_run(&p->ctx->pool, radius_item, &job, n_items(&job));
    for (int64_t bh = 0; bh < heads; bh++) {
        double r2 = 0.0;
        for (int64_t block = 0; block < job.n_blocks; block++) {
            const double r = job.partials[partial_index(&job, block, bh) * part_len + 2];
            r2 = r > r2 ? r : r2;
        }
        summaries[(size_t)bh * len + 2] = sqrt(r2);
    }
    return FXA_OK;
}

fxa_status fxa_scan_q(const fxa_attn_plan *p, const void *q, void *scratch, fxa_head_bound *hb)
{
    const int64_t n_blocks = n_blocks_of(p, p->d.seq_q);
    const int64_t heads = p->d.batch * p->d.heads_q;
    unsigned char *at = scratch;
    scan_job job = {.p = p,
                    .x = q,
                    .seq = p->d.seq_q,
                    .strides = p->q_strides,
                    .heads = p->d.heads_q,
                    .block_tokens = block_tokens(p, p->d.seq_q),
                    .n_blocks = n_blocks,
                    .bad = (fxa_bad_value *)at};
    job.qq = (double *)(at + fxa_align_up((size_t)(n_blocks * heads) * sizeof(fxa_bad_value)));
    plan_items(&job);
    fxa_pool_run(&p->ctx->pool, check_item, &job, n_items(&job));
    for (int64_t bh = 0; bh < heads; bh++) {
        const fxa_bad_value b = first_bad(&job, bh, 1, 0);
        if (b.bad_row >= 0)
            return report_bad(p, &b, bh, p->d.heads_q);
    }
    /* max ||q|| per (batch, kv head): over its query heads and the blocks. */
    for (int64_t bh = 0; bh < heads; bh++) {
        fxa_head_bound *h = hb + bh / p->group;
        for (int64_t block = 0; block < n_blocks; block++) {
            const double qn = sqrt(job.qq[partial_index(&job, block, bh)]);
            h->qmax = qn > h->qmax ? qn : h->qmax;
        }
    }
    return FXA_OK;
}

fxa_status fxa_scan_inputs(const fxa_attn_plan *p, const fxa_attn_args *a, unsigned char *ws)
{
    double *summaries = (double *)(ws + p->ws_summary);
    fxa_head_bound *hb = (fxa_head_bound *)(ws + p->ws_bounds);
    float *kbar = (float *)(ws + p->ws_kbar);
    const size_t len = fxa_summary_head_len(p);
    fxa_status st = fxa_scan_kv(p, a->k, a->v, p->d.seq_kv, p->k_strides, p->v_strides, summaries,
                                ws + p->ws_scan);
    if (st != FXA_OK)
        return st;
    const int64_t n_heads = p->d.batch * p->d.heads_kv;
    for (int64_t i = 0; i < n_heads; i++)
        fxa_summary_merge(p, summaries + (size_t)i * len, len, 1, hb + i,
                          kbar + (size_t)i * (size_t)p->d.head_dim);
    st = fxa_scan_q(p, a->q, ws + p->ws_scan, hb);
    for (int64_t i = 0; st == FXA_OK && i < n_heads; i++)
        st = fxa_head_prescale(p, hb + i, i);
    return st;
}
