/*
 * AVX2 K^T packing (contract: fxa_pack_kt_fn in kernels.h).
 * Built with -mavx2 (per file).
 * Blocks of 8 keys x 8 dimensions through packkt_impl.h's loop, with the
 * 8 x 8 transpose in ymm registers. Whole blocks use plain loads and stores
 * (masked stores are slow on some cores).
 */
#include <immintrin.h>

#include "../kernels.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
/* Fully unrolled, so that the blocks live in registers. */
#define UNROLL _Pragma("GCC unroll 8")

/* out[c][r] = in[r][c]: interleave pairs of rows, then pairs of pairs (128-bit
 * lane L of mid[4g + k] holds column 4L + k of rows 4g..4g+3), then join the
 * two lanes of each column. */
static ALWAYS_INLINE void transpose(const __m256 in[8], __m256 out[8])
{
    __m256 pairs[8], mid[8];
    UNROLL
    for (int r = 0; r < 8; r += 2) {
        pairs[r] = _mm256_unpacklo_ps(in[r], in[r + 1]);
        pairs[r + 1] = _mm256_unpackhi_ps(in[r], in[r + 1]);
    }
    UNROLL
    for (int g = 0; g < 8; g += 4) {
        mid[g] = _mm256_shuffle_ps(pairs[g], pairs[g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        mid[g + 1] = _mm256_shuffle_ps(pairs[g], pairs[g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        mid[g + 2] = _mm256_shuffle_ps(pairs[g + 1], pairs[g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        mid[g + 3] = _mm256_shuffle_ps(pairs[g + 1], pairs[g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    UNROLL
    for (int k = 0; k < 4; k++) {
        out[k] = _mm256_permute2f128_ps(mid[k], mid[4 + k], 0x20);
        out[4 + k] = _mm256_permute2f128_ps(mid[k], mid[4 + k], 0x31);
    }
}

/* All ones in the first count lanes. */
static ALWAYS_INLINE __m256i first_lanes(size_t count)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)count),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static ALWAYS_INLINE __m256 load_dims(const float *x, size_t dims, __m256i dim_mask)
{
    return dims == 8 ? _mm256_loadu_ps(x) : _mm256_maskload_ps(x, dim_mask);
}

static ALWAYS_INLINE void store_keys(float *x, size_t keys, __m256i key_mask, __m256 v)
{
    if (keys == 8)
        _mm256_storeu_ps(x, v);
    else
        _mm256_maskstore_ps(x, key_mask, v);
}

static ALWAYS_INLINE __m256 zero_vec(void)
{
    return _mm256_setzero_ps();
}

#define PACKKT_NAME fxa_f32_packkt_8x8__avx2
#define PACK_W 8
typedef __m256 pack_vec;
typedef __m256i pack_mask;
#include "../packkt_impl.h"
