/*
 * AVX-512 fp32 backward tiles (contract: fxa_attn_bwd_tile in kernels.h;
 * the loops: bwd_tiles_impl.h; the vector set: bwd_vec_avx512.h): 6 x 64
 * blocks on zmm (24 accumulators). Built with -mavx512f -mavx512vl
 * -mavx512bw -mavx512dq -mfma (per file).
 */
#include "bwd_vec_avx512.h"

#define BWD_DKDV_NAME fxa_f32_bwd_dkdv_6x64__avx512
#define BWD_DQ_NAME fxa_f32_bwd_dq_6x64__avx512

#include "../bwd_tiles_impl.h"
