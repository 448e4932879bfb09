/* The counting allocator (see alloc_count.h). */
#include "alloc_count.h"

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

/* glibc's allocator under its own names (exported for this purpose). */
extern void *__libc_malloc(size_t n);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t n);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t align, size_t n);

/* The declarations glibc's <malloc.h> gives, for -Wmissing-prototypes. */
void *memalign(size_t align, size_t n);
void *valloc(size_t n);
void *pvalloc(size_t n);
void *reallocarray(void *p, size_t n, size_t size);

static atomic_int g_on;
static atomic_long g_count;
static _Atomic(void *) g_first;

void fxt_alloc_count_begin(void)
{
    atomic_store(&g_count, 0);
    atomic_store(&g_first, NULL);
    atomic_store(&g_on, 1);
}

long fxt_alloc_count_end(void)
{
    atomic_store(&g_on, 0);
    return atomic_load(&g_count);
}

void *fxt_alloc_first_caller(void)
{
    return atomic_load(&g_first);
}

/* Count one call made from `caller` while counting is on. */
static void note(void *caller)
{
    if (!atomic_load_explicit(&g_on, memory_order_relaxed))
        return;
    if (atomic_fetch_add(&g_count, 1) == 0)
        atomic_store(&g_first, caller);
}

void *malloc(size_t n)
{
    note(__builtin_return_address(0));
    return __libc_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    note(__builtin_return_address(0));
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t n)
{
    note(__builtin_return_address(0));
    return __libc_realloc(p, n);
}

void *reallocarray(void *p, size_t n, size_t size)
{
    note(__builtin_return_address(0));
    if (size && n > SIZE_MAX / size) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_realloc(p, n * size);
}

void free(void *p)
{
    if (p)
        note(__builtin_return_address(0));
    __libc_free(p);
}

void *memalign(size_t align, size_t n)
{
    note(__builtin_return_address(0));
    return __libc_memalign(align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
    note(__builtin_return_address(0));
    return __libc_memalign(align, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    note(__builtin_return_address(0));
    if (align < sizeof(void *) || (align & (align - 1)))
        return EINVAL;
    void *p = __libc_memalign(align, n);
    if (!p)
        return ENOMEM;
    *out = p;
    return 0;
}

void *valloc(size_t n)
{
    note(__builtin_return_address(0));
    return __libc_memalign((size_t)sysconf(_SC_PAGESIZE), n);
}

void *pvalloc(size_t n)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    note(__builtin_return_address(0));
    if (n > SIZE_MAX - page) {
        errno = ENOMEM;
        return NULL;
    }
    return __libc_memalign(page, (n + page - 1) / page * page);
}
