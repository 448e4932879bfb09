/*
 * AVX2+FMA fp32 backward tiles (contract: fxa_attn_bwd_tile in kernels.h).
 * Built with -mavx2 -mfma (per file). The AVX-512 tiles' structure on ymm:
 *
 *   P, dS   6 x 16 blocks against one 16-key panel of K^T (then V^T): 12 ymm
 *           accumulators, FMA chains over c from 0; p = exp2(lambda s -
 *           lse2) (one FMA forms the argument; fxa_vexp2_shifted_f32x8 with
 *           shift 0), ds = p (dp - delta). Pad keys of the last panel are
 *           zero in K^T and V^T; their p and ds are never read.
 *   dK, dV  6 key rows x 16 columns in 12 ymm accumulators, FMA chain over i;
 *   dQ      6 query rows x 16 columns, FMA chain over j; column tails
 *           masked (vmaskmovps), never over-read.
 * Matches the reference to fp32 rounding (FMA changes the last bits); a
 * row's bits do not depend on its place in the tile.
 */
#include <stddef.h>
#include <immintrin.h>

#include "../kernels.h"
#include "vexp2_avx2.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

#define MR 6     /* micro-kernel rows */
#define NV 2     /* micro-kernel columns, in ymm (16 floats) */
#define PANEL 16 /* keys per K^T / V^T panel: 8 NV */

/* Lanes [0, n) of a vector (n clamped to 0..8), as vmaskmovps reads them. */
static inline __m256i lanes(ptrdiff_t n)
{
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int c = n < 0 ? 0 : (n > 8 ? 8 : (int)n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), idx);
}

/* acc[r][v] = sum_c a[r lda + c] bt[c PANEL + 8 v], c increasing from 0. */
static ALWAYS_INLINE void panel_dots(const float *a, size_t lda, const float *bt, size_t d,
                                     const size_t mr, __m256 acc[MR][NV])
{
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < NV; v++)
            acc[r][v] = _mm256_setzero_ps();
    }
    for (size_t c = 0; c < d; c++) {
        __m256 b[NV];
        UNROLL
        for (size_t v = 0; v < NV; v++)
            b[v] = _mm256_loadu_ps(bt + c * PANEL + 8 * v);
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m256 x = _mm256_broadcast_ss(a + r * lda + c);
            UNROLL
            for (size_t v = 0; v < NV; v++)
                acc[r][v] = _mm256_fmadd_ps(x, b[v], acc[r][v]);
        }
    }
}

/* p and ds of rows [i0, i0 + mr) x the 16 keys of the panel at j0. */
static ALWAYS_INLINE void p_ds_block(const fxa_attn_bwd_tile *t, size_t i0, size_t j0,
                                     const size_t mr)
{
    __m256 acc[MR][NV];
    const size_t panel_at = j0 * t->d;
    panel_dots(t->q + i0 * t->ldq, t->ldq, t->kt + panel_at, t->d, mr, acc);
    const __m256 lambda = _mm256_set1_ps(t->lambda);
    const __m256 zero = _mm256_setzero_ps();
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        const __m256 lse2 = _mm256_set1_ps(t->lse2[i0 + r]);
        float *p = t->p + (i0 + r) * t->ld_p + j0;
        UNROLL
        for (size_t v = 0; v < NV; v++)
            _mm256_storeu_ps(
                p + 8 * v, fxa_vexp2_shifted_f32x8(_mm256_fmsub_ps(lambda, acc[r][v], lse2), zero));
    }
    panel_dots(t->dout + i0 * t->ldq, t->ldq, t->vt + panel_at, t->d, mr, acc);
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        const __m256 delta = _mm256_set1_ps(t->delta[i0 + r]);
        const float *p = t->p + (i0 + r) * t->ld_p + j0;
        float *ds = t->ds + (i0 + r) * t->ld_p + j0;
        UNROLL
        for (size_t v = 0; v < NV; v++)
            _mm256_storeu_ps(ds + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(p + 8 * v),
                                                       _mm256_sub_ps(acc[r][v], delta)));
    }
}

/* CALL(mr) for the rows [0, n) in blocks of MR, the tail with its own
 * constant mr; i0 is the block's first row. */
#define FOR_ROW_BLOCKS(n, i0, CALL)                                                                \
    do {                                                                                           \
        size_t i0 = 0;                                                                             \
        for (; i0 + MR <= (n); i0 += MR)                                                           \
            CALL(MR);                                                                              \
        switch ((n)-i0) {                                                                          \
        case 5: CALL(5); break;                                                                    \
        case 4: CALL(4); break;                                                                    \
        case 3: CALL(3); break;                                                                    \
        case 2: CALL(2); break;                                                                    \
        case 1: CALL(1); break;                                                                    \
        default: break;                                                                            \
        }                                                                                          \
    } while (0)

static void p_ds(const fxa_attn_bwd_tile *t)
{
    for (size_t j0 = 0; j0 < t->n_kv; j0 += PANEL) {
#define P_DS(mr) p_ds_block(t, i0, j0, mr)
        FOR_ROW_BLOCKS(t->n_q, i0, P_DS);
#undef P_DS
    }
}

/* g[r][c0..] += sum_i w[i ldw + r w_step] x[i ldx + c0..] for rows r < mr of
 * g (ldg), i < n, columns masked by mask. */
static ALWAYS_INLINE void grad_block(float *g, size_t ldg, const float *w, size_t ldw,
                                     size_t w_step, const float *x, size_t ldx, size_t n,
                                     const __m256i mask[NV], const size_t mr)
{
    __m256 acc[MR][NV];
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < NV; v++)
            acc[r][v] = _mm256_maskload_ps(g + r * ldg + 8 * v, mask[v]);
    }
    for (size_t i = 0; i < n; i++) {
        __m256 xv[NV];
        UNROLL
        for (size_t v = 0; v < NV; v++)
            xv[v] = _mm256_maskload_ps(x + i * ldx + 8 * v, mask[v]);
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m256 wb = _mm256_broadcast_ss(w + i * ldw + r * w_step);
            UNROLL
            for (size_t v = 0; v < NV; v++)
                acc[r][v] = _mm256_fmadd_ps(wb, xv[v], acc[r][v]);
        }
    }
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < NV; v++)
            _mm256_maskstore_ps(g + r * ldg + 8 * v, mask[v], acc[r][v]);
    }
}

void fxa_f32_bwd_dkdv_6x16__avx2(const fxa_attn_bwd_tile *t)
{
    p_ds(t);
    for (size_t c0 = 0; c0 < t->d; c0 += 8 * NV) {
        __m256i mask[NV];
        for (size_t v = 0; v < NV; v++)
            mask[v] = lanes((ptrdiff_t)t->d - (ptrdiff_t)(c0 + 8 * v));
            /* dv_j += sum_i p_ij dout_i; dk_j += sum_i ds_ij q_i (key rows i0 + r) */
#define DV(mr)                                                                                     \
    grad_block(t->dv + i0 * t->ldg + c0, t->ldg, t->p + i0, t->ld_p, 1, t->dout + c0, t->ldq,      \
               t->n_q, mask, mr)
#define DK(mr)                                                                                     \
    grad_block(t->dk + i0 * t->ldg + c0, t->ldg, t->ds + i0, t->ld_p, 1, t->q + c0, t->ldq,        \
               t->n_q, mask, mr)
        FOR_ROW_BLOCKS(t->n_kv, i0, DV);
        FOR_ROW_BLOCKS(t->n_kv, i0, DK);
#undef DV
#undef DK
    }
}

void fxa_f32_bwd_dq_6x16__avx2(const fxa_attn_bwd_tile *t)
{
    p_ds(t);
    for (size_t c0 = 0; c0 < t->d; c0 += 8 * NV) {
        __m256i mask[NV];
        for (size_t v = 0; v < NV; v++)
            mask[v] = lanes((ptrdiff_t)t->d - (ptrdiff_t)(c0 + 8 * v));
            /* dq_i += sum_j ds_ij k_j (query rows i0 + r; ds of row r is ld_p apart) */
#define DQ(mr)                                                                                     \
    grad_block(t->dq + i0 * t->ldg + c0, t->ldg, t->ds + i0 * t->ld_p, 1, t->ld_p, t->k + c0,      \
               t->ldk, t->n_kv, mask, mr)
        FOR_ROW_BLOCKS(t->n_q, i0, DQ);
#undef DQ
    }
}
