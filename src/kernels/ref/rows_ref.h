/* Row primitives of the reference tiles for softmax_rows_impl.h, scalar C. */
#ifndef FXA_ROWS_REF_H
#define FXA_ROWS_REF_H

#include <math.h>
#include <stddef.h>

static float row_max(const float *z, size_t n)
{
    float mx = -INFINITY;
    for (size_t j = 0; j < n; j++)
        mx = z[j] > mx ? z[j] : mx;
    return mx;
}

static void row_scale(float *o, size_t d, float a)
{
    for (size_t c = 0; c < d; c++)
        o[c] *= a;
}

static void row_add(float *z, const float *b, size_t n)
{
    for (size_t j = 0; j < n; j++)
        z[j] += b[j];
}

#endif
