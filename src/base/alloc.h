/* Aligned allocation used for every library-owned buffer (64-byte lines). */
#ifndef FXA_ALLOC_H
#define FXA_ALLOC_H

#include "internal_api.h"

#include <stddef.h>

#define FXA_ALIGN 64

/* Round n up to a multiple of FXA_ALIGN; 0 stays 0. */
static inline size_t fxa_align_up(size_t n)
{
    return (n + (FXA_ALIGN - 1)) & ~(size_t)(FXA_ALIGN - 1);
}

/* NULL on failure or when n == 0. Free with fxa_free_aligned. */
FXA_INTERNAL void *fxa_malloc_aligned(size_t n);
void *fxa_calloc_aligned(size_t n);
FXA_INTERNAL void fxa_free_aligned(void *p); /* NULL is a no-op */

#endif
