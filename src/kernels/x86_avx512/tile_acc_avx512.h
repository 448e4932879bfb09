/*
 * The accumulator micro-operations of tile_blocks_impl.h on zmm (16 fp32 lanes), shared by the
 * AVX-512 tiles (fp32 and bf16 compute). A whole block's loads and stores (full, a constant at
 * every call) take an all-ones mask, which the compiler turns into plain loads and stores.
 * Include only from files compiled with -mavx512f.
 */
#ifndef FXA_TILE_ACC_AVX512_H
#define FXA_TILE_ACC_AVX512_H

#include <immintrin.h>
#include <stddef.h>

#include "rows_avx512.h"

typedef __m512 tb_acc;
typedef __mmask16 tb_mask;
#define TB_LANES 16
#define block_masks fxa_tail_masks16
#define acc_zero _mm512_setzero_ps
#define acc_set1 _mm512_set1_ps

/* The lanes a load or store touches: all of them in a whole block. */
static inline __attribute__((always_inline)) __mmask16 block_lanes(__mmask16 mask, int full)
{
    return full ? (__mmask16)0xffff : mask;
}

static inline __attribute__((always_inline)) __m512 acc_load(const float *x, __mmask16 mask,
                                                             int full)
{
    return _mm512_maskz_loadu_ps(block_lanes(mask, full), x);
}

static inline __attribute__((always_inline)) void acc_store(float *x, __mmask16 mask, __m512 a,
                                                            int full)
{
    _mm512_mask_storeu_ps(x, block_lanes(mask, full), a);
}

/* lambda (a - center), each operation rounded. */
static inline __attribute__((always_inline)) __m512 acc_scale(__m512 a, __m512 lambda,
                                                              __m512 center)
{
    return _mm512_mul_ps(lambda, _mm512_sub_ps(a, center));
}

#endif
