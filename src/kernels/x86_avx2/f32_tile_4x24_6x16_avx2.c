/*
 * AVX2+FMA fp32 attention tile (contract: fxa_attn_tile in kernels.h).
 * Built with -mavx2 -mfma -mf16c (per file).
 *
 *   scores  4 x 24 micro-kernel: 12 ymm accumulators, K^T rows of 24 keys
 *           loaded once per depth step and broadcast q; every score is a
 *           chain of FMAs over c from 0, whatever the rows per block; the key
 *           tail is masked (vmaskmovps), never over-read; full blocks use
 *           plain loads and stores.
 *   softmax per row, 8 lanes at a time, exp2 by fxa_vexp2_shifted_f32x8.
 *   P.V     6 x 16 micro-kernel: 12 ymm accumulators; FMA chain over j;
 *           the column tail masked.
 * Matches the reference kernels to fp32 rounding, bit for bit across thread
 * counts and tilings.
 */
#include <assert.h>
#include <immintrin.h>

#include "../kernels.h"
#include "rows_avx2.h"
#include "vexp2_avx2.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
/* Fully unroll the loops over micro-kernel rows and vectors, so that the
 * accumulator arrays live in registers. */
#define UNROLL _Pragma("GCC unroll 8")

#define SC_ROWS 4 /* score micro-kernel rows */
#define SC_VECS 3 /* score micro-kernel keys, in ymm (24) */
#define PV_ROWS 6 /* P.V micro-kernel rows */
#define PV_VECS 2 /* P.V micro-kernel columns, in ymm (16) */

/* Loads and stores of 8 floats: plain ones for a full block (full is a
 * compile-time constant in every caller), masked ones at the tail. AMD's
 * masked stores are microcoded (about 12 cycles each on Zen 3), so the full
 * blocks, nearly all of the work, must not pay for them. */
static ALWAYS_INLINE __m256 load8(const float *x, __m256i mask, int full)
{
    return full ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, mask);
}

static ALWAYS_INLINE void store8(float *x, __m256i mask, __m256 v, int full)
{
    if (full)
        _mm256_storeu_ps(x, v);
    else
        _mm256_maskstore_ps(x, mask, v);
}

static ALWAYS_INLINE void scores_block(const fxa_attn_tile *t, size_t i0, size_t j0,
                                       const size_t mr, const __m256i mask[SC_VECS], const int full)
{
    __m256 acc[SC_ROWS][SC_VECS];
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++)
            acc[r][v] = _mm256_setzero_ps();
    }
    const float *q = t->q + i0 * t->ldq;
    const float *kt = t->kt + j0; /* one panel holds the whole tile */
    for (size_t c = 0; c < t->d; c++) {
        __m256 kv[SC_VECS];
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++)
            kv[v] = load8(kt + c * t->kt_panel + 8 * v, mask[v], full);
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m256 qb = _mm256_broadcast_ss(q + r * t->ldq + c);
            UNROLL
            for (size_t v = 0; v < SC_VECS; v++)
                acc[r][v] = _mm256_fmadd_ps(qb, kv[v], acc[r][v]);
        }
    }
    const __m256 lambda = _mm256_set1_ps(t->lambda);
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        const __m256 center = _mm256_set1_ps(t->qk_center[i0 + r]);
        float *z = t->scores + (i0 + r) * t->ld_scores + j0;
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++)
            store8(z + 8 * v, mask[v], _mm256_mul_ps(lambda, _mm256_sub_ps(acc[r][v], center)),
                   full);
    }
}

/* Every row block of key columns [j0, j0 + 32). */
static ALWAYS_INLINE void score_columns(const fxa_attn_tile *t, size_t j0,
                                        const __m256i mask[SC_VECS], const int full)
{
    size_t i0 = 0;
    for (; i0 + SC_ROWS <= t->n_q; i0 += SC_ROWS)
        scores_block(t, i0, j0, SC_ROWS, mask, full);
    switch (t->n_q - i0) {
    case 3: scores_block(t, i0, j0, 3, mask, full); break;
    case 2: scores_block(t, i0, j0, 2, mask, full); break;
    case 1: scores_block(t, i0, j0, 1, mask, full); break;
    default: break;
    }
}

static void fxa_f32_score_4x24__avx2(const fxa_attn_tile *t)
{
    for (size_t j0 = 0; j0 < t->n_kv; j0 += 8 * SC_VECS) {
        __m256i mask[SC_VECS];
        for (size_t v = 0; v < SC_VECS; v++)
            mask[v] = tail_mask((ptrdiff_t)t->n_kv - (ptrdiff_t)(j0 + 8 * v));
        if (j0 + 8 * SC_VECS <= t->n_kv)
            score_columns(t, j0, mask, 1);
        else
            score_columns(t, j0, mask, 0);
    }
}

static float hsum(__m256 x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* p = exp2(z - shift) in place over row i's scores; returns the sum of p. Every row takes the
 * flush test. */
static float row_exp2(const fxa_attn_tile *t, size_t i, float shift, int may_flush)
{
    (void)may_flush;
    float *z = t->scores + i * t->ld_scores;
    const size_t n = t->n_kv;
    const __m256 m = _mm256_set1_ps(shift);
    __m256 sum = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 p = fxa_vexp2_shifted_f32x8(_mm256_loadu_ps(z + j), m);
        _mm256_storeu_ps(z + j, p);
        sum = _mm256_add_ps(sum, p);
    }
    if (j < n) {
        const __m256i k = tail_mask((ptrdiff_t)(n - j));
        const __m256 p = _mm256_and_ps(_mm256_castsi256_ps(k),
                                       fxa_vexp2_shifted_f32x8(_mm256_maskload_ps(z + j, k), m));
        _mm256_maskstore_ps(z + j, k, p);
        sum = _mm256_add_ps(sum, p);
    }
    return hsum(sum);
}

#define FXA_SOFTMAX_TILE fxa_attn_tile
#include "../softmax_rows_impl.h"

static ALWAYS_INLINE void pv_block(const fxa_attn_tile *t, size_t i0, size_t c0, const size_t mr,
                                   const __m256i mask[PV_VECS], const int full)
{
    __m256 acc[PV_ROWS][PV_VECS];
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            acc[r][v] = load8(t->o + (i0 + r) * t->ldo + c0 + 8 * v, mask[v], full);
    }
    const float *p = t->scores + i0 * t->ld_scores;
    for (size_t j = 0; j < t->n_kv; j++) {
        const float *vj = t->v + j * t->ldv + c0;
        __m256 vv[PV_VECS];
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            vv[v] = load8(vj + 8 * v, mask[v], full);
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m256 pb = _mm256_broadcast_ss(p + r * t->ld_scores + j);
            UNROLL
            for (size_t v = 0; v < PV_VECS; v++)
                acc[r][v] = _mm256_fmadd_ps(pb, vv[v], acc[r][v]);
        }
    }
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            store8(t->o + (i0 + r) * t->ldo + c0 + 8 * v, mask[v], acc[r][v], full);
    }
}

/* Every row block of output columns [c0, c0 + 16). */
static ALWAYS_INLINE void pv_columns(const fxa_attn_tile *t, size_t c0, const __m256i mask[PV_VECS],
                                     const int full)
{
    size_t i0 = 0;
    for (; i0 + PV_ROWS <= t->n_q; i0 += PV_ROWS)
        pv_block(t, i0, c0, PV_ROWS, mask, full);
    switch (t->n_q - i0) {
    case 5: pv_block(t, i0, c0, 5, mask, full); break;
    case 4: pv_block(t, i0, c0, 4, mask, full); break;
    case 3: pv_block(t, i0, c0, 3, mask, full); break;
    case 2: pv_block(t, i0, c0, 2, mask, full); break;
    case 1: pv_block(t, i0, c0, 1, mask, full); break;
    default: break;
    }
}

static void fxa_f32_pv_6x16__avx2(const fxa_attn_tile *t)
{
    for (size_t c0 = 0; c0 < t->d; c0 += 8 * PV_VECS) {
        __m256i mask[PV_VECS];
        for (size_t v = 0; v < PV_VECS; v++)
            mask[v] = tail_mask((ptrdiff_t)t->d - (ptrdiff_t)(c0 + 8 * v));
        if (c0 + 8 * PV_VECS <= t->d)
            pv_columns(t, c0, mask, 1);
        else
            pv_columns(t, c0, mask, 0);
    }
}

void fxa_f32_tile_4x24_6x16__avx2(const fxa_attn_tile *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    assert(t->kt_panel >= t->n_kv && t->ld_scores >= (t->n_kv + 15) / 16 * 16);
    fxa_f32_score_4x24__avx2(t);
    softmax_rows(t, 0, t->n_q);
    fxa_f32_pv_6x16__avx2(t);
}
