/*
 * peak: measured machine peak GFLOP/s, the denominator of `fxattn bench`'s efficiency.
 *
 * Each thread runs a throughput loop of independent accumulators for about 0.2 s after a
 * common barrier start; the per-thread rates are summed, and the best of 3 repetitions is
 * reported. The loops live in per-ISA files built with per-file flags (peak_avx512.c,
 * peak_avx2.c); peak.c picks one at run time and has a portable scalar loop.
 */
#ifndef FXT_PEAK_H
#define FXT_PEAK_H

#include <stdint.h>

typedef enum fxt_peak_kind {
    FXT_PEAK_F32_FMA = 0,  /* fp32 fused multiply-add, 2 FLOP per lane */
    FXT_PEAK_BF16_DOT = 1, /* bf16 pair dot into fp32 (vdpbf16ps), 4 FLOP per fp32 lane */
    FXT_PEAK_BF16_AMX = 2  /* AMX bf16 tile products (tdpbf16ps), 2 FLOP per bf16 product */
} fxt_peak_kind;

/*
 * Measured peak GFLOP/s of `threads` threads (values < 1 count as 1). Returns 0.0 when the
 * kind is unavailable on this CPU or build (bf16 needs avx512_bf16; AMX needs AMX-BF16 and
 * the OS's grant, which this asks for) or threads cannot be started. *isa_out (may be NULL)
 * gets a static string naming the loop used: "avx512f zmm fma", "avx512_bf16 zmm vdpbf16ps",
 * "amx tdpbf16ps 16x16x32", "avx2 fma ymm", "scalar", or "none".
 * Takes about 0.6 s.
 */
double fxt_peak_gflops(fxt_peak_kind kind, int threads, const char **isa_out);

/* Internal: one throughput loop. run(iters, a, b) executes iters iterations of
 * flops_per_iter FLOP and returns the sum of its accumulators. */
typedef struct fxt_peak_loop {
    float (*run)(uint64_t iters, float a, float b);
    double flops_per_iter;
    const char *isa;
} fxt_peak_loop;

#if defined(__x86_64__) || defined(__i386__)
extern const fxt_peak_loop fxt_peak_loop_avx512_f32;  /* peak_avx512.c */
extern const fxt_peak_loop fxt_peak_loop_avx512_bf16; /* peak_avx512.c */
extern const fxt_peak_loop fxt_peak_loop_avx2_f32;    /* peak_avx2.c */
#endif
#if defined(FXT_HAVE_AMX_PEAK) /* a compiler with AMX intrinsics (tools/CMakeLists.txt) */
extern const fxt_peak_loop fxt_peak_loop_amx_bf16; /* peak_amx.c */
int fxt_peak_amx_ready(void);                      /* peak_amx.c: CPU, OS and grant */
#endif

#endif /* FXT_PEAK_H */
