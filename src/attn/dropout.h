/*
 * Attention dropout (fxa_attn_desc.dropout_p): the keep decisions of
 * fxa_dropout_kept as biases of a tile, so that the forward and backward
 * tiles run dropout through their bias input (-INFINITY drops a weight).
 */
#ifndef FXA_DROPOUT_H
#define FXA_DROPOUT_H

#include <stddef.h>
#include <stdint.h>

#include "attn_internal.h"
#include "mask.h"

/* 1 when the plan has dropout. */
static inline int fxa_attn_dropout(const fxa_attn_plan *p)
{
    return p->d.dropout_p > 0.0;
}

/* Which weights a dropout bias removes. */
typedef enum fxa_drop_pass {
    FXA_DROP_KEEP = 0,   /* the kept weights stay: dropped ones get -INFINITY */
    FXA_DROP_DROPPED = 1 /* the dropped weights stay: kept ones get -INFINITY */
} fxa_drop_pass;

/* The bias of rows [i0, i0 + n) x keys [j0, j0 + n_kv) of head (b, h) for
 * dropout pass `pass`, at bias[r ld + j]: from[r ld + j] (the tile's mask
 * or causal bias; NULL: 0) where the weight stays, -INFINITY elsewhere.
 * FXA_TILE_SKIP when every weight is removed, else FXA_TILE_BIAS. from and
 * bias may be the same buffer. */
/* A run's dropout stream: generated from (seed, offset), or the caller's
 * keep decisions (keep, [B, Hq, Sq, Skv], nonzero = kept) when keep is set. */
typedef struct fxa_drop_stream {
    uint64_t seed;
    uint64_t offset;
    const uint8_t *keep;
} fxa_drop_stream;

fxa_tile_use fxa_dropout_bias(const fxa_attn_plan *p, const fxa_drop_stream *stream, int64_t b,
                              int64_t h, int64_t i0, size_t n, int64_t j0, size_t n_kv, size_t ld,
                              const float *from, float *bias, fxa_drop_pass pass);

/* Bytes of a dropout_keep array for the plan (B Hq Sq Skv). */
static inline size_t fxa_dropout_keep_bytes(const fxa_attn_plan *p)
{
    return (size_t)(p->d.batch * p->d.heads_q * p->d.seq_q) * (size_t)p->d.seq_kv;
}

#endif
