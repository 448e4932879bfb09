/*
 * Counting allocator for zero-allocation tests. alloc_count.c defines
 * malloc, calloc, realloc, reallocarray, free, posix_memalign,
 * aligned_alloc, memalign, valloc and pvalloc in the test executable
 * (replacing glibc's, as its manual allows), each forwarding to glibc's
 * __libc_* functions. Between fxt_alloc_count_begin and
 * fxt_alloc_count_end every call from any thread is counted: each
 * allocation, and each free of a non-NULL pointer. Add alloc_count.c to the
 * test's sources; not for sanitizer builds (the sanitizers own malloc).
 */
#ifndef FXT_ALLOC_COUNT_H
#define FXT_ALLOC_COUNT_H

/* Start counting from 0 (forgets the first caller). */
void fxt_alloc_count_begin(void);

/* Stop counting; the calls counted since fxt_alloc_count_begin. */
long fxt_alloc_count_end(void);

/* The return address of the first counted call of the last window (NULL
 * when none was counted): print it and look it up with addr2line. */
void *fxt_alloc_first_caller(void);

#endif
