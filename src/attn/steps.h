/*
 * The steps every attention driver shares (attn_run.c for one process,
 * acc.c for blockwise accumulation): pack a kv tile, decide each row's
 * shift, run a tile on a range of rows, normalise once.
 */
#ifndef FXA_STEPS_H
#define FXA_STEPS_H

#include "attn_internal.h"
#include "base/spans.h"

/* n consecutive query rows of one head and their unnormalised state; o has
 * a row stride of head_dim. */
typedef struct fxa_rows {
    const float *q;      /* [n][D] fp32 */
    const uint16_t *q16; /* [n][D rounded up to pairs] bf16 bits: bf16 compute only */
    float *m;
    float *l;
    float *o;
    float *qk_center;
    uint8_t *online;
    /* Masks and causal: each row's largest finite bias (base 2; -INFINITY
     * when every key is masked). NULL without a mask. */
    const float *bias_max;
    /* Each row's bias offset (mask.h), base 2; NULL without a mask. */
    const float *bias_off;
} fxa_rows;

/* Where consecutive rows of one head of a tensor are: the first's element
 * offset and the token stride. */
typedef struct fxa_row_at {
    int64_t off;
    int64_t token_stride;
} fxa_row_at;

/* FXA_OK when no written span (out[0..n_out)) shares a byte with a read
 * span (in[0..n_in)) or with another written span; else
 * FXA_ERR_INVALID_ARG and the first such pair named in the context's
 * message. Spans with a NULL pointer are skipped. */
fxa_status fxa_spans_disjoint(fxa_ctx *ctx, const fxa_span *out, int n_out, const fxa_span *in,
                              int n_in);

/* Row stride of the bf16 query copy: the dimension padded to pairs. */
size_t fxa_q16_stride(const fxa_attn_plan *p);

/* Load n query rows of Q (element offset off, token stride): as fp32 into
 * q [n][D] for fp32 compute, as their bf16 bits into q16 for bf16 compute
 * (all that its tiles and row statistics read; q is left alone). */
void fxa_load_q(const fxa_attn_plan *p, const void *q_base, int64_t off, int64_t token_stride,
                size_t n, float *q, uint16_t *q16);

/* Choose the head's prescaling (hb->kshift, lambda_k, eps_abs) from
 * hb->qmax, its key norms and the plan's lambda, after fxa_summary_merge,
 * and refuse (FXA_ERR_INVALID_ARG, naming the bound and the head, index =
 * b Hkv + kv head) a head whose scores cannot be formed in fp32: neither
 * its raw bound lambda qmax (kmax + eps) nor, with centring, its centred
 * bound fits FXA_SCORE_LIMIT. */
fxa_status fxa_head_prescale(const fxa_attn_plan *p, fxa_head_bound *hb, int64_t index);

/* With an LSE requested: refuse a head whose LSE bound
 * scale qmax kmax + ln N exceeds FLT_MAX (n_keys keys). */
fxa_status fxa_lse_check(const fxa_attn_plan *p, const fxa_head_bound *hb, int64_t n_heads,
                         int64_t n_keys);

/* FXA_ERR_INVALID_ARG when the output is bf16 and some head's max |v|
 * (which bounds its outputs) is past bf16's largest finite value: those
 * outputs would round to Inf. */
fxa_status fxa_out_range_check(const fxa_attn_plan *p, const fxa_head_bound *hb, int64_t n_heads);

/* Decide each row's shift (docs/numerics.md; see attn_run.c for the bound; with
 * rows->bias_max, the masked rows' gates of bound.c): sets
 * m, l = 0, o = 0, qk_center and the row kind (online: FXA_ROW_FIXED,
 * _FIXED_MAY_FLUSH or _ONLINE) for rows->q[0..n), and bound[i] = ceil(U_i).
 * Returns the number of rows that run online softmax. */
int64_t fxa_rows_decide(const fxa_attn_plan *p, const fxa_head_bound *hb, const float *kbar,
                        const fxa_rows *rows, size_t n, float *bound);

/* Pack n_kv keys and values (rows k_at of k_base, v_at of v_base) into one
 * kv tile: fp32 compute K^T [D][kv_tile] and V [kv_tile][D]; bf16 compute
 * the pair layouts of fxa_attn_tile_bf16, pads zeroed. Keys are scaled by
 * 2^-kshift (the head's prescaling; 0 copies them as they are). */
void fxa_pack_kv_tile(const fxa_attn_plan *p, const void *k_base, fxa_row_at k_at,
                      const void *v_base, fxa_row_at v_at, size_t n_kv, int kshift, void *kt,
                      void *vp);

/* Add one packed kv tile of n_kv keys into n rows of a head whose bound is
 * hb (its lambda_k). scores and p16 are the thread's scratch (sized by the
 * plan); bias, when not NULL, the tile's [n][kv_tile] bias (fxa_attn_tile). */
void fxa_rows_run_tile(const fxa_attn_plan *p, const fxa_head_bound *hb, const fxa_rows *rows,
                       size_t n, const void *kt, const void *vp, size_t n_kv, float *scores,
                       uint16_t *p16, const float *bias);

/* Normalise once: out_i = o_i / max(l_i, FLT_MIN) (0 for a row whose keys
 * are all masked, l_i = 0), in the plan's out_dtype
 * (bf16: that fp32 value rounded once to nearest even), row i at element
 * out_off + i token_stride of out_base, and, when lse is not NULL, lse_i in
 * natural log of the unshifted, uncentred scores (qk_center is in the
 * head's prescaled units, 2^-kshift; the row's bias offset, mask.h, taken
 * back; -INFINITY where l_i = 0), and, when parts is not NULL, parts[3i ..
 * 3i + 2] = fxa_attn_args.lse_parts of the row ({-INFINITY, 0, 0} where
 * l_i = 0). */
void fxa_rows_finish(const fxa_attn_plan *p, const fxa_head_bound *hb, const fxa_rows *rows,
                     size_t n, void *out_base, int64_t out_off, int64_t token_stride, float *lse,
                     float *parts);

#endif
