/*
 * The row statistics of fxa_row_stats (kernels.h) in portable C, written so
 * that compilers vectorise them without changing a bit: every double sum has
 * FXA_ROW_STATS_LANES interleaved partial sums (element c goes to sum
 * c mod 8) combined as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)),
 * products and sums round separately (-ffp-contract=off), and maxima are
 * taken on integers. Each ISA's file includes this header under its own
 * flags (ref/, x86_avx2/, x86_avx512/) and defines its table with
 * FXA_ROW_STATS_TABLE; all of them give the same results.
 */
#ifndef FXA_ROW_STATS_IMPL_H
#define FXA_ROW_STATS_IMPL_H

#include <assert.h>
#include <stdint.h>

#include "../base/convert_inline.h"
#include "fxattn.h" /* FXA_MAX_HEAD_DIM */
#include "kernels.h"

#define FXA_ROW_STATS_LANES 8

static double combine_lanes(const double s[FXA_ROW_STATS_LANES])
{
    return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

static double row_norm2_add(const float *x, size_t d, double *sum)
{
    double s[FXA_ROW_STATS_LANES] = {0.0};
    size_t c = 0;
    for (; c + FXA_ROW_STATS_LANES <= d; c += FXA_ROW_STATS_LANES)
        for (size_t k = 0; k < FXA_ROW_STATS_LANES; k++) {
            const double e = x[c + k];
            sum[c + k] += e;
            s[k] += e * e;
        }
    for (size_t k = 0; c < d; c++, k++) {
        const double e = x[c];
        sum[c] += e;
        s[k] += e * e;
    }
    return combine_lanes(s);
}

static double row_distance2(const float *x, const float *center, size_t d)
{
    double s[FXA_ROW_STATS_LANES] = {0.0};
    size_t c = 0;
    for (; c + FXA_ROW_STATS_LANES <= d; c += FXA_ROW_STATS_LANES)
        for (size_t k = 0; k < FXA_ROW_STATS_LANES; k++) {
            const double e = (double)x[c + k] - (double)center[c + k];
            s[k] += e * e;
        }
    for (size_t k = 0; c < d; c++, k++) {
        const double e = (double)x[c] - (double)center[c];
        s[k] += e * e;
    }
    return combine_lanes(s);
}

/* |x| orders like the integer of its bits; Inf and NaN bits lie above every
 * finite value's, so the result is Inf or NaN when some x_c is. */
static float row_abs_max(const float *x, size_t d)
{
    uint32_t m = 0;
    for (size_t c = 0; c < d; c++) {
        const uint32_t b = fxa_f32_bits(x[c]) & 0x7fffffffu;
        m = b > m ? b : m;
    }
    return fxa_bits_f32(m);
}

/* norm2_dot takes rows FXA_ROW_STATS_GROUP at a time: each row keeps its
 * own partial sums in its own order (so a row's bits do not depend on its
 * neighbours), and the group's independent add chains overlap instead of
 * waiting on one another's latency. (The bound pass's statistics stream
 * rows from memory one at a time: grouping them measured no faster.) */
#define FXA_ROW_STATS_GROUP 4

static void row_norm2_dot(const float *x, size_t ldx, size_t n, const float *y, size_t d,
                          double *xx, double *xy)
{
    size_t j = 0;
    for (; j + FXA_ROW_STATS_GROUP <= n; j += FXA_ROW_STATS_GROUP) {
        const float *xj = x + j * ldx;
        double s[FXA_ROW_STATS_GROUP][FXA_ROW_STATS_LANES] = {{0.0}};
        double t[FXA_ROW_STATS_GROUP][FXA_ROW_STATS_LANES] = {{0.0}};
        size_t c = 0;
        for (; c + FXA_ROW_STATS_LANES <= d; c += FXA_ROW_STATS_LANES)
            for (size_t r = 0; r < FXA_ROW_STATS_GROUP; r++)
                for (size_t k = 0; k < FXA_ROW_STATS_LANES; k++) {
                    const double e = xj[r * ldx + c + k];
                    s[r][k] += e * e;
                    t[r][k] += e * (double)y[c + k];
                }
        for (size_t r = 0; r < FXA_ROW_STATS_GROUP; r++) {
            for (size_t u = c, k = 0; u < d; u++, k++) {
                const double e = xj[r * ldx + u];
                s[r][k] += e * e;
                t[r][k] += e * (double)y[u];
            }
            xx[j + r] = combine_lanes(s[r]);
            xy[j + r] = combine_lanes(t[r]);
        }
    }
    for (; j < n; j++) {
        const float *xj = x + j * ldx;
        double s[FXA_ROW_STATS_LANES] = {0.0};
        double t[FXA_ROW_STATS_LANES] = {0.0};
        size_t c = 0;
        for (; c + FXA_ROW_STATS_LANES <= d; c += FXA_ROW_STATS_LANES)
            for (size_t k = 0; k < FXA_ROW_STATS_LANES; k++) {
                const double e = xj[c + k];
                s[k] += e * e;
                t[k] += e * (double)y[c + k];
            }
        for (size_t k = 0; c < d; c++, k++) {
            const double e = xj[c];
            s[k] += e * e;
            t[k] += e * (double)y[c];
        }
        xx[j] = combine_lanes(s);
        xy[j] = combine_lanes(t);
    }
}

/* The bf16 forms widen their rows (exactly, with this ISA's vector code)
 * into a buffer on the stack and run the fp32 bodies on it: the same bits as
 * the fp32 forms on the widened rows, by construction. */
static void widen_bf16(const uint16_t *x, size_t d, float *out)
{
    assert(d <= FXA_MAX_HEAD_DIM);
    for (size_t c = 0; c < d; c++)
        out[c] = fxa_bf16_bits_to_f32(x[c]);
}

static double row_norm2_add_bf16(const uint16_t *x, size_t d, double *sum)
{
    float row[FXA_MAX_HEAD_DIM];
    widen_bf16(x, d, row);
    return row_norm2_add(row, d, sum);
}

static double row_distance2_bf16(const uint16_t *x, const float *center, size_t d)
{
    float row[FXA_MAX_HEAD_DIM];
    widen_bf16(x, d, row);
    return row_distance2(row, center, d);
}

/* |x| of bf16 bits orders like the integer of its low 15 bits, Inf and NaN
 * above every finite value, as in row_abs_max. */
static float row_abs_max_bf16(const uint16_t *x, size_t d)
{
    uint32_t m = 0;
    for (size_t c = 0; c < d; c++) {
        const uint32_t b = x[c] & 0x7fffu;
        m = b > m ? b : m;
    }
    return fxa_bits_f32(m << 16);
}

static void row_norm2_dot_bf16(const uint16_t *x, size_t ldx, size_t n, const float *y, size_t d,
                               double *xx, double *xy)
{
    float rows[FXA_ROW_STATS_GROUP][FXA_MAX_HEAD_DIM];
    for (size_t j = 0; j < n; j += FXA_ROW_STATS_GROUP) {
        const size_t m = n - j < FXA_ROW_STATS_GROUP ? n - j : FXA_ROW_STATS_GROUP;
        for (size_t r = 0; r < m; r++)
            widen_bf16(x + (j + r) * ldx, d, rows[r]);
        row_norm2_dot(rows[0], FXA_MAX_HEAD_DIM, m, y, d, xx + j, xy + j);
    }
}

#define FXA_ROW_STATS_TABLE(name)                                                                  \
    const fxa_row_stats name = {row_norm2_add,    row_distance2,      row_abs_max,                 \
                                row_norm2_dot,    row_norm2_add_bf16, row_distance2_bf16,          \
                                row_abs_max_bf16, row_norm2_dot_bf16}

#endif
