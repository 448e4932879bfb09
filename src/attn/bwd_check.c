/* The backward's input checks: the mask, outputs apart from inputs, every
 * input value finite, and scores that fp32 holds without prescaling. */
#include <math.h>
#include <string.h>

#include "bwd_internal.h"
#include "dropout.h"
#include "load.h"
#include "mask.h"
#include "steps.h"

/* The tensors whose values the backward checks, in the order their
 * errors are reported. */
enum { CHECKED = 5, CHECK_PARTS = 64 };

typedef struct checked {
    const char *name;
    const void *base;
    fxa_dtype dtype;
    const fxa_strides *st;
    int64_t heads, seq;
} checked;

/* One item of the parallel value check: its rows' largest squared norm and
 * the first of its rows with a non-finite value (-1: none). */
typedef struct check_part {
    double n2_max;
    int64_t bad_row;
} check_part;

typedef struct check_job {
    const fxa_attn_bwd_plan *bp;
    checked t[CHECKED];
    float *scratch;  /* thread 0's 2 D floats; thread k's lie k stride further */
    size_t stride;   /* floats */
    check_part *out; /* [CHECKED][CHECK_PARTS] */
} check_job;

static int64_t rows_of(const fxa_attn_bwd_plan *bp, const checked *t)
{
    return bp->fwd->d.batch * t->heads * t->seq;
}

/* Element offset of flat row r (batch, head, token order) of tensor t. */
static int64_t row_offset(const checked *t, int64_t r)
{
    const int64_t s = r % t->seq, h = r / t->seq % t->heads, b = r / (t->seq * t->heads);
    return b * t->st->batch + h * t->st->head + s * t->st->token;
}

/* ||row r of t||^2 in double (the kernels' row statistics against a zero
 * centre): non-finite exactly when one of its values is, since fp32 squares
 * stay far inside fp64. */
static double row_norm2(const fxa_attn_bwd_plan *bp, const checked *t, int64_t r, float *row,
                        const float *zero)
{
    const fxa_kernels *k = bp->ctx->kernels;
    const int64_t off = row_offset(t, r);
    if (t->dtype == FXA_BF16)
        return k->row_stats->distance2_bf16((const uint16_t *)t->base + off, zero, bp->dim);
    return k->row_stats->distance2(fxa_row_f32(k, t->base, t->dtype, off, bp->dim, row), zero,
                                   bp->dim);
}

/* Item `item`: part item % CHECK_PARTS of tensor item / CHECK_PARTS, an
 * equal share of its flat rows. */
static void check_item(void *arg, int64_t item, int thread_id)
{
    const check_job *job = arg;
    const checked *t = &job->t[item / CHECK_PARTS];
    const int64_t part = item % CHECK_PARTS, rows = rows_of(job->bp, t);
    const int64_t r0 = rows * part / CHECK_PARTS, r1 = rows * (part + 1) / CHECK_PARTS;
    float *row = job->scratch + (size_t)thread_id * job->stride;
    float *zero = row + job->bp->dim;
    memset(zero, 0, job->bp->dim * sizeof(float));
    check_part res = {0.0, -1};
    for (int64_t r = r0; r < r1; r++) {
        const double n2 = row_norm2(job->bp, t, r, row, zero);
        if (!isfinite(n2)) {
            res.bad_row = r;
            break;
        }
        res.n2_max = n2 > res.n2_max ? n2 : res.n2_max;
    }
    job->out[item] = res;
}

/* The first non-finite element of flat row r of t (one exists), named with
 * its position. */
static fxa_status report_non_finite(const fxa_attn_bwd_plan *bp, const checked *t, int64_t r,
                                    float *row)
{
    fxa_load_row(bp->ctx->kernels, t->base, t->dtype, row_offset(t, r), bp->dim, row);
    size_t c = 0;
    while (c + 1 < bp->dim && isfinite(row[c]))
        c++;
    return fxa_ctx_fail(bp->ctx, FXA_ERR_INVALID_ARG,
                        "%s has a non-finite value at batch %lld, token %lld, head %lld, dim %zu",
                        t->name, (long long)(r / (t->seq * t->heads)), (long long)(r % t->seq),
                        (long long)(r / t->seq % t->heads), c);
}

/* The values: every element finite, and the norms' products within fp32.
 * The rows are checked on the context's threads, in parts whose results
 * do not depend on the threads; the first non-finite element in tensor
 * and row order is reported. */
static fxa_status check_values(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a,
                               float *scratch, size_t stride)
{
    const fxa_attn_plan *p = bp->fwd;
    check_part out[CHECKED * CHECK_PARTS];
    check_job job = {
        .bp = bp,
        .t = {{"Q", a->q, p->d.dtype, &p->q_strides, p->d.heads_q, p->d.seq_q},
              {"K", a->k, p->d.dtype, &p->k_strides, p->d.heads_kv, p->d.seq_kv},
              {"V", a->v, p->d.dtype, &p->v_strides, p->d.heads_kv, p->d.seq_kv},
              {"out", a->out, p->d.out_dtype, &p->o_strides, p->d.heads_q, p->d.seq_q},
              {"dout", a->dout, p->d.out_dtype, &p->o_strides, p->d.heads_q, p->d.seq_q}},
        .scratch = scratch,
        .stride = stride,
        .out = out,
    };
    fxa_pool_run(&bp->ctx->pool, check_item, &job, CHECKED * CHECK_PARTS);
    double norm[CHECKED];
    for (int i = 0; i < CHECKED; i++) {
        double n2_max = 0.0;
        for (int64_t k = 0; k < CHECK_PARTS; k++) {
            const check_part *res = &out[i * CHECK_PARTS + k];
            if (res->bad_row >= 0)
                return report_non_finite(bp, &job.t[i], res->bad_row, scratch);
            n2_max = res->n2_max > n2_max ? res->n2_max : n2_max;
        }
        norm[i] = sqrt(n2_max);
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
    /* rows may have every key masked: a mask, or lower-right causal with Sq > Skv */
    const int masked_rows = p->d.mask_kind != FXA_MASK_NONE || fxa_causal_shift(p) < 0;
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
    const fxa_span in[8] = {
        {"Q", a->q, (size_t)p->q_extent * p->in_elem},
        {"K", a->k, (size_t)p->kv_extent[0] * p->in_elem},
        {"V", a->v, (size_t)p->kv_extent[1] * p->in_elem},
        {"out", a->out, (size_t)p->o_extent * p->out_elem},
        {"dout", a->dout, (size_t)p->o_extent * p->out_elem},
        {"lse", a->lse, rows * sizeof(float)},
        {"mask", p->mask_bytes ? a->mask : NULL, p->mask_bytes},
        {"dropout_keep", fxa_attn_dropout(p) ? a->dropout_keep : NULL, fxa_dropout_keep_bytes(p)},
    };
    const size_t grad_elem = a->grad_dtype == FXA_F32 ? sizeof(float) : sizeof(uint16_t);
    const fxa_span out[4] = {
        {"dq", a->dq, (size_t)p->q_extent * grad_elem},
        {"dk", a->dk, (size_t)p->kv_extent[0] * grad_elem},
        {"dv", a->dv, (size_t)p->kv_extent[1] * grad_elem},
        {"workspace", workspace, bp->ws_total},
    };
    return fxa_spans_disjoint(bp->ctx, out, 4, in, 8);
}

fxa_status fxa_bwd_check_inputs(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a,
                                void *workspace, float *scratch, size_t stride)
{
    fxa_status st = fxa_mask_check(bp->fwd, a->mask);
    if (st == FXA_OK)
        st = check_spans(bp, a, workspace);
    return st != FXA_OK ? st : check_values(bp, a, scratch, stride);
}
