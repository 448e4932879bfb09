/*
 * The softmax micro-kernels of the AVX-512 bf16-compute tiles (fxa_attn_tile_bf16 in
 * kernels.h), shared by the vdpbf16ps tile and the AMX tile, for softmax_rows_impl.h (which
 * this header includes: the tile files call softmax_rows): P = exp2(z - shift) rounded to bf16
 * into p16, and l summing the rounded values. The exp2 is bf16 compute's degree-4 one
 * (fxa_vexp2_shifted_bf16_f32x16, the twin of the portable tile's fxa_exp2_shifted_bf16_ref).
 *
 * The including file defines FXA_BF16_RAW_SCORES: 0 when its scores buffer holds z = lambda
 * (s - center) already (the vdpbf16ps tile scales while its accumulators are in registers), 1
 * when it holds the raw dot products s (the AMX tile stores its accumulator tiles as they are);
 * with 1 each vector is scaled here on load by the same two operations (z = lambda * (s -
 * center)), so both give the same z bits. With a bias (masks), row_bias stores z + bias in place
 * first and the row is then read as z (raw = 0) whatever FXA_BF16_RAW_SCORES says.
 * Include only from files compiled with -mavx512f -mavx512bf16.
 */
#ifndef FXA_BF16_SOFTMAX_AVX512_H
#define FXA_BF16_SOFTMAX_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "../kernels.h"
#include "rows_avx512.h"
#include "vexp2_avx512.h"

/* z of 16 scores of row i (masked lanes read as 0 before scaling); raw (a constant): the
 * buffer holds s. */
static inline __attribute__((always_inline)) __m512
fxa_bf16_load_z(const fxa_attn_tile_bf16 *t, size_t i, const float *s, __mmask16 k, const int raw)
{
    const __m512 x = _mm512_maskz_loadu_ps(k, s);
    if (!raw)
        return x;
    return _mm512_mul_ps(_mm512_set1_ps(t->lambda),
                         _mm512_sub_ps(x, _mm512_set1_ps(t->qk_center[i])));
}

/* Whether row scores are read as raw s: without a bias, as the tile stores them. */
#define FXA_BF16_RAW(t) (FXA_BF16_RAW_SCORES && !(t)->bias)

#if FXA_BF16_RAW_SCORES
#define FXA_SOFTMAX_OWN_ZMAX
#define FXA_SOFTMAX_OWN_BIAS
/* max_j z_ij of row i (exact: the scaling is monotone). */
static inline __attribute__((always_inline)) float row_zmax(const fxa_attn_tile_bf16 *t, size_t i)
{
    if (!FXA_BF16_RAW(t))
        return row_max(t->scores + i * t->ld_scores, t->n_kv);
    const float *s = t->scores + i * t->ld_scores;
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (size_t j = 0; j < t->n_kv; j += 16) {
        const __mmask16 k = fxa_tail_mask16((ptrdiff_t)(t->n_kv - j));
        mx = _mm512_mask_max_ps(mx, k, mx, fxa_bf16_load_z(t, i, s + j, k, 1));
    }
    return _mm512_reduce_max_ps(mx);
}

/* Row i's raw s into z + bias, in place (z formed as fxa_bf16_load_z forms it). */
static inline void row_bias(const fxa_attn_tile_bf16 *t, size_t i)
{
    float *s = t->scores + i * t->ld_scores;
    const float *b = t->bias + i * t->ld_bias;
    for (size_t j = 0; j < t->n_kv; j += 16) {
        const __mmask16 k = fxa_tail_mask16((ptrdiff_t)(t->n_kv - j));
        _mm512_mask_storeu_ps(
            s + j, k,
            _mm512_add_ps(fxa_bf16_load_z(t, i, s + j, k, 1), _mm512_maskz_loadu_ps(k, b + j)));
    }
}
#endif

/* Row i: p16 = bf16(exp2(z - shift)) (pad column zeroed); returns the sum of the
 * rounded values. may_flush 0 (a constant) leaves out the flush test, for
 * rows whose bound proves that no term flushes (FXA_ROW_FIXED). Whole
 * groups of 32 scores round two vectors into one (vcvtne2ps2bf16), store it
 * whole and add the rounded pairs into the sum with one vdpbf16ps by ones
 * (each p times 1 is exact: lane k adds p_2k, then p_2k+1); the tail goes 16
 * at a time under masks. */
static inline __attribute__((always_inline)) float row_exp2_from(const fxa_attn_tile_bf16 *t,
                                                                 size_t i, float shift,
                                                                 const int may_flush, const int raw)
{
    const float *s = t->scores + i * t->ld_scores;
    uint16_t *p16 = t->p16 + i * t->ld_scores;
    const size_t n = t->n_kv;
    const __m512 m = _mm512_set1_ps(shift);
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80); /* bf16 1.0 */
    __m512 sum = _mm512_setzero_ps();
    size_t j = 0;
    for (; j + 32 <= n; j += 32) {
        const __m512 z0 = fxa_bf16_load_z(t, i, s + j, 0xffff, raw);
        const __m512 z1 = fxa_bf16_load_z(t, i, s + j + 16, 0xffff, raw);
        const __m512 p0 = may_flush ? fxa_vexp2_shifted_bf16_f32x16(z0, m)
                                    : fxa_vexp2_shifted_bf16_noflush_f32x16(z0, m);
        const __m512 p1 = may_flush ? fxa_vexp2_shifted_bf16_f32x16(z1, m)
                                    : fxa_vexp2_shifted_bf16_noflush_f32x16(z1, m);
        const __m512bh pb = _mm512_cvtne2ps_pbh(p1, p0); /* p0 in the low half */
        _mm512_storeu_si512(p16 + j, (__m512i)pb);
        sum = _mm512_dpbf16_ps(sum, pb, ones);
    }
    for (; j < n; j += 16) {
        const __mmask16 k = fxa_tail_mask16((ptrdiff_t)(n - j));
        const __m512 z16 = fxa_bf16_load_z(t, i, s + j, k, raw);
        const __m512 p = may_flush ? fxa_vexp2_shifted_bf16_f32x16(z16, m)
                                   : fxa_vexp2_shifted_bf16_noflush_f32x16(z16, m);
        const __m256i pb = (__m256i)_mm512_cvtneps_pbh(p);
        _mm256_mask_storeu_epi16(p16 + j, k, pb);
        const __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(pb), 16));
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, back));
    }
    if (n % 2)
        p16[n] = 0;
    return _mm512_reduce_add_ps(sum);
}

/* row_exp2_from on the scores as the row holds them (raw s, or z once a bias was added). */
static inline __attribute__((always_inline)) float row_exp2(const fxa_attn_tile_bf16 *t, size_t i,
                                                            float shift, const int may_flush)
{
    if (FXA_BF16_RAW(t))
        return row_exp2_from(t, i, shift, may_flush, 1);
    return row_exp2_from(t, i, shift, may_flush, 0);
}

#define FXA_SOFTMAX_TILE fxa_attn_tile_bf16
#include "../softmax_rows_impl.h"

#endif
