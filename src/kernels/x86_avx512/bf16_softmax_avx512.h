/*
 * The softmax pass of the AVX-512 bf16-compute tiles (fxa_attn_tile_bf16 in
 * kernels.h), shared by the vdpbf16ps tile and the AMX tile: for each row,
 * the fixed or online update with P = exp2(z - shift) rounded to bf16 into
 * p16, and l summing the rounded values. The exp2 is bf16 compute's
 * degree-4 one (fxa_vexp2_shifted_bf16_f32x16, the twin of the portable
 * tile's fxa_exp2_shifted_bf16_ref).
 *
 * The scores buffer holds either z = lambda (s - center) already (raw = 0,
 * the vdpbf16ps tile scales while its accumulators are in registers) or the
 * raw dot products s (raw = 1, the AMX tile stores its accumulator tiles as
 * they are); with raw = 1 each vector is scaled here on load by the same two
 * operations (z = lambda * (s - center)), so both give the same z bits.
 * Include only from files compiled with -mavx512f -mavx512bf16.
 */
#ifndef FXA_BF16_SOFTMAX_AVX512_H
#define FXA_BF16_SOFTMAX_AVX512_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "../kernels.h"
#include "../ref/exp2_ref.h"
#include "rows_avx512.h"
#include "vexp2_avx512.h"

/* z of 16 scores (masked lanes read as 0 before scaling). */
static inline __attribute__((always_inline)) __m512
fxa_bf16_load_z(const float *s, __mmask16 k, __m512 lambda, __m512 center, const int raw)
{
    const __m512 x = _mm512_maskz_loadu_ps(k, s);
    return raw ? _mm512_mul_ps(lambda, _mm512_sub_ps(x, center)) : x;
}

/* max_j z_j over n scores (exact: the scaling is monotone). */
static inline __attribute__((always_inline)) float
fxa_bf16_row_max_z(const float *s, size_t n, __m512 lambda, __m512 center, const int raw)
{
    if (!raw)
        return fxa_row_max_f32x16(s, n);
    __m512 mx = _mm512_set1_ps(-INFINITY);
    for (size_t j = 0; j < n; j += 16) {
        const __mmask16 k = fxa_tail_mask16((ptrdiff_t)(n - j));
        mx = _mm512_mask_max_ps(mx, k, mx, fxa_bf16_load_z(s + j, k, lambda, center, 1));
    }
    return _mm512_reduce_max_ps(mx);
}

/* p16 = bf16(exp2(z - shift)) (pad column zeroed); returns the sum of the
 * rounded values. may_flush 0 (a constant) leaves out the flush test, for
 * rows whose bound proves that no term flushes (FXA_ROW_FIXED). Whole
 * groups of 32 scores round two vectors into one (vcvtne2ps2bf16), store it
 * whole and add the rounded pairs into the sum with one vdpbf16ps by ones
 * (each p times 1 is exact: lane k adds p_2k, then p_2k+1); the tail goes 16
 * at a time under masks. */
static inline __attribute__((always_inline)) float
fxa_bf16_exp2_row(const float *s, size_t n, float shift, uint16_t *p16, __m512 lambda,
                  __m512 center, const int raw, const int may_flush)
{
    const __m512 m = _mm512_set1_ps(shift);
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80); /* bf16 1.0 */
    __m512 sum = _mm512_setzero_ps();
    size_t j = 0;
    for (; j + 32 <= n; j += 32) {
        const __m512 z0 = fxa_bf16_load_z(s + j, 0xffff, lambda, center, raw);
        const __m512 z1 = fxa_bf16_load_z(s + j + 16, 0xffff, lambda, center, raw);
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
        const __m512 z16 = fxa_bf16_load_z(s + j, k, lambda, center, raw);
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

/* Rows [i0, i0 + n) of the tile: P into p16 and the row state updated. */
static inline __attribute__((always_inline)) void
fxa_bf16_softmax_rows_avx512(const fxa_attn_tile_bf16 *t, size_t i0, size_t n, const int raw)
{
    const __m512 lambda = _mm512_set1_ps(t->lambda);
    for (size_t i = i0; i < i0 + n; i++) {
        const float *s = t->scores + i * t->ld_scores;
        uint16_t *p16 = t->p16 + i * t->ld_scores;
        const __m512 center = _mm512_set1_ps(t->qk_center[i]);
        if (t->online[i] != FXA_ROW_ONLINE) {
            /* Constant flags: one specialised loop each. */
            const int may_flush = t->online[i] == FXA_ROW_FIXED_MAY_FLUSH;
            t->l[i] += may_flush
                           ? fxa_bf16_exp2_row(s, t->n_kv, t->m[i], p16, lambda, center, raw, 1)
                           : fxa_bf16_exp2_row(s, t->n_kv, t->m[i], p16, lambda, center, raw, 0);
            continue;
        }
        const float m_new =
            fmaxf(t->m[i], ceilf(fxa_bf16_row_max_z(s, t->n_kv, lambda, center, raw)));
        const float alpha = fxa_exp2_shifted_ref(t->m[i], m_new);
        const float sum = fxa_bf16_exp2_row(s, t->n_kv, m_new, p16, lambda, center, raw, 1);
        if (alpha != 1.0f)
            fxa_scale_row_f32x16(t->o + i * t->ldo, t->d, alpha);
        t->l[i] = t->l[i] * alpha + sum;
        t->m[i] = m_new;
    }
}

#endif
