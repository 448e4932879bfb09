/* Ulysses all-to-alls (see ulysses.c). */
#ifndef FXA_ULYSSES_H
#define FXA_ULYSSES_H

#include "mpi_internal.h"

/* Head-sharded local tensors of one rank (BHSD, the row's tokens). */
typedef struct fxa_ulysses_bufs {
    char *q; /* [B][Hq_loc][loc_sq][D] input dtype */
    char *k; /* [B][Hkv_loc][own block keys][D] */
    char *v;
    float *out; /* [B][Hq_loc][loc_sq][D] */
    float *lse; /* [B][Hq_loc][loc_sq] */
    float *bound;
    uint8_t *fb;
    char *send; /* staging for both exchanges */
    char *recv;
} fxa_ulysses_bufs;

/* Allocate every buffer of both exchanges (before any collective, so that
 * running out of memory can be agreed on instead of hanging a peer). */
fxa_status fxa_ulysses_alloc(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u);

/* Collective over the row: fill u->q, u->k, u->v from this rank's shards. */
fxa_status fxa_ulysses_forward(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_ulysses_bufs *u);

/* Collective over the row: send u's output rows to the shard owners and
 * write a->out (and lse, row_bound, row_fallback where not NULL). */
fxa_status fxa_ulysses_backward(fxa_mpi_attn_plan *p, const fxa_ulysses_bufs *u,
                                const fxa_attn_args *a);

void fxa_ulysses_bufs_free(fxa_ulysses_bufs *u);

#endif
