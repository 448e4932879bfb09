/*
 * AVX2+FMA fp32 backward tiles (contract: fxa_attn_bwd_tile in kernels.h;
 * the loops: bwd_tiles_impl.h): 6 x 16 blocks on ymm (12 accumulators),
 * against K^T and V^T panels of 16 keys; exp2 by fxa_vexp2_shifted_f32x8;
 * column tails by vmaskmovps. Built with -mavx2 -mfma (per file).
 */
#include <stddef.h>
#include <immintrin.h>

#include "../kernels.h"
#include "vexp2_avx2.h"

#define BWD_DKDV_NAME fxa_f32_bwd_dkdv_6x16__avx2
#define BWD_DQ_NAME fxa_f32_bwd_dq_6x16__avx2
#define BWD_W 8
#define BWD_NV 2
#define BWD_PANEL 16 /* = BWD_W BWD_NV, the set's bwd_kt_panel */
typedef __m256 bwd_vec;
typedef __m256i bwd_mask;

static inline bwd_mask first_lanes(ptrdiff_t n)
{
    const int c = n < 0 ? 0 : (n > 8 ? 8 : (int)n);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

#define vzero() _mm256_setzero_ps()
#define vset1(x) _mm256_set1_ps(x)
#define vbroadcast(ptr) _mm256_broadcast_ss(ptr)
#define vload(ptr) _mm256_loadu_ps(ptr)
#define vstore(ptr, v) _mm256_storeu_ps(ptr, v)
#define vmaskload(ptr, m) _mm256_maskload_ps(ptr, m)
#define vmaskstore(ptr, m, v) _mm256_maskstore_ps(ptr, m, v)
#define vfmadd(a, b, c) _mm256_fmadd_ps(a, b, c)
#define vmul(a, b) _mm256_mul_ps(a, b)
#define vsub(a, b) _mm256_sub_ps(a, b)
#define vadd(a, b) _mm256_add_ps(a, b)
#define vexp2_of(z, shift) fxa_vexp2_shifted_f32x8(_mm256_sub_ps(z, shift), _mm256_setzero_ps())

#include "../bwd_tiles_impl.h"
