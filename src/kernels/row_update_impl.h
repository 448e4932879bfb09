/*
 * The online-softmax row update of fxa_attn_tile (kernels.h), one
 * implementation for every tile, fp32 and bf16 compute alike:
 *   fxa_online_shift  m' = max(m, ceil(max_j z_j)), an integer, and
 *                     alpha = 2^(m - m'), an exact power of two (1 if m = m');
 *   (the tile's own exp2 pass at shift m', summing its terms into sum)
 *   fxa_online_fold   o *= alpha (skipped when alpha = 1), l = alpha l + sum,
 *                     m = m'.
 * A tile file includes this header under its own flags with its vector
 * width's row_max and row_scale (ref/rows_ref.h, x86_avx2/rows_avx2.h), the
 * way row_stats_impl.h is built per ISA. Every step is exact, so every
 * vector width gives the same bits. (The AVX-512 tiles keep their own copy
 * on x86_avx512/rows_avx512.h: through this header their instruction
 * streams change, which cannot be tested without AVX-512 hardware.)
 */
#ifndef FXA_ROW_UPDATE_IMPL_H
#define FXA_ROW_UPDATE_IMPL_H

#include <math.h>
#include <stddef.h>

#include "ref/exp2_ref.h"

/* Defined by the including file: max_j z[j] over n scores (exact), and
 * o[c] *= a for c < d. */
static float row_max(const float *z, size_t n);
static void row_scale(float *o, size_t d, float a);

typedef struct fxa_row_shift {
    float m;     /* the new running shift m' */
    float alpha; /* 2^(m - m') */
} fxa_row_shift;

static inline fxa_row_shift fxa_online_shift(float m, const float *z, size_t n)
{
    fxa_row_shift s;
    s.m = fmaxf(m, ceilf(row_max(z, n)));
    s.alpha = fxa_exp2_shifted_ref(m, s.m);
    return s;
}

static inline void fxa_online_fold(fxa_row_shift s, float sum, float *m, float *l, float *o,
                                   size_t d)
{
    if (s.alpha != 1.0f)
        row_scale(o, d, s.alpha);
    *l = *l * s.alpha + sum;
    *m = s.m;
}

#endif
