/*
 * AVX512-BF16 backward tiles for bf16 compute (contract:
 * fxa_attn_bwd_tile_bf16 in kernels.h). Built with -mavx512f -mavx512vl
 * -mavx512bw -mavx512dq -mavx512bf16 -mfma (per file).
 *
 *   P, dS   6 x 64 blocks on vdpbf16ps against one 64-key panel of K (then
 *           V) pairs: per key-dimension pair, four zmm of packed key pairs
 *           and a broadcast pair of q (dO); 24 fp32 accumulators. p =
 *           exp2((lambda (s - center) + bias) - lse2) inv_sum (each step rounded to
 *           fp32; the fp32 exp2, fxa_vexp2_shifted_f32x16) and
 *           ds = p (dp - delta) in fp32
 *           for two rows at a time, rounded to bf16 together
 *           (vcvtne2ps2bf16) into the dS rows and, interleaved (vpermw),
 *           into the query-row pairs of P and dS. Pad keys
 *           of the last panel are zero in K and V, so whole panels are
 *           computed; their p and ds are never read (an odd n_kv's pad
 *           column of the dS rows is zeroed).
 *   dK, dV  6 key rows x 64 columns over the query-row pairs: four zmm of
 *           packed (Q or dO) row pairs, a broadcast pair of p (ds);
 *   dQ      6 query rows x 64 columns over the key pairs: four zmm of packed
 *           K row pairs, a broadcast pair of ds. Column tails are masked.
 * A row's bits do not depend on its place in the tile. The hardware flushes
 * subnormal bf16 inputs and products, and vcvtne2ps2bf16 subnormal values, to
 * zero; the products (and so the results) match the reference otherwise,
 * up to the fused multiply-add forming the exp2 argument.
 */
#include <stdint.h>
#include <string.h>

#include "bwd_vec_avx512.h"

/* A pair of bf16 values as one 32-bit lane, broadcast to 16 lanes. */
static inline __attribute__((always_inline)) __m512bh bcast_pair(const uint16_t *pair)
{
    int32_t bits;
    memcpy(&bits, pair, sizeof bits);
    return (__m512bh)_mm512_set1_epi32(bits);
}

/* The operands: bf16 pairs, summed by vdpbf16ps. */
typedef uint16_t bwd_elem;
typedef __m512bh bwd_in;
#define BWD_PACK 2
#define vload_in(ptr) ((__m512bh)_mm512_loadu_si512(ptr))
#define vmaskload_in(ptr, m) ((__m512bh)_mm512_maskz_loadu_epi32(m, ptr))
#define vbroadcast_in(ptr) bcast_pair(ptr)
#define vdot(acc, a, b) _mm512_dpbf16_ps(acc, a, b)

#include "../bwd_blocks_impl.h"

/* 16 pairs (even[k], odd[k]) of two fp32 vectors rounded to bf16: one
 * vcvtne2ps2bf16 (even in the low half), then the halves interleaved. */
static BWD_ALWAYS_INLINE __m512i pairs_of(__m512i both)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, both);
}

static BWD_ALWAYS_INLINE __m512i round2(__m512 even, __m512 odd)
{
    return (__m512i)_mm512_cvtne2ps_pbh(odd, even);
}

/* Prefetch rows [i0, i0 + MR) of q and dout (those within the tile) into L1. */
static BWD_ALWAYS_INLINE void prefetch_rows(const fxa_attn_bwd_tile_bf16 *t, size_t i0)
{
    const size_t end = i0 + MR < t->n_q ? i0 + MR : t->n_q;
    for (size_t i = i0; i < end; i++) {
        for (size_t c = 0; c < t->d; c += 32) {
            _mm_prefetch((const char *)(t->q + i * t->ldq + c), _MM_HINT_T0);
            _mm_prefetch((const char *)(t->dout + i * t->ldq + c), _MM_HINT_T0);
        }
    }
}

/* p and ds of rows [i0, i0 + mr) x the BWD_PANEL keys of the panel at j0: dp -
 * delta first (kept in dpd), then the scores, each row pair's p and ds
 * formed in registers and stored rounded (a missing odd row as zero). */
static BWD_ALWAYS_INLINE void p_ds_block(const fxa_attn_bwd_tile_bf16 *t, size_t i0, size_t j0,
                                         const size_t mr, const int biased)
{
    const size_t pairs = (t->d + 1) / 2;
    __m512 acc[MR][BWD_NV];
    float dpd[MR][BWD_PANEL];
    const size_t panel_at = 2 * j0 * pairs;
    if (j0 == 0) /* the first panel brings the rows in: the next block's from L3 meanwhile */
        prefetch_rows(t, i0 + MR);
    panel_dots(t->dout + i0 * t->ldq, t->ldq, t->vt + panel_at, pairs, mr, acc);
    BWD_UNROLL
    for (size_t r = 0; r < mr; r++) {
        const __m512 delta = _mm512_set1_ps(t->delta[i0 + r]);
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++)
            _mm512_storeu_ps(dpd[r] + BWD_W * v, _mm512_sub_ps(acc[r][v], delta));
    }
    panel_dots(t->q + i0 * t->ldq, t->ldq, t->kt + panel_at, pairs, mr, acc);
    const __m512 lambda = _mm512_set1_ps(t->lambda);
    BWD_UNROLL
    for (size_t r = 0; r < mr; r += 2) {
        const int two = r + 1 < mr;
        const __m512 lse_e = _mm512_set1_ps(t->lse2[i0 + r]);
        const __m512 lse_o = two ? _mm512_set1_ps(t->lse2[i0 + r + 1]) : _mm512_setzero_ps();
        const __m512 inv_e = _mm512_set1_ps(t->inv_sum[i0 + r]);
        const __m512 inv_o = two ? _mm512_set1_ps(t->inv_sum[i0 + r + 1]) : _mm512_setzero_ps();
        const __m512 c_e = _mm512_set1_ps(t->center[i0 + r]);
        const __m512 c_o = two ? _mm512_set1_ps(t->center[i0 + r + 1]) : _mm512_setzero_ps();
        const size_t pair_at = 2 * ((i0 + r) / 2 * t->ld_p + j0);
        uint16_t *row = t->ds + (i0 + r) * t->ld_p + j0;
        const float *bias = biased ? t->bias + (i0 + r) * t->ld_p + j0 : NULL;
        BWD_UNROLL
        for (size_t v = 0; v < BWD_NV; v++) {
            const __m512 z_e = _mm512_mul_ps(lambda, _mm512_sub_ps(acc[r][v], c_e));
            const __m512 z_o = two ? _mm512_mul_ps(lambda, _mm512_sub_ps(acc[r + 1][v], c_o))
                                   : _mm512_setzero_ps();
            const __m512 zb_e =
                biased ? _mm512_add_ps(z_e, _mm512_loadu_ps(bias + BWD_W * v)) : z_e;
            const __m512 zb_o =
                biased && two ? _mm512_add_ps(z_o, _mm512_loadu_ps(bias + t->ld_p + BWD_W * v))
                              : z_o;
            const __m512 p_e = _mm512_mul_ps(
                fxa_vexp2_shifted_f32x16(_mm512_sub_ps(zb_e, lse_e), _mm512_setzero_ps()), inv_e);
            const __m512 p_o =
                two ? _mm512_mul_ps(
                          fxa_vexp2_shifted_f32x16(_mm512_sub_ps(zb_o, lse_o), _mm512_setzero_ps()),
                          inv_o)
                    : _mm512_setzero_ps();
            const __m512 ds_e = _mm512_mul_ps(p_e, _mm512_loadu_ps(dpd[r] + BWD_W * v));
            const __m512 ds_o = two ? _mm512_mul_ps(p_o, _mm512_loadu_ps(dpd[r + 1] + BWD_W * v))
                                    : _mm512_setzero_ps();
            const __m512i ds2 = round2(ds_e, ds_o);
            _mm512_storeu_si512(t->pt + pair_at + 2 * BWD_W * v, pairs_of(round2(p_e, p_o)));
            _mm512_storeu_si512(t->dst + pair_at + 2 * BWD_W * v, pairs_of(ds2));
            _mm256_storeu_si256((__m256i *)(row + BWD_W * v), _mm512_castsi512_si256(ds2));
            if (two)
                _mm256_storeu_si256((__m256i *)(row + t->ld_p + BWD_W * v),
                                    _mm512_extracti64x4_epi64(ds2, 1));
        }
    }
}

/* p and ds of the tile, an odd n_kv's pad column of the dS rows zeroed. */
static void p_ds(const fxa_attn_bwd_tile_bf16 *t)
{
    P_DS_PANELS(t);
    if (t->n_kv % 2) {
        for (size_t i = 0; i < t->n_q; i++)
            t->ds[i * t->ld_p + t->n_kv] = 0;
    }
}

/* dv_j += sum_i p_ij dout_i, dk_j += sum_i ds_ij q_i over the query-row
 * pairs (key rows j, their pairs 2 apart); dq_i += sum_j ds_ij k_j over the
 * key pairs (ds rows ld_p apart). */
void fxa_bf16_bwd_dkdv_6x64__avx512bf16(const fxa_attn_bwd_tile_bf16 *t)
{
    p_ds(t);
    grad_blocks(t->d, t->n_kv, t->ldg, 2 * t->ld_p, 2, t->ldqp, (t->n_q + 1) / 2, t->dv, t->pt,
                t->doutp, t->dk, t->dst, t->qp, 0);
}

void fxa_bf16_bwd_dq_6x64__avx512bf16(const fxa_attn_bwd_tile_bf16 *t)
{
    if (!t->p_ds_given)
        p_ds(t);
    grad_blocks(t->d, t->n_q, t->ldg, 2, t->ld_p, t->ldkp, (t->n_kv + 1) / 2, t->dq, t->ds, t->kp,
                NULL, NULL, NULL, 1);
}
