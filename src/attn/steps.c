/* The shared attention steps (see steps.h). */
#include "steps.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "load.h"

size_t fxa_q16_stride(const fxa_attn_plan *p)
{
    return ((size_t)p->d.head_dim + 1) / 2 * 2;
}

void fxa_load_q(const fxa_attn_plan *p, const void *q_base, int64_t off, int64_t token_stride,
                size_t n, float *q, uint16_t *q16)
{
    const size_t dim = (size_t)p->d.head_dim;
    fxa_load_rows(p->ctx->kernels, q_base, p->d.dtype, off, token_stride, n, dim, q, dim);
    if (p->d.compute != FXA_COMPUTE_BF16)
        return;
    /* bf16 inputs (the plan checks): their bits, the odd tail zeroed. */
    const size_t stride = fxa_q16_stride(p);
    const uint16_t *src = q_base;
    for (size_t r = 0; r < n; r++) {
        memcpy(q16 + r * stride, src + off + (int64_t)r * token_stride, dim * sizeof *q16);
        if (dim % 2)
            q16[r * stride + dim] = 0;
    }
}

int64_t fxa_rows_decide(const fxa_attn_plan *p, const fxa_head_bound *hb, const float *kbar,
                        const fxa_rows *rows, size_t n, float *bound)
{
    const size_t dim = (size_t)p->d.head_dim;
    const int auto_mode = p->d.mode == FXA_MODE_AUTO;
    const int centred = auto_mode && p->d.center;
    const fxa_row_stats *rs = p->ctx->kernels->row_stats;
    int64_t n_online = 0;
    for (size_t i = 0; i < n; i++) {
        double qq;
        double qk;
        rs->norm2_dot(rows->q + i * dim, kbar, dim, &qq, &qk);
        const double qn = p->lambda * sqrt(qq);
        const double ceil_u = ceil(qn * (hb->radius + hb->eps_radius));
        const int strict = auto_mode && ceil_u <= hb->gate_strict;
        const int fixed =
            strict || (centred && qn * hb->eps_radius <= 1.0 && ceil_u <= hb->gate_centered);
        /* Centring serves the bound; a row that falls back is the classic
         * online softmax on raw scores (one rounding fewer per score). */
        rows->qk_center[i] = centred && fixed ? (float)qk : 0.0f;
        rows->online[i] = strict  ? FXA_ROW_FIXED
                          : fixed ? FXA_ROW_FIXED_MAY_FLUSH
                                  : FXA_ROW_ONLINE;
        rows->m[i] = fixed ? (float)(ceil_u - hb->c) : -INFINITY;
        rows->l[i] = 0.0f;
        memset(rows->o + i * dim, 0, dim * sizeof(float));
        bound[i] = (float)ceil_u;
        n_online += !fixed;
    }
    return n_online;
}

/* Keys per pack_kt call: a multiple of 16, so that a group starts where a
 * panel may. */
#define PACK_GROUP 16

/* fp32 compute: K transposed into panels of kt_panel keys (fxa_attn_tile) by
 * the kernel set's pack_kt, a group of keys at a time (fp32 rows read in
 * place, other dtypes converted into scratch); V rows into [kv_tile][D]. */
static void pack_f32(const fxa_attn_plan *p, const void *k_base, const void *v_base, int64_t off,
                     int64_t token_stride, size_t n_kv, float *kt, float *v)
{
    const fxa_kernels *kernels = p->ctx->kernels;
    const size_t dim = (size_t)p->d.head_dim;
    const size_t panel = p->kt_panel;
    float scratch[PACK_GROUP][FXA_MAX_HEAD_DIM];
    const float *rows[PACK_GROUP];
    for (size_t j0 = 0; j0 < n_kv; j0 += PACK_GROUP) {
        const size_t n = n_kv - j0 < PACK_GROUP ? n_kv - j0 : PACK_GROUP;
        for (size_t j = 0; j < n; j++)
            rows[j] = fxa_row_f32(kernels, k_base, p->d.dtype,
                                  off + (int64_t)(j0 + j) * token_stride, dim, scratch[j]);
        kernels->pack_kt(rows, n, dim, panel, kt + fxa_kt_offset(panel, dim, 0, j0));
    }
    fxa_load_rows(kernels, v_base, p->d.dtype, off, token_stride, n_kv, dim, v, dim);
}

/* bf16 compute: the pair layouts of fxa_attn_tile_bf16, every pad zeroed.
 * Inputs are bf16 (the plan checks), so reading their bits is exact. */
static void pack_bf16(const fxa_attn_plan *p, const uint16_t *k, const uint16_t *v, int64_t off,
                      int64_t token_stride, size_t n_kv, uint16_t *kp, uint16_t *vp)
{
    const size_t dim = (size_t)p->d.head_dim;
    const size_t pairs = (dim + 1) / 2;
    memset(kp, 0, pairs * p->kv_tile * 2 * sizeof *kp);
    memset(vp, 0, p->kv_tile * dim * sizeof *vp);
    for (size_t j = 0; j < n_kv; j++) {
        const uint16_t *kj = k + off + (int64_t)j * token_stride;
        const uint16_t *vj = v + off + (int64_t)j * token_stride;
        for (size_t c = 0; c < dim; c++) {
            kp[2 * fxa_kt_offset(p->kt_panel, pairs, c / 2, j) + c % 2] = kj[c];
            vp[2 * ((j / 2) * dim + c) + j % 2] = vj[c];
        }
    }
}

void fxa_pack_kv_tile(const fxa_attn_plan *p, const void *k_base, const void *v_base,
                      int64_t off, int64_t token_stride, size_t n_kv, void *kt, void *vp)
{
    if (p->d.compute == FXA_COMPUTE_BF16)
        pack_bf16(p, k_base, v_base, off, token_stride, n_kv, kt, vp);
    else
        pack_f32(p, k_base, v_base, off, token_stride, n_kv, kt, vp);
}

void fxa_rows_run_tile(const fxa_attn_plan *p, const fxa_rows *rows, size_t n, const void *kt,
                       const void *vp, size_t n_kv, float *scores, uint16_t *p16)
{
    const size_t dim = (size_t)p->d.head_dim;
    if (p->d.compute == FXA_COMPUTE_BF16) {
        const fxa_attn_tile_bf16 t = {
            .n_q = n,
            .n_kv = n_kv,
            .d = dim,
            .lambda = (float)p->lambda,
            .q = rows->q16,
            .ldq = fxa_q16_stride(p),
            .kp = kt,
            .kp_panel = p->kt_panel,
            .vp = vp,
            .ldvp = dim,
            .qk_center = rows->qk_center,
            .online = rows->online,
            .m = rows->m,
            .l = rows->l,
            .o = rows->o,
            .ldo = dim,
            .scores = scores,
            .ld_scores = p->kv_tile,
            .p16 = p16,
        };
        p->ctx->kernels->attn_tile_bf16(&t);
        return;
    }
    const fxa_attn_tile t = {
        .n_q = n,
        .n_kv = n_kv,
        .d = dim,
        .lambda = (float)p->lambda,
        .q = rows->q,
        .ldq = dim,
        .kt = kt,
        .kt_panel = p->kt_panel,
        .v = vp,
        .ldv = dim,
        .qk_center = rows->qk_center,
        .online = rows->online,
        .m = rows->m,
        .l = rows->l,
        .o = rows->o,
        .ldo = dim,
        .scores = scores,
        .ld_scores = p->kv_tile,
    };
    p->ctx->kernels->attn_tile(&t);
}

void fxa_rows_finish(const fxa_attn_plan *p, const fxa_rows *rows, size_t n, float *out,
                     int64_t token_stride, float *lse)
{
    const size_t dim = (size_t)p->d.head_dim;
    for (size_t i = 0; i < n; i++) {
        const float l = fmaxf(rows->l[i], FLT_MIN);
        const float *o = rows->o + i * dim;
        float *dst = out + (int64_t)i * token_stride;
        for (size_t c = 0; c < dim; c++)
            dst[c] = o[c] / l;
        if (lse) {
            const double log2_sum = (double)rows->m[i] + log2((double)l);
            lse[i] = (float)(log2_sum * 0.6931471805599453 +
                             p->d.scale * (double)rows->qk_center[i]);
        }
    }
}
