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

typedef __m256 peak_vec;
#define peak_set1 _mm256_set1_ps
#define peak_add _mm256_add_ps

/* c = c*a + b per accumulator: stays finite and normal for a just below 1. */
#define PEAK_NAME fma_chains
#define PEAK_STEP(c, a, b) _mm256_fmadd_ps(c, a, b)
#include "peak_loop_impl.h"

static float f32_run(uint64_t iters, float a, float b)
{
    const __m256 c = fma_chains(iters, _mm256_set1_ps(a), _mm256_set1_ps(b), b);
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 8 lanes x 2 FLOP per FMA. */
const fxt_peak_loop fxt_peak_loop_avx2_f32 = {f32_run, PEAK_ACC * 8.0 * 2.0, "avx2 fma ymm"};

#endif
