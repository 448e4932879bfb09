/* Key/value summaries and their merge (see summary.h). */
#include "summary.h"

#include <math.h>
#include <string.h>

#include "load.h"

size_t fxa_summary_head_len(const fxa_attn_plan *p)
{
    return FXA_SUMMARY_FIXED + (size_t)p->d.head_dim;
}

static int note_bad(const fxa_row_stats *rs, fxa_bad_value *bad, char tensor, int64_t row,
                    const float *x, size_t d)
{
    if (!rs->any_non_finite(x, d))
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

/* The fp32 mean the kernels subtract: (float)(sum / n) per dimension. */
static void fp32_mean(const double *sum, double n, size_t dim, float *mean)
{
    for (size_t c = 0; c < dim; c++)
        mean[c] = (float)(sum[c] / n);
}

/* The rows of a group of heads (fxa_summarize_heads), as fp32. */
typedef struct group_rows {
    const fxa_attn_plan *p;
    int64_t off, head_stride, token_stride;
    float scratch[FXA_MAX_HEAD_DIM];
} group_rows;

static const float *group_row(group_rows *g, const void *x, int64_t h, int64_t j)
{
    return fxa_row_f32(g->p->ctx->kernels, x, g->p->d.dtype,
                       g->off + h * g->head_stride + j * g->token_stride,
                       (size_t)g->p->d.head_dim, g->scratch);
}

void fxa_summarize_heads(const fxa_attn_plan *p, const void *k, const void *v, int64_t off,
                         int64_t head_stride, int64_t token_stride, int64_t n, int64_t n_heads,
                         double *summaries, fxa_bad_value *bad)
{
    const size_t dim = (size_t)p->d.head_dim;
    const size_t len = fxa_summary_head_len(p);
    const fxa_row_stats *rs = p->ctx->kernels->row_stats;
    group_rows g = {.p = p, .off = off, .head_stride = head_stride, .token_stride = token_stride};
    double kmax2[FXA_SUMMARY_GROUP] = {0.0};
    double vmax[FXA_SUMMARY_GROUP] = {0.0};
    for (int64_t h = 0; h < n_heads; h++) {
        bad[h].bad_row = -1;
        memset(summaries + (size_t)h * len, 0, len * sizeof(double));
    }
    /* Token by token, the group's heads in turn: each pass reads one run of
     * n_heads D values per token where heads are adjacent in memory. */
    for (int64_t j = 0; j < n; j++) {
        for (int64_t h = 0; h < n_heads; h++) {
            if (bad[h].bad_row >= 0)
                continue;
            const float *row = group_row(&g, k, h, j);
            if (note_bad(rs, &bad[h], 'K', j, row, dim))
                continue;
            const double nn = rs->norm2_add(row, dim, summaries + (size_t)h * len + FXA_SUMMARY_FIXED);
            kmax2[h] = nn > kmax2[h] ? nn : kmax2[h];
        }
    }
    for (int64_t j = 0; j < n; j++) {
        for (int64_t h = 0; h < n_heads; h++) {
            if (bad[h].bad_row >= 0)
                continue;
            const float *row = group_row(&g, v, h, j);
            if (note_bad(rs, &bad[h], 'V', j, row, dim))
                continue;
            const double a = rs->abs_max(row, dim);
            vmax[h] = a > vmax[h] ? a : vmax[h];
        }
    }
    for (int64_t h = 0; h < n_heads; h++) {
        double *summary = summaries + (size_t)h * len;
        summary[0] = (double)n;
        summary[1] = sqrt(kmax2[h]);
        summary[2] = summary[1];
        summary[3] = vmax[h];
    }
    if (!p->d.center || n == 0)
        return;
    /* The radius around the fp32 mean the kernels subtract: the bound and
     * the scores must use the same keys. */
    float mean[FXA_SUMMARY_GROUP][FXA_MAX_HEAD_DIM];
    double r2[FXA_SUMMARY_GROUP] = {0.0};
    for (int64_t h = 0; h < n_heads; h++)
        fp32_mean(summaries + (size_t)h * len + FXA_SUMMARY_FIXED, (double)n, dim, mean[h]);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t h = 0; h < n_heads; h++) {
            if (bad[h].bad_row >= 0)
                continue;
            const float *row = group_row(&g, k, h, j);
            const double nn = rs->distance2(row, mean[h], dim);
            r2[h] = nn > r2[h] ? nn : r2[h];
        }
    }
    for (int64_t h = 0; h < n_heads; h++)
        summaries[(size_t)h * len + 2] = sqrt(r2[h]);
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
            const double r = s[2] + sqrt(p->ctx->kernels->row_stats->distance2(mean, kbar, dim));
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
