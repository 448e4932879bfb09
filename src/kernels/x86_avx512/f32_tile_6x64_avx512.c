/*
 * AVX-512 fp32 attention tile (contract: fxa_attn_tile in kernels.h).
 * Built with -mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma (per file).
 *
 *   scores  6 x 64 micro-kernel: 24 zmm accumulators, K^T in 64-key panels
 *           (one contiguous 64 x d stream per block), a panel row loaded
 *           once per depth step and broadcast q; every score is a
 *           chain of FMAs over c from 0 (the same chain for any rows-per-
 *           block, so a row's bits never depend on its place in the tile);
 *           the key tail is masked, never over-read.
 *   softmax per row, 16 lanes at a time: fixed shift or online update with
 *           an integer running shift, exp2 by fxa_vexp2_shifted_f32x16
 *           (without its flush test in FXA_ROW_FIXED rows, which never flush).
 *   P.V     6 x 64 micro-kernel: 24 zmm accumulators, V rows loaded once per
 *           key and broadcast p; FMA chain over j; the column tail masked.
 * Matches the reference kernels to fp32 rounding (FMA and lane-wise sums
 * change the last bits), bit for bit across thread counts and tilings.
 */
#include <assert.h>
#include <immintrin.h>

#include "../kernels.h"
#include "rows_avx512.h"
#include "vexp2_avx512.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
/* Fully unroll the loops over micro-kernel rows and vectors, so that the
 * accumulator arrays live in registers. */
#define UNROLL _Pragma("GCC unroll 8")

#define SC_ROWS 6                    /* score micro-kernel rows */
#define SC_VECS 4                    /* score micro-kernel columns, in zmm (64 keys) */
#define KT_PANEL FXA_AVX512_KT_PANEL /* = 16 SC_VECS: one panel per block */
#define PV_ROWS 6                    /* P.V micro-kernel rows */
#define PV_VECS 4                    /* P.V micro-kernel columns, in zmm (64 floats) */

/* Scores of rows [i0, i0 + mr) x keys [j0, j0 + 64) (one K^T panel),
 * masked to the tile. */
static ALWAYS_INLINE void scores_block(const fxa_attn_tile *t, size_t i0, size_t j0,
                                       const size_t mr, const __mmask16 mask[SC_VECS],
                                       const int full)
{
    __m512 acc[SC_ROWS][SC_VECS];
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++)
            acc[r][v] = _mm512_setzero_ps();
    }
    const float *q = t->q + i0 * t->ldq;
    const float *kt = t->kt + fxa_kt_offset(KT_PANEL, t->d, 0, j0);
    for (size_t c = 0; c < t->d; c++) {
        __m512 kv[SC_VECS];
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++)
            kv[v] = full ? _mm512_loadu_ps(kt + c * KT_PANEL + 16 * v)
                         : _mm512_maskz_loadu_ps(mask[v], kt + c * KT_PANEL + 16 * v);
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m512 qb = _mm512_set1_ps(q[r * t->ldq + c]);
            UNROLL
            for (size_t v = 0; v < SC_VECS; v++)
                acc[r][v] = _mm512_fmadd_ps(qb, kv[v], acc[r][v]);
        }
    }
    const __m512 lambda = _mm512_set1_ps(t->lambda);
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        const __m512 center = _mm512_set1_ps(t->qk_center[i0 + r]);
        float *z = t->scores + (i0 + r) * t->ld_scores + j0;
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++) {
            const __m512 zv = _mm512_mul_ps(lambda, _mm512_sub_ps(acc[r][v], center));
            if (full)
                _mm512_storeu_ps(z + 16 * v, zv);
            else
                _mm512_mask_storeu_ps(z + 16 * v, mask[v], zv);
        }
    }
}

static void fxa_f32_score_6x64__avx512(const fxa_attn_tile *t)
{
    for (size_t j0 = 0; j0 < t->n_kv; j0 += KT_PANEL) {
        __mmask16 mask[SC_VECS];
        fxa_tail_masks16((ptrdiff_t)(t->n_kv - j0), SC_VECS, mask);
        size_t i0 = 0;
        if (j0 + KT_PANEL <= t->n_kv) /* a full panel: plain loads and stores */
            for (; i0 + SC_ROWS <= t->n_q; i0 += SC_ROWS)
                scores_block(t, i0, j0, SC_ROWS, mask, 1);
        for (; i0 + SC_ROWS <= t->n_q; i0 += SC_ROWS)
            scores_block(t, i0, j0, SC_ROWS, mask, 0);
        switch (t->n_q - i0) {
        case 5: scores_block(t, i0, j0, 5, mask, 0); break;
        case 4: scores_block(t, i0, j0, 4, mask, 0); break;
        case 3: scores_block(t, i0, j0, 3, mask, 0); break;
        case 2: scores_block(t, i0, j0, 2, mask, 0); break;
        case 1: scores_block(t, i0, j0, 1, mask, 0); break;
        default: break;
        }
    }
}

/* p = exp2(z - shift) in place over row i's scores; returns the sum of p. With
 * may_flush 0 (a constant) the flush test is left out: the row's bound
 * proves that no term flushes (FXA_ROW_FIXED). */
static ALWAYS_INLINE float row_exp2(const fxa_attn_tile *t, size_t i, float shift,
                                    const int may_flush)
{
    float *z = t->scores + i * t->ld_scores;
    const size_t n = t->n_kv;
    const __m512 m = _mm512_set1_ps(shift);
    __m512 sum = _mm512_setzero_ps();
    size_t j = 0;
    for (; j + 16 <= n; j += 16) { /* whole vectors: plain loads and stores */
        const __m512 p = may_flush ? fxa_vexp2_shifted_f32x16(_mm512_loadu_ps(z + j), m)
                                   : fxa_vexp2_shifted_noflush_f32x16(_mm512_loadu_ps(z + j), m);
        _mm512_storeu_ps(z + j, p);
        sum = _mm512_add_ps(sum, p);
    }
    for (; j < n; j += 16) {
        const __mmask16 k = fxa_tail_mask16((ptrdiff_t)(n - j));
        const __m512 z16 = _mm512_maskz_loadu_ps(k, z + j);
        const __m512 p =
            may_flush ? fxa_vexp2_shifted_f32x16(z16, m) : fxa_vexp2_shifted_noflush_f32x16(z16, m);
        _mm512_mask_storeu_ps(z + j, k, p);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, p));
    }
    return _mm512_reduce_add_ps(sum);
}

#define FXA_SOFTMAX_TILE fxa_attn_tile
#include "../softmax_rows_impl.h"

/* o[rows i0..i0+mr, cols c0..c0+64) += P V over keys [j0, j1), masks per
 * column vector. */
static ALWAYS_INLINE void pv_block(const fxa_attn_tile *t, size_t i0, size_t c0, size_t j0,
                                   size_t j1, const size_t mr, const __mmask16 mask[PV_VECS],
                                   const int full)
{
    __m512 acc[PV_ROWS][PV_VECS];
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            acc[r][v] =
                full ? _mm512_loadu_ps(t->o + (i0 + r) * t->ldo + c0 + 16 * v)
                     : _mm512_maskz_loadu_ps(mask[v], t->o + (i0 + r) * t->ldo + c0 + 16 * v);
    }
    const float *p = t->scores + i0 * t->ld_scores;
    for (size_t j = j0; j < j1; j++) {
        const float *vj = t->v + j * t->ldv + c0;
        __m512 vv[PV_VECS];
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            vv[v] =
                full ? _mm512_loadu_ps(vj + 16 * v) : _mm512_maskz_loadu_ps(mask[v], vj + 16 * v);
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m512 pb = _mm512_set1_ps(p[r * t->ld_scores + j]);
            UNROLL
            for (size_t v = 0; v < PV_VECS; v++)
                acc[r][v] = _mm512_fmadd_ps(pb, vv[v], acc[r][v]);
        }
    }
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++) {
            float *o = t->o + (i0 + r) * t->ldo + c0 + 16 * v;
            if (full)
                _mm512_storeu_ps(o, acc[r][v]);
            else
                _mm512_mask_storeu_ps(o, mask[v], acc[r][v]);
        }
    }
}

/* Keys per pass of P.V: 64 columns of PV_KEYS V rows (32 KiB) stay in L1
 * while every row block of the tile reads them. Each o element's FMA chain
 * still runs over j in order (a pass continues from o), so the bits do not
 * depend on PV_KEYS. */
#define PV_KEYS 128

static void fxa_f32_pv_6x64__avx512(const fxa_attn_tile *t)
{
    for (size_t j0 = 0; j0 < t->n_kv; j0 += PV_KEYS) {
        const size_t j1 = j0 + PV_KEYS < t->n_kv ? j0 + PV_KEYS : t->n_kv;
        for (size_t c0 = 0; c0 < t->d; c0 += 16 * PV_VECS) {
            __mmask16 mask[PV_VECS];
            fxa_tail_masks16((ptrdiff_t)(t->d - c0), PV_VECS, mask);
            size_t i0 = 0;
            if (c0 + 16 * PV_VECS <= t->d) /* full columns: plain loads and stores */
                for (; i0 + PV_ROWS <= t->n_q; i0 += PV_ROWS)
                    pv_block(t, i0, c0, j0, j1, PV_ROWS, mask, 1);
            for (; i0 + PV_ROWS <= t->n_q; i0 += PV_ROWS)
                pv_block(t, i0, c0, j0, j1, PV_ROWS, mask, 0);
            switch (t->n_q - i0) {
            case 5: pv_block(t, i0, c0, j0, j1, 5, mask, 0); break;
            case 4: pv_block(t, i0, c0, j0, j1, 4, mask, 0); break;
            case 3: pv_block(t, i0, c0, j0, j1, 3, mask, 0); break;
            case 2: pv_block(t, i0, c0, j0, j1, 2, mask, 0); break;
            case 1: pv_block(t, i0, c0, j0, j1, 1, mask, 0); break;
            default: break;
            }
        }
    }
}

void fxa_f32_tile_6x64__avx512(const fxa_attn_tile *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    assert(t->kt_panel == KT_PANEL && t->ld_scores >= (t->n_kv + 15) / 16 * 16);
    fxa_f32_score_6x64__avx512(t);
    softmax_rows(t, 0, t->n_q);
    fxa_f32_pv_6x64__avx512(t);
}
