/*
 * Row helpers shared by the AVX-512 tiles (fp32 and bf16 compute): tail
 * masks, and the row primitives of softmax_rows_impl.h (the row max of an
 * online-softmax row and its power-of-two rescale), 16 lanes at a time.
 * Include only from files compiled with -mavx512f.
 */
#ifndef FXA_ROWS_AVX512_H
#define FXA_ROWS_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>

/* Lanes [0, n) of 16 (n may be <= 0 or exceed 16). */
static inline __mmask16 fxa_tail_mask16(ptrdiff_t n)
{
    const unsigned bits = n >= 16 ? 0xffffu : (n <= 0 ? 0u : (1u << n) - 1u);
    return (__mmask16)bits;
}

/* Masks of nvec consecutive vectors covering [0, n): vector v holds lanes
 * [16 v, 16 v + 16) of it. */
static inline void fxa_tail_masks16(ptrdiff_t n, size_t nvec, __mmask16 *mask)
{
    for (size_t v = 0; v < nvec; v++)
        mask[v] = fxa_tail_mask16(n - 16 * (ptrdiff_t)v);
}

/* max_j z[j] over n scores (exact). */
static inline float row_max(const float *z, size_t n)
{
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (size_t j = 0; j < n; j += 16) {
        const __mmask16 k = fxa_tail_mask16((ptrdiff_t)(n - j));
        mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, z + j));
    }
    return _mm512_reduce_max_ps(mx);
}

/* o[0..d) *= a. */
static inline void row_scale(float *o, size_t d, float a)
{
    const __m512 av = _mm512_set1_ps(a);
    for (size_t c = 0; c < d; c += 16) {
        const __mmask16 k = fxa_tail_mask16((ptrdiff_t)(d - c));
        _mm512_mask_storeu_ps(o + c, k, _mm512_mul_ps(av, _mm512_maskz_loadu_ps(k, o + c)));
    }
}

/* z[0..n) += b[0..n). */
static inline void row_add(float *z, const float *b, size_t n)
{
    for (size_t j = 0; j < n; j += 16) {
        const __mmask16 k = fxa_tail_mask16((ptrdiff_t)(n - j));
        _mm512_mask_storeu_ps(
            z + j, k,
            _mm512_add_ps(_mm512_maskz_loadu_ps(k, z + j), _mm512_maskz_loadu_ps(k, b + j)));
    }
}

#endif
