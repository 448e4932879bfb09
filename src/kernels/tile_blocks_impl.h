/*
 * The score and P.V passes of the SIMD attention tiles (fxa_attn_tile and fxa_attn_tile_bf16 in
 * kernels.h), written once: the loops over column blocks, row blocks and depth live here, and
 * each tile file supplies only its vector micro-operations (BLIS style). Both products are one
 * register block,
 *     acc[r][v] = acc[r][v] + sum over depth steps k (increasing) of a[r][k] b[k][v],
 * one multiply-add chain per lane, with a step of a broadcast (a query value or bf16 pair, a P
 * value or pair) and a step of b loaded as vectors (a K^T panel row, a V row):
 *   scores  acc = 0, a = q, b = K^T, stored as z = lambda (acc - qk_center_i);
 *   P.V     acc = o, a = P, b = V, stored back to o.
 * A row's chain is the same whatever the rows per block, so its bits never depend on its place
 * in the tile. Column tails are masked, never over-read.
 *
 * A tile file defines, before including this header (under its own ISA flags):
 *   TB_TILE                  the tile type;
 *   tb_elem, TB_PAIR         q, K, P and V elements (float or bf16 bits) and the elements per
 *                            lane of a depth step (1, or 2 for bf16 pairs);
 *   tb_acc, tb_vec, tb_mask  the fp32 accumulator vector, the multiplicand vector and the lane
 *                            mask; TB_LANES, the lanes of a vector;
 *   SC_ROWS x SC_VECS, PV_ROWS x PV_VECS
 *                            the two register blocks (rows <= 6, vectors <= 4);
 *   PV_KEYS                  depth steps of P.V per pass over o (cache blocking only);
 *   TB_FULL_PLAIN            1: whole column blocks take plain loads and stores; 0: all masked;
 *   TB_K(t, j0), TB_K_LD(t)  K from key j0 (j0 a multiple of the score block) and the elements
 *                            between its depth steps; TB_V(t), TB_V_LD(t) and TB_P(t) likewise;
 *   block_masks(n, nvec, mask)        masks of nvec vectors covering lanes [0, n);
 *   acc_zero(), acc_set1(x), acc_load(x, mask, full), acc_store(x, mask, a, full),
 *   acc_scale(a, lambda, center)      lambda (a - center), rounded after each operation;
 *   vec_load(x, mask, full), vec_bcast(x), vec_madd(acc, a, b)
 *                                     a step of b, a step of a in every lane, acc + a b.
 * It gets tile_scores(t) and tile_pv(t).
 */
#ifndef FXA_TILE_BLOCKS_IMPL_H
#define FXA_TILE_BLOCKS_IMPL_H

#include <stddef.h>

#include "kernels.h"

#define TB_INLINE inline __attribute__((always_inline))
/* Fully unroll the loops over block rows and vectors, so that the accumulators live in
 * registers. */
#define TB_UNROLL _Pragma("GCC unroll 8")
#define TB_MAX_ROWS 6
#define TB_MAX_VECS 4

/* acc[r nv + v] += sum over steps k in [k0, k1) of a[r][k] b[k][v] (r < mr, v < nv): a's row r
 * at a + r lda, b's step k at b + k ldb. */
static TB_INLINE void block_madd(tb_acc *acc, const size_t mr, const size_t nv, const tb_elem *a,
                                 size_t lda, const tb_elem *b, size_t ldb, size_t k0, size_t k1,
                                 const tb_mask *mask, const int full)
{
    for (size_t k = k0; k < k1; k++) {
        tb_vec bk[TB_MAX_VECS];
        TB_UNROLL
        for (size_t v = 0; v < nv; v++)
            bk[v] = vec_load(b + k * ldb + TB_PAIR * TB_LANES * v, mask[v], full);
        TB_UNROLL
        for (size_t r = 0; r < mr; r++) {
            const tb_vec ar = vec_bcast(a + r * lda + TB_PAIR * k);
            TB_UNROLL
            for (size_t v = 0; v < nv; v++)
                acc[r * nv + v] = vec_madd(acc[r * nv + v], ar, bk[v]);
        }
    }
}

/* One register block of mr rows from row i0, at column col0 (a key of the scores, a column of
 * o); P.V (pv) over depth steps [k0, k1). pv, mr and full are constants at every call. */
static TB_INLINE void tile_block(const TB_TILE *t, const int pv, size_t i0, size_t col0, size_t k0,
                                 size_t k1, const size_t mr, const tb_mask *mask, const int full)
{
    const size_t nv = pv ? PV_VECS : SC_VECS;
    const size_t ld = pv ? t->ldo : t->ld_scores;
    float *out = (pv ? t->o + i0 * t->ldo : t->scores + i0 * t->ld_scores) + col0;
    tb_acc acc[TB_MAX_ROWS * TB_MAX_VECS];
    TB_UNROLL
    for (size_t r = 0; r < mr; r++) {
        TB_UNROLL
        for (size_t v = 0; v < nv; v++)
            acc[r * nv + v] =
                pv ? acc_load(out + r * ld + TB_LANES * v, mask[v], full) : acc_zero();
    }
    if (pv)
        block_madd(acc, mr, nv, TB_P(t) + i0 * t->ld_scores, t->ld_scores, TB_V(t) + TB_PAIR * col0,
                   TB_V_LD(t), k0, k1, mask, full);
    else
        block_madd(acc, mr, nv, t->q + i0 * t->ldq, t->ldq, TB_K(t, col0), TB_K_LD(t), 0,
                   (t->d + TB_PAIR - 1) / TB_PAIR, mask, full);
    const tb_acc lambda = acc_set1(t->lambda);
    TB_UNROLL
    for (size_t r = 0; r < mr; r++) {
        const tb_acc center = acc_set1(pv ? 0.0f : t->qk_center[i0 + r]);
        TB_UNROLL
        for (size_t v = 0; v < nv; v++) {
            const tb_acc x = acc[r * nv + v];
            acc_store(out + r * ld + TB_LANES * v, mask[v], pv ? x : acc_scale(x, lambda, center),
                      full);
        }
    }
}

/* Every row block of one column block: whole blocks, then the rest in one block of a constant
 * row count. */
static TB_INLINE void tile_rows(const TB_TILE *t, const int pv, size_t col0, size_t k0, size_t k1,
                                const tb_mask *mask, const int full)
{
    const size_t rows = pv ? PV_ROWS : SC_ROWS;
    size_t i0 = 0;
    for (; i0 + rows <= t->n_q; i0 += rows)
        tile_block(t, pv, i0, col0, k0, k1, rows, mask, full);
    switch (t->n_q - i0) {
    case 5:
        if (rows > 5)
            tile_block(t, pv, i0, col0, k0, k1, 5, mask, full);
        break;
    case 4:
        if (rows > 4)
            tile_block(t, pv, i0, col0, k0, k1, 4, mask, full);
        break;
    case 3: tile_block(t, pv, i0, col0, k0, k1, 3, mask, full); break;
    case 2: tile_block(t, pv, i0, col0, k0, k1, 2, mask, full); break;
    case 1: tile_block(t, pv, i0, col0, k0, k1, 1, mask, full); break;
    default: break;
    }
}

/* The column block at col0 of n columns (keys of the scores, columns of o). */
static TB_INLINE void tile_columns(const TB_TILE *t, const int pv, size_t col0, size_t n, size_t k0,
                                   size_t k1)
{
    const size_t nv = pv ? PV_VECS : SC_VECS;
    tb_mask mask[TB_MAX_VECS];
    block_masks((ptrdiff_t)(n - col0), nv, mask);
    if (TB_FULL_PLAIN && col0 + TB_LANES * nv <= n)
        tile_rows(t, pv, col0, k0, k1, mask, 1);
    else
        tile_rows(t, pv, col0, k0, k1, mask, 0);
}

/* z of every score of the tile into t->scores. */
static void tile_scores(const TB_TILE *t)
{
    for (size_t j0 = 0; j0 < t->n_kv; j0 += TB_LANES * SC_VECS)
        tile_columns(t, 0, j0, t->n_kv, 0, 0);
}

/* o += P V. Each o element's chain runs over the keys in order across passes (a pass continues
 * from o), so the bits do not depend on PV_KEYS. */
static void tile_pv(const TB_TILE *t)
{
    const size_t steps = (t->n_kv + TB_PAIR - 1) / TB_PAIR;
    for (size_t k0 = 0; k0 < steps; k0 += PV_KEYS) {
        const size_t k1 = steps - k0 > PV_KEYS ? k0 + PV_KEYS : steps;
        for (size_t c0 = 0; c0 < t->d; c0 += TB_LANES * PV_VECS)
            tile_columns(t, 1, c0, t->d, k0, k1);
    }
}

#endif
