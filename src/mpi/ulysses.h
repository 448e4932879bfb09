/* Ulysses exchanges by groups of heads: their plan and buffers
 * (ulysses_plan.c), the exchanges (ulysses.c) and the pipelined local run
 * of pure Ulysses (ulysses_run.c). */
#ifndef FXA_ULYSSES_H
#define FXA_ULYSSES_H

#include "mpi_internal.h"

/* Head-sharded local tensors of one rank (BHSD, the row's tokens), the
 * staging of both exchanges and, with R == 1, the pipeline's local
 * problems (whose workspace is the plan's). */
typedef struct fxa_ulysses_bufs {
    char *q; /* [B][Hq_loc][loc_sq][D] input dtype */
    char *k; /* [B][Hkv_loc][own block keys][D] */
    char *v;
    float *out;   /* [B][Hq_loc][loc_sq][D] */
    float *lse;   /* [B][Hq_loc][loc_sq] */
    float *parts; /* [B][Hq_loc][loc_sq][3]: each row's lse_parts */
    float *bound;
    uint8_t *fb;
    int groups;          /* G: every member's local heads split into G groups by kv head */
    int64_t piece;       /* most elements in one message */
    char *in_send;       /* every group's rows for the other members (in) */
    int64_t *in_send_at; /* [G + 1]: group offsets in in_send (elements) */
    float *back_send;    /* every group's output rows for the other members */
    float *back_recv;    /* the other members' output rows of this rank's tokens */
    int64_t *back_at;    /* [G * U + 1]: (group, member) offsets in back_send / back_recv */
    int64_t *back_from;
    MPI_Request *in_req; /* one group's receives of the way in, by member (in_req_at[U + 1]) */
    int *in_req_at;
    /* Every group's sends (both ways) and receives of the way back, by
     * member: pend_n[v] of them from pend_req[pend_at[v]]. */
    MPI_Request *pend_req;
    int *pend_at;
    int *pend_n;
    /* R == 1: the local problems of each group, in order (ulysses_run.c). */
    fxa_mpi_segment *stage;
    int *stage_at;         /* [G + 1] */
    fxa_attn_plan **plans; /* [G] owned plans of aligned heads (NULL entries otherwise) */
} fxa_ulysses_bufs;

/* Floats of one output row on the Ulysses way back: o (D), lse, bound, the
 * fallback flag and the row's three lse_parts. */
static inline int64_t fxa_ulysses_back_row(int64_t dim)
{
    return dim + 6;
}

/* Plan and allocate p->ulysses_bufs (U > 1; the segments planned), and
 * with R == 1 raise p->ws_bytes to the pipeline's largest stage. Local: a
 * failure says why in msg, and the caller agrees on it. */
fxa_status fxa_ulysses_plan(fxa_mpi_attn_plan *p, char *msg, size_t cap);
/* Free p->ulysses_bufs (NULL: nothing to do). */
void fxa_ulysses_plan_free(fxa_mpi_attn_plan *p);

/* Offset within the row (*off) and length of row member v's shard of a
 * sequence of seq tokens. */
void fxa_ulysses_member_shard(const fxa_mpi_attn_plan *p, int64_t seq, int v, int64_t *off,
                              int64_t *len);

/* Local kv heads [*k0, *k0 + *nk) of member v's group g, and the local q
 * heads [*q0, *q0 + *nq) that use them (empty groups have nk == nq == 0). */
void fxa_ulysses_group(const fxa_mpi_attn_plan *p, int groups, int v, int g, int64_t *q0,
                       int64_t *nq, int64_t *k0, int64_t *nk);

/* Collective over the row, in group order: post group g's way in (this
 * rank's rows of each member's group-g heads; receives of the row's rows of
 * its own group-g heads straight into u->q, u->k, u->v) and copy its own
 * rows; then wait for its receives (deadline waits, naming the member).
 * The sends stay pending (fxa_ulysses_pending_wait), so that no rank waits
 * for a slower peer to take its rows. */
fxa_status fxa_ulysses_in_post(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_ulysses_bufs *u,
                               int g);
fxa_status fxa_ulysses_in_wait(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u);

/* Collective over the row, in group order after the way in: post group g's
 * output rows to their token owners (and the receives of theirs). */
fxa_status fxa_ulysses_back_post(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u, int g);
/* Wait for every pending request: the sends of both ways, the receives of
 * the way back. */
fxa_status fxa_ulysses_pending_wait(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u);

/* Local, after every rank agreed: write a->out (and lse, row_bound,
 * row_fallback where not NULL) from the received rows and this rank's own. */
void fxa_ulysses_write(const fxa_mpi_attn_plan *p, const fxa_ulysses_bufs *u,
                       const fxa_attn_args *a);

/* R == 1: the pipelined run (ulysses_run.c): group g + 1 travels in and
 * group g - 1's output travels back while group g computes. Returns this
 * rank's own status (the caller agrees); sum gathers the local statistics,
 * *a2a_seconds the time in the exchanges. */
fxa_status fxa_ulysses_run(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_ulysses_bufs *u,
                           fxa_attn_stats *sum, double *a2a_seconds);

#endif
