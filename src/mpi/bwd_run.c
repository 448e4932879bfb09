/*
 * One distributed backward call (bwd.h): check the arguments (agreed);
 * with U > 1 the way in inside the row (every member's heads of this
 * rank's tokens of Q, K, V, O, dO and lse to their owner) and the way back
 * (dQ, dK, dV rows of each member's tokens to it), group of heads by group
 * (one message per member each way and group, in pieces of at most
 * p->piece bytes). With R == 1 they are pipelined around the local
 * backward of each group: group g + 1's way in and group g - 1's way back
 * are in flight while group g computes, and every rank agrees once at the
 * end. Each head is computed by the same kernels on the same keys as in
 * one process, whatever its group, so the gradients keep the single
 * process's bytes. With R > 1 (one group) the way in, the ring along the
 * column (bwd_ring.c) and the way back, each agreed on. The caller's dq,
 * dk, dv are written only once every rank agreed. Every buffer is the
 * plan's: a run allocates nothing.
 */
#include <stdio.h>

#include "bwd.h"
#include "mpi_begin.h"

/* fxa_mpi_take of this run kind. */
static fxa_status take(const void *p, const void *user_args, fxa_mpi_call *c)
{
    return fxa_bwd_take_args(p, user_args, &c->args.bwd, c->msg, sizeof c->msg);
}

/* U == 1, R == 1: the local backward on bwd args a; msg gets its error. */
static fxa_status run_local(fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a, char *msg,
                            size_t cap)
{
    if (!p->local)
        return FXA_OK; /* no query heads */
    const fxa_status st = fxa_attn_bwd_run(p->local, a, p->ws, NULL);
    if (st != FXA_OK)
        snprintf(msg, cap, "%s", fxa_ctx_last_error(p->m->ctx));
    return st;
}

/* Group g's block of the head-sharded tensors (group-major) as the local
 * backward's args. */
static fxa_attn_bwd_args group_args(const fxa_mpi_attn_bwd_plan *p, int g)
{
    int64_t q0;
    int64_t nq;
    int64_t k0;
    int64_t nk;
    fxa_bwd_group(p, p->m->u, g, &q0, &nq, &k0, &nk);
    const size_t dim = (size_t)p->d.head_dim;
    const size_t qr = (size_t)(p->d.batch * q0 * p->row_sq); /* rows before the block */
    const size_t kr = (size_t)(p->d.batch * k0 * p->row_skv);
    return (fxa_attn_bwd_args){.struct_size = sizeof(fxa_attn_bwd_args),
                               .q = p->q + qr * dim * p->es,
                               .k = p->k + kr * dim * p->es,
                               .v = p->v + kr * dim * p->es,
                               .out = p->out + qr * dim,
                               .dout = p->dout + qr * dim,
                               .lse = p->lse + qr,
                               .lse_parts = p->with_parts ? p->parts + 3 * qr : NULL,
                               .dq = p->dq + qr * dim,
                               .dk = p->dk + kr * dim,
                               .dv = p->dv + kr * dim};
}

/* U > 1, R > 1 (one group): the way in, the ring, the way back, each
 * agreed on. */
static fxa_status run_ulysses_ring(fxa_mpi_attn_bwd_plan *p, const fxa_bwd_side *in, int n_in,
                                   const fxa_bwd_side *back, int n_back, fxa_mpi_stats *stats,
                                   double *a2a)
{
    fxa_mpi *m = p->m;
    char msg[512];
    double t0 = MPI_Wtime();
    fxa_status st = fxa_bwd_post_group(p, in, n_in, 1, 0);
    if (st == FXA_OK)
        st = fxa_bwd_take_group(p, in, n_in, 0);
    *a2a += MPI_Wtime() - t0;
    const fxa_attn_bwd_args loc = group_args(p, 0);
    if (st == FXA_OK)
        st = fxa_bwd_ring_run(p, &loc, stats);
    snprintf(msg, sizeof msg, "%s", m->last_error);
    st = fxa_mpi_agree(m, st, msg);
    if (st == FXA_OK)
        fxa_bwd_ring_write(p, &loc);
    if (st == FXA_OK) {
        t0 = MPI_Wtime();
        st = fxa_bwd_post_group(p, back, n_back, 0, 0);
        if (st == FXA_OK)
            st = fxa_bwd_wait_pending(p);
        *a2a += MPI_Wtime() - t0;
        st = fxa_mpi_agree(m, st, m->last_error);
    }
    return st;
}

/* U > 1, R == 1: the pipeline. Group g + 1's way in is posted once group
 * g's arrived, group g's way back as soon as it computed; a local failure
 * stops compute, not the exchanges (the peers wait on this rank's rows),
 * and every rank agrees once at the end. */
static fxa_status run_ulysses_local(fxa_mpi_attn_bwd_plan *p, const fxa_bwd_side *in, int n_in,
                                    const fxa_bwd_side *back, int n_back, double *a2a)
{
    fxa_mpi *m = p->m;
    char msg[512] = "";
    fxa_status own = FXA_OK;
    double t0 = MPI_Wtime();
    fxa_status st = fxa_bwd_post_group(p, in, n_in, 1, 0);
    for (int g = 0; g < p->groups && st == FXA_OK; g++) {
        st = fxa_bwd_take_group(p, in, n_in, g);
        if (st == FXA_OK && g + 1 < p->groups)
            st = fxa_bwd_post_group(p, in, n_in, 1, g + 1);
        *a2a += MPI_Wtime() - t0;
        if (st == FXA_OK && own == FXA_OK && p->gplan && p->gplan[g]) {
            const fxa_attn_bwd_args loc = group_args(p, g);
            own = fxa_attn_bwd_run(p->gplan[g], &loc, p->ws, NULL);
            if (own != FXA_OK)
                snprintf(msg, sizeof msg, "%s", fxa_ctx_last_error(m->ctx));
        }
        t0 = MPI_Wtime();
        if (st == FXA_OK)
            st = fxa_bwd_post_group(p, back, n_back, 0, g);
    }
    if (st == FXA_OK)
        st = fxa_bwd_wait_pending(p);
    *a2a += MPI_Wtime() - t0;
    if (st != FXA_OK)
        snprintf(msg, sizeof msg, "%s", m->last_error);
    return fxa_mpi_agree(m, st != FXA_OK ? st : own, msg);
}

/* U > 1: whether the run carries lse_parts, agreed: every rank with query
 * tokens passes them or none does (a rank's parts travel to the owners of
 * its heads), else FXA_ERR_INVALID_ARG on every rank. */
static fxa_status agree_parts(fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a)
{
    const int has = p->q_len > 0 && a->lse_parts;
    const int lacks = p->q_len > 0 && !a->lse_parts;
    const int in[2] = {has, lacks};
    int any[2] = {0, 0};
    const fxa_status st =
        fxa_mpi_allreduce(p->m, in, any, 2, MPI_INT, MPI_MAX, p->m->comm, "agreeing on lse_parts");
    if (st != FXA_OK)
        return st;
    if (any[0] && any[1])
        return fxa_mpi_fail(p->m, FXA_ERR_INVALID_ARG,
                            "lse_parts given on some ranks and not on others: every rank with "
                            "query tokens passes its shard of the forward's lse_parts, or none "
                            "does");
    p->with_parts = any[0];
    return FXA_OK;
}

/* U > 1: the exchanges around the local backward or the ring; once every
 * rank agreed, the caller's gradients written. */
static fxa_status run_ulysses(fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a,
                              fxa_mpi_stats *stats)
{
    const fxa_status sp = agree_parts(p, a);
    if (sp != FXA_OK)
        return sp;
    fxa_bwd_side in[7];
    fxa_bwd_side back[3];
    const int n_in = fxa_bwd_sides_in(p, a, in);
    const int n_back = fxa_bwd_sides_back(p, a, back);
    double a2a = 0.0;
    p->n_posted = p->in_req_at[p->groups]; /* the pending requests follow the way in's receives */
    const fxa_status st = p->m->ring > 1 ? run_ulysses_ring(p, in, n_in, back, n_back, stats, &a2a)
                                         : run_ulysses_local(p, in, n_in, back, n_back, &a2a);
    if (st == FXA_OK)
        fxa_bwd_unpack_back(p, back, n_back);
    if (stats)
        stats->a2a_seconds = a2a;
    return st;
}

/* fxa_mpi_body of the backward: Ulysses (U > 1), the ring (R > 1) or one
 * rank's whole problem. */
static fxa_status body(void *plan, fxa_mpi_call *c)
{
    fxa_mpi_attn_bwd_plan *p = plan;
    const fxa_attn_bwd_args *a = &c->args.bwd;
    fxa_status st;
    c->local.rows = p->d.batch * p->d.heads_q * p->d.seq_q;
    c->local.compute = p->d.compute;
    if (p->m->ulysses > 1)
        return run_ulysses(p, a, c->stats);
    if (p->m->ring > 1) {
        st = fxa_bwd_ring_run(p, a, c->stats);
        st = fxa_mpi_agree(p->m, st, p->m->last_error);
        if (st == FXA_OK)
            fxa_bwd_ring_write(p, a);
        return st;
    }
    st = run_local(p, a, c->msg, sizeof c->msg);
    return fxa_mpi_agree(p->m, st, c->msg);
}

fxa_status fxa_mpi_attn_bwd_run(fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *user_args,
                                fxa_mpi_stats *user_stats)
{
    return fxa_mpi_call_run(p ? p->m : NULL, p ? p->call : 0, p, user_args, user_stats, take, body);
}
