/* The SIMD kernel sets that test_pack_kt and test_row_stats compare with the reference ones. */
#ifndef FXA_UNIT_SIMD_SETS_H
#define FXA_UNIT_SIMD_SETS_H

#include <stdio.h>

#include "kernels/dispatch.h"
#include "kernels/kernels.h"

/* compare(name, k) for each SIMD kernel set (avx2, avx512) that this build and CPU have; the
 * others are printed as not compared. */
static inline void for_each_simd_set(void (*compare)(const char *name, const fxa_kernels *k))
{
    static const char *const isas[] = {"avx2", "avx512"};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        const fxa_kernels *k = NULL;
        char msg[256];
        if (fxa_kernels_select(isas[i], &k, msg, sizeof msg) != FXA_OK) {
            printf("%s: not compared (%s)\n", isas[i], msg);
            continue;
        }
        compare(isas[i], k);
    }
}

#endif
