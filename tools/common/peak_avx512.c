/*
 * peak_avx512: zmm throughput loops for peak.c (fp32 FMA and bf16 dot), each with
 * PEAK_ACC independent accumulators. Built with per-file flags, never -march=native:
 *   set_source_files_properties(peak_avx512.c PROPERTIES COMPILE_OPTIONS
 *                               "-mavx512f;-mavx512bf16;-mavx512bw;-mavx512vl")
 * peak.c calls these only after checking the CPU (avx512f, avx512bf16).
 */
#include "peak.h"

#if defined(__x86_64__) || defined(__i386__)
#if !defined(__AVX512F__) || !defined(__AVX512BF16__)
#error "peak_avx512.c needs -mavx512f -mavx512bf16 -mavx512bw -mavx512vl"
#endif

#include <immintrin.h>

#define PEAK_ACC 16

/* c = c*a + b per accumulator: stays finite and normal for a just below 1. Distinct starting
 * values keep the compiler from merging identical chains. */
static float f32_run(uint64_t iters, float a, float b)
{
    __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b), c[PEAK_ACC];
#pragma GCC unroll 16
    for (int j = 0; j < PEAK_ACC; j++)
        c[j] = _mm512_set1_ps(b * (float)(j + 1));
    for (uint64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < PEAK_ACC; j++)
            c[j] = _mm512_fmadd_ps(c[j], va, vb);
    }
#pragma GCC unroll 16
    for (int j = 1; j < PEAK_ACC; j++)
        c[0] = _mm512_add_ps(c[0], c[j]);
    return _mm512_reduce_add_ps(c[0]);
}

/* c += a.b over bf16 pairs: grows by 2ab per iteration, far from overflow for small b. */
static float bf16_run(uint64_t iters, float a, float b)
{
    __m512 fa = _mm512_set1_ps(a), fb = _mm512_set1_ps(b), c[PEAK_ACC];
    __m512bh va = _mm512_cvtne2ps_pbh(fa, fa), vb = _mm512_cvtne2ps_pbh(fb, fb);
#pragma GCC unroll 16
    for (int j = 0; j < PEAK_ACC; j++)
        c[j] = _mm512_set1_ps(b * (float)(j + 1));
    for (uint64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int j = 0; j < PEAK_ACC; j++)
            c[j] = _mm512_dpbf16_ps(c[j], va, vb);
    }
#pragma GCC unroll 16
    for (int j = 1; j < PEAK_ACC; j++)
        c[0] = _mm512_add_ps(c[0], c[j]);
    return _mm512_reduce_add_ps(c[0]);
}

/* FMA: 16 lanes x 2 FLOP; vdpbf16ps: 16 lanes x 2 products x 2 FLOP. */
const fxt_peak_loop fxt_peak_loop_avx512_f32 = {f32_run, PEAK_ACC * 16.0 * 2.0, "avx512f zmm fma"};
const fxt_peak_loop fxt_peak_loop_avx512_bf16 = {bf16_run, PEAK_ACC * 16.0 * 4.0,
                                                 "avx512_bf16 zmm vdpbf16ps"};

#endif
