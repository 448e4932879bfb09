/*
 * The backward tiles of the SIMD sets (fxa_attn_bwd_tile in kernels.h),
 * written once:
 *
 *   P, dS   MR x (BWD_NV vectors) blocks against one panel of BWD_PANEL keys
 *           of K^T (then V^T): MR x BWD_NV accumulators, a panel row loaded
 *           once per depth step and q (dO) broadcast, each score a chain of
 *           FMAs over c from 0; then p = exp2(lambda s - lse2) (one FMA
 *           forms the argument; the ISA's exp2 with shift 0; with a bias,
 *           lse2 - bias is rounded first and takes lse2's place) and
 *           ds = p (dp - delta). Pad keys of the last panel are zero in K^T
 *           and V^T, so whole panels are computed; their p and ds are never
 *           read.
 *   dK, dV  MR key rows x BWD_NV vectors of columns, one row of dO (Q) loaded
 *           per query and p (ds) broadcast: an FMA chain over i;
 *   dQ      MR query rows x BWD_NV vectors, one K row loaded per key and ds
 *           broadcast: an FMA chain over j. Column tails are masked, never
 *           over-read.
 * A row's bits do not depend on its place in the tile; the results match
 * the reference to fp32 rounding (FMA changes the last bits).
 *
 * A tile file defines, before including this header, under its own ISA
 * flags:
 *   BWD_DKDV_NAME, BWD_DQ_NAME   the fxa_attn_bwd_fn names this header defines;
 *   BWD_W, BWD_NV, BWD_PANEL     lanes per vector, vectors per block row, keys
 *                                per panel (BWD_W BWD_NV);
 *   bwd_vec, bwd_mask            the vector and lane-mask types;
 *   first_lanes(n)               the mask of lanes [0, n), n clamped to 0..BWD_W;
 *   vzero(), vset1(x), vbroadcast(ptr), vload(ptr), vstore(ptr, v),
 *   vmaskload(ptr, m), vmaskstore(ptr, m, v), vfmadd(a, b, c) (a b + c),
 *   vmul(a, b), vsub(a, b)       the vector operations;
 *   vexp2_of(lambda, s, lse2)    exp2(lambda s - lse2) (one FMA, then exp2).
 */
#ifndef FXA_BWD_TILES_IMPL_H
#define FXA_BWD_TILES_IMPL_H

#include <stddef.h>

#include "kernels.h"

#define BWD_ALWAYS_INLINE inline __attribute__((always_inline))
/* Loops over rows and vectors unrolled whole, so the accumulators live in registers. */
#define BWD_UNROLL _Pragma("GCC unroll 8")
#define MR 6 /* micro-kernel rows */

/* acc[r][v] = sum_c a[r lda + c] bt[c BWD_PANEL + BWD_W v], c increasing from 0. */
static BWD_ALWAYS_INLINE void panel_dots(const float *a, size_t lda, const float *bt, size_t d,
                                         const size_t mr, bwd_vec acc[MR][BWD_NV])
{
    BWD_UNROLL
    for (size_t r = 0; r < mr; r++) {
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            acc[r][v] = vzero();
    }
    for (size_t c = 0; c < d; c++) {
        bwd_vec b[BWD_NV];
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            b[v] = vload(bt + c * BWD_PANEL + BWD_W * v);
        BWD_UNROLL
        for (size_t r = 0; r < mr; r++) {
            const bwd_vec x = vbroadcast(a + r * lda + c);
            BWD_UNROLL
            for (size_t v = 0; v < BWD_NV; v++)
                acc[r][v] = vfmadd(x, b[v], acc[r][v]);
        }
    }
}

/* p and ds of rows [i0, i0 + mr) x the BWD_PANEL keys of the panel at j0;
 * with `biased` (a constant) the exp2's shift is lse2 - bias per key. */
static BWD_ALWAYS_INLINE void p_ds_block(const fxa_attn_bwd_tile *t, size_t i0, size_t j0,
                                         const size_t mr, const int biased)
{
    bwd_vec acc[MR][BWD_NV];
    const size_t panel_at = j0 * t->d;
    panel_dots(t->q + i0 * t->ldq, t->ldq, t->kt + panel_at, t->d, mr, acc);
    const bwd_vec lambda = vset1(t->lambda);
    BWD_UNROLL
    for (size_t r = 0; r < mr; r++) {
        const bwd_vec lse2 = vset1(t->lse2[i0 + r]);
        float *p = t->p + (i0 + r) * t->ld_p + j0;
        const float *bias = biased ? t->bias + (i0 + r) * t->ld_p + j0 : NULL;
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            vstore(p + BWD_W * v, vexp2_of(lambda, acc[r][v],
                                           biased ? vsub(lse2, vload(bias + BWD_W * v)) : lse2));
    }
    panel_dots(t->dout + i0 * t->ldq, t->ldq, t->vt + panel_at, t->d, mr, acc);
    BWD_UNROLL
    for (size_t r = 0; r < mr; r++) {
        const bwd_vec delta = vset1(t->delta[i0 + r]);
        const float *p = t->p + (i0 + r) * t->ld_p + j0;
        float *ds = t->ds + (i0 + r) * t->ld_p + j0;
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            vstore(ds + BWD_W * v, vmul(vload(p + BWD_W * v), vsub(acc[r][v], delta)));
    }
}

/* CALL(mr) for the rows [0, n) in blocks of MR (i0: the block's first row),
 * the tail with its own constant mr. */
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
    for (size_t j0 = 0; j0 < t->n_kv; j0 += BWD_PANEL) {
#define P_DS(mr) p_ds_block(t, i0, j0, mr, 0)
#define P_DS_BIASED(mr) p_ds_block(t, i0, j0, mr, 1)
        if (t->bias)
            FOR_ROW_BLOCKS(t->n_q, i0, P_DS_BIASED);
        else
            FOR_ROW_BLOCKS(t->n_q, i0, P_DS);
#undef P_DS
#undef P_DS_BIASED
    }
}

/* g[r][..] += sum_i w[i ldw + r w_step] x[i ldx + ..] for rows r < mr of g
 * (ldg), i < n, the columns of mask. */
static BWD_ALWAYS_INLINE void grad_block(float *g, size_t ldg, const float *w, size_t ldw,
                                         size_t w_step, const float *x, size_t ldx, size_t n,
                                         const bwd_mask mask[BWD_NV], const size_t mr)
{
    bwd_vec acc[MR][BWD_NV];
    BWD_UNROLL
    for (size_t r = 0; r < mr; r++) {
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            acc[r][v] = vmaskload(g + r * ldg + BWD_W * v, mask[v]);
    }
    for (size_t i = 0; i < n; i++) {
        bwd_vec xv[BWD_NV];
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            xv[v] = vmaskload(x + i * ldx + BWD_W * v, mask[v]);
        BWD_UNROLL
        for (size_t r = 0; r < mr; r++) {
            const bwd_vec wb = vbroadcast(w + i * ldw + r * w_step);
            BWD_UNROLL
            for (size_t v = 0; v < BWD_NV; v++)
                acc[r][v] = vfmadd(wb, xv[v], acc[r][v]);
        }
    }
    BWD_UNROLL
    for (size_t r = 0; r < mr; r++) {
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            vmaskstore(g + r * ldg + BWD_W * v, mask[v], acc[r][v]);
    }
}

/* The masks of the columns [c0, d) in one block row. */
static inline void column_masks(size_t d, size_t c0, bwd_mask mask[BWD_NV])
{
    for (size_t v = 0; v < BWD_NV; v++)
        mask[v] = first_lanes((ptrdiff_t)d - (ptrdiff_t)(c0 + BWD_W * v));
}

void BWD_DKDV_NAME(const fxa_attn_bwd_tile *t)
{
    p_ds(t);
    for (size_t c0 = 0; c0 < t->d; c0 += BWD_W * BWD_NV) {
        bwd_mask mask[BWD_NV];
        column_masks(t->d, c0, mask);
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

void BWD_DQ_NAME(const fxa_attn_bwd_tile *t)
{
    if (!t->p_ds_given)
        p_ds(t);
    for (size_t c0 = 0; c0 < t->d; c0 += BWD_W * BWD_NV) {
        bwd_mask mask[BWD_NV];
        column_masks(t->d, c0, mask);
        /* dq_i += sum_j ds_ij k_j (query rows i0 + r; ds of row r is ld_p apart) */
#define DQ(mr)                                                                                     \
    grad_block(t->dq + i0 * t->ldg + c0, t->ldg, t->ds + i0 * t->ld_p, 1, t->ld_p, t->k + c0,      \
               t->ldk, t->n_kv, mask, mr)
        FOR_ROW_BLOCKS(t->n_q, i0, DQ);
#undef DQ
    }
}

#endif
