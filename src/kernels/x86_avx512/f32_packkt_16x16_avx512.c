/*
 * AVX-512 K^T packing (contract: fxa_pack_kt_fn in kernels.h).
 * Built with -mavx512f -mavx512vl -mavx512bw -mavx512dq (per file).
 * Blocks of 16 keys x 16 dimensions through packkt_impl.h's loop, with the
 * 16 x 16 transpose in zmm registers.
 */
#include <immintrin.h>

#include "../kernels.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))
/* Fully unrolled, so that the blocks live in registers. */
#define UNROLL _Pragma("GCC unroll 16")

static ALWAYS_INLINE __m512 unpacklo_pairs(__m512 a, __m512 b)
{
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}

static ALWAYS_INLINE __m512 unpackhi_pairs(__m512 a, __m512 b)
{
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}

/* One round of 128-bit lane shuffles: for k < 4 and b in {0, g}, out[b + k] takes lanes 0 and 2
 * of in[b + k] and in[b + k + s] (0x88), out[b + k + s] their lanes 1 and 3 (0xdd). */
static ALWAYS_INLINE void shuffle_lanes(const __m512 in[16], __m512 out[16], const int s,
                                        const int g)
{
    UNROLL
    for (int b = 0; b <= g; b += g) {
        UNROLL
        for (int k = 0; k < 4; k++) {
            out[b + k] = _mm512_shuffle_f32x4(in[b + k], in[b + k + s], 0x88);
            out[b + k + s] = _mm512_shuffle_f32x4(in[b + k], in[b + k + s], 0xdd);
        }
    }
}

/* out[c][r] = in[r][c]: interleave pairs of rows, then pairs of pairs (128-bit
 * lane L of mid[4g + k] holds column 4L + k of rows 4g..4g+3), then gather the
 * four lanes of each column with two rounds of 128-bit shuffles. */
static ALWAYS_INLINE void transpose(const __m512 in[16], __m512 out[16])
{
    __m512 pairs[16], mid[16], half[16];
    UNROLL
    for (int r = 0; r < 16; r += 2) {
        pairs[r] = _mm512_unpacklo_ps(in[r], in[r + 1]);
        pairs[r + 1] = _mm512_unpackhi_ps(in[r], in[r + 1]);
    }
    UNROLL
    for (int g = 0; g < 16; g += 4) {
        mid[g] = unpacklo_pairs(pairs[g], pairs[g + 2]);
        mid[g + 1] = unpackhi_pairs(pairs[g], pairs[g + 2]);
        mid[g + 2] = unpacklo_pairs(pairs[g + 1], pairs[g + 3]);
        mid[g + 3] = unpackhi_pairs(pairs[g + 1], pairs[g + 3]);
    }
    shuffle_lanes(mid, half, 4, 8);
    shuffle_lanes(half, out, 8, 4);
}

static ALWAYS_INLINE __mmask16 first_lanes(size_t count)
{
    return (__mmask16)((1u << count) - 1u);
}

static ALWAYS_INLINE __m512 load_dims(const float *x, size_t dims, __mmask16 dim_mask)
{
    (void)dims;
    return _mm512_maskz_loadu_ps(dim_mask, x);
}

static ALWAYS_INLINE __m512 zero_vec(void)
{
    return _mm512_setzero_ps();
}

static ALWAYS_INLINE void store_keys(float *x, size_t keys, __mmask16 key_mask, __m512 v)
{
    (void)keys;
    _mm512_mask_storeu_ps(x, key_mask, v);
}

#define PACKKT_NAME fxa_f32_packkt_16x16__avx512
#define PACK_W 16
typedef __m512 pack_vec;
typedef __mmask16 pack_mask;
#include "../packkt_impl.h"
