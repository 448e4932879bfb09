/*
 * The fp64 reference of the attention backward, for the backward tests
 * (test_attn_bwd, test_attn_bwd_mask): the forward and the gradients of
 * contiguous [B, H, S, D] doubles with GQA (a kv head's dK and dV summed over
 * its query heads) and an optional dense bias [B, Hq, Sq, Skv] (natural log,
 * -inf where masked) that stands for a boolean or additive mask with any
 * broadcast strides, or for causal; each element's first-order fp32 envelope
 * of docs/numerics.md ("Backward"), with the bias's and bf16 compute's
 * roundings; and the run, compare and thread-invariance scaffolding the
 * backward tests share.
 */
#ifndef FXT_ATTN_BWD_REF_H
#define FXT_ATTN_BWD_REF_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"

/* A problem's sizes and its softmax scale tau. */
typedef struct fxt_bwd_shape {
    int64_t b, hq, hkv, sq, skv, d;
    double tau;
} fxt_bwd_shape;

/* The roundings of bf16 compute, for the envelope (on 0: fp32 compute). */
typedef struct fxt_bf16_rounding {
    int on;           /* bf16 compute */
    int dout_rounded; /* an fp32 dout rounded to bf16 for the products */
} fxt_bf16_rounding;

/* The dense bias of d's mask (mask_kind, mask_strides over mask) and causal
 * (top-left: query i sees keys j <= i) into bias [B, Hq, Sq, Skv]: -inf
 * where masked, the additive mask's value, 0 elsewhere. */
void fxt_ref_bias(const fxa_attn_desc *d, const void *mask, double *bias);

/* Attention in fp64: out [B, Hq, Sq, D] and natural-log lse [B, Hq, Sq],
 * with bias (NULL: none); a row with every key masked gets out 0 and lse
 * -inf. */
void fxt_ref_attn_fwd(const fxt_bwd_shape *s, const double *q, const double *k, const double *v,
                      const double *bias, double *out, double *lse);

/*
 * The gradients grad = {dq, dk, dv} in fp64 from the given out and lse (as
 * fxattn returned them), P_ij = exp(tau s_ij + bias_ij - lse_i) (0 for a
 * masked key or a row with lse -inf: a constant row), and, when env is not
 * NULL, each element's first-order fp32 envelope env = {dq, dk, dv}:
 *   a_ij  = lambda (D + 2) u A_ij + u |lse2_i| + u |e_ij|,  A_ij = sum_c |q_ic k_jc|
 *           (+ u |bias2_ij| + u |lse2_i - bias2_ij| with a bias: fxattn rounds
 *           the base-2 bias and lse2 - bias2 before the exp2's argument)
 *   eps_ij = ln2 a_ij + 3u                       (P's relative error)
 *   E_ds  = P_ij ((eps_ij + 2u) |dp_ij - delta_i| + D u B_ij + u |delta_i|),
 *           B_ij = sum_c |dO_ic v_jc|
 *   dv_jc: sum_i ((eps_ij + u) + n u) P_ij |dO_ic|            (n: terms summed)
 *   dk_jc: tau sum_i (E_ds + (1 + n) u |ds_ij|) |q_ic| + 2u |dk_jc|; dq alike with k
 * With bf16 compute (br.on; ub = 2^-8, bf16's unit roundoff) P is rounded
 * for dV (eps_ij + ub), dS for dK and dQ (E_ds + ub |ds_ij|), and an fp32
 * dO rounded for dP and dV (br.dout_rounded: dp by ub B_ij more, dV by
 * ub P |dO|); the bf16 products themselves are exact.
 */
void fxt_ref_attn_bwd(const fxt_bwd_shape *s, fxt_bf16_rounding br, const double *q,
                      const double *k, const double *v, const double *bias, const double *out,
                      const double *dout, const double *lse, double *const grad[3],
                      double *const env[3]);

/* The reference gradients grad = {dq, dk, dv} of q, k, v with bias (NULL:
 * none) and dout (no envelope), and their largest difference from
 * central differences (step 1e-5) of L = sum dO . O over every element of
 * q, k and v (each restored after). */
double fxt_ref_fd_error(const fxt_bwd_shape *s, double *q, double *k, double *v, const double *bias,
                        const double *dout, double *const grad[3]);

/* The forward of d with args a on a fresh context (default threads) and
 * workspace, CHECKed to succeed (case `label`). */
void fxt_fwd_checked(const char *label, const fxa_attn_desc *d, const fxa_attn_args *a);

/* The backward of d with args a on a fresh context of n_threads threads
 * and a fresh workspace; the status. stats (may be NULL) as
 * fxa_attn_bwd_run fills it; the context's last error into msg (cap bytes)
 * when msg is not NULL. */
fxa_status fxt_bwd_once(const fxa_attn_desc *d, int n_threads, const fxa_attn_bwd_args *a,
                        fxa_attn_bwd_stats *stats, char *msg, size_t cap);

/* Gradient `name` of case `label` (got, n elements) against the fp64 ref:
 * CHECKs every error within 2x its envelope env (a NaN fails) and no
 * nonzero element where the envelope is 0 (no term reaches it); prints the
 * largest error and ratio. */
void fxt_bwd_compare(const char *label, const char *name, const double *got, const double *ref,
                     const double *env, size_t n);

/* Runs the backward again (run(arg, threads)) on 1 and on 3 threads after
 * a run on 2: 1 kv head runs one pass on 1 thread and two on 2 and 3, 2 kv
 * heads one pass on 1 and 2 threads and two on 3, 6 kv heads one pass on
 * all. Copies grads (n[w] floats each, a run's results) into keep first,
 * fills grads with 0xff bytes before each run, and CHECKs each run OK and
 * bit-identical to keep. */
typedef fxa_status (*fxt_bwd_runner)(void *arg, int n_threads);
void fxt_bwd_check_threads(const char *label, fxt_bwd_runner run, void *arg, float *const grads[3],
                           float *const keep[3], const size_t n[3]);

#endif
