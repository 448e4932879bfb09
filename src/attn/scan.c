/* The bound pass (see scan.h). Threads over (batch, head); each item reports
 * its first non-finite element and the lowest item wins, so the message does
 * not depend on the thread count. */
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
    double *summaries;
    fxa_bad_value *bad;
} scan_job;

static void scan_kv_head(void *arg, int64_t item, int thread_id)
{
    const scan_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const int64_t b = item / p->d.heads_kv;
    const int64_t h = item % p->d.heads_kv;
    (void)thread_id;
    fxa_summarize_head(p, job->x, job->v, b * job->strides.batch + h * job->strides.head,
                       job->strides.token, job->seq,
                       job->summaries + (size_t)item * fxa_summary_head_len(p), job->bad + item);
}

/* Item (b, hq): Q must be finite. */
static void scan_q_head(void *arg, int64_t item, int thread_id)
{
    const scan_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    const int64_t b = item / p->d.heads_q;
    const int64_t h = item % p->d.heads_q;
    const int64_t base = b * p->q_strides.batch + h * p->q_strides.head;
    fxa_bad_value *bad = job->bad + item;
    float scratch[FXA_MAX_HEAD_DIM];
    (void)thread_id;
    bad->bad_row = -1;
    for (int64_t i = 0; i < p->d.seq_q; i++) {
        const float *row = fxa_row_f32(p->ctx->kernels, job->x, p->d.dtype,
                                       base + i * p->q_strides.token, dim, scratch);
        if (!fxa_any_non_finite(row, dim))
            continue;
        for (size_t c = 0; c < dim; c++) {
            if (!isfinite(row[c])) {
                *bad = (fxa_bad_value){i, (int64_t)c, row[c], 'Q'};
                return;
            }
        }
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
    scan_job job = {p, k, v, seq_kv, kv_strides, summaries, bad};
    const int64_t n_items = p->d.batch * p->d.heads_kv;
    fxa_pool_run(&p->ctx->pool, scan_kv_head, &job, n_items);
    return report_first_bad(p, bad, n_items, p->d.heads_kv);
}

fxa_status fxa_scan_q(const fxa_attn_plan *p, const void *q, void *bad)
{
    scan_job job = {p, q, NULL, p->d.seq_q, p->q_strides, NULL, bad};
    const int64_t n_items = p->d.batch * p->d.heads_q;
    fxa_pool_run(&p->ctx->pool, scan_q_head, &job, n_items);
    return report_first_bad(p, bad, n_items, p->d.heads_q);
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
