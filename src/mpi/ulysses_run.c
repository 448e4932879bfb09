/*
 * Pure Ulysses (R == 1), pipelined by groups of heads: group g + 1's way in
 * and group g - 1's way back are posted before group g computes, so that a
 * member's data is ready (or the peer is copying it) when it is needed
 * instead of every rank stopping for one all-to-all each way. Each head is
 * computed by the same kernels on the same keys as in one process, whatever
 * its group (per-head results do not depend on the other heads of a call),
 * so the output keeps the single process's bytes.
 */
#include "ulysses.h"

typedef struct exchanges {
    const fxa_mpi_attn_plan *p;
    fxa_ulysses_bufs *u;
} exchanges;

/* While a group computes, drive the exchanges in flight (the next group's
 * way in, every pending send and way back): over TCP, MPI moves data only
 * inside MPI calls, so without these the next group would travel only once
 * this one is done. */
static void exchange_progress(void *arg)
{
    const exchanges *x = arg;
    const int n = x->p->m->ulysses;
    int done;
    MPI_Testall(x->u->in_req_at[n], x->u->in_req, &done, MPI_STATUSES_IGNORE);
    for (int v = 0; v < n; v++)
        MPI_Testall(x->u->pend_n[v], x->u->pend_req + x->u->pend_at[v], &done, MPI_STATUSES_IGNORE);
}

static void set_progress(fxa_ulysses_bufs *u, void (*fn)(void *), void *arg)
{
    for (int i = 0; i < u->stage_at[u->groups]; i++)
        fxa_attn_plan_set_progress(u->stage[i].plan, fn, arg);
}

fxa_status fxa_ulysses_run(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_ulysses_bufs *u,
                           fxa_attn_stats *sum, double *a2a_seconds)
{
    /* The head-sharded tensors are the local problem. */
    const fxa_mpi_local loc = {u->q, u->k, u->v, u->out, u->lse, u->parts, u->fb, u->bound};
    double t0 = MPI_Wtime();
    fxa_status st = fxa_ulysses_in_post(p, a, u, 0);
    /* A local failure stops compute, not the exchanges: the peers wait on
     * this rank's rows; the caller agrees on the outcome afterwards. */
    fxa_status own = FXA_OK;
    const int computes = p->loc_sq > 0; /* no query tokens: exchanges only */
    exchanges x = {p, u};
    set_progress(u, exchange_progress, &x);
    for (int g = 0; g < u->groups && st == FXA_OK; g++) {
        st = fxa_ulysses_in_wait(p, u);
        if (st == FXA_OK && g + 1 < u->groups)
            st = fxa_ulysses_in_post(p, a, u, g + 1);
        const double t1 = MPI_Wtime();
        *a2a_seconds += t1 - t0;
        for (int i = u->stage_at[g]; computes && st == FXA_OK && i < u->stage_at[g + 1]; i++)
            own = own == FXA_OK ? fxa_mpi_run_segment(p, &loc, &u->stage[i], p->ws, sum) : own;
        t0 = MPI_Wtime();
        if (st == FXA_OK)
            st = fxa_ulysses_back_post(p, u, g);
    }
    set_progress(u, NULL, NULL);
    if (st == FXA_OK)
        st = fxa_ulysses_pending_wait(p, u);
    *a2a_seconds += MPI_Wtime() - t0;
    return st != FXA_OK ? st : own;
}
