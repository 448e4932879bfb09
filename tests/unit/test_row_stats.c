/*
 * The bound pass's row statistics (fxa_row_stats in src/kernels/kernels.h):
 * every ISA's build must return the reference build's bits (one portable
 * source compiled per ISA, so a vectoriser that reorders a sum or contracts
 * a product into an FMA fails here), and the reference must be right:
 * sums against long double, maxima exactly, and a non-finite value must
 * make the statistics non-finite (the bound pass's only finiteness test).
 * The bf16 forms must give the fp32 forms' bits on the widened rows.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "simd_sets.h"
#include "testutil.h"

#define MAX_D 300

static const size_t g_dims[] = {1,  2,  3,  5,   7,   8,   9,   15,  16, 17,
                                31, 33, 64, 100, 127, 128, 129, 256, 300};
#define N_DIMS (sizeof g_dims / sizeof g_dims[0])

/* A row of mixed magnitudes: normal values, large and tiny ones, subnormals,
 * signed zeros. */
static void fill_row(fxt_rng *r, float *x, size_t d)
{
    for (size_t c = 0; c < d; c++) {
        const double u = fxt_rng_uniform(r);
        const double n = fxt_rng_normal(r);
        if (u < 0.05)
            x[c] = fxt_rng_uniform(r) < 0.5 ? 0.0f : -0.0f;
        else if (u < 0.10)
            x[c] = (float)(n * 1e-40); /* subnormal */
        else if (u < 0.15)
            x[c] = (float)(n * 1e15);
        else
            x[c] = (float)(n * 3.0);
    }
}

static int same_bits_d(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* One row through norm2_dot. */
static void norm2_dot1(const fxa_row_stats *rs, const float *x, const float *y, size_t d,
                       double *xx, double *xy)
{
    rs->norm2_dot(x, d, 1, y, d, xx, xy);
}

/* One kernel set against the reference, bit for bit, on `rounds` rows per
 * dimension. */
static void compare_to_ref(const char *name, const fxa_row_stats *rs, int rounds)
{
    const fxa_row_stats *ref = &fxa_f32_rowstats__ref;
    fxt_rng r;
    fxt_rng_seed(&r, 42);
    long long mismatches = 0;
    for (size_t i = 0; i < N_DIMS; i++) {
        const size_t d = g_dims[i];
        for (int round = 0; round < rounds; round++) {
            float x[MAX_D], y[MAX_D];
            double sum_ref[MAX_D], sum[MAX_D];
            fill_row(&r, x, d);
            fill_row(&r, y, d);
            for (size_t c = 0; c < d; c++)
                sum_ref[c] = sum[c] = fxt_rng_normal(&r);
            const double n_ref = ref->norm2_add(x, d, sum_ref);
            const double n = rs->norm2_add(x, d, sum);
            int ok = same_bits_d(n, n_ref) && memcmp(sum, sum_ref, d * sizeof *sum) == 0;
            ok &= same_bits_d(rs->distance2(x, y, d), ref->distance2(x, y, d));
            ok &= test_f32_bits(rs->abs_max(x, d)) == test_f32_bits(ref->abs_max(x, d));
            double xx, xy, xx_ref, xy_ref;
            norm2_dot1(rs, x, y, d, &xx, &xy);
            norm2_dot1(ref, x, y, d, &xx_ref, &xy_ref);
            ok &= same_bits_d(xx, xx_ref) && same_bits_d(xy, xy_ref);
            if (!ok && mismatches++ < 5)
                fprintf(stderr, "%s: d = %zu, round %d differs from the reference\n", name, d,
                        round);
        }
    }
    printf("%s: %zu dimensions x %d rows, %lld differ from the reference bits\n", name, N_DIMS,
           rounds, mismatches);
    CHECK(mismatches == 0, "%s: %lld rows differ from the reference build", name, mismatches);
}

/* The reference against long double: each double sum of d terms is within
 * d 2^-52 (relative to the sum of magnitudes) of the exact value. */
static void check_ref_accuracy(void)
{
    const fxa_row_stats *ref = &fxa_f32_rowstats__ref;
    fxt_rng r;
    fxt_rng_seed(&r, 7);
    double worst = 0.0;
    int max_ok = 1;
    for (size_t i = 0; i < N_DIMS; i++) {
        const size_t d = g_dims[i];
        for (int round = 0; round < 200; round++) {
            float x[MAX_D], y[MAX_D];
            double sum[MAX_D] = {0};
            fill_row(&r, x, d);
            fill_row(&r, y, d);
            long double nn = 0, dd = 0, dot = 0, dot_abs = 0;
            float amax = 0.0f;
            for (size_t c = 0; c < d; c++) {
                nn += (long double)x[c] * x[c];
                const long double e = (long double)x[c] - y[c];
                dd += e * e;
                dot += (long double)x[c] * y[c];
                dot_abs += fabsl((long double)x[c] * y[c]);
                amax = fabsf(x[c]) > amax ? fabsf(x[c]) : amax;
            }
            const double tol = (double)d * 0x1p-52;
            double xx, xy;
            norm2_dot1(ref, x, y, d, &xx, &xy);
            const double errs[4] = {
                fabs((double)(ref->norm2_add(x, d, sum) - nn)) / (double)(nn > 0 ? nn : 1),
                fabs((double)(ref->distance2(x, y, d) - dd)) / (double)(dd > 0 ? dd : 1),
                fabs((double)(xx - nn)) / (double)(nn > 0 ? nn : 1),
                fabs((double)(xy - dot)) / (double)(dot_abs > 0 ? dot_abs : 1)};
            for (int k = 0; k < 4; k++) {
                worst = errs[k] / tol > worst ? errs[k] / tol : worst;
                CHECK(errs[k] <= tol, "d = %zu: statistic %d off by %g (tolerance %g)", d, k,
                      errs[k], tol);
            }
            for (size_t c = 0; c < d; c++)
                CHECK(sum[c] == (double)x[c], "d = %zu: sum[%zu] = %g, want %g", d, c, sum[c],
                      (double)x[c]);
            max_ok &= ref->abs_max(x, d) == amax;
        }
    }
    printf("reference sums: worst error %.3g of the d 2^-52 tolerance\n", worst);
    CHECK(max_ok, "abs_max differs from the max of fabsf");
}

/* The statistics the bound pass reads (norm2_add for K, distance2 from zero
 * for Q, abs_max for V) are non-finite exactly when a value is: Inf, -Inf
 * and NaNs (quiet, signalling, negative) at every position, among extreme
 * finite values (whose squares must stay finite) that must not count. */
static void check_non_finite(const char *name, const fxa_row_stats *rs)
{
    const float finite[] = {FLT_MAX, -FLT_MAX, FLT_MIN, 0x1p-149f, -0.0f, 0.0f, 1.0f};
    const uint32_t bad_bits[] = {0x7f800000u, 0xff800000u, 0x7fc00000u,
                                 0x7f800001u, 0xffc00000u, 0x7fffffffu};
    static const float zero[MAX_D];
    long long missed = 0, false_alarms = 0;
    for (size_t i = 0; i < N_DIMS; i++) {
        const size_t d = g_dims[i];
        float x[MAX_D];
        double sum[MAX_D] = {0};
        for (size_t c = 0; c < d; c++)
            x[c] = finite[c % (sizeof finite / sizeof finite[0])];
        false_alarms += !isfinite(rs->norm2_add(x, d, sum)) + !isfinite(rs->distance2(x, zero, d)) +
                        !isfinite(rs->abs_max(x, d));
        for (size_t c = 0; c < d; c++)
            for (size_t b = 0; b < sizeof bad_bits / sizeof bad_bits[0]; b++) {
                const float keep = x[c];
                x[c] = test_bits_f32(bad_bits[b]);
                missed += isfinite(rs->norm2_add(x, d, sum)) + isfinite(rs->distance2(x, zero, d)) +
                          isfinite(rs->abs_max(x, d));
                x[c] = keep;
            }
    }
    printf("%s: non-finite values: %lld missed, %lld false alarms\n", name, missed, false_alarms);
    CHECK(missed == 0 && false_alarms == 0, "%s: non-finite values missed %lld, false alarms %lld",
          name, missed, false_alarms);
}

/* Several rows per norm2_dot call give each row the bits it gets alone,
 * whatever its neighbours and the count (groups and the rows left over). */
static void check_groups(const char *name, const fxa_row_stats *rs)
{
    enum { ROWS = 11, DIM = 129 };
    static const size_t dims[] = {1, 7, 8, 17, 64, 128, DIM};
    fxt_rng r;
    fxt_rng_seed(&r, 11);
    long long mismatches = 0;
    for (size_t di = 0; di < sizeof dims / sizeof dims[0]; di++) {
        const size_t d = dims[di];
        for (size_t n = 1; n <= ROWS; n++) {
            float x[ROWS][DIM], y[DIM];
            for (size_t j = 0; j < n; j++)
                fill_row(&r, x[j], d);
            fill_row(&r, y, d);
            double xx[ROWS], xy[ROWS];
            rs->norm2_dot(x[0], DIM, n, y, d, xx, xy);
            int ok = 1;
            for (size_t j = 0; j < n; j++) {
                double xx1, xy1;
                norm2_dot1(rs, x[j], y, d, &xx1, &xy1);
                ok &= same_bits_d(xx[j], xx1) && same_bits_d(xy[j], xy1);
            }
            if (!ok && mismatches++ < 5)
                fprintf(stderr, "%s: %zu rows of %zu differ from one row per call\n", name, n, d);
        }
    }
    printf("%s: norm2_dot on groups of rows: %lld cases differ from one row per call\n", name,
           mismatches);
    CHECK(mismatches == 0, "%s: %lld grouped cases differ from one row per call", name, mismatches);
}

/* bf16 bits of x: its top half (truncation keeps every class: zeros,
 * subnormals, large values). */
static uint16_t bf16_bits(float x)
{
    return (uint16_t)(test_f32_bits(x) >> 16);
}

/* The bf16 forms against the fp32 forms on the widened rows, bit for bit:
 * one row at a time, and norm2_dot on groups of rows ldx apart (d up to
 * FXA_MAX_HEAD_DIM, the bf16 forms' limit; g_dims is sorted). */
static void check_bf16(const char *name, const fxa_row_stats *rs)
{
    enum { ROWS = 11, LD = 303 };
    fxt_rng r;
    fxt_rng_seed(&r, 23);
    long long mismatches = 0;
    for (size_t i = 0; i < N_DIMS && g_dims[i] <= FXA_MAX_HEAD_DIM; i++) {
        const size_t d = g_dims[i];
        for (int round = 0; round < 20; round++) {
            static uint16_t x16[ROWS * LD];
            static float x[ROWS * LD];
            float y[MAX_D], row[MAX_D];
            for (size_t j = 0; j < ROWS; j++) {
                fill_row(&r, row, d);
                for (size_t c = 0; c < d; c++) {
                    x16[j * LD + c] = bf16_bits(row[c]);
                    x[j * LD + c] = test_bits_f32((uint32_t)x16[j * LD + c] << 16);
                }
            }
            fill_row(&r, y, d);
            double sum[MAX_D], sum16[MAX_D];
            for (size_t c = 0; c < d; c++)
                sum[c] = sum16[c] = fxt_rng_normal(&r);
            int ok = same_bits_d(rs->norm2_add_bf16(x16, d, sum16), rs->norm2_add(x, d, sum)) &&
                     memcmp(sum, sum16, d * sizeof *sum) == 0;
            ok &= same_bits_d(rs->distance2_bf16(x16, y, d), rs->distance2(x, y, d));
            ok &= test_f32_bits(rs->abs_max_bf16(x16, d)) == test_f32_bits(rs->abs_max(x, d));
            const size_t n = 1 + (size_t)round % ROWS;
            double xx[ROWS], xy[ROWS], xx16[ROWS], xy16[ROWS];
            rs->norm2_dot(x, LD, n, y, d, xx, xy);
            rs->norm2_dot_bf16(x16, LD, n, y, d, xx16, xy16);
            for (size_t j = 0; j < n; j++)
                ok &= same_bits_d(xx[j], xx16[j]) && same_bits_d(xy[j], xy16[j]);
            if (!ok && mismatches++ < 5)
                fprintf(stderr, "%s: bf16 rows, d = %zu, round %d differ from the fp32 forms\n",
                        name, d, round);
        }
    }
    /* Non-finite bf16 values (Inf, -Inf, NaNs) at every position are seen. */
    static const uint16_t bad[] = {0x7f80u, 0xff80u, 0x7fc0u, 0x7f81u, 0xffc0u, 0x7fffu};
    static const float zero[MAX_D];
    long long missed = 0, false_alarms = 0;
    for (size_t i = 0; i < N_DIMS && g_dims[i] <= FXA_MAX_HEAD_DIM; i++) {
        const size_t d = g_dims[i];
        uint16_t x16[MAX_D];
        double sum[MAX_D] = {0};
        for (size_t c = 0; c < d; c++) /* +-bf16 max, tiny, subnormal, zeros */
            x16[c] = (uint16_t[]){0x7f7fu, 0xff7fu, 0x0080u, 0x0001u, 0x8000u, 0x0000u}[c % 6];
        false_alarms += !isfinite(rs->norm2_add_bf16(x16, d, sum)) +
                        !isfinite(rs->distance2_bf16(x16, zero, d)) +
                        !isfinite(rs->abs_max_bf16(x16, d));
        for (size_t c = 0; c < d; c++)
            for (size_t b = 0; b < sizeof bad / sizeof bad[0]; b++) {
                const uint16_t keep = x16[c];
                x16[c] = bad[b];
                missed += isfinite(rs->norm2_add_bf16(x16, d, sum)) +
                          isfinite(rs->distance2_bf16(x16, zero, d)) +
                          isfinite(rs->abs_max_bf16(x16, d));
                x16[c] = keep;
            }
    }
    printf("%s: bf16 rows: %lld differ from the fp32 forms; non-finite: %lld missed, %lld false "
           "alarms\n",
           name, mismatches, missed, false_alarms);
    CHECK(mismatches == 0, "%s: %lld bf16 cases differ from the fp32 forms", name, mismatches);
    CHECK(missed == 0 && false_alarms == 0,
          "%s: bf16 non-finite values missed %lld, false alarms %lld", name, missed, false_alarms);
}

/* A SIMD set: its own statistics, matching the reference's and passing the reference's
 * checks. */
static void check_simd_set(const char *name, const fxa_kernels *k)
{
    CHECK(k->row_stats != &fxa_f32_rowstats__ref, "%s: the set uses the reference statistics",
          name);
    compare_to_ref(name, k->row_stats, 300);
    check_non_finite(name, k->row_stats);
    check_groups(name, k->row_stats);
    check_bf16(name, k->row_stats);
}

int main(void)
{
    check_ref_accuracy();
    check_non_finite("ref", &fxa_f32_rowstats__ref);
    check_groups("ref", &fxa_f32_rowstats__ref);
    check_bf16("ref", &fxa_f32_rowstats__ref);
    for_each_simd_set(check_simd_set);
    return test_summary("test_row_stats");
}
