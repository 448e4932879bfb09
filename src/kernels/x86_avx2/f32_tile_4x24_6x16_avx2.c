/*
 * AVX2+FMA fp32 attention tile (contract: fxa_attn_tile in kernels.h).
 * Built with -mavx2 -mfma -mf16c (per file).
 *
 *   scores  4 x 24 micro-kernel: 12 ymm accumulators, K^T rows of 24 keys
 *           loaded once per depth step and broadcast q; every score is a
 *           chain of FMAs over c from 0, whatever the rows per block; the key
 *           tail is masked (vmaskmovps), never over-read; full blocks use
 *           plain loads and stores.
 *   softmax per row, 8 lanes at a time, exp2 by fxa_vexp2_shifted_f32x8.
 *   P.V     6 x 16 micro-kernel: 12 ymm accumulators; FMA chain over j;
 *           the column tail masked.
 * The loops of the score and P.V passes are tile_blocks_impl.h's, the row
 * updates softmax_rows_impl.h's; this file holds the ymm micro-operations.
 * Matches the reference kernels to fp32 rounding, bit for bit across thread
 * counts and tilings.
 */
#include <assert.h>
#include <immintrin.h>

#include "../kernels.h"
#include "rows_avx2.h"
#include "vexp2_avx2.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

#define SC_ROWS 4            /* score micro-kernel rows */
#define SC_VECS 3            /* score micro-kernel keys, in ymm (24) */
#define PV_ROWS 6            /* P.V micro-kernel rows */
#define PV_VECS 2            /* P.V micro-kernel columns, in ymm (16) */
#define PV_KEYS ((size_t)-1) /* P.V in one pass over the keys */

/* The micro-operations of tile_blocks_impl.h on ymm. Loads and stores of 8 floats: plain ones
 * for a whole block (full is a compile-time constant at every call), masked ones at the tail.
 * AMD's masked stores are microcoded (about 12 cycles each on Zen 3), so the whole blocks,
 * nearly all of the work, must not pay for them. */
#define TB_TILE fxa_attn_tile
typedef float tb_elem;
typedef __m256 tb_acc;
typedef __m256 tb_vec;
typedef __m256i tb_mask;
#define TB_PAIR 1
#define TB_LANES 8
#define TB_FULL_PLAIN 1
#define TB_K(t, j0) ((t)->kt + (j0)) /* one panel holds the whole tile */
#define TB_K_LD(t) ((t)->kt_panel)
#define TB_V(t) ((t)->v)
#define TB_V_LD(t) ((t)->ldv)
#define TB_P(t) ((t)->scores)

static ALWAYS_INLINE __m256 load8(const float *x, __m256i mask, int full)
{
    return full ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, mask);
}

static ALWAYS_INLINE void store8(float *x, __m256i mask, __m256 v, int full)
{
    if (full)
        _mm256_storeu_ps(x, v);
    else
        _mm256_maskstore_ps(x, mask, v);
}

#define acc_load load8
#define acc_store store8
#define vec_load load8
#define acc_zero _mm256_setzero_ps
#define acc_set1 _mm256_set1_ps

static ALWAYS_INLINE void block_masks(ptrdiff_t n, size_t nvec, __m256i *mask)
{
    for (size_t v = 0; v < nvec; v++)
        mask[v] = tail_mask(n - 8 * (ptrdiff_t)v);
}

static ALWAYS_INLINE __m256 acc_scale(__m256 a, __m256 lambda, __m256 center)
{
    return _mm256_mul_ps(lambda, _mm256_sub_ps(a, center));
}

static ALWAYS_INLINE __m256 vec_bcast(const float *x)
{
    return _mm256_broadcast_ss(x);
}

static ALWAYS_INLINE __m256 vec_madd(__m256 acc, __m256 a, __m256 b)
{
    return _mm256_fmadd_ps(a, b, acc);
}

#include "../tile_blocks_impl.h"

static float hsum(__m256 x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* p = exp2(z - shift) in place over row i's scores; returns the sum of p. Every row takes the
 * flush test. */
static float row_exp2(const fxa_attn_tile *t, size_t i, float shift, int may_flush)
{
    (void)may_flush;
    float *z = t->scores + i * t->ld_scores;
    const size_t n = t->n_kv;
    const __m256 m = _mm256_set1_ps(shift);
    __m256 sum = _mm256_setzero_ps();
    size_t j = 0;
    for (; j + 8 <= n; j += 8) {
        const __m256 p = fxa_vexp2_shifted_f32x8(_mm256_loadu_ps(z + j), m);
        _mm256_storeu_ps(z + j, p);
        sum = _mm256_add_ps(sum, p);
    }
    if (j < n) {
        const __m256i k = tail_mask((ptrdiff_t)(n - j));
        const __m256 p = _mm256_and_ps(_mm256_castsi256_ps(k),
                                       fxa_vexp2_shifted_f32x8(_mm256_maskload_ps(z + j, k), m));
        _mm256_maskstore_ps(z + j, k, p);
        sum = _mm256_add_ps(sum, p);
    }
    return hsum(sum);
}

#define FXA_SOFTMAX_TILE fxa_attn_tile
#include "../softmax_rows_impl.h"

void fxa_f32_tile_4x24_6x16__avx2(const fxa_attn_tile *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    assert(t->kt_panel >= t->n_kv && t->ld_scores >= (t->n_kv + 15) / 16 * 16);
    tile_scores(t);
    softmax_rows(t, 0, t->n_q);
    tile_pv(t);
}
