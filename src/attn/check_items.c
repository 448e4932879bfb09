/*
 * The arithmetic of a check run (check_internal.h): norms, key means and
 * radii and the true row max of sampled rows, fp64 over the values the
 * kernels see (rows read with the plan's strides and widened by
 * fxa_row_f32). Every item's arithmetic runs in a fixed order on its own
 * slice of the workspace, so the report does not depend on the thread
 * count.
 */
#include <math.h>
#include <string.h>

#include "check_internal.h"
#include "load.h"

size_t fxa_check_scratch_len(const fxa_attn_desc *d, int64_t samples)
{
    const size_t n = (size_t)(d->batch * d->seq_q);
    return 4 * n + 2 * (size_t)samples * (size_t)d->batch;
}

/* Sort x[0..n) ascending, stably, with tmp[0..n) as scratch: a top-down
 * merge sort that splits at n / 2 and takes the left element on ties, so
 * that equal values (0.0 and -0.0) keep their order. */
static void merge_sort(double *x, size_t n, double *tmp)
{
    if (n <= 1)
        return;
    const size_t n1 = n / 2;
    merge_sort(x, n1, tmp);
    merge_sort(x + n1, n - n1, tmp);
    size_t i = 0, j = n1, o = 0;
    while (i < n1 && j < n)
        tmp[o++] = !(x[j] < x[i]) ? x[i++] : x[j++];
    while (i < n1)
        tmp[o++] = x[i++];
    memcpy(x, tmp, o * sizeof *x);
}

/* The upper median (element n/2 once sorted); sorts x. 0 when n is 0. */
static double median(double *x, size_t n, double *tmp)
{
    if (!n)
        return 0.0;
    merge_sort(x, n, tmp);
    return x[n / 2];
}

static const float *row_of(const fxa_attn_plan *p, const void *base, fxa_strides s, int64_t b,
                           int64_t h, int64_t j, float *buf)
{
    const int64_t off = b * s.batch + h * s.head + j * s.token;
    return fxa_row_f32(p->ctx->kernels, base, p->d.dtype, off, (size_t)p->d.head_dim, buf);
}

void fxa_check_keys_item(void *arg, int64_t item, int thread_id)
{
    const fxa_check_job *job = arg;
    const fxa_attn_plan *p = job->plan->centred;
    const int64_t dim = p->d.head_dim;
    const int64_t b = item / p->d.heads_kv;
    const int64_t kvh = item % p->d.heads_kv;
    float *buf = job->rows + (size_t)thread_id * 2 * (size_t)dim;
    double *kbar = job->kbar + (size_t)item * (size_t)dim;
    fxa_check_keys *ks = &job->keys[item];
    ks->kmax = ks->radius = ks->vmax = 0.0;
    for (int64_t c = 0; c < dim; c++)
        kbar[c] = 0.0;
    for (int64_t j = 0; j < p->d.seq_kv; j++) {
        const float *kj = row_of(p, job->k, p->k_strides, b, kvh, j, buf);
        double nn = 0.0;
        for (int64_t c = 0; c < dim; c++) {
            kbar[c] += kj[c] / (double)p->d.seq_kv;
            nn += (double)kj[c] * kj[c];
        }
        ks->kmax = fmax(ks->kmax, sqrt(nn));
        if (job->v) {
            const float *vj = row_of(p, job->v, p->v_strides, b, kvh, j, buf + dim);
            for (int64_t c = 0; c < dim; c++)
                ks->vmax = fmax(ks->vmax, fabs((double)vj[c]));
        }
    }
    for (int64_t j = 0; j < p->d.seq_kv; j++) {
        const float *kj = row_of(p, job->k, p->k_strides, b, kvh, j, buf);
        double nn = 0.0;
        for (int64_t c = 0; c < dim; c++)
            nn += pow(kj[c] - kbar[c], 2.0);
        ks->radius = fmax(ks->radius, sqrt(nn));
    }
}

/* The true max over keys of the base-2 scores of row (b, h, i), raw and
 * centred on the key mean kbar. */
static void true_max(const fxa_check_job *job, const float *qi, const double *kbar, int64_t b,
                     int64_t kvh, float *buf, double *raw, double *centred)
{
    const fxa_attn_plan *p = job->plan->centred;
    const int64_t dim = p->d.head_dim;
    double qk_bar = 0.0;
    double best = -INFINITY;
    for (int64_t c = 0; c < dim; c++)
        qk_bar += qi[c] * kbar[c];
    for (int64_t j = 0; j < p->d.seq_kv; j++) {
        const float *kj = row_of(p, job->k, p->k_strides, b, kvh, j, buf);
        double s = 0.0;
        for (int64_t c = 0; c < dim; c++)
            s += (double)qi[c] * kj[c];
        best = fmax(best, p->lambda * s);
    }
    *raw = best;
    *centred = best - p->lambda * qk_bar;
}

void fxa_check_head_item(void *arg, int64_t h, int thread_id)
{
    const fxa_check_job *job = arg;
    const fxa_check_plan *plan = job->plan;
    const fxa_attn_plan *p = plan->centred;
    const fxa_attn_desc *d = &p->d;
    const int64_t n = d->batch * d->seq_q;
    const int64_t kvh = h / p->group;
    float *qbuf = job->rows + (size_t)thread_id * 2 * (size_t)d->head_dim;
    float *kbuf = qbuf + d->head_dim;
    double *scratch = job->scratch + (size_t)thread_id * plan->scratch_len;
    double *over = scratch + 3 * n;
    double *over_raw = over + plan->samples * d->batch;
    double *sort_tmp = over_raw + plan->samples * d->batch;
    int64_t n_over = 0;
    int64_t fb_count_c = 0;
    int64_t fb_count_r = 0;
    fxa_check_head r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    for (int64_t b = 0; b < d->batch; b++) {
        const int64_t kv_item = b * d->heads_kv + kvh;
        const fxa_check_keys *ks = &job->keys[kv_item];
        const double *kbar = job->kbar + (size_t)kv_item * (size_t)d->head_dim;
        r.k_norm_max = fmax(r.k_norm_max, ks->kmax);
        r.k_radius_centered = fmax(r.k_radius_centered, ks->radius);
        r.vmax = fmax(r.vmax, ks->vmax);
        for (int64_t i = 0; i < d->seq_q; i++) {
            const int64_t row = (b * d->heads_q + h) * d->seq_q + i;
            const float *qi = row_of(p, job->q, p->q_strides, b, h, i, qbuf);
            double nn = 0.0;
            for (int64_t c = 0; c < d->head_dim; c++)
                nn += (double)qi[c] * qi[c];
            scratch[b * d->seq_q + i] = sqrt(nn);
            scratch[n + b * d->seq_q + i] = job->bound_c[row];
            scratch[2 * n + b * d->seq_q + i] = job->bound_r[row];
            fb_count_c += job->fb_c[row];
            fb_count_r += job->fb_r[row];
        }
        for (int64_t s = 0; s < plan->samples; s++) {
            const int64_t i = plan->samples > 1 ? s * (d->seq_q - 1) / (plan->samples - 1) : 0;
            const int64_t row = (b * d->heads_q + h) * d->seq_q + i;
            const float *qi = row_of(p, job->q, p->q_strides, b, h, i, qbuf);
            double raw;
            double centred;
            true_max(job, qi, kbar, b, kvh, kbuf, &raw, &centred);
            over[n_over] = job->bound_c[row] - centred;
            over_raw[n_over++] = job->bound_r[row] - raw;
        }
    }
    if (!job->v)
        r.vmax = 1.0; /* V taken as zeros: C as for Vmax 1 */
    r.c = fxa_fixed_m_c(d->seq_kv, r.vmax);
    r.gate = fxa_fixed_m_gate_strict(r.c);
    r.gate_centered = fxa_fixed_m_gate_centered(r.c, d->seq_kv);
    r.rows = n;
    r.fallback_rows_centered = fb_count_c;
    r.fallback_rows_raw = fb_count_r;
    r.sampled_rows = n_over;
    r.fallback_share_centered = (double)fb_count_c / (double)n;
    r.fallback_share_raw = (double)fb_count_r / (double)n;
    r.q_norm_min = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        r.q_norm_max = fmax(r.q_norm_max, scratch[i]);
        r.q_norm_min = fmin(r.q_norm_min, scratch[i]);
        r.bound_max = fmax(r.bound_max, scratch[n + i]);
        r.bound_raw_max = fmax(r.bound_raw_max, scratch[2 * n + i]);
    }
    r.q_norm_median = median(scratch, (size_t)n, sort_tmp);
    r.bound_median = median(scratch + n, (size_t)n, sort_tmp);
    r.bound_raw_median = median(scratch + 2 * n, (size_t)n, sort_tmp);
    for (int64_t i = 0; i < n_over; i++) {
        r.overshoot_max = fmax(r.overshoot_max, over[i]);
        r.overshoot_raw_max = fmax(r.overshoot_raw_max, over_raw[i]);
    }
    r.overshoot_median = median(over, (size_t)n_over, sort_tmp);
    r.overshoot_raw_median = median(over_raw, (size_t)n_over, sort_tmp);
    job->heads[h] = r;
}
