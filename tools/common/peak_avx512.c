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

typedef __m512 peak_vec;
#define peak_set1 _mm512_set1_ps
#define peak_add _mm512_add_ps

/* c = c*a + b per accumulator: stays finite and normal for a just below 1. */
#define PEAK_NAME fma_chains
#define PEAK_STEP(c, a, b) _mm512_fmadd_ps(c, a, b)
#include "peak_loop_impl.h"

/* c += a.b over bf16 pairs (a and b hold them): grows by 2ab per iteration, far from overflow
 * for small b. */
#define PEAK_NAME dot_chains
#define PEAK_STEP(c, a, b) _mm512_dpbf16_ps(c, (__m512bh)(a), (__m512bh)(b))
#include "peak_loop_impl.h"

static float f32_run(uint64_t iters, float a, float b)
{
    return _mm512_reduce_add_ps(fma_chains(iters, _mm512_set1_ps(a), _mm512_set1_ps(b), b));
}

static float bf16_run(uint64_t iters, float a, float b)
{
    const __m512 fa = _mm512_set1_ps(a), fb = _mm512_set1_ps(b);
    const __m512 pa = (__m512)_mm512_cvtne2ps_pbh(fa, fa), pb = (__m512)_mm512_cvtne2ps_pbh(fb, fb);
    return _mm512_reduce_add_ps(dot_chains(iters, pa, pb, b));
}

/* FMA: 16 lanes x 2 FLOP; vdpbf16ps: 16 lanes x 2 products x 2 FLOP. */
const fxt_peak_loop fxt_peak_loop_avx512_f32 = {f32_run, PEAK_ACC * 16.0 * 2.0, "avx512f zmm fma"};
const fxt_peak_loop fxt_peak_loop_avx512_bf16 = {bf16_run, PEAK_ACC * 16.0 * 4.0,
                                                 "avx512_bf16 zmm vdpbf16ps"};

#endif
