/*
 * The AVX-512 vector set of the backward tiles (bwd_blocks_impl.h,
 * bwd_tiles_impl.h): fp32 on zmm, 6 x 64 blocks (four vectors a row)
 * against panels of FXA_AVX512_KT_PANEL keys; exp2 by
 * fxa_vexp2_shifted_f32x16. For files built with AVX-512 F/VL/BW/DQ and
 * FMA.
 */
#ifndef FXA_BWD_VEC_AVX512_H
#define FXA_BWD_VEC_AVX512_H

#include <immintrin.h>
#include <stddef.h>

#include "../kernels.h"
#include "vexp2_avx512.h"

#define BWD_W 16
#define BWD_NV 4
#define BWD_PANEL FXA_AVX512_KT_PANEL /* = BWD_W BWD_NV */
typedef __m512 bwd_vec;
typedef __mmask16 bwd_mask;

static inline bwd_mask first_lanes(ptrdiff_t n)
{
    if (n >= 16)
        return (bwd_mask)0xffff;
    if (n <= 0)
        return (bwd_mask)0;
    return (bwd_mask)((1u << n) - 1u);
}

#define vzero() _mm512_setzero_ps()
#define vset1(x) _mm512_set1_ps(x)
#define vbroadcast(ptr) _mm512_set1_ps(*(ptr))
#define vload(ptr) _mm512_loadu_ps(ptr)
#define vstore(ptr, v) _mm512_storeu_ps(ptr, v)
#define vmaskload(ptr, m) _mm512_maskz_loadu_ps(m, ptr)
#define vmaskstore(ptr, m, v) _mm512_mask_storeu_ps(ptr, m, v)
#define vfmadd(a, b, c) _mm512_fmadd_ps(a, b, c)
#define vmul(a, b) _mm512_mul_ps(a, b)
#define vsub(a, b) _mm512_sub_ps(a, b)
#define vadd(a, b) _mm512_add_ps(a, b)
#define vexp2_of(z, shift) fxa_vexp2_shifted_f32x16(_mm512_sub_ps(z, shift), _mm512_setzero_ps())

#endif
