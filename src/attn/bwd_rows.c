/* The backward's P parameters of query rows (see bwd_internal.h): from
 * the forward's lse parts, else from its lse. Shared by both computes'
 * preps (bwd_run.c, bwd_bf16.c). */
#include <math.h>
#include <string.h>

#include "bwd_internal.h"
#include "mask.h"

fxa_bwd_rows_p fxa_bwd_rows_p_at(const fxa_attn_bwd_plan *bp, unsigned char *ws, size_t row0)
{
    return (fxa_bwd_rows_p){
        .lse2 = (float *)(ws + bp->ws_lse2) + row0,
        .inv_sum = (float *)(ws + bp->ws_inv_sum) + row0,
        .center = (float *)(ws + bp->ws_center) + row0,
        .off = fxa_attn_masked(bp->fwd) ? (float *)(ws + bp->ws_off) + row0 : NULL,
    };
}

/* The forward's P of a row from its lse parts {m, l, c} (fxa_attn_args):
 * lse2 = m + k and inv_sum = 2^k / l with k = floor(log2 l) where m + k is
 * exact in fp32 (|m| < 2^23, m an integer: inv_sum in (1/2, 1]), else
 * lse2 = m and inv_sum = 1 / l (then l <= N: the row ran online). */
static void p_of_parts(const float *parts, float *lse2, float *inv_sum, float *center)
{
    const double lg = log2((double)parts[1]);
    const double k = floor(lg);
    const int exact = fabsf(parts[0]) < 0x1p23f;
    *lse2 = exact ? (float)((double)parts[0] + k) : parts[0];
    *inv_sum = (float)exp2((exact ? k : 0.0) - lg);
    *center = parts[2];
}

void fxa_bwd_rows_shift(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a, int64_t b,
                        int64_t h, int64_t i0, size_t n, fxa_bwd_rows_p out)
{
    const fxa_attn_plan *p = bp->fwd;
    const int64_t row = (b * p->d.heads_q + h) * p->d.seq_q + i0;
    const float *lse = a->lse + row;
    const float *parts = a->lse_parts ? a->lse_parts + 3 * row : NULL;
    if (out.off && p->d.causal)
        memset(out.off, 0, n * sizeof *out.off);
    else if (out.off) /* lse2 is scratch here, written below */
        fxa_mask_row_max(p, a->mask, b, h, i0, n, out.lse2, out.off);
    for (size_t i = 0; i < n; i++) {
        if (lse[i] == -INFINITY) { /* every key masked: p = 0 */
            out.lse2[i] = INFINITY;
            out.inv_sum[i] = 0.0f;
            out.center[i] = 0.0f;
        } else if (parts) {
            p_of_parts(parts + 3 * i, out.lse2 + i, out.inv_sum + i, out.center + i);
        } else { /* the biases' frame: their offset included */
            out.lse2[i] =
                (float)((double)lse[i] * 1.4426950408889634 + (out.off ? (double)out.off[i] : 0.0));
            out.inv_sum[i] = 1.0f;
            out.center[i] = 0.0f;
        }
    }
}
