/*
 * AVX512-BF16 backward tiles for bf16 compute (contract:
 * fxa_attn_bwd_tile_bf16 in kernels.h). Built with -mavx512f -mavx512vl
 * -mavx512bw -mavx512dq -mavx512bf16 -mfma (per file).
 *
 *   P, dS   6 x 64 blocks on vdpbf16ps against one 64-key panel of K (then
 *           V) pairs: per key-dimension pair, four zmm of packed key pairs
 *           and a broadcast pair of q (dO); 24 fp32 accumulators. p =
 *           exp2(lambda s - lse2) (one FMA forms the argument; the fp32
 *           exp2, fxa_vexp2_shifted_f32x16; with a bias, lse2 - bias is
 *           rounded first and takes lse2's place) and ds = p (dp - delta) in fp32
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
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../kernels.h"
#include "vexp2_avx512.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")
#define MR 6
#define NV 4
#define W 16
#define PANEL FXA_AVX512_KT_PANEL /* = W NV */

static ALWAYS_INLINE __mmask16 first_lanes(ptrdiff_t n)
{
    if (n >= 16)
        return (__mmask16)0xffff;
    if (n <= 0)
        return (__mmask16)0;
    return (__mmask16)((1u << n) - 1u);
}

/* A pair of bf16 values as one 32-bit lane, broadcast to 16 lanes. */
static ALWAYS_INLINE __m512bh bcast_pair(const uint16_t *pair)
{
    int32_t bits;
    memcpy(&bits, pair, sizeof bits);
    return (__m512bh)_mm512_set1_epi32(bits);
}

/* acc[r][v] = pair sums over c of a[r lda + 2c ..] and the panel's key pairs. */
static ALWAYS_INLINE void panel_dots(const uint16_t *a, size_t lda, const uint16_t *panel,
                                     size_t pairs, const size_t mr, __m512 acc[MR][NV])
{
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < NV; v++)
            acc[r][v] = _mm512_setzero_ps();
    }
    for (size_t c = 0; c < pairs; c++) {
        __m512bh b[NV];
        UNROLL
        for (size_t v = 0; v < NV; v++)
            b[v] = (__m512bh)_mm512_loadu_si512(panel + 2 * (c * PANEL + W * v));
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m512bh x = bcast_pair(a + r * lda + 2 * c);
            UNROLL
            for (size_t v = 0; v < NV; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], x, b[v]);
        }
    }
}

/* 16 pairs (even[k], odd[k]) of two fp32 vectors rounded to bf16: one
 * vcvtne2ps2bf16 (even in the low half), then the halves interleaved. */
static ALWAYS_INLINE __m512i pairs_of(__m512i both)
{
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(idx, both);
}

static ALWAYS_INLINE __m512i round2(__m512 even, __m512 odd)
{
    return (__m512i)_mm512_cvtne2ps_pbh(odd, even);
}

/* p and ds of rows [i0, i0 + mr) x the PANEL keys of the panel at j0: dp -
 * delta first (kept in dpd), then the scores, each row pair's p and ds
 * formed in registers and stored rounded (a missing odd row as zero). */
static ALWAYS_INLINE void p_ds_block(const fxa_attn_bwd_tile_bf16 *t, size_t i0, size_t j0,
                                     const size_t mr, const int biased)
{
    const size_t pairs = (t->d + 1) / 2;
    __m512 acc[MR][NV];
    float dpd[MR][PANEL];
    const size_t panel_at = 2 * j0 * pairs;
    panel_dots(t->dout + i0 * t->ldq, t->ldq, t->vt + panel_at, pairs, mr, acc);
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        const __m512 delta = _mm512_set1_ps(t->delta[i0 + r]);
        UNROLL
        for (size_t v = 0; v < NV; v++)
            _mm512_storeu_ps(dpd[r] + W * v, _mm512_sub_ps(acc[r][v], delta));
    }
    panel_dots(t->q + i0 * t->ldq, t->ldq, t->kt + panel_at, pairs, mr, acc);
    const __m512 lambda = _mm512_set1_ps(t->lambda);
    UNROLL
    for (size_t r = 0; r < mr; r += 2) {
        const int two = r + 1 < mr;
        const __m512 lse_e = _mm512_set1_ps(t->lse2[i0 + r]);
        const __m512 lse_o = two ? _mm512_set1_ps(t->lse2[i0 + r + 1]) : _mm512_setzero_ps();
        const size_t pair_at = 2 * ((i0 + r) / 2 * t->ld_p + j0);
        uint16_t *row = t->ds + (i0 + r) * t->ld_p + j0;
        const float *bias = biased ? t->bias + (i0 + r) * t->ld_p + j0 : NULL;
        UNROLL
        for (size_t v = 0; v < NV; v++) {
            const __m512 sh_e =
                biased ? _mm512_sub_ps(lse_e, _mm512_loadu_ps(bias + W * v)) : lse_e;
            const __m512 sh_o = biased && two
                                    ? _mm512_sub_ps(lse_o, _mm512_loadu_ps(bias + t->ld_p + W * v))
                                    : lse_o;
            const __m512 p_e = fxa_vexp2_shifted_f32x16(_mm512_fmsub_ps(lambda, acc[r][v], sh_e),
                                                        _mm512_setzero_ps());
            const __m512 p_o =
                two ? fxa_vexp2_shifted_f32x16(_mm512_fmsub_ps(lambda, acc[r + 1][v], sh_o),
                                               _mm512_setzero_ps())
                    : _mm512_setzero_ps();
            const __m512 ds_e = _mm512_mul_ps(p_e, _mm512_loadu_ps(dpd[r] + W * v));
            const __m512 ds_o =
                two ? _mm512_mul_ps(p_o, _mm512_loadu_ps(dpd[r + 1] + W * v)) : _mm512_setzero_ps();
            const __m512i ds2 = round2(ds_e, ds_o);
            _mm512_storeu_si512(t->pt + pair_at + 2 * W * v, pairs_of(round2(p_e, p_o)));
            _mm512_storeu_si512(t->dst + pair_at + 2 * W * v, pairs_of(ds2));
            _mm256_storeu_si256((__m256i *)(row + W * v), _mm512_castsi512_si256(ds2));
            if (two)
                _mm256_storeu_si256((__m256i *)(row + t->ld_p + W * v),
                                    _mm512_extracti64x4_epi64(ds2, 1));
        }
    }
}

/* CALL(mr) for the rows [0, n) in blocks of MR (i0: the block's first row, even),
 * the tail with its own constant mr. */
#define FOR_ROW_BLOCKS(n, i0, CALL)                                                                \
    do {                                                                                           \
        size_t i0 = 0;                                                                             \
        for (; i0 + MR <= (n); i0 += MR)                                                           \
            CALL(MR);                                                                              \
        switch ((n)-i0) {                                                                          \
        case 5: CALL(5); break;                                                                    \
        case 4: CALL(4); break;                                                                    \
        case 3: CALL(3); break;                                                                    \
        case 2: CALL(2); break;                                                                    \
        case 1: CALL(1); break;                                                                    \
        default: break;                                                                            \
        }                                                                                          \
    } while (0)

static void p_ds(const fxa_attn_bwd_tile_bf16 *t)
{
    for (size_t j0 = 0; j0 < t->n_kv; j0 += PANEL) {
#define P_DS(mr) p_ds_block(t, i0, j0, mr, 0)
#define P_DS_BIASED(mr) p_ds_block(t, i0, j0, mr, 1)
        if (t->bias)
            FOR_ROW_BLOCKS(t->n_q, i0, P_DS_BIASED);
        else
            FOR_ROW_BLOCKS(t->n_q, i0, P_DS);
#undef P_DS
#undef P_DS_BIASED
    }
    if (t->n_kv % 2) {
        for (size_t i = 0; i < t->n_q; i++)
            t->ds[i * t->ld_p + t->n_kv] = 0;
    }
}

/* g[r][..] += sum over n pairs k of the pair at w + k ldw + r w_step times
 * the pairs x + 2 (k ldx + ..), for rows r < mr of g (ldg), the columns of
 * mask. */
static ALWAYS_INLINE void grad_block(float *g, size_t ldg, const uint16_t *w, size_t ldw,
                                     size_t w_step, const uint16_t *x, size_t ldx, size_t n,
                                     const __mmask16 mask[NV], const size_t mr)
{
    __m512 acc[MR][NV];
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < NV; v++)
            acc[r][v] = _mm512_maskz_loadu_ps(mask[v], g + r * ldg + W * v);
    }
    for (size_t k = 0; k < n; k++) {
        __m512bh xv[NV];
        UNROLL
        for (size_t v = 0; v < NV; v++)
            xv[v] = (__m512bh)_mm512_maskz_loadu_epi32(mask[v], x + 2 * (k * ldx + W * v));
        UNROLL
        for (size_t r = 0; r < mr; r++) {
            const __m512bh wb = bcast_pair(w + k * ldw + r * w_step);
            UNROLL
            for (size_t v = 0; v < NV; v++)
                acc[r][v] = _mm512_dpbf16_ps(acc[r][v], wb, xv[v]);
        }
    }
    UNROLL
    for (size_t r = 0; r < mr; r++) {
        UNROLL
        for (size_t v = 0; v < NV; v++)
            _mm512_mask_storeu_ps(g + r * ldg + W * v, mask[v], acc[r][v]);
    }
}

/* The masks of the columns [c0, d) in one block row. */
static inline void column_masks(size_t d, size_t c0, __mmask16 mask[NV])
{
    for (size_t v = 0; v < NV; v++)
        mask[v] = first_lanes((ptrdiff_t)d - (ptrdiff_t)(c0 + W * v));
}

void fxa_bf16_bwd_dkdv_6x64__avx512bf16(const fxa_attn_bwd_tile_bf16 *t)
{
    p_ds(t);
    const size_t q_pairs = (t->n_q + 1) / 2;
    for (size_t c0 = 0; c0 < t->d; c0 += W * NV) {
        __mmask16 mask[NV];
        column_masks(t->d, c0, mask);
        /* dv_j += sum_i p_ij dout_i; dk_j += sum_i ds_ij q_i (key rows j0 + r,
         * their pairs 2 apart) */
#define DV(mr)                                                                                     \
    grad_block(t->dv + j0 * t->ldg + c0, t->ldg, t->pt + 2 * j0, 2 * t->ld_p, 2,                   \
               t->doutp + 2 * c0, t->ldqp, q_pairs, mask, mr)
#define DK(mr)                                                                                     \
    grad_block(t->dk + j0 * t->ldg + c0, t->ldg, t->dst + 2 * j0, 2 * t->ld_p, 2, t->qp + 2 * c0,  \
               t->ldqp, q_pairs, mask, mr)
        FOR_ROW_BLOCKS(t->n_kv, j0, DV);
        FOR_ROW_BLOCKS(t->n_kv, j0, DK);
#undef DV
#undef DK
    }
}

void fxa_bf16_bwd_dq_6x64__avx512bf16(const fxa_attn_bwd_tile_bf16 *t)
{
    if (!t->p_ds_given)
        p_ds(t);
    const size_t kv_pairs = (t->n_kv + 1) / 2;
    for (size_t c0 = 0; c0 < t->d; c0 += W * NV) {
        __mmask16 mask[NV];
        column_masks(t->d, c0, mask);
        /* dq_i += sum_j ds_ij k_j (query rows i0 + r, ds rows ld_p apart) */
#define DQ(mr)                                                                                     \
    grad_block(t->dq + i0 * t->ldg + c0, t->ldg, t->ds + i0 * t->ld_p, 2, t->ld_p, t->kp + 2 * c0, \
               t->ldkp, kv_pairs, mask, mr)
        FOR_ROW_BLOCKS(t->n_q, i0, DQ);
#undef DQ
    }
}
