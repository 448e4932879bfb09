/* FP8 E4M3 (OCP e4m3fn): exact decoding, saturating round-to-nearest-even
 * encoding, and the row-scaled (ROW_MX) and per-output-channel quantisers
 * declared in fxattn_proj.h. */
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../base/convert_inline.h"
#include "fxattn_proj.h"

#define E4M3_MAX_BITS 0x43e00000u          /* 448.0f = 1.75 * 2^8 */
#define E4M3_MIN_NORMAL_BITS 0x3c800000u   /* 2^-6 */
#define E4M3_HALF_MIN_SUB_BITS 0x3a800000u /* 2^-10, half the smallest subnormal */

float fxa_e4m3_to_f32(uint8_t code)
{
    const uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    const uint32_t e = (code >> 3) & 0xfu, m = code & 7u;
    if (e == 0xfu && m == 7u) /* S.1111.111: quiet NaN with the sign */
        return fxa_bits_f32(sign | 0x7fc00000u);
    if (e == 0) /* zero or subnormal: m * 2^-9, exact */
        return fxa_bits_f32(sign | fxa_f32_bits((float)m * 0x1p-9f));
    return fxa_bits_f32(sign | ((e + 120u) << 23) | (m << 20)); /* rebias 7 -> 127 */
}

uint8_t fxa_f32_to_e4m3(float x)
{
    const uint32_t b = fxa_f32_bits(x);
    const uint32_t sign = (b >> 24) & 0x80u;
    const uint32_t mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) /* NaN */
        return 0x7fu;
    if (mag >= E4M3_MAX_BITS) /* >= 448 or Inf: saturate */
        return (uint8_t)(sign | 0x7eu);
    if (mag >= E4M3_MIN_NORMAL_BITS) {
        /* Normal: rebias the exponent from 127 to 7 and round the 23-bit
         * mantissa to 3 bits (RNE on the 20 dropped bits); a carry moves into
         * the exponent, and mag < 448 keeps the result <= 0x7e. */
        uint32_t v = mag - (120u << 23);
        v += 0x7ffffu + ((v >> 20) & 1u);
        return (uint8_t)(sign | (v >> 20));
    }
    if (mag <= E4M3_HALF_MIN_SUB_BITS) /* rounds to zero (2^-10 ties to even 0) */
        return (uint8_t)sign;
    /* 2^-10 < |x| < 2^-6, a normal fp32 with exponent field e in 117..120:
     * |x| = sig * 2^(e - 150), which is sig / 2^(141 - e) units of 2^-9.
     * Round that quotient to an integer (RNE); 8 is the code of 2^-6. */
    const uint32_t e = mag >> 23;
    const uint32_t sig = (mag & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 141u - e; /* 21..24 */
    const uint32_t rem = sig & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    uint32_t q = sig >> shift;
    if (rem > half || (rem == half && (q & 1u)))
        q++;
    return (uint8_t)(sign | q);
}

/* a * b <= PTRDIFF_MAX, for a >= 0 and b >= 1. */
static int mul_fits(int64_t a, int64_t b)
{
    return a <= (int64_t)PTRDIFF_MAX / b;
}

/* Shapes of a [rows][n] fp32 array quantised to rows * (n + extra) bytes
 * (extra 4 for the packed rows, 0 for weight codes): every byte count fits. */
static int shape_ok(int64_t rows, int64_t n, int64_t extra)
{
    if (rows < 0 || n < 1 || n > (int64_t)PTRDIFF_MAX / 4 - extra)
        return 0;
    return mul_fits(rows, 4 * n) && mul_fits(rows, n + extra);
}

/* 1 if all count values are finite. */
static int all_finite(const float *x, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        if (!isfinite(x[i]))
            return 0;
    return 1;
}

/* Scale of one row of finite values: absmax / 448, 1.0f for an all-zero row,
 * FLT_MIN where the quotient is below FLT_MIN (a subnormal or zero scale
 * could not carry the row; x / FLT_MIN is then exact and below 448). */
static float row_scale(const float *x, int64_t n)
{
    float amax = 0.0f;
    for (int64_t j = 0; j < n; j++) {
        const float a = fabsf(x[j]);
        if (a > amax)
            amax = a;
    }
    if (amax == 0.0f)
        return 1.0f;
    const float s = amax / FXA_E4M3_MAX;
    return s >= FLT_MIN ? s : FLT_MIN;
}

/* codes[j] = e4m3(x[j] / scale) for one row (scale > 0, x finite). */
static void quantize_row(const float *x, int64_t n, float scale, uint8_t *codes)
{
    for (int64_t j = 0; j < n; j++)
        codes[j] = fxa_f32_to_e4m3(x[j] / scale);
}

/* The packed scale: little-endian bytes of the fp32 bit pattern. */
static void put_f32_le(uint8_t *p, float v)
{
    const uint32_t b = fxa_f32_bits(v);
    p[0] = (uint8_t)b;
    p[1] = (uint8_t)(b >> 8);
    p[2] = (uint8_t)(b >> 16);
    p[3] = (uint8_t)(b >> 24);
}

static float get_f32_le(const uint8_t *p)
{
    return fxa_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                        (uint32_t)p[3] << 24);
}

fxa_status fxa_e4m3_quantize_rows(const float *x, int64_t rows, int64_t n, uint8_t *packed)
{
    if (!x || !packed || !shape_ok(rows, n, 4) || !all_finite(x, rows * n))
        return FXA_ERR_INVALID_ARG;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        uint8_t *pr = packed + r * (n + 4);
        const float scale = row_scale(xr, n);
        quantize_row(xr, n, scale, pr);
        put_f32_le(pr + n, scale);
    }
    return FXA_OK;
}

fxa_status fxa_e4m3_dequantize_rows(const uint8_t *packed, int64_t rows, int64_t n, float *x)
{
    if (!packed || !x || !shape_ok(rows, n, 4))
        return FXA_ERR_INVALID_ARG;
    /* Check everything before writing anything. */
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *pr = packed + r * (n + 4);
        const float scale = get_f32_le(pr + n);
        if (!isfinite(scale) || signbit(scale))
            return FXA_ERR_INVALID_ARG;
        for (int64_t j = 0; j < n; j++)
            if ((pr[j] & 0x7fu) == 0x7fu)
                return FXA_ERR_INVALID_ARG;
    }
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *pr = packed + r * (n + 4);
        const float scale = get_f32_le(pr + n);
        for (int64_t j = 0; j < n; j++)
            x[r * n + j] = fxa_e4m3_to_f32(pr[j]) * scale;
    }
    return FXA_OK;
}

fxa_status fxa_e4m3_quantize_weights(const float *w, int64_t out_channels, int64_t in_features,
                                     uint8_t *codes, float *scales)
{
    if (!w || !codes || !scales || !shape_ok(out_channels, in_features, 0) ||
        !all_finite(w, out_channels * in_features))
        return FXA_ERR_INVALID_ARG;
    for (int64_t o = 0; o < out_channels; o++) {
        const float *wo = w + o * in_features;
        const float scale = row_scale(wo, in_features);
        quantize_row(wo, in_features, scale, codes + o * in_features);
        scales[o] = scale;
    }
    return FXA_OK;
}
