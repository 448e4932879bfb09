/*
 * AVX512-BF16 attention tile for FXA_COMPUTE_BF16 (contract:
 * fxa_attn_tile_bf16 in kernels.h). Built with -mavx512f -mavx512vl
 * -mavx512bw -mavx512dq -mavx512bf16 -mfma (per file).
 *
 *   scores  6 x 64 micro-kernel on vdpbf16ps over a 64-key K panel: per
 *           key-dimension pair, four zmm of packed key pairs (contiguous)
 *           and a broadcast query pair; 24 zmm accumulators in fp32.
 *   softmax bf16 compute's exp2 (degree 4), then P rounded to bf16
 *           (vcvtne2ps2bf16, 32 at a time); l sums the rounded P
 *           (bf16_softmax_avx512.h, shared with the AMX tile).
 *   P.V     6 x 64 micro-kernel on vdpbf16ps: per key pair, four zmm of
 *           packed value pairs and a broadcast pair of p; 24 accumulators.
 * The hardware flushes subnormal bf16 products (DAZ/FTZ); P itself is never
 * subnormal (exp2 flushes below 2^-126), so only products below 2^-126
 * differ from the scalar reference, far below its rounding.
 */
#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../kernels.h"
#include "rows_avx512.h"
#define FXA_BF16_RAW_SCORES 0 /* the score kernel stores z */
#include "bf16_softmax_avx512.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

#define SC_ROWS 6
#define SC_VECS 4                    /* 64 keys */
#define KP_PANEL FXA_AVX512_KT_PANEL /* = 16 SC_VECS: one K panel per block */
#define PV_ROWS 6
#define PV_VECS 4

/* A pair of bf16 values as one 32-bit lane, broadcast to 16 lanes. */
static inline __m512bh broadcast_pair(const uint16_t *pair)
{
    int32_t bits;
    memcpy(&bits, pair, sizeof bits);
    return (__m512bh)_mm512_set1_epi32(bits);
}

/* Scores of rows [i0, i0 + mr) x keys [j0, j0 + 64) (one K panel), masked
 * to the tile. */
static ALWAYS_INLINE void scores_block(const fxa_attn_tile_bf16 *t, size_t i0, size_t j0,
                                       const size_t mr, const __mmask16 mask[SC_VECS])
{
    const size_t pairs = (t->d + 1) / 2;
    __m512 acc[SC_ROWS][SC_VECS];
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++)
            acc[r][v] = _mm512_setzero_ps();
    }
    const uint16_t *q = t->q + i0 * t->ldq;
    const uint16_t *kp = t->kp + 2 * fxa_kt_offset(KP_PANEL, pairs, 0, j0);
    for (size_t c = 0; c < pairs; c++) {
        __m512bh kv[SC_VECS];
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++)
            kv[v] = (__m512bh)_mm512_maskz_loadu_epi32(mask[v], kp + 2 * (c * KP_PANEL + 16 * v));
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m512bh qb = broadcast_pair(q + r * t->ldq + 2 * c);
            UNROLL
            for (size_t v = 0; v < SC_VECS; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], qb, kv[v]);
        }
    }
    const __m512 lambda = _mm512_set1_ps(t->lambda);
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        const __m512 center = _mm512_set1_ps(t->qk_center[i0 + r]);
        float *z = t->scores + (i0 + r) * t->ld_scores + j0;
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++)
            _mm512_mask_storeu_ps(z + 16 * v, mask[v],
                                  _mm512_mul_ps(lambda, _mm512_sub_ps(acc[r][v], center)));
    }
}

static void fxa_bf16_score_6x64__avx512bf16(const fxa_attn_tile_bf16 *t)
{
    for (size_t j0 = 0; j0 < t->n_kv; j0 += KP_PANEL) {
        __mmask16 mask[SC_VECS];
        fxa_tail_masks16((ptrdiff_t)(t->n_kv - j0), SC_VECS, mask);
        size_t i0 = 0;
        for (; i0 + SC_ROWS <= t->n_q; i0 += SC_ROWS)
            scores_block(t, i0, j0, SC_ROWS, mask);
        switch (t->n_q - i0) {
        case 5: scores_block(t, i0, j0, 5, mask); break;
        case 4: scores_block(t, i0, j0, 4, mask); break;
        case 3: scores_block(t, i0, j0, 3, mask); break;
        case 2: scores_block(t, i0, j0, 2, mask); break;
        case 1: scores_block(t, i0, j0, 1, mask); break;
        default: break;
        }
    }
}

static ALWAYS_INLINE void pv_block(const fxa_attn_tile_bf16 *t, size_t i0, size_t c0,
                                   const size_t mr, const __mmask16 mask[PV_VECS])
{
    const size_t key_pairs = (t->n_kv + 1) / 2;
    __m512 acc[PV_ROWS][PV_VECS];
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            acc[r][v] = _mm512_maskz_loadu_ps(mask[v], t->o + (i0 + r) * t->ldo + c0 + 16 * v);
    }
    const uint16_t *p = t->p16 + i0 * t->ld_scores;
    for (size_t j = 0; j < key_pairs; j++) {
        const uint16_t *vj = t->vp + 2 * (j * t->ldvp + c0);
        __m512bh vv[PV_VECS];
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            vv[v] = (__m512bh)_mm512_maskz_loadu_epi32(mask[v], vj + 32 * v);
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m512bh pb = broadcast_pair(p + r * t->ld_scores + 2 * j);
            UNROLL
            for (size_t v = 0; v < PV_VECS; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], pb, vv[v]);
        }
    }
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            _mm512_mask_storeu_ps(t->o + (i0 + r) * t->ldo + c0 + 16 * v, mask[v], acc[r][v]);
    }
}

static void fxa_bf16_pv_6x64__avx512bf16(const fxa_attn_tile_bf16 *t)
{
    for (size_t c0 = 0; c0 < t->d; c0 += 16 * PV_VECS) {
        __mmask16 mask[PV_VECS];
        fxa_tail_masks16((ptrdiff_t)(t->d - c0), PV_VECS, mask);
        size_t i0 = 0;
        for (; i0 + PV_ROWS <= t->n_q; i0 += PV_ROWS)
            pv_block(t, i0, c0, PV_ROWS, mask);
        switch (t->n_q - i0) {
        case 5: pv_block(t, i0, c0, 5, mask); break;
        case 4: pv_block(t, i0, c0, 4, mask); break;
        case 3: pv_block(t, i0, c0, 3, mask); break;
        case 2: pv_block(t, i0, c0, 2, mask); break;
        case 1: pv_block(t, i0, c0, 1, mask); break;
        default: break;
        }
    }
}

void fxa_bf16_tile_6x64__avx512bf16(const fxa_attn_tile_bf16 *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    assert(t->kp_panel == KP_PANEL && t->ldvp >= t->d && t->ld_scores >= t->n_kv + t->n_kv % 2);
    fxa_bf16_score_6x64__avx512bf16(t);
    softmax_rows(t, 0, t->n_q);
    fxa_bf16_pv_6x64__avx512bf16(t);
}
