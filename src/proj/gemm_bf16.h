/* bf16 GEMM for the projection (gemm_bf16.c): y = x w^T with fp32
 * accumulation, on oneDNN's matmul (AVX512-BF16 kernels where the CPU has
 * them). One object serves a run of GEMMs that share x (the column blocks
 * of a weight decoded block by block), keeping oneDNN's primitives between
 * them. */
#ifndef FXA_GEMM_BF16_H
#define FXA_GEMM_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"

typedef struct fxa_gemm_bf16 fxa_gemm_bf16;

/* For x [m][k] and outputs with row stride ldy, on n_threads threads.
 * FXA_ERR_NO_MEMORY or FXA_ERR_INTERNAL (with a reason in err). */
fxa_status fxa_gemm_bf16_create(fxa_gemm_bf16 **g, int64_t m, int64_t k, int64_t ldy, int n_threads,
                                char *err, size_t errlen);

/* y [m][n] (row stride ldy) = x [m][k] (bf16 bits, row-major) times w
 * [n][k] (bf16 bits, row-major) transposed. Products of bf16 values are
 * exact in fp32; only the fp32 accumulation rounds. Primitives are kept
 * for the last two distinct n. FXA_ERR_INTERNAL (with a reason in err) when
 * oneDNN refuses or fails. */
fxa_status fxa_gemm_bf16_run(fxa_gemm_bf16 *g, const uint16_t *x, const uint16_t *w, int64_t n,
                             float *y, char *err, size_t errlen);

void fxa_gemm_bf16_destroy(fxa_gemm_bf16 *g);

#endif
