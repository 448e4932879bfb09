/*
 * Test-only entry point into the AVX-512 exp2 (src/kernels/x86_avx512/vexp2_avx512.h),
 * so that test_exp2.c, compiled for baseline x86-64, can measure it. The definition is in
 * exp2_avx512_probe.c, built with -mavx512f -mavx512vl -mavx512bw -mavx512dq -mfma; the
 * build defines FXA_TEST_EXP2_AVX512 for test_exp2 where it compiles that file (x86-64).
 */
#ifndef FXA_TEST_EXP2_AVX512_PROBE_H
#define FXA_TEST_EXP2_AVX512_PROBE_H

#include <stddef.h>

/* out[i] = fxa_vexp2_shifted_f32x16(z, m) lane for (z[i], m[i]), i < n: 16 lanes at a
 * time, the tail by masked loads and stores (nothing outside [0, n) is read or written).
 * Call only on a CPU with AVX-512F/BW/VL/DQ and FMA (__builtin_cpu_supports). */
void fxa_test_vexp2_avx512(const float *z, const float *m, float *out, size_t n);

/* The same for fxa_vexp2_shifted_noflush_f32x16 (no flush test). */
void fxa_test_vexp2_noflush_avx512(const float *z, const float *m, float *out, size_t n);

/* The same for bf16 compute's degree-4 exp2: fxa_vexp2_shifted_bf16_f32x16 and its
 * no-flush variant. */
void fxa_test_vexp2_bf16_avx512(const float *z, const float *m, float *out, size_t n);
void fxa_test_vexp2_bf16_noflush_avx512(const float *z, const float *m, float *out, size_t n);

#endif
