/* The shared attention steps (see steps.h). */
#include "steps.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "bound.h"
#include "load.h"

size_t fxa_q16_stride(const fxa_attn_plan *p)
{
    return ((size_t)p->d.head_dim + 1) / 2 * 2;
}

fxa_status fxa_spans_disjoint(fxa_ctx *ctx, const fxa_span *out, int n_out, const fxa_span *in,
                              int n_in)
{
    const fxa_span *a, *b;
    if (fxa_spans_clash(out, n_out, in, n_in, &a, &b))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "%s overlaps %s: the outputs must not share memory with the "
                            "inputs or with each other",
                            a->name, b->name);
    return FXA_OK;
}

void fxa_load_q(const fxa_attn_plan *p, const void *q_base, int64_t off, int64_t token_stride,
                size_t n, float *q, uint16_t *q16)
{
    const size_t dim = (size_t)p->d.head_dim;
    if (p->d.compute != FXA_COMPUTE_BF16) {
        fxa_load_rows(p->ctx->kernels, q_base, p->d.dtype, off, token_stride, n, dim, q, dim);
        return;
    }
    /* bf16 inputs (the plan checks): their bits, the odd tail zeroed. */
    const size_t stride = fxa_q16_stride(p);
    const uint16_t *src = q_base;
    for (size_t r = 0; r < n; r++) {
        memcpy(q16 + r * stride, src + off + (int64_t)r * token_stride, dim * sizeof *q16);
        if (dim % 2)
            q16[r * stride + dim] = 0;
    }
}

/* ceil(log2 x) for finite x > 0. */
static int ceil_log2(double x)
{
    int e;
    const double f = frexp(x, &e); /* x = f 2^e, f in [0.5, 1) */
    return f == 0.5 ? e - 1 : e;
}

static int imax(int a, int b)
{
    return a > b ? a : b;
}

/*
 * Prescaling. The tiles form z = lambda_k (q . k' - q . kbar') in fp32 with
 * k' = k 2^-b and lambda_k = lambda 2^b, which equals lambda (q.k - q.kbar)
 * bit for bit wherever no product is subnormal, so b = 0 unless an fp32
 * quantity would overflow: b must keep max ||k'|| and qmax max ||k'|| (every
 * partial sum of a dot product, and q.kbar') below 2^125 (lo), lambda_k
 * below 2^125 (hi) and above 2^-100, and q.k' away from underflow; b is
 * then the smallest shift these allow (the largest products, so that tiny
 * q and k gain precision rather than flush). Scaling k down makes some
 * products (and k' elements)
 * subnormal: each loses at most 2^-150 in k' units, (D + 1) of them per
 * score, which eps_abs = lambda (D + 2) 2^(b - 149) covers in the bound
 * (the rounding of subnormal k' elements, |q| sqrt(D) 2^(b - 150), is
 * already inside eps_radius since 2^b <= 2^127 kmax). Scaling k up is exact.
 */
fxa_status fxa_head_prescale(const fxa_attn_plan *p, fxa_head_bound *hb, int64_t index)
{
    const double lam = fabs(p->lambda); /* the bounds need |scale|; lambda_k keeps its sign */
    const double qm = hb->qmax;
    const double km = hb->kmax;
    const int64_t batch = index / p->d.heads_kv;
    const int64_t head = index % p->d.heads_kv;
    hb->kshift = 0;
    hb->eps_abs = 0.0;
    hb->lambda_k = (float)p->lambda;
    int lo = -100000;
    if (km > 0.0) {
        lo = ceil_log2(km) - 125;
        if (qm > 0.0)
            lo = imax(lo, ceil_log2(qm * km) - 125);
    }
    const int hi = 125 - ceil_log2(lam);
    const int lo_lambda = -99 - ceil_log2(lam); /* |lambda_k| >= 2^-100 */
    const int ordinary =
        lo <= 0 && 0 <= hi && 0 >= lo_lambda && !(qm > 0.0 && km > 0.0 && qm * km < 0x1p-60);
    /* Otherwise the largest products the keys allow (no underflow of the
     * products of the largest elements), with lambda_k kept normal. */
    const int b = ordinary ? 0 : imax(lo, lo_lambda);
    const double eps_abs = b > 0 ? lam * ldexp((double)p->d.head_dim + 2.0, b - 149) : 0.0;
    const double z_raw = lam * qm * (km + hb->eps_radius) + eps_abs;
    const double z_cen = lam * qm * (hb->radius + hb->eps_radius) + eps_abs;
    if (!(z_raw <= FXA_SCORE_LIMIT) && !(p->d.center && z_cen <= FXA_SCORE_LIMIT))
        return fxa_ctx_fail(
            p->ctx, FXA_ERR_INVALID_ARG,
            "scale * |q| * |k%s| = %.3g exceeds the fp32 range (base-2 scores "
            "up to %.3g, above %.3g) at batch %lld, kv head %lld: max |q| %.3g, "
            "max |k%s| %.3g, scale %.3g",
            p->d.center ? " - kbar" : "", fabs(p->d.scale) * qm * (p->d.center ? hb->radius : km),
            p->d.center ? z_cen : z_raw, FXA_SCORE_LIMIT, (long long)batch, (long long)head, qm,
            p->d.center ? " - kbar" : "", p->d.center ? hb->radius : km, p->d.scale);
    if (b < lo || b > hi)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "scale %.3g with max |q| %.3g and max |k| %.3g at batch %lld, kv "
                            "head %lld: the scores cannot be formed in fp32 (no power-of-two "
                            "prescaling keeps the keys, q.k and the scale finite)",
                            p->d.scale, qm, km, (long long)batch, (long long)head);
    hb->kshift = b;
    hb->eps_abs = eps_abs;
    hb->lambda_k = (float)ldexp(p->lambda, b);
    return FXA_OK;
}

fxa_status fxa_lse_check(const fxa_attn_plan *p, const fxa_head_bound *hb, int64_t n_heads,
                         int64_t n_keys)
{
    const double ln_n = log((double)(n_keys < 1 ? 1 : n_keys));
    for (int64_t i = 0; i < n_heads; i++) {
        const double bound = fabs(p->d.scale) * hb[i].qmax * hb[i].kmax + ln_n;
        if (!(bound <= (double)FLT_MAX))
            return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                                "the LSE bound scale * |q| * |k| + ln N = %.3g exceeds the fp32 "
                                "range at batch %lld, kv head %lld (max |q| %.3g, max |k| %.3g, "
                                "scale %.3g)",
                                bound, (long long)(i / p->d.heads_kv),
                                (long long)(i % p->d.heads_kv), hb[i].qmax, hb[i].kmax, p->d.scale);
    }
    return FXA_OK;
}

fxa_status fxa_out_range_check(const fxa_attn_plan *p, const fxa_head_bound *hb, int64_t n_heads)
{
    const double bf16_max = 0x1.fep127; /* 0x7f7f: larger values may round to Inf */
    if (p->d.out_dtype != FXA_BF16)
        return FXA_OK;
    for (int64_t i = 0; i < n_heads; i++) {
        if (hb[i].vmax > bf16_max)
            return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                                "V has |v| = %.4g at batch %lld, kv head %lld, past bf16's largest "
                                "finite value %.4g: the bf16 output would overflow (use an fp32 "
                                "output)",
                                hb[i].vmax, (long long)(i / p->d.heads_kv),
                                (long long)(i % p->d.heads_kv), bf16_max);
    }
    return FXA_OK;
}

int64_t fxa_rows_decide(const fxa_attn_plan *p, const fxa_head_bound *hb, const float *kbar,
                        const fxa_rows *rows, size_t n, float *bound)
{
    const size_t dim = (size_t)p->d.head_dim;
    const int auto_mode = p->d.mode == FXA_MODE_AUTO;
    const int centred = auto_mode && p->d.center;
    const fxa_row_stats *rs = p->ctx->kernels->row_stats;
    int64_t n_online = 0;
    double qq_rows[FXA_STATS_ROWS];
    double qk_rows[FXA_STATS_ROWS];
    const size_t ld16 = fxa_q16_stride(p);
    const int add_mask = p->d.mask_kind == FXA_MASK_ADD;
    const int gate_masked = fxa_fixed_m_gate_masked(hb->c, p->d.seq_kv);
    for (size_t i = 0; i < n; i++) {
        if (i % FXA_STATS_ROWS == 0) {
            const size_t m = n - i < FXA_STATS_ROWS ? n - i : FXA_STATS_ROWS;
            if (p->d.compute == FXA_COMPUTE_BF16)
                rs->norm2_dot_bf16(rows->q16 + i * ld16, ld16, m, kbar, dim, qq_rows, qk_rows);
            else
                rs->norm2_dot(rows->q + i * dim, dim, m, kbar, dim, qq_rows, qk_rows);
        }
        const double qq = qq_rows[i % FXA_STATS_ROWS];
        const double qk = qk_rows[i % FXA_STATS_ROWS];
        const double qn = fabs(p->lambda) * sqrt(qq);
        const double u = qn * (hb->radius + hb->eps_radius) + hb->eps_abs;
        const double ceil_u = ceil(u);
        /* Masked rows (bound.c): a row with every key masked has only zero terms; a boolean
         * mask or causal leaves the unmasked scores unbiased (the strict gate); an additive one
         * raises the shift by the row's largest bias (the masked gate). The centred gate's
         * zero-sum argument needs every key, so no masked row takes it. */
        const double bmax = rows->bias_max ? (double)rows->bias_max[i] : 0.0;
        const int all_masked = bmax == -INFINITY;
        int strict = auto_mode && ceil_u <= hb->gate_strict;
        int fixed = strict || (centred && qn * hb->eps_radius + hb->eps_abs <= 1.0 &&
                               ceil_u <= hb->gate_centered);
        if (rows->bias_max) {
            strict = auto_mode && (all_masked || (!add_mask && ceil_u <= hb->gate_strict));
            fixed = strict || (auto_mode && add_mask && ceil_u <= gate_masked &&
                               fabs(bmax) <= FXA_BIAS_FIXED_LIMIT);
        }
        const double shift_bound = all_masked ? ceil_u : ceil(u + bmax);
        /* Centring serves the bound; a row that falls back is the classic
         * online softmax on raw scores (one rounding fewer per score),
         * unless its raw scores could overflow fp32 while its centred ones
         * fit (fxa_head_prescale checked that they do). */
        const int rescue = !fixed && p->d.center &&
                           !(qn * (hb->kmax + hb->eps_radius) + hb->eps_abs <= FXA_SCORE_LIMIT);
        rows->qk_center[i] =
            (centred && fixed) || rescue ? (float)(hb->kshift ? ldexp(qk, -hb->kshift) : qk) : 0.0f;
        rows->online[i] = strict ? FXA_ROW_FIXED : fixed ? FXA_ROW_FIXED_MAY_FLUSH : FXA_ROW_ONLINE;
        rows->m[i] = fixed ? (float)(shift_bound - hb->c) : -INFINITY;
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
 * place, other dtypes converted into scratch); V rows into [kv_tile][packed_ld]. */
static void pack_f32(const fxa_attn_plan *p, const void *k_base, fxa_row_at k_at,
                     const void *v_base, fxa_row_at v_at, size_t n_kv, int kshift, float *kt,
                     float *v)
{
    const fxa_kernels *kernels = p->ctx->kernels;
    const size_t dim = (size_t)p->d.head_dim;
    const size_t panel = p->kt_panel;
    float scratch[PACK_GROUP][FXA_MAX_HEAD_DIM];
    const void *rows[PACK_GROUP];
    for (size_t j0 = 0; j0 < n_kv; j0 += PACK_GROUP) {
        const size_t n = n_kv - j0 < PACK_GROUP ? n_kv - j0 : PACK_GROUP;
        for (size_t j = 0; j < n; j++) {
            const int64_t at = k_at.off + (int64_t)(j0 + j) * k_at.token_stride;
            if (kshift == 0) {
                rows[j] = fxa_row_f32(kernels, k_base, p->d.dtype, at, dim, scratch[j]);
                continue;
            }
            fxa_load_row(kernels, k_base, p->d.dtype, at, dim, scratch[j]);
            for (size_t c = 0; c < dim; c++)
                scratch[j][c] = ldexpf(scratch[j][c], -kshift);
            rows[j] = scratch[j];
        }
        kernels->pack_kt(rows, n, dim, panel, kt + fxa_kt_offset(panel, dim, 0, j0));
    }
    fxa_load_rows(kernels, v_base, p->d.dtype, v_at.off, v_at.token_stride, n_kv, dim, v,
                  p->packed_ld);
}

/* bf16 compute: the pair layouts of fxa_attn_tile_bf16, every pad zeroed.
 * Inputs are bf16 (the plan checks), so reading their bits is exact. K rows
 * whose pairs are 4-byte aligned 32-bit words (an even head_dim and even
 * offsets from an aligned base) go through the kernel set's pack_kt, which
 * places a pair of K exactly where the pair layout wants it; the rest (odd
 * dims, odd strides, prescaled keys) is copied one value at a time. A full
 * tile of aligned pairs has no pads to zero. */
static void pack_bf16(const fxa_attn_plan *p, const uint16_t *k, fxa_row_at k_at, const uint16_t *v,
                      fxa_row_at v_at, size_t n_kv, int kshift, uint16_t *kp, uint16_t *vp)
{
    const size_t dim = (size_t)p->d.head_dim;
    const size_t pairs = (dim + 1) / 2;
    const size_t panel = p->kt_panel;
    const int words = kshift == 0 && dim % 2 == 0 && k_at.off % 2 == 0 &&
                      k_at.token_stride % 2 == 0 && (uintptr_t)k % 4 == 0;
    if (!words || n_kv < p->kv_tile) {
        memset(kp, 0, pairs * p->kv_tile * 2 * sizeof *kp);
        memset(vp, 0, p->kv_tile * p->packed_ld * sizeof *vp);
    }
    if (words) {
        const void *rows[PACK_GROUP];
        for (size_t j0 = 0; j0 < n_kv; j0 += PACK_GROUP) {
            const size_t n = n_kv - j0 < PACK_GROUP ? n_kv - j0 : PACK_GROUP;
            for (size_t j = 0; j < n; j++)
                rows[j] = k + k_at.off + (int64_t)(j0 + j) * k_at.token_stride;
            p->ctx->kernels->pack_kt(rows, n, pairs, panel,
                                     (uint32_t *)kp + fxa_kt_offset(panel, pairs, 0, j0));
        }
    } else {
        for (size_t j = 0; j < n_kv; j++) {
            const uint16_t *kj = k + k_at.off + (int64_t)j * k_at.token_stride;
            uint16_t *kpj = kp + 2 * fxa_kt_offset(panel, pairs, 0, j); /* pair c at 2 c panel */
            for (size_t c = 0; c < dim; c++)
                /* A prescaled key is rounded back to bf16 (exact unless subnormal). */
                kpj[2 * (c / 2) * panel + c % 2] =
                    kshift ? fxa_f32_to_bf16(ldexpf(fxa_bf16_bits_to_f32(kj[c]), -kshift)) : kj[c];
        }
    }
    for (size_t j = 0; j < n_kv; j += 2) { /* V rows j and j + 1 interleaved */
        const uint16_t *v0 = v + v_at.off + (int64_t)j * v_at.token_stride;
        uint16_t *out = vp + j * p->packed_ld;
        if (j + 1 < n_kv) {
            const uint16_t *v1 = v0 + v_at.token_stride;
            for (size_t c = 0; c < dim; c++) {
                out[2 * c] = v0[c];
                out[2 * c + 1] = v1[c];
            }
        } else {
            for (size_t c = 0; c < dim; c++)
                out[2 * c] = v0[c];
        }
    }
}

void fxa_pack_kv_tile(const fxa_attn_plan *p, const void *k_base, fxa_row_at k_at,
                      const void *v_base, fxa_row_at v_at, size_t n_kv, int kshift, void *kt,
                      void *vp)
{
    if (p->d.compute == FXA_COMPUTE_BF16)
        pack_bf16(p, k_base, k_at, v_base, v_at, n_kv, kshift, kt, vp);
    else
        pack_f32(p, k_base, k_at, v_base, v_at, n_kv, kshift, kt, vp);
}

/* The bf16-compute tile of t's rows and keys (fxa_attn_tile_bf16): q16 rows ldq16 apart, K
 * pairs kp and V pairs vp (packed as t's K^T and V), P in p16. */
static fxa_attn_tile_bf16 tile_bf16(const fxa_attn_tile *t, const uint16_t *q16, size_t ldq16,
                                    const void *kp, const void *vp, uint16_t *p16)
{
    return (fxa_attn_tile_bf16){
        .n_q = t->n_q,
        .n_kv = t->n_kv,
        .d = t->d,
        .lambda = t->lambda,
        .q = q16,
        .ldq = ldq16,
        .kp = kp,
        .kp_panel = t->kt_panel,
        .vp = vp,
        .ldvp = t->ldv,
        .qk_center = t->qk_center,
        .online = t->online,
        .m = t->m,
        .l = t->l,
        .o = t->o,
        .ldo = t->ldo,
        .scores = t->scores,
        .ld_scores = t->ld_scores,
        .p16 = p16,
        .bias = t->bias,
        .ld_bias = t->ld_bias,
    };
}

void fxa_rows_run_tile(const fxa_attn_plan *p, const fxa_head_bound *hb, const fxa_rows *rows,
                       size_t n, const void *kt, const void *vp, size_t n_kv, float *scores,
                       uint16_t *p16, const float *bias)
{
    const size_t dim = (size_t)p->d.head_dim;
    const fxa_attn_tile t = {
        .n_q = n,
        .n_kv = n_kv,
        .d = dim,
        .lambda = hb->lambda_k,
        .q = rows->q,
        .ldq = dim,
        .kt = kt,
        .kt_panel = p->kt_panel,
        .v = vp,
        .ldv = p->packed_ld,
        .qk_center = rows->qk_center,
        .online = rows->online,
        .m = rows->m,
        .l = rows->l,
        .o = rows->o,
        .ldo = dim,
        .scores = scores,
        .ld_scores = p->kv_tile,
        .bias = bias,
        .ld_bias = p->kv_tile,
    };
    if (p->d.compute == FXA_COMPUTE_BF16) {
        const fxa_attn_tile_bf16 t16 = tile_bf16(&t, rows->q16, fxa_q16_stride(p), kt, vp, p16);
        p->ctx->kernels->attn_tile_bf16(&t16);
        return;
    }
    p->ctx->kernels->attn_tile(&t);
}

/* Row i's lse and lse parts (fxa_rows_finish) from its state, l_i > 0. */
static void row_lse(const fxa_attn_plan *p, const fxa_head_bound *hb, const fxa_rows *rows,
                    size_t i, float *lse, float *parts)
{
    const double off = rows->bias_off ? (double)rows->bias_off[i] : 0.0;
    if (lse)
        *lse = (float)(((double)rows->m[i] + log2((double)rows->l[i]) - off) * 0.6931471805599453 +
                       p->d.scale * ldexp((double)rows->qk_center[i], hb->kshift));
    if (parts) {
        parts[0] = rows->m[i];
        parts[1] = rows->l[i];
        parts[2] = ldexpf(rows->qk_center[i], hb->kshift);
    }
}

void fxa_rows_finish(const fxa_attn_plan *p, const fxa_head_bound *hb, const fxa_rows *rows,
                     size_t n, void *out_base, int64_t out_off, int64_t token_stride, float *lse,
                     float *parts)
{
    const size_t dim = (size_t)p->d.head_dim;
    for (size_t i = 0; i < n; i++) {
        const float l = fmaxf(rows->l[i], FLT_MIN);
        const float *o = rows->o + i * dim;
        const int64_t at = out_off + (int64_t)i * token_stride;
        if (p->d.out_dtype == FXA_BF16) {
            uint16_t *dst = (uint16_t *)out_base + at;
            for (size_t c = 0; c < dim; c++)
                dst[c] = fxa_f32_to_bf16(o[c] / l);
        } else {
            float *dst = (float *)out_base + at;
            for (size_t c = 0; c < dim; c++)
                dst[c] = o[c] / l;
        }
        if (rows->l[i] == 0.0f) { /* every key masked */
            if (lse)
                lse[i] = -INFINITY;
            if (parts) {
                parts[3 * i] = -INFINITY;
                parts[3 * i + 1] = 0.0f;
                parts[3 * i + 2] = 0.0f;
            }
        } else {
            row_lse(p, hb, rows, i, lse ? lse + i : NULL, parts ? parts + 3 * i : NULL);
        }
    }
}
