/* The bound pass (see scan.h). Threads over (batch, group of adjacent
 * heads); each head reports its first non-finite element and the lowest
 * (batch, head) wins, so the message does not depend on the thread count. */
#include "scan.h"

#include <math.h>

#include "load.h"
#include "summary.h"

typedef struct scan_job {
    const fxa_attn_plan *p;
    const void *x; /* Q, or K */
    const void *v;
    int64_t seq;
    fxa_strides strides;
    int64_t heads;      /* of x */
    int64_t group;      /* heads per item */
    double *summaries;  /* per (batch, head) */
    fxa_bad_value *bad; /* per (batch, head) */
} scan_job;

/* Heads per item: up to FXA_SUMMARY_GROUP adjacent heads, so that a
 * token-major row is read in runs of several heads, but about two items per
 * thread when heads are few. Grouping never changes a head's results. */
static int64_t heads_per_item(const fxa_attn_plan *p, int64_t heads)
{
    const int64_t items_per_batch =
        (2 * (int64_t)p->ctx->pool.n_threads + p->d.batch - 1) / p->d.batch;
    const int64_t g = (heads + items_per_batch - 1) / items_per_batch;
    return g < 1 ? 1 : g > FXA_SUMMARY_GROUP ? FXA_SUMMARY_GROUP : g;
}

/* Item (b, group): the first head and the number of heads. */
static int64_t item_heads(const scan_job *job, int64_t item, int64_t *b, int64_t *h0)
{
    const int64_t groups = (job->heads + job->group - 1) / job->group;
    *b = item / groups;
    *h0 = item % groups * job->group;
    return job->heads - *h0 < job->group ? job->heads - *h0 : job->group;
}

static void scan_kv_group(void *arg, int64_t item, int thread_id)
{
    const scan_job *job = arg;
    const fxa_attn_plan *p = job->p;
    int64_t b, h0;
    const int64_t nh = item_heads(job, item, &b, &h0);
    const int64_t first = b * job->heads + h0;
    (void)thread_id;
    fxa_summarize_heads(p, job->x, job->v, b * job->strides.batch + h0 * job->strides.head,
                        job->strides.head, job->strides.token, job->seq, nh,
                        job->summaries + (size_t)first * fxa_summary_head_len(p),
                        job->bad + first);
}

/* Item (b, group of q heads): Q must be finite; each head reports its
 * first non-finite element, reading the group token by token. */
static void scan_q_group(void *arg, int64_t item, int thread_id)
{
    const scan_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    int64_t b, h0;
    const int64_t nh = item_heads(job, item, &b, &h0);
    fxa_bad_value *bad = job->bad + b * job->heads + h0;
    float scratch[FXA_MAX_HEAD_DIM];
    (void)thread_id;
    for (int64_t h = 0; h < nh; h++)
        bad[h].bad_row = -1;
    for (int64_t i = 0; i < p->d.seq_q; i++)
        for (int64_t h = 0; h < nh; h++) {
            if (bad[h].bad_row >= 0)
                continue;
            const float *row = fxa_row_f32(p->ctx->kernels, job->x, p->d.dtype,
                                           b * job->strides.batch + (h0 + h) * job->strides.head +
                                               i * job->strides.token,
                                           dim, scratch);
            if (!p->ctx->kernels->row_stats->any_non_finite(row, dim))
                continue;
            size_t c = 0;
            while (isfinite(row[c]))
                c++;
            bad[h] = (fxa_bad_value){i, (int64_t)c, row[c], 'Q'};
        }
}

static fxa_status report_first_bad(const fxa_attn_plan *p, const fxa_bad_value *bad,
                                   int64_t n_items, int64_t heads)
{
    for (int64_t i = 0; i < n_items; i++) {
        if (bad[i].bad_row < 0)
            continue;
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "%c has a non-finite value (%g) at batch %lld, token %lld, head %lld, "
                            "dim %lld",
                            bad[i].tensor, (double)bad[i].bad_value, (long long)(i / heads),
                            (long long)bad[i].bad_row, (long long)(i % heads),
                            (long long)bad[i].bad_col);
    }
    return FXA_OK;
}

fxa_status fxa_scan_kv(const fxa_attn_plan *p, const void *k, const void *v, int64_t seq_kv,
                       fxa_strides kv_strides, double *summaries, void *bad)
{
    const int64_t group = heads_per_item(p, p->d.heads_kv);
    scan_job job = {p, k, v, seq_kv, kv_strides, p->d.heads_kv, group, summaries, bad};
    const int64_t n_items = p->d.batch * ((p->d.heads_kv + group - 1) / group);
    fxa_pool_run(&p->ctx->pool, scan_kv_group, &job, n_items);
    return report_first_bad(p, bad, p->d.batch * p->d.heads_kv, p->d.heads_kv);
}

fxa_status fxa_scan_q(const fxa_attn_plan *p, const void *q, void *bad)
{
    const int64_t group = heads_per_item(p, p->d.heads_q);
    scan_job job = {p, q, NULL, p->d.seq_q, p->q_strides, p->d.heads_q, group, NULL, bad};
    const int64_t n_items = p->d.batch * ((p->d.heads_q + group - 1) / group);
    fxa_pool_run(&p->ctx->pool, scan_q_group, &job, n_items);
    return report_first_bad(p, bad, p->d.batch * p->d.heads_q, p->d.heads_q);
}

fxa_status fxa_scan_inputs(const fxa_attn_plan *p, const fxa_attn_args *a, unsigned char *ws)
{
    double *summaries = (double *)(ws + p->ws_summary);
    fxa_head_bound *hb = (fxa_head_bound *)(ws + p->ws_bounds);
    float *kbar = (float *)(ws + p->ws_kbar);
    const size_t len = fxa_summary_head_len(p);
    fxa_status st = fxa_scan_kv(p, a->k, a->v, p->d.seq_kv, p->kv_strides, summaries,
                                ws + p->ws_scan);
    if (st != FXA_OK)
        return st;
    for (int64_t i = 0; i < p->d.batch * p->d.heads_kv; i++)
        fxa_summary_merge(p, summaries + (size_t)i * len, len, 1, hb + i,
                          kbar + (size_t)i * (size_t)p->d.head_dim);
    return fxa_scan_q(p, a->q, ws + p->ws_scan);
}
