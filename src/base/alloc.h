/* Aligned allocation used for every library-owned buffer (64-byte lines). */
#ifndef FXA_ALLOC_H
#define FXA_ALLOC_H

#include "internal_api.h"

#include <stddef.h>
#include <stdlib.h>

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

/* free() each of the n pointers (NULL entries are no-ops). */
static inline void fxa_free_each(void *const *ptrs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(ptrs[i]);
}

/* Free the malloc'ed pointers listed, in order: an owner's buffers named
 * once, e.g. FXA_FREE_EACH(b->rows, b->cols, b). */
#define FXA_FREE_EACH(...)                                                                         \
    fxa_free_each((void *const[]){__VA_ARGS__},                                                    \
                  sizeof((void *const[]){__VA_ARGS__}) / sizeof(void *))

#endif
