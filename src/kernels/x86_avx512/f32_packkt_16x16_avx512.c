/*
 * AVX-512 K^T packing (contract: fxa_pack_kt_fn in kernels.h).
 * Built with -mavx512f -mavx512vl -mavx512bw -mavx512dq (per file).
 * Blocks of 16 keys x 16 dimensions: 16 row loads, the 16 x 16 transpose in
 * registers, then one 16-key store per dimension into its panel row (groups
 * of 16 keys start on a multiple of 16, so they never straddle a panel). The
 * key tail loads no missing row and masks its stores; the dimension tail
 * masks its loads and stores only the dimensions that exist.
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

/* out[c][r] = in[r][c]: interleave pairs of rows, then pairs of pairs (128-bit
 * lane L of mid[4g + k] holds column 4L + k of rows 4g..4g+3), then gather the
 * four lanes of each column with two rounds of 128-bit shuffles. */
static ALWAYS_INLINE void transpose_16x16(const __m512 in[16], __m512 out[16])
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
    /* 0x88 takes lanes 0 and 2 of each source, 0xdd lanes 1 and 3. */
    UNROLL
    for (int k = 0; k < 4; k++) {
        half[k] = _mm512_shuffle_f32x4(mid[k], mid[4 + k], 0x88);
        half[4 + k] = _mm512_shuffle_f32x4(mid[k], mid[4 + k], 0xdd);
        half[8 + k] = _mm512_shuffle_f32x4(mid[8 + k], mid[12 + k], 0x88);
        half[12 + k] = _mm512_shuffle_f32x4(mid[8 + k], mid[12 + k], 0xdd);
    }
    UNROLL
    for (int k = 0; k < 4; k++) {
        out[k] = _mm512_shuffle_f32x4(half[k], half[8 + k], 0x88);
        out[8 + k] = _mm512_shuffle_f32x4(half[k], half[8 + k], 0xdd);
        out[4 + k] = _mm512_shuffle_f32x4(half[4 + k], half[12 + k], 0x88);
        out[12 + k] = _mm512_shuffle_f32x4(half[4 + k], half[12 + k], 0xdd);
    }
}

static ALWAYS_INLINE __mmask16 first_lanes(size_t count)
{
    return (__mmask16)((1u << count) - 1u);
}

void fxa_f32_packkt_16x16__avx512(const void *const *rows, size_t n, size_t d, size_t panel,
                                  void *kt_out)
{
    /* Moved as fp32 lanes: loads, shuffles and stores keep every bit. */
    float *kt = kt_out;
    for (size_t j0 = 0; j0 < n; j0 += 16) {
        const size_t keys = n - j0 < 16 ? n - j0 : 16;
        const __mmask16 key_mask = first_lanes(keys);
        float *group = kt + fxa_kt_offset(panel, d, 0, j0);
        for (size_t c0 = 0; c0 < d; c0 += 16) {
            const size_t dims = d - c0 < 16 ? d - c0 : 16;
            const __mmask16 dim_mask = first_lanes(dims);
            __m512 in[16], out[16];
            UNROLL
            for (size_t r = 0; r < 16; r++)
                in[r] = r < keys ? _mm512_maskz_loadu_ps(dim_mask, (const float *)rows[j0 + r] + c0)
                                 : _mm512_setzero_ps();
            transpose_16x16(in, out);
            UNROLL
            for (size_t c = 0; c < 16; c++)
                if (c < dims)
                    _mm512_mask_storeu_ps(group + (c0 + c) * panel, key_mask, out[c]);
        }
    }
}
