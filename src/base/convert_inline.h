/* Inline bf16/f16 -> fp32 widening for the library's hot loops (the public
 * fxa_bf16_to_f32 / fxa_f16_to_f32 call these), exact for every input, fp32
 * -> bf16 rounding (fxa_f32_to_bf16), and the bit pattern of a float and
 * back, for the conversions. */
#ifndef FXA_CONVERT_INLINE_H
#define FXA_CONVERT_INLINE_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fxa_f32_bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline float fxa_bits_f32(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static inline float fxa_bf16_bits_to_f32(uint16_t h)
{
    const uint32_t b = (uint32_t)h << 16;
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* Round to nearest even; NaN stays a quiet NaN with its sign. */
static inline uint16_t fxa_f32_to_bf16_bits(float x)
{
    uint32_t b = fxa_f32_bits(x);
    if ((b & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((b >> 16) | 0x0040u);
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

static inline float fxa_f16_bits_to_f32(uint16_t h)
{
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    uint32_t b;
    float x;
    if (exp == 0x1f) { /* Inf or NaN: keep the payload's top bits */
        b = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in fp32 */
        const float mag = (float)man * 0x1p-24f;
        return sign ? -mag : mag;
    } else {
        b = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&x, &b, sizeof x);
    return x;
}

#endif
