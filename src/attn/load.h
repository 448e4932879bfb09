/* Reading rows of Q, K or V in any input dtype as fp32. */
#ifndef FXA_LOAD_H
#define FXA_LOAD_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../base/convert_inline.h"
#include "../kernels/kernels.h"
#include "fxattn.h"

/* dst[0..d) = base[off .. off + d) converted to fp32 (exact for every dtype);
 * fp16 goes through the kernel set's widening (F16C where the CPU has it). */
static inline void fxa_load_row(const fxa_kernels *k, const void *base, fxa_dtype dtype,
                                int64_t off, size_t d, float *dst)
{
    if (dtype == FXA_F32) {
        memcpy(dst, (const float *)base + off, d * sizeof(float));
    } else if (dtype == FXA_BF16) {
        const uint16_t *src = (const uint16_t *)base + off;
        for (size_t c = 0; c < d; c++)
            dst[c] = fxa_bf16_bits_to_f32(src[c]);
    } else {
        k->widen_f16((const uint16_t *)base + off, dst, d);
    }
}

/* The row as fp32 without a copy when the dtype is fp32 (the row itself),
 * else converted into scratch (fxa_load_row). */
static inline const float *fxa_row_f32(const fxa_kernels *k, const void *base, fxa_dtype dtype,
                                       int64_t off, size_t d, float *scratch)
{
    if (dtype == FXA_F32)
        return (const float *)base + off;
    fxa_load_row(k, base, dtype, off, d, scratch);
    return scratch;
}

/* n rows starting at off, row_stride apart, into dst with leading dim ld. */
static inline void fxa_load_rows(const fxa_kernels *k, const void *base, fxa_dtype dtype,
                                 int64_t off, int64_t row_stride, size_t n, size_t d, float *dst,
                                 size_t ld)
{
    for (size_t r = 0; r < n; r++)
        fxa_load_row(k, base, dtype, off + (int64_t)r * row_stride, d, dst + r * ld);
}

#endif
