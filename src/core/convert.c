/* fp32 <-> bf16 / fp16 conversions, round to nearest even. */
#include <math.h>
#include <string.h>

#include "../base/convert_inline.h"
#include "fxattn.h"

float fxa_bf16_to_f32(uint16_t h)
{
    return fxa_bf16_bits_to_f32(h);
}

float fxa_f16_to_f32(uint16_t h)
{
    return fxa_f16_bits_to_f32(h);
}

uint16_t fxa_f32_to_bf16(float x)
{
    return fxa_f32_to_bf16_bits(x);
}

uint16_t fxa_f32_to_f16(float x)
{
    uint32_t b = fxa_f32_bits(x);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    uint32_t mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u);
    if (mag >= 0x477ff000u) /* >= 65520 rounds to Inf (65504 is the largest finite) */
        return (uint16_t)(sign | 0x7c00u);
    if (mag < 0x38800000u) { /* below 2^-14: a subnormal (or zero) in units of 2^-24 */
        float units = nearbyintf(fxa_bits_f32(mag) * 0x1p24f); /* exact scaling, RNE */
        return (uint16_t)(sign | (uint16_t)units);
    }
    uint32_t v = mag - (112u << 23); /* rebias the exponent from 127 to 15 */
    v += 0xfffu + ((v >> 13) & 1u);  /* round the 23-bit mantissa to 10 bits */
    return (uint16_t)(sign | (uint16_t)(v >> 13));
}

fxa_status fxa_convert_f32(const float *src, fxa_dtype dst_type, void *dst, size_t n)
{
    if (!src || (!dst && n > 0))
        return FXA_ERR_INVALID_ARG;
    if (dst_type == FXA_F32) {
        memmove(dst, src, n * sizeof(float));
        return FXA_OK;
    }
    if (dst_type != FXA_BF16 && dst_type != FXA_F16)
        return FXA_ERR_INVALID_ARG;
    uint16_t *out = dst;
    int overflow = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t h = dst_type == FXA_BF16 ? fxa_f32_to_bf16(src[i]) : fxa_f32_to_f16(src[i]);
        uint16_t inf_bits = dst_type == FXA_BF16 ? 0x7f80u : 0x7c00u;
        overflow |= isfinite(src[i]) && (h & 0x7fffu) == inf_bits;
        out[i] = h;
    }
    return overflow ? FXA_ERR_INVALID_ARG : FXA_OK;
}
