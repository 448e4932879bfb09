/*
 * Input draws shared by the backward tests (test_attn_bwd, test_attn_bwd_mask).
 */
#ifndef FXT_BWD_FIXTURES_H
#define FXT_BWD_FIXTURES_H

#include <stddef.h>

#include "testutil.h"

/* a[i] = scale * N(0, 1) and b[i] = N(0, 1) for i < n, drawn from r in the
 * order a[0], b[0], a[1], b[1], ... (Q with dO, K with V). */
static inline void normal_pairs(fxt_rng *r, double scale, double *a, double *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        a[i] = scale * fxt_rng_normal(r);
        b[i] = fxt_rng_normal(r);
    }
}

#endif
