/*
 * Byte spans of the tensors a call reads and writes, and the check that
 * its outputs share no byte with its inputs or with each other (attention
 * runs, the blockwise accumulator, distributed runs, projections).
 */
#ifndef FXA_SPANS_H
#define FXA_SPANS_H

#include <stddef.h>
#include <stdint.h>

/* A tensor a call reads or writes: its name (for messages), where it
 * starts and its bytes (from its shape and strides). */
typedef struct fxa_span {
    const char *name;
    const void *at;
    size_t bytes;
} fxa_span;

/* 1 when a and b share a byte (a NULL or empty span shares none). */
static inline int fxa_spans_overlap(const fxa_span *a, const fxa_span *b)
{
    const uintptr_t x = (uintptr_t)a->at, y = (uintptr_t)b->at;
    return a->at && b->at && a->bytes > 0 && b->bytes > 0 && x < y + b->bytes && y < x + a->bytes;
}

/* The first written span (out[0..n_out), in order) that shares a byte
 * with a read span (in[0..n_in)) or with a later written span: 1 and
 * *first, *second set to the pair; 0 when every written span is apart. */
static inline int fxa_spans_clash(const fxa_span *out, int n_out, const fxa_span *in, int n_in,
                                  const fxa_span **first, const fxa_span **second)
{
    for (int i = 0; i < n_out; i++) {
        const fxa_span *clash = NULL;
        for (int j = 0; j < n_in && !clash; j++)
            clash = fxa_spans_overlap(&out[i], &in[j]) ? &in[j] : NULL;
        for (int j = i + 1; j < n_out && !clash; j++)
            clash = fxa_spans_overlap(&out[i], &out[j]) ? &out[j] : NULL;
        if (clash) {
            *first = &out[i];
            *second = clash;
            return 1;
        }
    }
    return 0;
}

#endif
