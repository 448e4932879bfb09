/*
 * peak_avx2: ymm fp32 FMA throughput loop for peak.c, PEAK_ACC independent accumulators.
 * Built with per-file flags, never -march=native:
 *   set_source_files_properties(peak_avx2.c PROPERTIES COMPILE_OPTIONS "-mavx2;-mfma")
 * peak.c calls it only after checking the CPU (avx2, fma).
 */
#include "peak.h"

#if defined(__x86_64__) || defined(__i386__)
#if !defined(__AVX2__) || !defined(__FMA__)
#error "peak_avx2.c needs -mavx2 -mfma"
#endif

#include <immintrin.h>

#define PEAK_ACC 12 /* + a and b: 14 of the 16 ymm registers */

/* c = c*a + b per accumulator: stays finite and normal for a just below 1. Distinct starting
 * values keep the compiler from merging identical chains. */
static float f32_run(uint64_t iters, float a, float b)
{
    __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b), c[PEAK_ACC];
#pragma GCC unroll 12
    for (int j = 0; j < PEAK_ACC; j++)
        c[j] = _mm256_set1_ps(b * (float)(j + 1));
    for (uint64_t i = 0; i < iters; i++) {
#pragma GCC unroll 12
        for (int j = 0; j < PEAK_ACC; j++)
            c[j] = _mm256_fmadd_ps(c[j], va, vb);
    }
#pragma GCC unroll 12
    for (int j = 1; j < PEAK_ACC; j++)
        c[0] = _mm256_add_ps(c[0], c[j]);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(c[0]), _mm256_extractf128_ps(c[0], 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 lanes x 2 FLOP per FMA. */
const fxt_peak_loop fxt_peak_loop_avx2_f32 = {f32_run, PEAK_ACC * 8.0 * 2.0, "avx2 fma ymm"};

#endif
