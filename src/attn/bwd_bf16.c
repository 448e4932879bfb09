/*
 * The backward's bf16 compute (FXA_COMPUTE_BF16): its prep and tiles in the
 * pair layouts of fxa_attn_bwd_tile_bf16. Inputs are read as fp32 (exact)
 * and rounded to bf16 once (exact for bf16 inputs; an fp32 dout or out is
 * rounded for the products, while delta = dO . O takes the values as they
 * are, in double). The schedules and the order of every gradient's
 * additions are bwd_run.c's.
 */
#include <math.h>
#include <string.h>

#include "../base/convert_inline.h"
#include "bwd_internal.h"
#include "load.h"

static uint16_t *ws_bf16(unsigned char *ws, size_t off)
{
    return (uint16_t *)(ws + off);
}

static size_t rows_in(int64_t total, int64_t start, size_t block)
{
    return (size_t)(total - start < (int64_t)block ? total - start : (int64_t)block);
}

static int64_t row_at(const fxa_strides *s, int64_t b, int64_t h, int64_t i)
{
    return b * s->batch + h * s->head + i * s->token;
}

/* n rows of x [n][dim] rounded to bf16 rows of d16 (the pad zero) at rows,
 * and into the row pairs at pairs (row r of the block is pair row r / 2,
 * slot r % 2; an odd n's pad slot zero). Blocks start at even rows. */
static void round_rows(const float *x, size_t n, size_t dim, size_t d16, uint16_t *rows,
                       uint16_t *pairs)
{
    for (size_t r = 0; r < n; r++) {
        for (size_t c = 0; c < dim; c++) {
            const uint16_t h = fxa_f32_to_bf16_bits(x[r * dim + c]);
            if (rows)
                rows[r * d16 + c] = h;
            pairs[2 * ((r / 2) * dim + c) + r % 2] = h;
        }
        if (rows && d16 > dim)
            rows[r * d16 + dim] = 0;
    }
    if (n % 2) {
        for (size_t c = 0; c < dim; c++)
            pairs[2 * ((n / 2) * dim + c) + 1] = 0;
    }
}

/* n bf16 rows of d16 values packed into pair panels at kt (a short block's
 * pad keys zeroed first); rows is scratch of n pointers. */
static void pack_pairs(const fxa_attn_bwd_plan *bp, const uint16_t *x, size_t n, uint16_t *kt,
                       const void **rows)
{
    if (n < bp->block_kv)
        memset(kt, 0, bp->block_kv * bp->d16 * sizeof(uint16_t));
    for (size_t j = 0; j < n; j++)
        rows[j] = x + j * bp->d16;
    bp->ctx->kernels->pack_kt(rows, n, bp->d16 / 2, bp->panel, kt);
}

void fxa_bwd_prep_kv_bf16(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a,
                          unsigned char *ws, int64_t b, int64_t kvh, int64_t slot, int64_t kb,
                          float *scratch, float *scratch16, const void **rows)
{
    const fxa_attn_plan *p = bp->fwd;
    const fxa_kernels *kern = bp->ctx->kernels;
    const int64_t j0 = kb * (int64_t)bp->block_kv;
    const size_t n = rows_in(p->d.seq_kv, j0, bp->block_kv);
    const size_t key0 = (size_t)slot * bp->kv_pad + (size_t)j0;
    uint16_t *x16 = (uint16_t *)scratch16;
    uint16_t *kp = ws_bf16(ws, bp->ws_k) + key0 * bp->dim;
    if (n < bp->block_kv)
        memset(kp, 0, bp->block_kv * bp->dim * sizeof(uint16_t));
    fxa_load_rows(kern, a->k, p->d.dtype, row_at(&p->k_strides, b, kvh, j0), p->k_strides.token, n,
                  bp->dim, scratch, bp->dim);
    round_rows(scratch, n, bp->dim, bp->d16, x16, kp);
    pack_pairs(bp, x16, n, ws_bf16(ws, bp->ws_kt) + key0 * bp->d16, rows);
    fxa_load_rows(kern, a->v, p->d.dtype, row_at(&p->v_strides, b, kvh, j0), p->v_strides.token, n,
                  bp->dim, scratch, bp->dim);
    for (size_t j = 0; j < n; j++) {
        for (size_t c = 0; c < bp->d16; c++)
            x16[j * bp->d16 + c] = c < bp->dim ? fxa_f32_to_bf16_bits(scratch[j * bp->dim + c]) : 0;
    }
    pack_pairs(bp, x16, n, ws_bf16(ws, bp->ws_vt) + key0 * bp->d16, rows);
}

void fxa_bwd_prep_q_bf16(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a, unsigned char *ws,
                         int64_t b, int64_t h, int64_t cq, int64_t qb, float *scratch,
                         float *scratch2)
{
    const fxa_attn_plan *p = bp->fwd;
    const fxa_kernels *kern = bp->ctx->kernels;
    const int64_t i0 = qb * (int64_t)bp->block_q;
    const size_t n = rows_in(p->d.seq_q, i0, bp->block_q);
    const size_t row0 = (size_t)(cq * p->d.seq_q + i0);
    const size_t pair0 = ((size_t)cq * (size_t)((p->d.seq_q + 1) / 2) + (size_t)i0 / 2) * bp->dim;
    float *delta = (float *)(ws + bp->ws_delta) + row0;
    const int64_t o_off = row_at(&p->o_strides, b, h, i0);
    fxa_load_rows(kern, a->q, p->d.dtype, row_at(&p->q_strides, b, h, i0), p->q_strides.token, n,
                  bp->dim, scratch, bp->dim);
    round_rows(scratch, n, bp->dim, bp->d16, ws_bf16(ws, bp->ws_q) + row0 * bp->d16,
               ws_bf16(ws, bp->ws_qp) + 2 * pair0);
    fxa_load_rows(kern, a->dout, p->d.out_dtype, o_off, p->o_strides.token, n, bp->dim, scratch,
                  bp->dim);
    fxa_load_rows(kern, a->out, p->d.out_dtype, o_off, p->o_strides.token, n, bp->dim, scratch2,
                  bp->dim);
    for (size_t i = 0; i < n; i++) {
        double dot = 0.0;
        for (size_t c = 0; c < bp->dim; c++)
            dot += (double)scratch[i * bp->dim + c] * (double)scratch2[i * bp->dim + c];
        delta[i] = (float)(dot * fxa_bwd_keep(p));
    }
    fxa_bwd_rows_shift(bp, a, b, h, i0, n, fxa_bwd_rows_p_at(bp, ws, row0));
    round_rows(scratch, n, bp->dim, bp->d16, ws_bf16(ws, bp->ws_do) + row0 * bp->d16,
               ws_bf16(ws, bp->ws_dop) + 2 * pair0);
}

fxa_attn_bwd_tile_bf16 fxa_bwd_tile_bf16(const fxa_attn_bwd_plan *bp, unsigned char *ws, int64_t cq,
                                         int64_t qb, int64_t slot, int64_t kb, float *p_area,
                                         float *ds_area)
{
    const fxa_attn_plan *p = bp->fwd;
    const int64_t i0 = qb * (int64_t)bp->block_q;
    const int64_t j0 = kb * (int64_t)bp->block_kv;
    const size_t row0 = (size_t)(cq * p->d.seq_q + i0);
    const size_t pair0 = ((size_t)cq * (size_t)((p->d.seq_q + 1) / 2) + (size_t)i0 / 2) * bp->dim;
    const size_t key0 = (size_t)slot * bp->kv_pad + (size_t)j0;
    uint16_t *pt = (uint16_t *)p_area;
    return (fxa_attn_bwd_tile_bf16){
        .n_q = rows_in(p->d.seq_q, i0, bp->block_q),
        .n_kv = rows_in(p->d.seq_kv, j0, bp->block_kv),
        .d = bp->dim,
        .lambda = (float)p->lambda,
        .q = ws_bf16(ws, bp->ws_q) + row0 * bp->d16,
        .dout = ws_bf16(ws, bp->ws_do) + row0 * bp->d16,
        .ldq = bp->d16,
        .qp = ws_bf16(ws, bp->ws_qp) + 2 * pair0,
        .doutp = ws_bf16(ws, bp->ws_dop) + 2 * pair0,
        .ldqp = bp->dim,
        .lse2 = (const float *)(ws + bp->ws_lse2) + row0,
        .inv_sum = (const float *)(ws + bp->ws_inv_sum) + row0,
        .center = (const float *)(ws + bp->ws_center) + row0,
        .delta = (const float *)(ws + bp->ws_delta) + row0,
        .kt = ws_bf16(ws, bp->ws_kt) + key0 * bp->d16,
        .vt = ws_bf16(ws, bp->ws_vt) + key0 * bp->d16,
        .kt_panel = bp->panel,
        .kp = ws_bf16(ws, bp->ws_k) + key0 * bp->dim,
        .ldkp = bp->dim,
        .pt = pt,
        .dst = pt + bp->block_q * bp->block_kv,
        .ds = (uint16_t *)ds_area,
        .ld_p = bp->block_kv,
        .ldg = bp->dim,
    };
}
