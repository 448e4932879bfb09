/*
 * 2^(z - m) for 8 lanes, m integer-valued: the AVX2+FMA twin of
 * fxa_exp2_shifted_ref (kernels/ref/exp2_ref.h), with the same reduction and
 * degree-7 polynomial. z = zi + f with zi = round(z) and f = z - zi exact;
 * n = zi - m; 2^n is built in the exponent field, clamped to [-127, 127]
 * (n = -127 gives 0); results with n + f < -126 are flushed to 0.
 * Include only from files compiled with -mavx2 -mfma.
 */
#ifndef FXA_VEXP2_AVX2_H
#define FXA_VEXP2_AVX2_H

#include <immintrin.h>

#include "../ref/exp2_ref.h"

static inline __m256 fxa_vexp2_shifted_f32x8(__m256 z, __m256 m)
{
    const __m256 zi = _mm256_round_ps(z, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256 f = _mm256_sub_ps(z, zi);
    const __m256 n = _mm256_sub_ps(zi, m);
    static const float c[] = {FXA_EXP2_COEFFS};
    __m256 p = _mm256_set1_ps(c[0]);
    FXA_EXP2_UNROLL
    for (int k = 1; k <= FXA_EXP2_DEGREE; k++)
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c[k]));
    /* Clamp before converting: NaN (z = -inf) and huge gaps become -127. */
    const __m256 nc =
        _mm256_min_ps(_mm256_max_ps(n, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
    const __m256i bits =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nc), _mm256_set1_epi32(127)), 23);
    const __m256 r = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    const __m256 keep = _mm256_cmp_ps(_mm256_add_ps(n, f), _mm256_set1_ps(-126.0f), _CMP_GE_OQ);
    return _mm256_and_ps(keep, r);
}

#endif
