/* bf16 GEMM for the projection (gemm_bf16.c): y = x w^T with fp32
 * accumulation, on oneDNN's matmul (AVX512-BF16 kernels where the CPU has
 * them). */
#ifndef FXA_GEMM_BF16_H
#define FXA_GEMM_BF16_H

#include <stdint.h>

#include "fxattn.h"

/* y [m][n] (row stride n) = x [m][k] (bf16 bits, row-major) times w [n][k]
 * (bf16 bits, row-major) transposed. Products of bf16 values are exact in
 * fp32; only the fp32 accumulation rounds. FXA_ERR_INTERNAL (with a reason
 * in err) when oneDNN refuses or fails. */
fxa_status fxa_gemm_bf16(const uint16_t *x, const uint16_t *w, int64_t m, int64_t n, int64_t k,
                         float *y, char *err, size_t errlen);

#endif
