/* F16C fp16 widening (contract: fxa_widen_f16_fn in kernels.h), shared by the
 * AVX2 and AVX-512 sets. Built with -mavx2 -mfma -mf16c (per file). */
#include <immintrin.h>

#include "kernels.h"

void fxa_widen_f16_f16c(const uint16_t *src, float *dst, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = _cvtsh_ss(src[i]);
}
