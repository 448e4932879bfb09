/* Aligned allocation: thin wrappers so that the allocator can be swapped. */
#include "alloc.h"

#include <stdlib.h>
#include <string.h>

void *fxa_malloc_aligned(size_t n)
{
    if (n == 0)
        return NULL;
    return aligned_alloc(FXA_ALIGN, fxa_align_up(n));
}

void *fxa_calloc_aligned(size_t n)
{
    void *p = fxa_malloc_aligned(n);
    if (p)
        memset(p, 0, fxa_align_up(n));
    return p;
}

void fxa_free_aligned(void *p)
{
    free(p);
}
