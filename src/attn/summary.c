/* Key/value summaries and their merge (see summary.h). */
#include "fxattn_diag.h"
#include "summary.h"

#include <math.h>
#include <string.h>

#include "load.h"

size_t fxa_summary_part_len(const fxa_attn_plan *p)
{
    return FXA_SUMMARY_FIXED + (size_t)p->d.head_dim;
}

int64_t fxa_summary_groups(int64_t seq)
{
    return (seq + FXA_CANONICAL_KEYS - 1) / FXA_CANONICAL_KEYS;
}

size_t fxa_summary_head_len(const fxa_attn_plan *p)
{
    const size_t groups = p->d.reproducible ? (size_t)fxa_summary_groups(p->d.seq_kv) : 0;
    return fxa_summary_part_len(p) + groups * (FXA_GROUP_FIXED + (size_t)p->d.head_dim);
}

/* The group sections of a reproducible head summary. */
static const double *group_at(const fxa_attn_plan *p, const double *s, int64_t g)
{
    const size_t dim = (size_t)p->d.head_dim;
    return s + FXA_SUMMARY_FIXED + dim + (size_t)g * (FXA_GROUP_FIXED + dim);
}

double fxa_groups_radius(const fxa_attn_plan *p, const double *summaries, int64_t n_blocks,
                         size_t stride, const float *kbar)
{
    const size_t dim = (size_t)p->d.head_dim;
    const int64_t groups = fxa_summary_groups(p->d.seq_kv);
    double radius = 0.0;
    for (int64_t b = 0; b < n_blocks; b++) {
        for (int64_t g = 0; g < groups; g++) {
            const double *s = group_at(p, summaries + (size_t)b * stride, g);
            if (!(s[0] >= 1.0))
                continue;
            float mean[FXA_MAX_HEAD_DIM];
            fxa_fp32_mean(s + FXA_GROUP_FIXED, s[0], dim, mean);
            const double r = s[1] + sqrt(p->ctx->kernels->row_stats->distance2(mean, kbar, dim));
            radius = r > radius ? r : radius;
        }
    }
    return radius;
}

/* Reproducible plans: the key sums of n_blocks head summaries, one chain
 * over their groups in order (groups without keys add nothing, so an empty
 * block or a block's unused sections change no bit). */
static void groups_sum(const fxa_attn_plan *p, const double *summaries, int64_t n_blocks,
                       size_t stride, double *sum)
{
    const size_t dim = (size_t)p->d.head_dim;
    const int64_t groups = fxa_summary_groups(p->d.seq_kv);
    for (int64_t b = 0; b < n_blocks; b++) {
        for (int64_t g = 0; g < groups; g++) {
            const double *s = group_at(p, summaries + (size_t)b * stride, g);
            if (!(s[0] >= 1.0))
                continue;
            for (size_t c = 0; c < dim; c++)
                sum[c] += s[FXA_GROUP_FIXED + c];
        }
    }
}

/* The bound pass needs no separate finiteness scan: a row's ||x||^2 (and
 * ||x - 0||^2) in fp64 is finite exactly when all its values are (the
 * square of a finite fp32 value is below 2^256, far inside fp64, and the
 * squares are never negative, so no Inf - Inf can hide one), and its
 * abs_max is Inf or NaN exactly when one of its values is. Only a row whose
 * statistic is not finite is searched for its first bad value. */
static void note_bad(fxa_bad_value *bad, char tensor, int64_t row, const float *x, size_t d)
{
    for (size_t c = 0; c < d; c++) {
        if (!isfinite(x[c])) {
            bad->tensor = tensor;
            bad->bad_row = row;
            bad->bad_col = (int64_t)c;
            bad->bad_value = x[c];
            return;
        }
    }
}

void fxa_fp32_mean(const double *sum, double n, size_t dim, float *mean)
{
    for (size_t c = 0; c < dim; c++)
        mean[c] = (float)(sum[c] / n);
}

/* Head and token of the block's i-th row in memory order. */
static void row_at(const fxa_row_block *blk, int64_t i, int64_t *h, int64_t *j)
{
    if (blk->head_stride < blk->token_stride) {
        *j = i / blk->n_heads;
        *h = i % blk->n_heads;
    } else {
        *h = i / blk->n_tokens;
        *j = i % blk->n_tokens;
    }
}

/* Where row (h, j) starts, in elements. */
static int64_t row_offset(const fxa_row_block *blk, int64_t h, int64_t j)
{
    return blk->off + h * blk->head_stride + j * blk->token_stride;
}

/* Row (h, j) of x as fp32 (in place for fp32 inputs, else in scratch). */
static const float *block_row(const fxa_attn_plan *p, const void *x, const fxa_row_block *blk,
                              int64_t h, int64_t j, float *scratch)
{
    return fxa_row_f32(p->ctx->kernels, x, p->d.dtype, row_offset(blk, h, j), (size_t)p->d.head_dim,
                       scratch);
}

/* The statistics of row (h, j) of x: bf16 rows are read as they are (the
 * kernels' bf16 forms give their fp32 widening's bits), other dtypes as
 * fp32 rows. */
static double row_norm2_add(const fxa_attn_plan *p, const void *x, const fxa_row_block *blk,
                            int64_t h, int64_t j, double *sum)
{
    const fxa_row_stats *rs = p->ctx->kernels->row_stats;
    const size_t dim = (size_t)p->d.head_dim;
    if (p->d.dtype == FXA_BF16)
        return rs->norm2_add_bf16((const uint16_t *)x + row_offset(blk, h, j), dim, sum);
    float scratch[FXA_MAX_HEAD_DIM];
    return rs->norm2_add(block_row(p, x, blk, h, j, scratch), dim, sum);
}

static double row_distance2(const fxa_attn_plan *p, const void *x, const fxa_row_block *blk,
                            int64_t h, int64_t j, const float *center)
{
    const fxa_row_stats *rs = p->ctx->kernels->row_stats;
    const size_t dim = (size_t)p->d.head_dim;
    if (p->d.dtype == FXA_BF16)
        return rs->distance2_bf16((const uint16_t *)x + row_offset(blk, h, j), center, dim);
    float scratch[FXA_MAX_HEAD_DIM];
    return rs->distance2(block_row(p, x, blk, h, j, scratch), center, dim);
}

static float row_abs_max(const fxa_attn_plan *p, const void *x, const fxa_row_block *blk, int64_t h,
                         int64_t j)
{
    const fxa_row_stats *rs = p->ctx->kernels->row_stats;
    const size_t dim = (size_t)p->d.head_dim;
    if (p->d.dtype == FXA_BF16)
        return rs->abs_max_bf16((const uint16_t *)x + row_offset(blk, h, j), dim);
    float scratch[FXA_MAX_HEAD_DIM];
    return rs->abs_max(block_row(p, x, blk, h, j, scratch), dim);
}

/* Note row (h, j)'s first non-finite value in *bad. */
static void note_bad_row(const fxa_attn_plan *p, const void *x, const fxa_row_block *blk, int64_t h,
                         int64_t j, char tensor, fxa_bad_value *bad)
{
    float scratch[FXA_MAX_HEAD_DIM];
    note_bad(bad, tensor, j, block_row(p, x, blk, h, j, scratch), (size_t)p->d.head_dim);
}

void fxa_summarize_block(const fxa_attn_plan *p, const void *k, const void *v,
                         const fxa_row_block *blk, const fxa_row_block *vblk, double *partials,
                         fxa_bad_value *bad)
{
    const size_t len = fxa_summary_part_len(p);
    for (int64_t h = 0; h < blk->n_heads; h++) {
        memset(partials + (size_t)h * len, 0, len * sizeof(double));
        partials[(size_t)h * len] = (double)blk->n_tokens;
        bad[2 * h].bad_row = -1;
        bad[2 * h + 1].bad_row = -1;
    }
    for (int64_t i = 0; i < blk->n_tokens * blk->n_heads; i++) {
        int64_t h, j;
        row_at(blk, i, &h, &j);
        double *part = partials + (size_t)h * len;
        if (bad[2 * h].bad_row < 0) {
            const double nn = row_norm2_add(p, k, blk, h, j, part + FXA_SUMMARY_FIXED);
            if (isfinite(nn))
                part[1] = nn > part[1] ? nn : part[1];
            else
                note_bad_row(p, k, blk, h, j, 'K', &bad[2 * h]);
        }
        if (bad[2 * h + 1].bad_row < 0) {
            const float a = row_abs_max(p, v, vblk, h, j);
            if (isfinite(a))
                part[3] = a > part[3] ? a : part[3];
            else
                note_bad_row(p, v, vblk, h, j, 'V', &bad[2 * h + 1]);
        }
    }
}

void fxa_radius_block(const fxa_attn_plan *p, const void *k, const fxa_row_block *blk,
                      const float *means, double *partials)
{
    const size_t dim = (size_t)p->d.head_dim;
    const size_t len = fxa_summary_part_len(p);
    for (int64_t h = 0; h < blk->n_heads; h++)
        partials[(size_t)h * len + 2] = 0.0;
    for (int64_t i = 0; i < blk->n_tokens * blk->n_heads; i++) {
        int64_t h, j;
        row_at(blk, i, &h, &j);
        const double nn = row_distance2(p, k, blk, h, j, means + (size_t)h * dim);
        double *r2 = partials + (size_t)h * len + 2;
        *r2 = nn > *r2 ? nn : *r2;
    }
}

void fxa_check_block(const fxa_attn_plan *p, const void *x, const fxa_row_block *blk,
                     fxa_bad_value *bad, double *norm2_max)
{
    static const float zero[FXA_MAX_HEAD_DIM];
    for (int64_t h = 0; h < blk->n_heads; h++) {
        bad[h].bad_row = -1;
        norm2_max[h] = 0.0;
    }
    for (int64_t i = 0; i < blk->n_tokens * blk->n_heads; i++) {
        int64_t h, j;
        row_at(blk, i, &h, &j);
        if (bad[h].bad_row >= 0)
            continue;
        const double nn = row_distance2(p, x, blk, h, j, zero);
        if (isfinite(nn))
            norm2_max[h] = nn > norm2_max[h] ? nn : norm2_max[h];
        else
            note_bad_row(p, x, blk, h, j, 'Q', &bad[h]);
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
    hb->qmax = 0.0;
    hb->eps_abs = 0.0;
    hb->lambda_k = (float)p->lambda;
    hb->kshift = 0;
    for (int64_t b = 0; b < n_blocks; b++) {
        const double *s = summaries + (size_t)b * stride;
        n += s[0];
        hb->kmax = s[1] > hb->kmax ? s[1] : hb->kmax;
        hb->vmax = s[3] > hb->vmax ? s[3] : hb->vmax;
        for (size_t c = 0; c < dim && !p->d.reproducible; c++)
            sum[c] += s[FXA_SUMMARY_FIXED + c];
    }
    if (!(n >= 1.0))
        return 0;
    hb->radius = hb->kmax;
    if (p->d.center && p->d.reproducible) {
        groups_sum(p, summaries, n_blocks, stride, sum);
        fxa_fp32_mean(sum, n, dim, kbar);
        hb->radius = fxa_groups_radius(p, summaries, n_blocks, stride, kbar);
    } else if (p->d.center) {
        fxa_fp32_mean(sum, n, dim, kbar);
        hb->radius = 0.0;
        for (int64_t b = 0; b < n_blocks; b++) {
            const double *s = summaries + (size_t)b * stride;
            if (!(s[0] >= 1.0))
                continue;
            float mean[FXA_MAX_HEAD_DIM];
            fxa_fp32_mean(s + FXA_SUMMARY_FIXED, s[0], dim, mean);
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
