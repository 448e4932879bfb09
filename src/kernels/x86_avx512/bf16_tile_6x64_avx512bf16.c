/*
 * AVX512-BF16 attention tile for FXA_COMPUTE_BF16 (contract:
 * fxa_attn_tile_bf16 in kernels.h). Built with -mavx512f -mavx512vl
 * -mavx512bw -mavx512dq -mavx512bf16 -mfma (per file).
 *
 *   scores  6 x 64 micro-kernel on vdpbf16ps over a 64-key K panel: per
 *           key-dimension pair, four zmm of packed key pairs (contiguous)
 *           and a broadcast query pair; 24 zmm accumulators in fp32.
 *   softmax bf16 compute's exp2 (degree 4), then P rounded to bf16
 *           (vcvtne2ps2bf16, 32 at a time); l sums the rounded P
 *           (bf16_softmax_avx512.h, shared with the AMX tile).
 *   P.V     6 x 64 micro-kernel on vdpbf16ps: per key pair, four zmm of
 *           packed value pairs and a broadcast pair of p; 24 accumulators.
 * The loops of the score and P.V passes are tile_blocks_impl.h's.
 * The hardware flushes subnormal bf16 products (DAZ/FTZ); P itself is never
 * subnormal (exp2 flushes below 2^-126), so only products below 2^-126
 * differ from the scalar reference, far below its rounding.
 */
#include <assert.h>
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../kernels.h"
#include "rows_avx512.h"
#include "tile_acc_avx512.h"
#define FXA_BF16_RAW_SCORES 0 /* the score kernel stores z */
#include "bf16_softmax_avx512.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

#define SC_ROWS 6
#define SC_VECS 4                    /* 64 keys */
#define KP_PANEL FXA_AVX512_KT_PANEL /* = 16 SC_VECS: one K panel per block */
#define PV_ROWS 6
#define PV_VECS 4
#define PV_KEYS ((size_t)-1) /* P.V in one pass over the key pairs */

/* The micro-operations of tile_blocks_impl.h: a depth step is a pair of bf16 values per lane
 * (vdpbf16ps), and every load and store is masked. */
#define TB_TILE fxa_attn_tile_bf16
typedef uint16_t tb_elem;
typedef __m512bh tb_vec;
#define TB_PAIR 2
#define TB_FULL_PLAIN 0
#define TB_K(t, j0) ((t)->kp + 2 * fxa_kt_offset(KP_PANEL, ((t)->d + 1) / 2, 0, (j0)))
#define TB_K_LD(t) (2 * KP_PANEL)
#define TB_V(t) ((t)->vp)
#define TB_V_LD(t) (2 * (t)->ldvp)
#define TB_P(t) ((t)->p16)

/* 16 pairs of bf16 values. */
static ALWAYS_INLINE __m512bh vec_load(const uint16_t *x, __mmask16 mask, int full)
{
    (void)full;
    return (__m512bh)_mm512_maskz_loadu_epi32(mask, x);
}

/* A pair of bf16 values as one 32-bit lane, broadcast to 16 lanes. */
static ALWAYS_INLINE __m512bh vec_bcast(const uint16_t *pair)
{
    int32_t bits;
    memcpy(&bits, pair, sizeof bits);
    return (__m512bh)_mm512_set1_epi32(bits);
}

static ALWAYS_INLINE __m512 vec_madd(__m512 acc, __m512bh a, __m512bh b)
{
    return _mm512_dpbf16_ps(acc, a, b);
}

#include "../tile_blocks_impl.h"

void fxa_bf16_tile_6x64__avx512bf16(const fxa_attn_tile_bf16 *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    assert(t->kp_panel == KP_PANEL && t->ldvp >= t->d && t->ld_scores >= t->n_kv + t->n_kv % 2);
    tile_scores(t);
    softmax_rows(t, 0, t->n_q);
    tile_pv(t);
}
