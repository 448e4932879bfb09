/* CPU feature detection: CPUID bits together with the OS state (XGETBV), so
 * that an ISA counts only when the OS saves its registers. */
#ifndef FXA_CPU_H
#define FXA_CPU_H

#include "internal_api.h"

typedef struct fxa_cpu {
    int sse2;
    int avx2;
    int fma;
    int f16c;
    int avx512f;
    int avx512bw;
    int avx512vl;
    int avx512dq;
    int avx512bf16;
    /* AMX-TILE and AMX-BF16, with the tile state enabled by the OS (XCR0) and
     * this process granted its use (Linux: arch_prctl ARCH_REQ_XCOMP_PERM,
     * asked once here, as oneDNN and PyTorch do). */
    int amx_bf16;
} fxa_cpu;

/* Detected once (pthread_once); later calls return the cached result. */
FXA_INTERNAL const fxa_cpu *fxa_cpu_get(void);

#endif
