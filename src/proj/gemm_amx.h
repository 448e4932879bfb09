/* bf16 GEMM for the projection on AMX tiles (gemm_amx.c): y = x w^T with
 * fp32 accumulation, where the context runs the `amx` kernel set. Debian's
 * oneDNN (2.6) runs these GEMMs on AMX too, at ~1.4 TFLOP/s on 2 cores of
 * the Xeon in bench/RESULTS.md: each output block of 32 x 32 here sums the
 * whole of k in its tiles. */
#ifndef FXA_GEMM_AMX_H
#define FXA_GEMM_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "../core/ctx_api.h"

/* Whether fxa_gemm_amx_run takes this GEMM: the context's kernel set is
 * `amx` (the CPU, the OS's grant and this build have AMX; FXA_ISA may
 * refuse it), k and n are multiples of 32, and w's rows are 4-byte
 * aligned (its pairs are read as 32-bit words). */
int fxa_gemm_amx_fits(const fxa_ctx *ctx, int64_t k, int64_t n, const void *w);

/* Whether the context runs the `amx` kernel set (and this build has the
 * tiles): fxa_gemm_amx_fits may take GEMMs of 32-multiple shapes. */
int fxa_gemm_amx_usable(const fxa_ctx *ctx);

/* Bytes of scratch fxa_gemm_amx_run needs for inner dimension k on
 * n_threads threads (each thread's packed block of w). */
size_t fxa_gemm_amx_scratch_bytes(int64_t k, int n_threads);

/* y [m][n] (row stride ldy) = x [m][k] (bf16 bits, row-major) times w
 * [n][k] (bf16 bits, row-major) transposed, on the context's pool. Each
 * item packs 128 columns of w into AMX's pair layout (the kernel set's
 * pack_kt, 16-column panels) in the thread's part of scratch (64-byte
 * aligned, fxa_gemm_amx_scratch_bytes), then computes those columns for
 * every row. Products are exact in fp32; each y element sums k in
 * increasing chunks of 32 (the tile instruction's own order within a
 * chunk), so results do not depend on the thread count. Only for GEMMs
 * that fxa_gemm_amx_fits. */
void fxa_gemm_amx_run(fxa_ctx *ctx, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                      int64_t n, float *y, int64_t ldy, void *scratch);

#endif
