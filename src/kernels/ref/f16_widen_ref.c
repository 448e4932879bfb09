/* Portable fp16 widening (the spec of widen_f16, fxa_widen_f16_fn in kernels.h). */
#include "../../base/convert_inline.h"
#include "../kernels.h"

void fxa_widen_f16_ref(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = fxa_f16_bits_to_f32(src[i]);
}
