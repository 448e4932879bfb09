/*
 * The backward tiles of the SIMD sets (fxa_attn_bwd_tile in kernels.h),
 * written once on the blocks of bwd_blocks_impl.h:
 *
 *   P, dS   MR x (BWD_NV vectors) blocks against one panel of BWD_PANEL keys
 *           of K^T (then V^T) (panel_dots: FMA chains over c from 0); then
 *           p = exp2((lambda (s - center) + bias) - lse2) inv_sum (each step rounded
 *           to fp32 as the forward forms z, the ISA's exp2 with shift 0)
 *           and ds = p (dp - delta). Pad keys of the
 *           last panel are zero in K^T and V^T, so whole panels are
 *           computed; their p and ds are never read.
 *   dK, dV  MR key rows x BWD_NV vectors of columns, one row of dO (Q) loaded
 *           per query and p (ds) broadcast: an FMA chain over i;
 *   dQ      MR query rows x BWD_NV vectors, one K row loaded per key and ds
 *           broadcast: an FMA chain over j.
 * A row's bits do not depend on its place in the tile; the results match
 * the reference to fp32 rounding (FMA changes the last bits).
 *
 * A tile file defines, before including this header, under its own ISA
 * flags, the vector set of bwd_blocks_impl.h, vset1(x), vbroadcast(ptr),
 * vload(ptr), vstore(ptr, v), vfmadd(a, b, c) (a b + c), vmul(a, b),
 * vsub(a, b), vadd(a, b), vexp2_of(z, shift) (exp2(z - shift), z - shift
 * rounded once) and BWD_DKDV_NAME, BWD_DQ_NAME, the fxa_attn_bwd_fn names
 * this header defines.
 */
#ifndef FXA_BWD_TILES_IMPL_H
#define FXA_BWD_TILES_IMPL_H

#include <stddef.h>

#include "kernels.h"

/* The operands: fp32 values. */
typedef float bwd_elem;
typedef bwd_vec bwd_in;
#define BWD_PACK 1
#define vload_in(ptr) vload(ptr)
#define vmaskload_in(ptr, m) vmaskload(ptr, m)
#define vbroadcast_in(ptr) vbroadcast(ptr)
#define vdot(acc, a, b) vfmadd(a, b, acc)

#include "bwd_blocks_impl.h"

/* p and ds of rows [i0, i0 + mr) x the BWD_PANEL keys of the panel at j0;
 * with `biased` (a constant) each score takes its bias before the shift. */
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
        const bwd_vec inv_sum = vset1(t->inv_sum[i0 + r]);
        const bwd_vec center = vset1(t->center[i0 + r]);
        float *p = t->p + (i0 + r) * t->ld_p + j0;
        const float *bias = biased ? t->bias + (i0 + r) * t->ld_p + j0 : NULL;
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++) {
            const bwd_vec z = vmul(lambda, vsub(acc[r][v], center));
            const bwd_vec zb = biased ? vadd(z, vload(bias + BWD_W * v)) : z;
            vstore(p + BWD_W * v, vmul(vexp2_of(zb, lse2), inv_sum));
        }
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

/* dv_j += sum_i p_ij dout_i, dk_j += sum_i ds_ij q_i (key rows j, p and ds
 * columns); dq_i += sum_j ds_ij k_j (ds rows ld_p apart). */
static void p_ds(const fxa_attn_bwd_tile *t)
{
    P_DS_PANELS(t);
}

void BWD_DKDV_NAME(const fxa_attn_bwd_tile *t)
{
    p_ds(t);
    grad_blocks(t->d, t->n_kv, t->ldg, t->ld_p, 1, t->ldq, t->n_q, t->dv, t->p, t->dout, t->dk,
                t->ds, t->q, 0);
}

void BWD_DQ_NAME(const fxa_attn_bwd_tile *t)
{
    if (!t->p_ds_given)
        p_ds(t);
    grad_blocks(t->d, t->n_q, t->ldg, 1, t->ld_p, t->ldk, t->n_kv, t->dq, t->ds, t->k, NULL, NULL,
                NULL, 1);
}

#endif
