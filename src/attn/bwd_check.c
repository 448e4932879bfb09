/* The backward's input checks: the mask, outputs apart from inputs, every
 * input value finite, and scores that fp32 holds without prescaling. */
#include <math.h>

#include "bwd_internal.h"
#include "load.h"
#include "mask.h"
#include "steps.h"

/* The first non-finite element of a [B, heads, seq, D] tensor, reported
 * with its position, and the largest row norm in *norm_max; row is
 * scratch of D floats. */
static fxa_status check_finite(const fxa_attn_bwd_plan *bp, const char *name, const void *base,
                               fxa_dtype dtype, const fxa_strides *st, int64_t heads, int64_t seq,
                               float *row, double *norm_max)
{
    const fxa_attn_plan *p = bp->fwd;
    double n2_max = 0.0;
    for (int64_t b = 0; b < p->d.batch; b++) {
        for (int64_t h = 0; h < heads; h++) {
            for (int64_t s = 0; s < seq; s++) {
                fxa_load_row(bp->ctx->kernels, base, dtype,
                             b * st->batch + h * st->head + s * st->token, bp->dim, row);
                double n2 = 0.0;
                for (size_t c = 0; c < bp->dim; c++) {
                    n2 += (double)row[c] * (double)row[c];
                    if (!isfinite(row[c]))
                        return fxa_ctx_fail(bp->ctx, FXA_ERR_INVALID_ARG,
                                            "%s has a non-finite value at batch %lld, token %lld, "
                                            "head %lld, dim %zu",
                                            name, (long long)b, (long long)s, (long long)h, c);
                }
                n2_max = n2 > n2_max ? n2 : n2_max;
            }
        }
    }
    *norm_max = sqrt(n2_max);
    return FXA_OK;
}

/* The values: every element finite, and the norms' products within fp32. */
static fxa_status check_values(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a, float *row)
{
    const fxa_attn_plan *p = bp->fwd;
    const struct {
        const char *name;
        const void *base;
        fxa_dtype dtype;
        const fxa_strides *st;
        int64_t heads, seq;
    } t[5] = {{"Q", a->q, p->d.dtype, &p->q_strides, p->d.heads_q, p->d.seq_q},
              {"K", a->k, p->d.dtype, &p->k_strides, p->d.heads_kv, p->d.seq_kv},
              {"V", a->v, p->d.dtype, &p->v_strides, p->d.heads_kv, p->d.seq_kv},
              {"out", a->out, p->d.out_dtype, &p->o_strides, p->d.heads_q, p->d.seq_q},
              {"dout", a->dout, p->d.out_dtype, &p->o_strides, p->d.heads_q, p->d.seq_q}};
    double norm[5];
    for (int i = 0; i < 5; i++) {
        const fxa_status st = check_finite(bp, t[i].name, t[i].base, t[i].dtype, t[i].st,
                                           t[i].heads, t[i].seq, row, &norm[i]);
        if (st != FXA_OK)
            return st;
    }
    /* Every partial sum of q.k and dout.v is at most the norms' product
     * (Cauchy-Schwarz); the backward forms them in fp32 without the
     * forward's prescaling, so they must stay far inside fp32. */
    const double qk = norm[0] * norm[1], dov = norm[4] * norm[2], limit = 0x1p120;
    if (qk > limit || dov > limit)
        return fxa_ctx_fail(bp->ctx, FXA_ERR_UNSUPPORTED,
                            "the backward forms q.k (up to %.3g) and dout.v (up to %.3g) in fp32 "
                            "without prescaling; products of norms above 2^120 are not supported",
                            qk, dov);
    const int64_t n = p->d.batch * p->d.heads_q * p->d.seq_q;
    const int masked_rows = p->d.mask_kind != FXA_MASK_NONE; /* rows may have every key masked */
    for (int64_t r = 0; r < n; r++) {
        if (!isfinite(a->lse[r]) && !(masked_rows && a->lse[r] == -INFINITY))
            return fxa_ctx_fail(bp->ctx, FXA_ERR_INVALID_ARG,
                                "lse has a non-finite value at batch %lld, head %lld, token %lld",
                                (long long)(r / (p->d.heads_q * p->d.seq_q)),
                                (long long)(r / p->d.seq_q % p->d.heads_q),
                                (long long)(r % p->d.seq_q));
    }
    return FXA_OK;
}

/* Refuse outputs (dq, dk, dv, the workspace) that overlap an input or each
 * other. */
static fxa_status check_spans(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a,
                              void *workspace)
{
    const fxa_attn_plan *p = bp->fwd;
    const size_t rows = (size_t)(p->d.batch * p->d.heads_q * p->d.seq_q);
    const fxa_span in[7] = {
        {"Q", a->q, (size_t)p->q_extent * p->in_elem},
        {"K", a->k, (size_t)p->kv_extent[0] * p->in_elem},
        {"V", a->v, (size_t)p->kv_extent[1] * p->in_elem},
        {"out", a->out, (size_t)p->o_extent * p->out_elem},
        {"dout", a->dout, (size_t)p->o_extent * p->out_elem},
        {"lse", a->lse, rows * sizeof(float)},
        {"mask", p->mask_bytes ? a->mask : NULL, p->mask_bytes},
    };
    const fxa_span out[4] = {
        {"dq", a->dq, (size_t)p->q_extent * sizeof(float)},
        {"dk", a->dk, (size_t)p->kv_extent[0] * sizeof(float)},
        {"dv", a->dv, (size_t)p->kv_extent[1] * sizeof(float)},
        {"workspace", workspace, bp->ws_total},
    };
    return fxa_spans_disjoint(bp->ctx, out, 4, in, 7);
}

fxa_status fxa_bwd_check_inputs(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a,
                                void *workspace, float *row)
{
    fxa_status st = fxa_mask_check(bp->fwd, a->mask);
    if (st == FXA_OK)
        st = check_spans(bp, a, workspace);
    return st != FXA_OK ? st : check_values(bp, a, row);
}
