/* Key/value summaries and their merge (see summary.h). */
#include "summary.h"

#include <math.h>
#include <string.h>

#include "load.h"

size_t fxa_summary_head_len(const fxa_attn_plan *p)
{
    return FXA_SUMMARY_FIXED + (size_t)p->d.head_dim;
}

static int note_bad(fxa_bad_value *bad, char tensor, int64_t row, const float *x, size_t d)
{
    int ok = 1;
    for (size_t c = 0; c < d; c++)
        ok &= isfinite(x[c]) != 0;
    if (ok)
        return 0;
    for (size_t c = 0; c < d; c++) {
        if (!isfinite(x[c])) {
            bad->tensor = tensor;
            bad->bad_row = row;
            bad->bad_col = (int64_t)c;
            bad->bad_value = x[c];
            break;
        }
    }
    return 1;
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

/* The fp32 mean the kernels subtract: (float)(sum / n) per dimension. */
static void fp32_mean(const double *sum, double n, size_t dim, float *mean)
{
    for (size_t c = 0; c < dim; c++)
        mean[c] = (float)(sum[c] / n);
}

void fxa_summarize_head(const fxa_attn_plan *p, const void *k, const void *v, int64_t off,
                        int64_t token_stride, int64_t n, double *summary, fxa_bad_value *bad)
{
    const size_t dim = (size_t)p->d.head_dim;
    double *sum = summary + FXA_SUMMARY_FIXED;
    float row[FXA_MAX_HEAD_DIM];
    double kmax2 = 0.0;
    double vmax = 0.0;
    bad->bad_row = -1;
    memset(summary, 0, fxa_summary_head_len(p) * sizeof(double));
    for (int64_t j = 0; j < n; j++) {
        fxa_load_row(p->ctx->kernels, k, p->d.dtype, off + j * token_stride, dim, row);
        if (note_bad(bad, 'K', j, row, dim))
            return;
        for (size_t c = 0; c < dim; c++)
            sum[c] += row[c];
        const double nn = squared_distance(row, NULL, dim);
        kmax2 = nn > kmax2 ? nn : kmax2;
    }
    for (int64_t j = 0; j < n; j++) {
        fxa_load_row(p->ctx->kernels, v, p->d.dtype, off + j * token_stride, dim, row);
        if (note_bad(bad, 'V', j, row, dim))
            return;
        const double a = abs_max(row, dim);
        vmax = a > vmax ? a : vmax;
    }
    summary[0] = (double)n;
    summary[1] = sqrt(kmax2);
    summary[2] = summary[1];
    summary[3] = vmax;
    if (p->d.center && n > 0) {
        /* The radius around the fp32 mean the kernels subtract: the bound
         * and the scores must use the same keys. */
        float mean[FXA_MAX_HEAD_DIM];
        fp32_mean(sum, (double)n, dim, mean);
        double r2 = 0.0;
        for (int64_t j = 0; j < n; j++) {
            fxa_load_row(p->ctx->kernels, k, p->d.dtype, off + j * token_stride, dim, row);
            const double nn = squared_distance(row, mean, dim);
            r2 = nn > r2 ? nn : r2;
        }
        summary[2] = sqrt(r2);
    }
}

int fxa_summary_merge(const fxa_attn_plan *p, const double *summaries, size_t stride,
                      int64_t n_blocks, fxa_head_bound *hb, float *kbar)
{
    const size_t dim = (size_t)p->d.head_dim;
    double n = 0.0;
    double sum[FXA_MAX_HEAD_DIM] = {0};
    hb->kmax = 0.0;
    hb->vmax = 0.0;
    for (int64_t b = 0; b < n_blocks; b++) {
        const double *s = summaries + (size_t)b * stride;
        n += s[0];
        hb->kmax = s[1] > hb->kmax ? s[1] : hb->kmax;
        hb->vmax = s[3] > hb->vmax ? s[3] : hb->vmax;
        for (size_t c = 0; c < dim; c++)
            sum[c] += s[FXA_SUMMARY_FIXED + c];
    }
    if (!(n >= 1.0))
        return 0;
    hb->radius = hb->kmax;
    if (p->d.center) {
        fp32_mean(sum, n, dim, kbar);
        hb->radius = 0.0;
        for (int64_t b = 0; b < n_blocks; b++) {
            const double *s = summaries + (size_t)b * stride;
            if (!(s[0] >= 1.0))
                continue;
            float mean[FXA_MAX_HEAD_DIM];
            fp32_mean(s + FXA_SUMMARY_FIXED, s[0], dim, mean);
            const double r = s[2] + sqrt(squared_distance(mean, kbar, dim));
            hb->radius = r > hb->radius ? r : hb->radius;
        }
    } else {
        memset(kbar, 0, dim * sizeof(float));
    }
    const int64_t n_keys = (int64_t)n;
    hb->eps_radius = (double)(dim + 2) * 0x1p-23 * hb->kmax;
    hb->c = fxa_fixed_m_c(n_keys, hb->vmax);
    hb->gate_strict = fxa_fixed_m_gate_strict(hb->c);
    hb->gate_centered = fxa_fixed_m_gate_centered(hb->c, n_keys);
    return 1;
}
