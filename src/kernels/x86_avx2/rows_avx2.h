/*
 * Row primitives of the AVX2 tile for softmax_rows_impl.h, 8 lanes at a time
 * (plain loads and stores, the tail masked, never over-read). Include only from files compiled with
 * -mavx2.
 */
#ifndef FXA_ROWS_AVX2_H
#define FXA_ROWS_AVX2_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>

/* Lanes [0, n) of a ymm (n may exceed 8 or be <= 0). */
static inline __m256i tail_mask(ptrdiff_t n)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int clamped = n > 8 ? 8 : (n < 0 ? 0 : (int)n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(clamped), lanes);
}

static float hmax(__m256 x)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float row_max(const float *z, size_t n)
{
    __m256 mx = _mm256_set1_ps(-INFINITY);
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        mx = _mm256_max_ps(mx, _mm256_loadu_ps(z + j));
    if (j < n) {
        const __m256i k = tail_mask((ptrdiff_t)(n - j));
        const __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(z + j, k),
                                          _mm256_castsi256_ps(k));
        mx = _mm256_max_ps(mx, x);
    }
    return hmax(mx);
}

static void row_scale(float *o, size_t d, float a)
{
    const __m256 av = _mm256_set1_ps(a);
    size_t c = 0;
    for (; c + 8 <= d; c += 8)
        _mm256_storeu_ps(o + c, _mm256_mul_ps(av, _mm256_loadu_ps(o + c)));
    if (c < d) {
        const __m256i k = tail_mask((ptrdiff_t)(d - c));
        _mm256_maskstore_ps(o + c, k, _mm256_mul_ps(av, _mm256_maskload_ps(o + c, k)));
    }
}

static void row_add(float *z, const float *b, size_t n)
{
    size_t j = 0;
    for (; j + 8 <= n; j += 8)
        _mm256_storeu_ps(z + j, _mm256_add_ps(_mm256_loadu_ps(z + j), _mm256_loadu_ps(b + j)));
    if (j < n) {
        const __m256i k = tail_mask((ptrdiff_t)(n - j));
        _mm256_maskstore_ps(
            z + j, k, _mm256_add_ps(_mm256_maskload_ps(z + j, k), _mm256_maskload_ps(b + j, k)));
    }
}

#endif
