/*
 * The AVX-512 exp2 over arrays, for test_exp2 (contract in exp2_avx512_probe.h).
 * Built with -mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma (per file); nothing else
 * in test_exp2 is, so only this file may contain AVX-512 code.
 */
#include "exp2_avx512_probe.h"

#include <immintrin.h>

#include "kernels/x86_avx512/vexp2_avx512.h"

/* One 16-lane function over arrays; the tail by masked loads and stores (masked-off
 * lanes evaluate 2^(0 - 0) and are not stored). */
#define PROBE_BODY(fn)                                                                             \
    size_t i = 0;                                                                                  \
    for (; i + 16 <= n; i += 16)                                                                   \
        _mm512_storeu_ps(out + i, fn(_mm512_loadu_ps(z + i), _mm512_loadu_ps(m + i)));             \
    if (i < n) {                                                                                   \
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);                                     \
        const __m512 r = fn(_mm512_maskz_loadu_ps(k, z + i), _mm512_maskz_loadu_ps(k, m + i));     \
        _mm512_mask_storeu_ps(out + i, k, r);                                                      \
    }

void fxa_test_vexp2_noflush_avx512(const float *z, const float *m, float *out, size_t n)
{
    PROBE_BODY(fxa_vexp2_shifted_noflush_f32x16)
}

void fxa_test_vexp2_avx512(const float *z, const float *m, float *out, size_t n)
{
    PROBE_BODY(fxa_vexp2_shifted_f32x16)
}

void fxa_test_vexp2_bf16_avx512(const float *z, const float *m, float *out, size_t n)
{
    PROBE_BODY(fxa_vexp2_shifted_bf16_f32x16)
}

void fxa_test_vexp2_bf16_noflush_avx512(const float *z, const float *m, float *out, size_t n)
{
    PROBE_BODY(fxa_vexp2_shifted_bf16_noflush_f32x16)
}
