/*
 * The blocks both SIMD backward tiles are made of (fp32: bwd_tiles_impl.h;
 * bf16 compute: x86_avx512/bf16_bwd_6x64_avx512bf16.c), written once:
 *   panel_dots   MR x (BWD_NV vectors) dot products against one panel of
 *                BWD_PANEL keys: a panel row loaded once per depth step, the
 *                row operand broadcast, each sum a chain over the depth from 0;
 *   grad_block   MR gradient rows x BWD_NV vectors of columns += a weighted
 *                sum of rows: a row loaded per term, its weight broadcast, a
 *                chain in increasing term order; column tails masked, never
 *                over-read;
 *   P_DS_PANELS  the includer's p_ds_block over the tile's panels and row
 *                blocks, with the bias or without;
 *   grad_blocks  grad_block over a tile's column and row blocks.
 * A row's bits do not depend on its place in the tile.
 *
 * The includer defines first, under its own ISA flags, the vector set
 * (bwd_vec, bwd_mask, BWD_W, BWD_NV, BWD_PANEL, first_lanes(n), vzero(),
 * vmaskload(ptr, m), vmaskstore(ptr, m, v)) and the operands:
 *   bwd_elem, BWD_PACK   the operands' element type and elements per lane
 *                        (fp32: float, 1; bf16 pairs: uint16_t, 2);
 *   bwd_in               the operand vector type;
 *   vload_in(ptr), vmaskload_in(ptr, m), vbroadcast_in(ptr)  (one lane's
 *                        BWD_PACK elements to every lane);
 *   vdot(acc, a, b)      acc + a b lane by lane (a pair sum for bf16).
 */
#ifndef FXA_BWD_BLOCKS_IMPL_H
#define FXA_BWD_BLOCKS_IMPL_H

#include <stddef.h>

#define BWD_ALWAYS_INLINE inline __attribute__((always_inline))
/* Loops over rows and vectors unrolled whole, so the accumulators live in registers. */
#define BWD_UNROLL _Pragma("GCC unroll 8")
#define MR 6 /* micro-kernel rows */
/* STMT for every accumulator acc[r][v] of mr rows, unrolled whole. */
#define FOR_ACC(mr, r, v, STMT)                                                                    \
    BWD_UNROLL                                                                                     \
    for (size_t r = 0; r < (mr); r++) {                                                            \
        BWD_UNROLL                                                                                 \
        for (size_t v = 0; v < BWD_NV; v++)                                                        \
            STMT;                                                                                  \
    }

/* acc[r][v] = vdot(acc[r][v], a[r a_step ..] broadcast, b[v]) for r < mr. */
static BWD_ALWAYS_INLINE void dot_step(bwd_vec acc[MR][BWD_NV], const bwd_in b[BWD_NV],
                                       const bwd_elem *a, size_t a_step, const size_t mr)
{
    BWD_UNROLL
    for (size_t r = 0; r < mr; r++) {
        const bwd_in x = vbroadcast_in(a + r * a_step);
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            acc[r][v] = vdot(acc[r][v], x, b[v]);
    }
}

/* acc[r][v] = sum over c < n of a[r lda + BWD_PACK c ..] . bt[BWD_PACK (c
 * BWD_PANEL + BWD_W v) ..], c increasing from 0. */
static BWD_ALWAYS_INLINE void panel_dots(const bwd_elem *a, size_t lda, const bwd_elem *bt,
                                         size_t n, const size_t mr, bwd_vec acc[MR][BWD_NV])
{
    FOR_ACC(mr, r, v, acc[r][v] = vzero())
    for (size_t c = 0; c < n; c++) {
        bwd_in b[BWD_NV];
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            b[v] = vload_in(bt + BWD_PACK * (c * BWD_PANEL + BWD_W * v));
        dot_step(acc, b, a + BWD_PACK * c, lda, mr);
    }
}

/* g[r][..] += sum over k < n of the weight w[k ldw + r w_step ..] times the
 * row x[BWD_PACK (k ldx) + ..], for rows r < mr of g (ldg), the columns of
 * mask; with prefetch, the next MR rows of g are prefetched into L1 first
 * (for gradients that live past L2 between tiles). */
static BWD_ALWAYS_INLINE void grad_block(float *g, size_t ldg, const bwd_elem *w, size_t ldw,
                                         size_t w_step, const bwd_elem *x, size_t ldx, size_t n,
                                         const bwd_mask mask[BWD_NV], const size_t mr,
                                         const int prefetch)
{
    bwd_vec acc[MR][BWD_NV];
    FOR_ACC(mr, r, v, acc[r][v] = vmaskload(g + r * ldg + BWD_W * v, mask[v]))
    if (prefetch)
        FOR_ACC(mr, r, v, _mm_prefetch((const char *)(g + (r + MR) * ldg + BWD_W * v), _MM_HINT_T0))
    for (size_t k = 0; k < n; k++) {
        bwd_in xv[BWD_NV];
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            xv[v] = vmaskload_in(x + BWD_PACK * (k * ldx + BWD_W * v), mask[v]);
        dot_step(acc, xv, w + k * ldw, w_step, mr);
    }
    FOR_ACC(mr, r, v, vmaskstore(g + r * ldg + BWD_W * v, mask[v], acc[r][v]))
}

/* The masks of the columns [c0, d) in one block row. */
static inline void column_masks(size_t d, size_t c0, bwd_mask mask[BWD_NV])
{
    for (size_t v = 0; v < BWD_NV; v++)
        mask[v] = first_lanes((ptrdiff_t)d - (ptrdiff_t)(c0 + BWD_W * v));
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

/* p_ds_block(t, i0, j0, mr, biased) (the includer's, `biased` a constant)
 * for every panel j0 and row block i0 of the tile t. */
#define BWD_P_DS_PLAIN(mr) p_ds_block(t, i0, j0, mr, 0)
#define BWD_P_DS_BIASED(mr) p_ds_block(t, i0, j0, mr, 1)
#define P_DS_PANELS(t)                                                                             \
    do {                                                                                           \
        for (size_t j0 = 0; j0 < (t)->n_kv; j0 += BWD_PANEL) {                                     \
            if ((t)->bias)                                                                         \
                FOR_ROW_BLOCKS((t)->n_q, i0, BWD_P_DS_BIASED);                                     \
            else                                                                                   \
                FOR_ROW_BLOCKS((t)->n_q, i0, BWD_P_DS_PLAIN);                                      \
        }                                                                                          \
    } while (0)

/* Gradient rows [0, n_rows) of g1 (ldg) += sum over k < n of the weight
 * w1[k ldw + r w_step] (row r) times the operand row x1 + BWD_PACK k ldx,
 * in column blocks of BWD_W BWD_NV and row blocks of MR; then g2 from w2
 * and x2 alike in the same column block (g2 NULL: none). prefetch: each
 * block prefetches the next one's gradient rows (grad_block). */
static BWD_ALWAYS_INLINE void grad_blocks(size_t d, size_t n_rows, size_t ldg, size_t ldw,
                                          size_t w_step, size_t ldx, size_t n, float *g1,
                                          const bwd_elem *w1, const bwd_elem *x1, float *g2,
                                          const bwd_elem *w2, const bwd_elem *x2,
                                          const int prefetch)
{
    for (size_t c0 = 0; c0 < d; c0 += BWD_W * BWD_NV) {
        bwd_mask mask[BWD_NV];
        column_masks(d, c0, mask);
#define G1(mr)                                                                                     \
    grad_block(g1 + i0 * ldg + c0, ldg, w1 + i0 * w_step, ldw, w_step, x1 + BWD_PACK * c0, ldx, n, \
               mask, mr, prefetch)
#define G2(mr)                                                                                     \
    grad_block(g2 + i0 * ldg + c0, ldg, w2 + i0 * w_step, ldw, w_step, x2 + BWD_PACK * c0, ldx, n, \
               mask, mr, prefetch)
        FOR_ROW_BLOCKS(n_rows, i0, G1);
        if (g2)
            FOR_ROW_BLOCKS(n_rows, i0, G2);
#undef G1
#undef G2
    }
}

#endif
