/*
 * AVX-512 fp32 backward tiles (contract: fxa_attn_bwd_tile in kernels.h).
 * Built with -mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma (per file).
 *
 *   P, dS   6 x 64 blocks against one 64-key panel of K^T (then V^T): 24 zmm
 *           accumulators, a panel row loaded once per depth step and q (dO)
 *           broadcast; each score a chain of FMAs over c from 0. Then
 *           p = exp2(lambda s - lse2) (one FMA forms the argument;
 *           fxa_vexp2_shifted_f32x16 with shift 0) and ds = p (dp - delta).
 *           Pad keys of the last panel are zero in K^T and V^T, so whole
 *           panels are computed; their p and ds are never read.
 *   dK, dV  6 key rows x 64 columns of the gradient in 24 zmm accumulators,
 *           one row of dO (Q) loaded per query and p (ds) broadcast; FMA
 *           chain over i; the column tail masked.
 *   dQ      6 query rows x 64 columns, one K row loaded per key and ds
 *           broadcast; FMA chain over j.
 * Matches the reference to fp32 rounding (FMA changes the last bits); a
 * row's bits do not depend on its place in the tile.
 */
#include <stddef.h>
#include <immintrin.h>

#include "../kernels.h"
#include "vexp2_avx512.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

#define MR 6                      /* micro-kernel rows */
#define NV 4                      /* micro-kernel columns, in zmm (64 floats) */
#define PANEL FXA_AVX512_KT_PANEL /* = 16 NV */

/* Lanes [0, n) of a vector (n clamped to 0..16). */
static inline __mmask16 lanes(ptrdiff_t n)
{
    if (n >= 16)
        return (__mmask16)0xffff;
    if (n <= 0)
        return (__mmask16)0;
    return (__mmask16)((1u << n) - 1u);
}

/* acc[r][v] = sum_c a[r lda + c] bt[c PANEL + 16 v], c increasing from 0. */
static ALWAYS_INLINE void panel_dots(const float *a, size_t lda, const float *bt, size_t d,
                                     const size_t mr, __m512 acc[MR][NV])
{
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < NV; v++)
            acc[r][v] = _mm512_setzero_ps();
    }
    for (size_t c = 0; c < d; c++) {
        __m512 b[NV];
        UNROLL
        for (size_t v = 0; v < NV; v++)
            b[v] = _mm512_loadu_ps(bt + c * PANEL + 16 * v);
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m512 x = _mm512_set1_ps(a[r * lda + c]);
            UNROLL
            for (size_t v = 0; v < NV; v++)
                acc[r][v] = _mm512_fmadd_ps(x, b[v], acc[r][v]);
        }
    }
}

/* p and ds of rows [i0, i0 + mr) x the 64 keys of the panel at j0. */
static ALWAYS_INLINE void p_ds_block(const fxa_attn_bwd_tile *t, size_t i0, size_t j0,
                                     const size_t mr)
{
    __m512 acc[MR][NV];
    const size_t panel_at = j0 * t->d;
    panel_dots(t->q + i0 * t->ldq, t->ldq, t->kt + panel_at, t->d, mr, acc);
    const __m512 lambda = _mm512_set1_ps(t->lambda);
    const __m512 zero = _mm512_setzero_ps();
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        const __m512 lse2 = _mm512_set1_ps(t->lse2[i0 + r]);
        float *p = t->p + (i0 + r) * t->ld_p + j0;
        UNROLL
        for (size_t v = 0; v < NV; v++)
            _mm512_storeu_ps(p + 16 * v, fxa_vexp2_shifted_f32x16(
                                             _mm512_fmsub_ps(lambda, acc[r][v], lse2), zero));
    }
    panel_dots(t->dout + i0 * t->ldq, t->ldq, t->vt + panel_at, t->d, mr, acc);
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        const __m512 delta = _mm512_set1_ps(t->delta[i0 + r]);
        const float *p = t->p + (i0 + r) * t->ld_p + j0;
        float *ds = t->ds + (i0 + r) * t->ld_p + j0;
        UNROLL
        for (size_t v = 0; v < NV; v++)
            _mm512_storeu_ps(ds + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(p + 16 * v),
                                                        _mm512_sub_ps(acc[r][v], delta)));
    }
}

/* Calls BLOCK(..., mr) for the rows [0, n) in blocks of MR, the tail with
 * its own constant mr. */
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

/* g[r][c0..] += sum_i w[i ldw + r] x[i ldx + c0..] for rows r < mr of g
 * (ldg), i < n, columns masked by mask. */
static ALWAYS_INLINE void grad_block(float *g, size_t ldg, const float *w, size_t ldw,
                                     size_t w_step, const float *x, size_t ldx, size_t n,
                                     const __mmask16 mask[NV], const size_t mr)
{
    __m512 acc[MR][NV];
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < NV; v++)
            acc[r][v] = _mm512_maskz_loadu_ps(mask[v], g + r * ldg + 16 * v);
    }
    for (size_t i = 0; i < n; i++) {
        __m512 xv[NV];
        UNROLL
        for (size_t v = 0; v < NV; v++)
            xv[v] = _mm512_maskz_loadu_ps(mask[v], x + i * ldx + 16 * v);
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m512 wb = _mm512_set1_ps(w[i * ldw + r * w_step]);
            UNROLL
            for (size_t v = 0; v < NV; v++)
                acc[r][v] = _mm512_fmadd_ps(wb, xv[v], acc[r][v]);
        }
    }
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < NV; v++)
            _mm512_mask_storeu_ps(g + r * ldg + 16 * v, mask[v], acc[r][v]);
    }
}

void fxa_f32_bwd_dkdv_6x64__avx512(const fxa_attn_bwd_tile *t)
{
    p_ds(t);
    for (size_t c0 = 0; c0 < t->d; c0 += 16 * NV) {
        __mmask16 mask[NV];
        for (size_t v = 0; v < NV; v++)
            mask[v] = lanes((ptrdiff_t)t->d - (ptrdiff_t)(c0 + 16 * v));
            /* dv_j += sum_i p_ij dout_i; dk_j += sum_i ds_ij q_i (key rows j0 + r) */
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

void fxa_f32_bwd_dq_6x64__avx512(const fxa_attn_bwd_tile *t)
{
    p_ds(t);
    for (size_t c0 = 0; c0 < t->d; c0 += 16 * NV) {
        __mmask16 mask[NV];
        for (size_t v = 0; v < NV; v++)
            mask[v] = lanes((ptrdiff_t)t->d - (ptrdiff_t)(c0 + 16 * v));
            /* dq_i += sum_j ds_ij k_j (query rows i0 + r; ds of row r is ld_p apart) */
#define DQ(mr)                                                                                     \
    grad_block(t->dq + i0 * t->ldg + c0, t->ldg, t->ds + i0 * t->ld_p, 1, t->ld_p, t->k + c0,      \
               t->ldk, t->n_kv, mask, mr)
        FOR_ROW_BLOCKS(t->n_q, i0, DQ);
#undef DQ
    }
}
