/*
 * The synthetic weights of the Wan layer (wan_synth.c), for runs without a checkpoint:
 * counter-based streams of N(0, 1) values (fxa_wan_synth in fxattn_wan.h), one stream per
 * tensor, so that any slice of a tensor (a rank's shard) is made without the rest.
 */
#ifndef FXA_WAN_SYNTH_H
#define FXA_WAN_SYNTH_H

#include <stdint.h>

/* The streams of the layer's tensors (the input x is FXA_WAN_SYNTH_X, 0). */
enum {
    FXA_WAN_STREAM_WQ = 1, /* then WK, WV, WO: the weights of q, k, v, o */
    FXA_WAN_STREAM_WK,
    FXA_WAN_STREAM_WV,
    FXA_WAN_STREAM_WO,
    FXA_WAN_STREAM_BQKV, /* the q, k and v biases, one after the other */
    FXA_WAN_STREAM_BO,
    FXA_WAN_STREAM_GQ, /* the RMSNorm gammas of q and k */
    FXA_WAN_STREAM_GK
};

/* Values [first, first + n) of one stream as mean + sd * N(0, 1) into dst[n]. */
void fxa_wan_synth_fill(float *dst, int64_t first, int64_t n, uint64_t seed, uint64_t stream,
                        double mean, double sd);

#endif
