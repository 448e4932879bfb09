/*
 * AVX2+FMA fp32 attention tile (contract: fxa_attn_tile in kernels.h).
 * Built with -mavx2 -mfma -mf16c (per file); also holds the F16C fp16
 * widening that the AVX2 and AVX-512 sets use while packing.
 *
 *   scores  4 x 24 micro-kernel: 12 ymm accumulators, K^T rows of 24 keys
 *           loaded once per depth step and broadcast q; every score is a
 *           chain of FMAs over c from 0, whatever the rows per block; the key
 *           tail is masked (vmaskmovps), never over-read.
 *   softmax per row, 8 lanes at a time, exp2 by fxa_vexp2_shifted_f32x8.
 *   P.V     6 x 16 micro-kernel: 12 ymm accumulators; FMA chain over j;
 *           the column tail masked.
 * Matches the reference kernels to fp32 rounding, bit for bit across thread
 * counts and tilings.
 */
#include <assert.h>
#include <immintrin.h>
#include <math.h>

#include "../kernels.h"
#include "../ref/exp2_ref.h"
#include "vexp2_avx2.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
/* Fully unroll the loops over micro-kernel rows and vectors, so that the
 * accumulator arrays live in registers. */
#define UNROLL _Pragma("GCC unroll 8")

#define SC_ROWS 4 /* score micro-kernel rows */
#define SC_VECS 3 /* score micro-kernel keys, in ymm (24) */
#define PV_ROWS 6 /* P.V micro-kernel rows */
#define PV_VECS 2 /* P.V micro-kernel columns, in ymm (16) */

/* Lanes [0, n) of a ymm (n may exceed 8 or be <= 0). */
static inline __m256i tail_mask(ptrdiff_t n)
{
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int clamped = n > 8 ? 8 : (n < 0 ? 0 : (int)n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(clamped), lanes);
}

static ALWAYS_INLINE void scores_block(const fxa_attn_tile *t, size_t i0, size_t j0,
                                       const size_t mr, const __m256i mask[SC_VECS])
{
    __m256 acc[SC_ROWS][SC_VECS];
    UNROLL
    for (size_t r = 0; r < mr; r++)
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++)
            acc[r][v] = _mm256_setzero_ps();
    const float *q = t->q + i0 * t->ldq;
    const float *kt = t->kt + j0; /* one panel holds the whole tile */
    for (size_t c = 0; c < t->d; c++) {
        __m256 kv[SC_VECS];
        UNROLL
        for (size_t v = 0; v < SC_VECS; v++)
            kv[v] = _mm256_maskload_ps(kt + c * t->kt_panel + 8 * v, mask[v]);
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
            _mm256_maskstore_ps(z + 8 * v, mask[v],
                                _mm256_mul_ps(lambda, _mm256_sub_ps(acc[r][v], center)));
    }
}

static void scores_tile(const fxa_attn_tile *t)
{
    for (size_t j0 = 0; j0 < t->n_kv; j0 += 8 * SC_VECS) {
        __m256i mask[SC_VECS];
        for (size_t v = 0; v < SC_VECS; v++)
            mask[v] = tail_mask((ptrdiff_t)t->n_kv - (ptrdiff_t)(j0 + 8 * v));
        size_t i0 = 0;
        for (; i0 + SC_ROWS <= t->n_q; i0 += SC_ROWS)
            scores_block(t, i0, j0, SC_ROWS, mask);
        switch (t->n_q - i0) {
        case 3: scores_block(t, i0, j0, 3, mask); break;
        case 2: scores_block(t, i0, j0, 2, mask); break;
        case 1: scores_block(t, i0, j0, 1, mask); break;
        default: break;
        }
    }
}

static float hsum(__m256 x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static float hmax(__m256 x)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* p = exp2(z - shift) in place over n scores; returns the sum of p. */
static float exp2_row_sum(float *z, size_t n, float shift)
{
    const __m256 m = _mm256_set1_ps(shift);
    __m256 sum = _mm256_setzero_ps();
    for (size_t j = 0; j < n; j += 8) {
        const __m256i k = tail_mask((ptrdiff_t)(n - j));
        const __m256 p = _mm256_and_ps(_mm256_castsi256_ps(k),
                                       fxa_vexp2_shifted_f32x8(_mm256_maskload_ps(z + j, k), m));
        _mm256_maskstore_ps(z + j, k, p);
        sum = _mm256_add_ps(sum, p);
    }
    return hsum(sum);
}

static float row_max(const float *z, size_t n)
{
    __m256 mx = _mm256_set1_ps(-INFINITY);
    for (size_t j = 0; j < n; j += 8) {
        const __m256i k = tail_mask((ptrdiff_t)(n - j));
        const __m256 x = _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(z + j, k),
                                          _mm256_castsi256_ps(k));
        mx = _mm256_max_ps(mx, x);
    }
    return hmax(mx);
}

static void softmax_rows(const fxa_attn_tile *t)
{
    for (size_t i = 0; i < t->n_q; i++) {
        float *z = t->scores + i * t->ld_scores;
        if (t->online[i] != FXA_ROW_ONLINE) {
            t->l[i] += exp2_row_sum(z, t->n_kv, t->m[i]);
            continue;
        }
        const float m_new = fmaxf(t->m[i], ceilf(row_max(z, t->n_kv)));
        const float alpha = fxa_exp2_shifted_ref(t->m[i], m_new); /* a power of two */
        const float sum = exp2_row_sum(z, t->n_kv, m_new);
        if (alpha != 1.0f) {
            float *o = t->o + i * t->ldo;
            const __m256 a = _mm256_set1_ps(alpha);
            for (size_t c = 0; c < t->d; c += 8) {
                const __m256i k = tail_mask((ptrdiff_t)(t->d - c));
                _mm256_maskstore_ps(o + c, k, _mm256_mul_ps(a, _mm256_maskload_ps(o + c, k)));
            }
        }
        t->l[i] = t->l[i] * alpha + sum;
        t->m[i] = m_new;
    }
}

static ALWAYS_INLINE void pv_block(const fxa_attn_tile *t, size_t i0, size_t c0, const size_t mr,
                                   const __m256i mask[PV_VECS])
{
    __m256 acc[PV_ROWS][PV_VECS];
    UNROLL
    for (size_t r = 0; r < mr; r++)
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            acc[r][v] = _mm256_maskload_ps(t->o + (i0 + r) * t->ldo + c0 + 8 * v, mask[v]);
    const float *p = t->scores + i0 * t->ld_scores;
    for (size_t j = 0; j < t->n_kv; j++) {
        const float *vj = t->v + j * t->ldv + c0;
        __m256 vv[PV_VECS];
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            vv[v] = _mm256_maskload_ps(vj + 8 * v, mask[v]);
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m256 pb = _mm256_broadcast_ss(p + r * t->ld_scores + j);
            UNROLL
            for (size_t v = 0; v < PV_VECS; v++)
                acc[r][v] = _mm256_fmadd_ps(pb, vv[v], acc[r][v]);
        }
    }
    UNROLL
    for (size_t r = 0; r < mr; r++)
        UNROLL
        for (size_t v = 0; v < PV_VECS; v++)
            _mm256_maskstore_ps(t->o + (i0 + r) * t->ldo + c0 + 8 * v, mask[v], acc[r][v]);
}

static void pv_tile(const fxa_attn_tile *t)
{
    for (size_t c0 = 0; c0 < t->d; c0 += 8 * PV_VECS) {
        __m256i mask[PV_VECS];
        for (size_t v = 0; v < PV_VECS; v++)
            mask[v] = tail_mask((ptrdiff_t)t->d - (ptrdiff_t)(c0 + 8 * v));
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

static void attn_tile_f32_avx2(const fxa_attn_tile *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    assert(t->kt_panel >= t->n_kv && t->ld_scores >= (t->n_kv + 15) / 16 * 16);
    scores_tile(t);
    softmax_rows(t);
    pv_tile(t);
}

void fxa_widen_f16_f16c(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}

const fxa_kernels fxa_kernels_avx2 = {
    .isa_name = "avx2",
    .description = "AVX2+FMA fp32 tile (4x24 scores, 6x16 P.V); bf16 compute: portable tile",
    .kv_tile = 256,
    .kt_panel = 256, /* one panel per tile: 24-key blocks never straddle panels */
    .attn_tile = attn_tile_f32_avx2,
    .attn_tile_bf16 = fxa_attn_tile_bf16_ref,
    .widen_f16 = fxa_widen_f16_f16c,
    .pack_kt = fxa_pack_kt_avx2,
    .row_stats = &fxa_row_stats_avx2,
};
