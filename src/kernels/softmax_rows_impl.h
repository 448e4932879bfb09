/*
 * The softmax pass of every attention tile (fxa_attn_tile and fxa_attn_tile_bf16 in
 * kernels.h), written once: the loop over rows and the fixed and online row updates live here,
 * and each tile file supplies only its vector micro-kernels (BLIS style). Per row i:
 *   fixed row   l_i += sum_j P_ij, P_ij = exp2(z_ij - m_i) at the row's constant shift;
 *   online row  m' = max(m_i, ceil(max_j z_ij)), an integer, and alpha = 2^(m_i - m'), an exact
 *               power of two (1 if m' = m_i); P_ij = exp2(z_ij - m'); o_i *= alpha (skipped
 *               when alpha = 1), l_i = alpha l_i + sum_j P_ij, m_i = m'.
 * With a bias (t->bias, masks and causal), z_ij + bias_ij first, in place, every row takes the
 * flush test (a masked -inf gives P = 0 there), and an online row with no unmasked key yet
 * (m' = -inf) writes P = 0 and keeps its state.
 * Every step but the exp2 pass is exact, so every vector width gives the same bits around it.
 *
 * A tile file defines, before including this header (each a static function, under its own
 * ISA flags):
 *   FXA_SOFTMAX_TILE   the tile type;
 *   row_max(z, n), row_scale(o, d, a), row_add(z, b, n)
 *                      max_j z[j] over n floats (exact), o[c] *= a for c < d and z[j] += b[j]
 *                      for j < n, its vector width's (ref/rows_ref.h, x86_avx2/rows_avx2.h,
 *                      x86_avx512/rows_avx512.h);
 *   row_exp2(t, i, shift, may_flush)
 *                      P of row i at the integer shift into the tile's P (in place in scores,
 *                      or p16), returning the sum of P; may_flush 0 (a constant at each call)
 *                      may leave out the flush test (FXA_ROW_FIXED rows never flush);
 *   row_zmax(t, i)     max_j z_ij of row i, only where the scores buffer does not hold z
 *                      (FXA_SOFTMAX_OWN_ZMAX defined); else row_max of the row's scores;
 *   row_bias(t, i)     z_ij + bias_ij into row i's scores, only where the scores buffer does not
 *                      hold z (FXA_SOFTMAX_OWN_BIAS defined); else row_add over the row.
 */
#ifndef FXA_SOFTMAX_ROWS_IMPL_H
#define FXA_SOFTMAX_ROWS_IMPL_H

#include <math.h>
#include <stddef.h>

#include "kernels.h"
#include "ref/exp2_ref.h"

/* The contract of the including file's micro-kernels. */
static float row_max(const float *z, size_t n);
static void row_scale(float *o, size_t d, float a);
static void row_add(float *z, const float *b, size_t n);
static float row_exp2(const FXA_SOFTMAX_TILE *t, size_t i, float shift, int may_flush);

#ifdef FXA_SOFTMAX_OWN_ZMAX
static float row_zmax(const FXA_SOFTMAX_TILE *t, size_t i);
#else
static inline float row_zmax(const FXA_SOFTMAX_TILE *t, size_t i)
{
    return row_max(t->scores + i * t->ld_scores, t->n_kv);
}
#endif

#ifdef FXA_SOFTMAX_OWN_BIAS
static void row_bias(const FXA_SOFTMAX_TILE *t, size_t i);
#else
static inline void row_bias(const FXA_SOFTMAX_TILE *t, size_t i)
{
    row_add(t->scores + i * t->ld_scores, t->bias + i * t->ld_bias, t->n_kv);
}
#endif

/* Rows [i0, i0 + n) of the tile: P written and the row state (m, l, o) updated. */
static inline __attribute__((always_inline)) void softmax_rows(const FXA_SOFTMAX_TILE *t, size_t i0,
                                                               size_t n)
{
    for (size_t i = i0; i < i0 + n; i++) {
        if (t->bias)
            row_bias(t, i);
        if (t->online[i] != FXA_ROW_ONLINE) {
            /* Constant flags: one specialised loop each. */
            const int may_flush = t->online[i] == FXA_ROW_FIXED_MAY_FLUSH || t->bias;
            t->l[i] += may_flush ? row_exp2(t, i, t->m[i], 1) : row_exp2(t, i, t->m[i], 0);
            continue;
        }
        /* Integer running shift: the rescale factor is an exact power of two and the largest
         * term lies in (1/2, 1]. */
        const float m_new = fmaxf(t->m[i], ceilf(row_zmax(t, i)));
        if (m_new == -INFINITY) { /* every key so far masked: P = 0 */
            row_exp2(t, i, 0.0f, 1);
            continue;
        }
        const float alpha = fxa_exp2_shifted_ref(t->m[i], m_new);
        const float sum = row_exp2(t, i, m_new, 1);
        if (alpha != 1.0f)
            row_scale(t->o + i * t->ldo, t->d, alpha);
        t->l[i] = t->l[i] * alpha + sum;
        t->m[i] = m_new;
    }
}

#endif
