/* GEMM for the projection on oneDNN's matmul (gemm_onednn.c): y = x w^T
 * with fp32 accumulation, operands bf16 (AVX512-BF16 kernels) or fp32 (for
 * AVX-512 CPUs whose OpenBLAS runs older kernels). One object, made by a
 * projection plan, serves the GEMMs that share x (the column blocks of a
 * weight decoded block by block) with one primitive per block width, made
 * with it; their scratchpad is the caller's (oneDNN's user scratchpad
 * mode). */
#ifndef FXA_GEMM_ONEDNN_H
#define FXA_GEMM_ONEDNN_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"

typedef struct fxa_gemm_onednn fxa_gemm_onednn;

/* For x [m][k] and w of `type` (FXA_BF16 bits or FXA_F32) and fp32 outputs
 * with row stride ldy, on n_threads threads, with primitives for w of
 * widths[0] and widths[1] rows (widths[1] 0: one width). FXA_ERR_NO_MEMORY
 * or FXA_ERR_INTERNAL (with a reason in err). */
fxa_status fxa_gemm_onednn_create(fxa_gemm_onednn **g, fxa_dtype type, int64_t m, int64_t k,
                                  int64_t ldy, int n_threads, const int64_t widths[2], char *err,
                                  size_t errlen);

/* Bytes of scratchpad fxa_gemm_onednn_run needs (the largest primitive's). */
size_t fxa_gemm_onednn_scratch_bytes(const fxa_gemm_onednn *g);

/* y [m][n] (row stride ldy) = x [m][k] (row-major) times w [n][k]
 * (row-major) transposed, n one of the widths, on scratch
 * (fxa_gemm_onednn_scratch_bytes, 64-byte aligned). Products are exact in
 * fp32 (bf16 x bf16, or fp32 operands that are bf16 or FP8 values); only
 * the fp32 accumulation rounds. FXA_ERR_INTERNAL (with a reason in err)
 * when oneDNN fails. */
fxa_status fxa_gemm_onednn_run(fxa_gemm_onednn *g, const void *x, const void *w, int64_t n,
                               float *y, void *scratch, char *err, size_t errlen);

void fxa_gemm_onednn_destroy(fxa_gemm_onednn *g);

/* 1 when oneDNN ran in an ancestor of this process before a fork(): its
 * OpenMP runtime (libgomp) carries a thread team whose threads exist only
 * there and would wait for them forever, so oneDNN must not run here. */
int fxa_gemm_onednn_forked(void);

#endif
