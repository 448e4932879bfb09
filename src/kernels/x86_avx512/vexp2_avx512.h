/*
 * 2^(z - m) for 16 lanes, m integer-valued: the AVX-512 twin of
 * fxa_exp2_shifted_ref (kernels/ref/exp2_ref.h), same reduction and the same
 * degree-7 polynomial, evaluated with FMA. z = zi + f with zi = round(z)
 * (vrndscaleps) and f = z - zi exact; n = zi - m is exact while
 * |zi - m| < 2^24 (larger gaps only occur for terms that flush anyway);
 * 2^n is applied by vscalefps. Results with n + f < -126 are flushed to 0,
 * like the reference; a variant skips that test where the caller proves no
 * lane flushes. Error: tests/unit/test_exp2.c.
 * Include only from files compiled with -mavx512f.
 */
#ifndef FXA_VEXP2_AVX512_H
#define FXA_VEXP2_AVX512_H

#include <immintrin.h>

#include "../ref/exp2_ref.h"

/* 2^(z - m): the reduction, the polynomial p ~ 2^f (bf16 = 0: the degree-7
 * one; bf16 = 1: bf16 compute's degree-4 one, the twin of
 * fxa_exp2_shifted_bf16_ref in ref/exp2_ref.h), and p 2^n, flushed to 0
 * where n + f < -126 unless flush = 0. bf16 and flush are constants at
 * every call (the wrappers below), so each variant compiles to its own
 * straight line. */
static inline __attribute__((always_inline)) __m512
fxa_vexp2_eval_f32x16(__m512 z, __m512 m, const int bf16, const int flush)
{
    const __m512 zi = _mm512_roundscale_ps(z, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(z, zi);
    static const float c7[] = {FXA_EXP2_COEFFS};
    static const float c4[] = {FXA_EXP2_BF16_COEFFS};
    const float *c = bf16 ? c4 : c7;
    const int degree = bf16 ? FXA_EXP2_BF16_DEGREE : FXA_EXP2_DEGREE;
    __m512 p = _mm512_set1_ps(c[0]);
    FXA_EXP2_UNROLL
    for (int k = 1; k <= degree; k++)
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c[k]));
    const __m512 n = _mm512_sub_ps(zi, m);
    if (!flush)
        return _mm512_scalef_ps(p, n);
    const __mmask16 keep =
        _mm512_cmp_ps_mask(_mm512_add_ps(n, f), _mm512_set1_ps(-126.0f), _CMP_GE_OQ);
    return _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(p, n));
}

static inline __m512 fxa_vexp2_shifted_f32x16(__m512 z, __m512 m)
{
    return fxa_vexp2_eval_f32x16(z, m, 0, 1);
}

/* The same without the flush test: equal to fxa_vexp2_shifted_f32x16
 * wherever z - m >= -126, as in the rows whose bound proves it
 * (FXA_ROW_FIXED: z - m >= -125). */
static inline __m512 fxa_vexp2_shifted_noflush_f32x16(__m512 z, __m512 m)
{
    return fxa_vexp2_eval_f32x16(z, m, 0, 0);
}

/* bf16 compute's exp2, with and without the flush test. */
static inline __m512 fxa_vexp2_shifted_bf16_f32x16(__m512 z, __m512 m)
{
    return fxa_vexp2_eval_f32x16(z, m, 1, 1);
}

static inline __m512 fxa_vexp2_shifted_bf16_noflush_f32x16(__m512 z, __m512 m)
{
    return fxa_vexp2_eval_f32x16(z, m, 1, 0);
}

#endif
