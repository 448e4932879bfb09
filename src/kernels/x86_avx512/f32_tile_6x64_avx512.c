/*
 * AVX-512 fp32 attention tile (contract: fxa_attn_tile in kernels.h).
 * Built with -mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma (per file).
 *
 *   scores  6 x 64 micro-kernel: 24 zmm accumulators, K^T in 64-key panels
 *           (one contiguous 64 x d stream per block), a panel row loaded
 *           once per depth step and broadcast q; every score is a
 *           chain of FMAs over c from 0 (the same chain for any rows-per-
 *           block, so a row's bits never depend on its place in the tile);
 *           the key tail is masked, never over-read.
 *   softmax per row, 16 lanes at a time: fixed shift or online update with
 *           an integer running shift, exp2 by fxa_vexp2_shifted_f32x16
 *           (without its flush test in FXA_ROW_FIXED rows, which never flush).
 *   P.V     6 x 64 micro-kernel: 24 zmm accumulators, V rows loaded once per
 *           key and broadcast p; FMA chain over j; the column tail masked.
 * The loops of the score and P.V passes are tile_blocks_impl.h's, the row
 * updates softmax_rows_impl.h's; this file holds the zmm micro-operations.
 * Matches the reference kernels to fp32 rounding (FMA and lane-wise sums
 * change the last bits), bit for bit across thread counts and tilings.
 */
#include <assert.h>
#include <immintrin.h>

#include "../kernels.h"
#include "rows_avx512.h"
#include "tile_acc_avx512.h"
#include "vexp2_avx512.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

#define SC_ROWS 6                    /* score micro-kernel rows */
#define SC_VECS 4                    /* score micro-kernel columns, in zmm (64 keys) */
#define KT_PANEL FXA_AVX512_KT_PANEL /* = 16 SC_VECS: one panel per block */
#define PV_ROWS 6                    /* P.V micro-kernel rows */
#define PV_VECS 4                    /* P.V micro-kernel columns, in zmm (64 floats) */
/* Keys per pass of P.V: 64 columns of PV_KEYS V rows (32 KiB) stay in L1 while every row block
 * of the tile reads them. */
#define PV_KEYS 128

/* The micro-operations of tile_blocks_impl.h: fp32 products on zmm. */
#define TB_TILE fxa_attn_tile
typedef float tb_elem;
typedef __m512 tb_vec;
#define TB_PAIR 1
#define TB_FULL_PLAIN 1
#define TB_K(t, j0) ((t)->kt + fxa_kt_offset(KT_PANEL, (t)->d, 0, (j0)))
#define TB_K_LD(t) KT_PANEL
#define TB_V(t) ((t)->v)
#define TB_V_LD(t) ((t)->ldv)
#define TB_P(t) ((t)->scores)
#define vec_load acc_load

static ALWAYS_INLINE __m512 vec_bcast(const float *x)
{
    return _mm512_set1_ps(*x);
}

static ALWAYS_INLINE __m512 vec_madd(__m512 acc, __m512 a, __m512 b)
{
    return _mm512_fmadd_ps(a, b, acc);
}

#include "../tile_blocks_impl.h"

/* p = exp2(z - shift) in place over row i's scores; returns the sum of p. With
 * may_flush 0 (a constant) the flush test is left out: the row's bound
 * proves that no term flushes (FXA_ROW_FIXED). */
static ALWAYS_INLINE float row_exp2(const fxa_attn_tile *t, size_t i, float shift,
                                    const int may_flush)
{
    float *z = t->scores + i * t->ld_scores;
    const size_t n = t->n_kv;
    const __m512 m = _mm512_set1_ps(shift);
    __m512 sum = _mm512_setzero_ps();
    size_t j = 0;
    for (; j + 16 <= n; j += 16) { /* whole vectors: plain loads and stores */
        const __m512 p = may_flush ? fxa_vexp2_shifted_f32x16(_mm512_loadu_ps(z + j), m)
                                   : fxa_vexp2_shifted_noflush_f32x16(_mm512_loadu_ps(z + j), m);
        _mm512_storeu_ps(z + j, p);
        sum = _mm512_add_ps(sum, p);
    }
    for (; j < n; j += 16) {
        const __mmask16 k = fxa_tail_mask16((ptrdiff_t)(n - j));
        const __m512 z16 = _mm512_maskz_loadu_ps(k, z + j);
        const __m512 p =
            may_flush ? fxa_vexp2_shifted_f32x16(z16, m) : fxa_vexp2_shifted_noflush_f32x16(z16, m);
        _mm512_mask_storeu_ps(z + j, k, p);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, p));
    }
    return _mm512_reduce_add_ps(sum);
}

#define FXA_SOFTMAX_TILE fxa_attn_tile
#include "../softmax_rows_impl.h"

void fxa_f32_tile_6x64__avx512(const fxa_attn_tile *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    assert(t->kt_panel == KT_PANEL && t->ld_scores >= (t->n_kv + 15) / 16 * 16);
    tile_scores(t);
    softmax_rows(t, 0, t->n_q);
    tile_pv(t);
}
