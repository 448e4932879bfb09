/*
 * One distributed attention call: check the arguments (agreed), then
 *   - pure Ulysses (R == 1, U > 1): the pipelined run of ulysses_run.c
 *     (heads travel in and back by groups while other groups compute);
 *   - otherwise: the Ulysses way in (U > 1), local attention (R == 1) or
 *     the ring (R > 1), normalisation of the ring accumulators, the way back;
 * agree on the outcome, then write the output. No output is written unless
 * every rank succeeded. Every buffer is the plan's: a run allocates nothing.
 */
#include <stdio.h>

#include "mpi_begin.h"
#include "mpi_internal.h"
#include "ring.h"
#include "ulysses.h"

/* fxa_mpi_take of this run kind. */
static fxa_status take(const void *p, const void *user_args, fxa_mpi_call *c)
{
    return fxa_mpi_take_args(p, user_args, &c->args.fwd, c->msg, sizeof c->msg);
}

/* R == 1: each segment is a whole local problem for fxa_attn_run, on the
 * plan's workspace (none when this rank holds no query token: its plans
 * stand for one). */
static fxa_status run_local(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, fxa_attn_stats *sum)
{
    fxa_status st = FXA_OK;
    for (int i = 0; p->loc_sq > 0 && i < p->n_seg && st == FXA_OK; i++)
        st = fxa_mpi_run_segment(p, loc, &p->seg[i], p->ws, sum);
    return st;
}

/* Global statistics: every rank calls this, stats or not. */
static fxa_status reduce_stats(fxa_mpi_attn_plan *p, const fxa_attn_stats *sum,
                               fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    /* Fallback rows are counted where they are computed (the head owner). */
    long long fb = sum->fallback_rows;
    double mx[2] = {sum->vmax, sum->max_bound};
    long long fb_all = 0;
    double mx_all[2] = {0.0, 0.0};
    fxa_status st =
        fxa_mpi_allreduce(m, &fb, &fb_all, 1, MPI_LONG_LONG, MPI_SUM, m->comm, "the statistics");
    if (st == FXA_OK)
        st = fxa_mpi_allreduce(m, mx, mx_all, 2, MPI_DOUBLE, MPI_MAX, m->comm, "the statistics");
    if (st != FXA_OK)
        return st;
    if (stats) {
        stats->rows = p->d.batch * p->d.heads_q * p->d.seq_q;
        stats->fallback_rows = fb_all;
        stats->vmax = mx_all[0];
        stats->max_bound = mx_all[1];
        stats->compute = p->d.compute;
    }
    return FXA_OK;
}

/* Pure Ulysses: the pipelined run, agreed on, then the output written. */
static fxa_status run_ulysses(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_attn_stats *sum,
                              fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    fxa_ulysses_bufs *ub = p->ulysses_bufs;
    double a2a = 0.0;
    const fxa_status own = fxa_ulysses_run(p, a, ub, sum, &a2a);
    if (stats)
        stats->a2a_seconds += a2a;
    const fxa_status st = fxa_mpi_agree(m, own, m->last_error);
    if (st == FXA_OK)
        fxa_ulysses_write(p, ub, a);
    return st;
}

/* Every group's way in (U > 1), one after the other, sends included. */
static fxa_status ulysses_in(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_ulysses_bufs *ub)
{
    fxa_status st = FXA_OK;
    for (int g = 0; g < ub->groups && st == FXA_OK; g++) {
        st = fxa_ulysses_in_post(p, a, ub, g);
        if (st == FXA_OK)
            st = fxa_ulysses_in_wait(p, ub);
    }
    return st == FXA_OK ? fxa_ulysses_pending_wait(p, ub) : st;
}

/* Every group's way back (U > 1), agreed on, then the output written. */
static fxa_status ulysses_back(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_ulysses_bufs *ub)
{
    fxa_status st = FXA_OK;
    for (int g = 0; g < ub->groups && st == FXA_OK; g++)
        st = fxa_ulysses_back_post(p, ub, g);
    if (st == FXA_OK)
        st = fxa_ulysses_pending_wait(p, ub);
    st = fxa_mpi_agree(p->m, st, p->m->last_error);
    if (st == FXA_OK)
        fxa_ulysses_write(p, ub, a);
    return st;
}

/* U == 1, or R > 1: the Ulysses way in, local attention or the ring
 * (agreed on), the ring's normalisation (agreed on), the way back. */
static fxa_status run_grid(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_attn_stats *sum,
                           fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    fxa_ulysses_bufs *ub = p->ulysses_bufs;
    char msg[512];
    fxa_mpi_local loc;
    fxa_status st = FXA_OK;
    if (m->ulysses > 1) {
        const double ta = MPI_Wtime();
        st = ulysses_in(p, a, ub);
        if (stats)
            stats->a2a_seconds += MPI_Wtime() - ta;
        loc = (fxa_mpi_local){ub->q, ub->k, ub->v, ub->out, ub->lse, ub->parts, ub->fb, ub->bound};
    } else {
        loc = (fxa_mpi_local){
            a->q, a->k, a->v, a->out, a->lse, a->lse_parts, a->row_fallback, a->row_bound};
    }
    /* Local work: this rank's own status; a peer's failure shows up in the
     * agreement below. */
    if (st == FXA_OK) {
        int column_failed = 0;
        const fxa_status own =
            m->ring == 1 ? run_local(p, &loc, sum) : fxa_ring_run(p, &loc, &column_failed, stats);
        snprintf(msg, sizeof msg, "%s", m->last_error);
        if (own == FXA_ERR_INVALID_ARG && m->ulysses == 1)
            fxa_mpi_find_non_finite(p, a, msg, sizeof msg);
        st = fxa_mpi_agree(m, own, msg);
    }
    if (st == FXA_OK && m->ring > 1) {
        const fxa_status own = fxa_ring_finish(p, &loc, sum);
        st = fxa_mpi_agree(m, own, m->last_error);
    }
    if (st == FXA_OK && m->ulysses > 1) {
        const double ta = MPI_Wtime();
        st = ulysses_back(p, a, ub);
        if (stats)
            stats->a2a_seconds += MPI_Wtime() - ta;
    }
    return st;
}

/* fxa_mpi_body of the forward: the grid's run, then the statistics. */
static fxa_status body(void *plan, fxa_mpi_call *c)
{
    fxa_mpi_attn_plan *p = plan;
    const fxa_attn_args *a = &c->args.fwd;
    fxa_attn_stats sum = {.struct_size = sizeof sum};
    fxa_status st = p->m->ulysses > 1 && p->m->ring == 1 ? run_ulysses(p, a, &sum, c->stats)
                                                         : run_grid(p, a, &sum, c->stats);
    if (st == FXA_OK)
        st = reduce_stats(p, &sum, c->stats);
    return st;
}

fxa_status fxa_mpi_attn_run(fxa_mpi_attn_plan *p, const fxa_attn_args *user_args,
                            fxa_mpi_stats *user_stats)
{
    return fxa_mpi_call_run(p ? p->m : NULL, p ? p->call : 0, p, user_args, user_stats, take, body);
}
