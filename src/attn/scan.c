/* The bound pass (see scan.h). Threads over (batch, head); each item reports
 * its first non-finite element and the lowest item wins, so the message does
 * not depend on the thread count. */
#include "scan.h"

#include <math.h>

#include "bound.h"
#include "load.h"

typedef struct scan_job {
    const fxa_attn_plan *p;
    const fxa_attn_args *a;
    unsigned char *ws;
} scan_job;

static void note_bad(fxa_scan_result *r, char tensor, int64_t row, const float *x, size_t d)
{
    for (size_t c = 0; c < d; c++) {
        if (!isfinite(x[c])) {
            r->tensor = tensor;
            r->bad_row = row;
            r->bad_col = (int64_t)c;
            r->bad_value = x[c];
            return;
        }
    }
}

static int row_finite(const float *x, size_t d)
{
    int ok = 1;
    for (size_t c = 0; c < d; c++)
        ok &= isfinite(x[c]) != 0;
    return ok;
}

/* sum_c (x_c - center_c)^2 in double (center may be NULL), four interleaved
 * partial sums: a fixed order that compilers vectorise. */
static double squared_distance(const float *x, const float *center, size_t d)
{
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    for (size_t c = 0; c < d; c++) {
        const double diff = (double)x[c] - (center ? (double)center[c] : 0.0);
        acc[c % 4] += diff * diff;
    }
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

/* max_c |x_c| (exact in fp32), eight partial maxima. */
static float abs_max(const float *x, size_t d)
{
    float m[8] = {0.0f};
    for (size_t c = 0; c < d; c++) {
        const float a = fabsf(x[c]);
        m[c % 8] = a > m[c % 8] ? a : m[c % 8];
    }
    float r = 0.0f;
    for (int i = 0; i < 8; i++)
        r = m[i] > r ? m[i] : r;
    return r;
}

/* Item (b, kvh): key mean, radii and Vmax of one kv head. Uses a stack row
 * buffer; two passes over K (the radius needs the mean first). */
static void scan_kv_head(void *arg, int64_t item, int thread_id)
{
    const scan_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    const int64_t b = item / p->d.heads_kv;
    const int64_t h = item % p->d.heads_kv;
    const int64_t base = b * p->kv_strides.batch + h * p->kv_strides.head;
    const int64_t n = p->d.seq_kv;
    fxa_head_bound *hb = (fxa_head_bound *)(job->ws + p->ws_bounds) + item;
    float *kbar = (float *)(job->ws + p->ws_kbar) + (size_t)item * dim;
    fxa_scan_result *res = (fxa_scan_result *)(job->ws + p->ws_scan) + item;
    double sum[FXA_MAX_HEAD_DIM] = {0};
    float row[FXA_MAX_HEAD_DIM];
    double kmax2 = 0.0;
    double vmax = 0.0;
    (void)thread_id;
    res->bad_row = -1;
    for (int64_t j = 0; j < n; j++) {
        fxa_load_row(p->ctx->kernels, job->a->k, p->d.dtype, base + j * p->kv_strides.token, dim, row);
        if (!row_finite(row, dim)) {
            note_bad(res, 'K', j, row, dim);
            return;
        }
        for (size_t c = 0; c < dim; c++)
            sum[c] += row[c];
        const double nn = squared_distance(row, NULL, dim);
        kmax2 = nn > kmax2 ? nn : kmax2;
    }
    for (int64_t j = 0; j < n; j++) {
        fxa_load_row(p->ctx->kernels, job->a->v, p->d.dtype, base + j * p->kv_strides.token, dim, row);
        if (!row_finite(row, dim)) {
            note_bad(res, 'V', j, row, dim);
            return;
        }
        const double a = abs_max(row, dim);
        vmax = a > vmax ? a : vmax;
    }
    hb->kmax = sqrt(kmax2);
    hb->radius = hb->kmax;
    for (size_t c = 0; c < dim; c++)
        kbar[c] = p->d.center ? (float)(sum[c] / (double)n) : 0.0f;
    if (p->d.center) {
        /* The radius around the fp32 kbar the kernels subtract: the bound and
         * the scores must use the same keys. */
        double r2 = 0.0;
        for (int64_t j = 0; j < n; j++) {
            fxa_load_row(p->ctx->kernels, job->a->k, p->d.dtype, base + j * p->kv_strides.token, dim, row);
            const double nn = squared_distance(row, kbar, dim);
            r2 = nn > r2 ? nn : r2;
        }
        hb->radius = sqrt(r2);
    }
    hb->eps_radius = (double)(dim + 2) * 0x1p-23 * hb->kmax;
    hb->vmax = vmax;
    hb->c = fxa_fixed_m_c(n, vmax);
    hb->gate_strict = fxa_fixed_m_gate_strict(hb->c);
    hb->gate_centered = fxa_fixed_m_gate_centered(hb->c, n);
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
    fxa_scan_result *res = (fxa_scan_result *)(job->ws + p->ws_scan) + item;
    float row[FXA_MAX_HEAD_DIM];
    (void)thread_id;
    res->bad_row = -1;
    for (int64_t i = 0; i < p->d.seq_q; i++) {
        fxa_load_row(p->ctx->kernels, job->a->q, p->d.dtype, base + i * p->q_strides.token, dim, row);
        if (!row_finite(row, dim)) {
            note_bad(res, 'Q', i, row, dim);
            return;
        }
    }
}

static fxa_status report_first_bad(const fxa_attn_plan *p, const unsigned char *ws,
                                   int64_t n_items, int64_t heads)
{
    const fxa_scan_result *res = (const fxa_scan_result *)(ws + p->ws_scan);
    for (int64_t i = 0; i < n_items; i++) {
        if (res[i].bad_row < 0)
            continue;
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "%c has a non-finite value (%g) at batch %lld, token %lld, head %lld, "
                            "dim %lld",
                            res[i].tensor, (double)res[i].bad_value, (long long)(i / heads),
                            (long long)res[i].bad_row, (long long)(i % heads),
                            (long long)res[i].bad_col);
    }
    return FXA_OK;
}

fxa_status fxa_scan_inputs(const fxa_attn_plan *p, const fxa_attn_args *a, unsigned char *ws)
{
    scan_job job = {p, a, ws};
    const int64_t n_kv_items = p->d.batch * p->d.heads_kv;
    const int64_t n_q_items = p->d.batch * p->d.heads_q;
    fxa_pool_run(&p->ctx->pool, scan_kv_head, &job, n_kv_items);
    fxa_status st = report_first_bad(p, ws, n_kv_items, p->d.heads_kv);
    if (st != FXA_OK)
        return st;
    fxa_pool_run(&p->ctx->pool, scan_q_head, &job, n_q_items);
    return report_first_bad(p, ws, n_q_items, p->d.heads_q);
}
