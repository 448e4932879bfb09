/* The ring along a grid column: its buffers, sized and allocated with the
 * plan (ring_plan.c), and its run (ring.c). */
#ifndef FXA_RING_H
#define FXA_RING_H

#include "mpi_internal.h"

/* Everything a ring run touches besides the caller's tensors (R > 1). */
typedef struct fxa_ring_bufs {
    fxa_attn_acc **accs; /* [n_seg]: segment i's accumulator */
    int depth;           /* slots: prefetch + 1 blocks in flight or in use */
    char *slots;         /* [2 * depth] K and V of the largest block */
    size_t slot_bytes;
    int64_t per_key; /* elements of K (or V) per key of a block */
    MPI_Datatype type;
    int64_t piece; /* most elements in one message */
    int pieces;    /* messages per tensor of the largest block */
    /* [4 * depth * pieces]: per slot the receives of K and V, then the
     * sends of K and V, `pieces` each. */
    MPI_Request *req;
    int n_req;
    /* The summaries: this rank's (its status first, then each segment's),
     * every rank's of the column, and one segment's block by block. */
    size_t sum_len;
    double *mine; /* [sum_len] */
    double *all;  /* [R * sum_len] */
    double *sums; /* [R * the longest segment summary + its heads' query norms] */
} fxa_ring_bufs;

/* Doubles of segment i in a rank's gathered summaries: its K/V summary
 * and, with reproducible plans, its largest query norm per (batch, kv
 * head). */
static inline size_t fxa_ring_seg_len(const fxa_mpi_attn_plan *p, int i)
{
    const fxa_mpi_segment *s = &p->seg[i];
    return fxa_kv_summary_len(s->plan) + (p->d.reproducible ? (size_t)(s->n_batch * s->n_kv) : 0);
}

/* Size and allocate p->ring_bufs (R > 1; the segments planned). Local: a
 * failure says why in msg, and the caller agrees on it. */
fxa_status fxa_ring_plan(fxa_mpi_attn_plan *p, char *msg, size_t cap);
/* Free p->ring_bufs (NULL: nothing to do). */
void fxa_ring_plan_free(fxa_mpi_attn_plan *p);

/* The ring along this rank's column. Returns this rank's own status;
 * *column_failed is set (and nothing computed) when another rank of the
 * column failed. The accumulators of p->ring_bufs then hold the
 * unnormalised result; the per-step times go to p->step_compute and
 * p->step_wait. */
fxa_status fxa_ring_run(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, int *column_failed,
                        fxa_mpi_stats *stats);

/* After every rank agreed on the ring: normalise each accumulator into
 * loc's outputs, statistics into sum. A failure is recorded on p->m. */
fxa_status fxa_ring_finish(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, fxa_attn_stats *sum);

#endif
