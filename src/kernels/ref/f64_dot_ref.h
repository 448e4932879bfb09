/* Dot products of fp64 rows for the fp64 kernels: each summed in increasing
 * c from 0.0, four keys at a time for independent chains (a key's sum does
 * not depend on the others). */
#ifndef FXA_F64_DOT_REF_H
#define FXA_F64_DOT_REF_H

#include <stddef.h>
#include <stdint.h>

/* out[j] = x . y_j for j < n, y_j at y + j ldy, rows of d doubles. */
static inline void fxa_f64_dots(const double *x, const double *y, int64_t ldy, size_t n, size_t d,
                                double *out)
{
    size_t j = 0;
    for (; j + 4 <= n; j += 4) {
        const double *y0 = y + (int64_t)j * ldy, *y1 = y0 + ldy, *y2 = y1 + ldy, *y3 = y2 + ldy;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        for (size_t c = 0; c < d; c++) {
            s0 += x[c] * y0[c];
            s1 += x[c] * y1[c];
            s2 += x[c] * y2[c];
            s3 += x[c] * y3[c];
        }
        out[j] = s0;
        out[j + 1] = s1;
        out[j + 2] = s2;
        out[j + 3] = s3;
    }
    for (; j < n; j++) {
        const double *yj = y + (int64_t)j * ldy;
        double s = 0.0;
        for (size_t c = 0; c < d; c++)
            s += x[c] * yj[c];
        out[j] = s;
    }
}

/* y[c] += a x[c], c < d. */
static inline void fxa_f64_axpy(double a, const double *x, size_t d, double *y)
{
    for (size_t c = 0; c < d; c++)
        y[c] += a * x[c];
}

#endif
