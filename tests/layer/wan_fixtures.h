/*
 * The Wan layer's setup shared by test_wan_api and test_zero_alloc_proj:
 * the load parameters of synthetic weights.
 */
#ifndef FXT_WAN_FIXTURES_H
#define FXT_WAN_FIXTURES_H

#include <stdint.h>

#include "fxattn_wan.h"

/* The load parameters of synthetic weights (path NULL) of `heads` heads and
 * `hidden` features from seed, in dtype; every other field its default. */
static inline fxa_wan_load_params wan_synth_params(int64_t heads, int64_t hidden, uint64_t seed,
                                                   fxa_dtype dtype)
{
    fxa_wan_load_params p;
    fxa_wan_load_params_init(&p);
    p.heads = heads;
    p.hidden = hidden;
    p.seed = seed;
    p.dtype = dtype;
    return p;
}

#endif
