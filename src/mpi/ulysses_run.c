/*
 * Pure Ulysses (R == 1), pipelined by groups of heads: group g + 1's way in
 * and group g - 1's way back are posted before group g computes, so that a
 * member's data is ready (or the peer is copying it) when it is needed
 * instead of every rank stopping for one all-to-all each way. Each head is
 * computed by the same kernels on the same keys as in one process, whatever
 * its group (per-head results do not depend on the other heads of a call),
 * so the output keeps the single process's bytes.
 */
#include <stdlib.h>

#include "ulysses.h"

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        const int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The plan of one batch of an aligned group (nq q heads on nk kv heads). */
static fxa_status group_plan(const fxa_mpi_attn_plan *p, int64_t nq, int64_t nk,
                             fxa_attn_plan **out, size_t *ws)
{
    fxa_attn_desc ld = p->d;
    ld.batch = 1;
    ld.heads_q = nq;
    ld.heads_kv = nk;
    ld.seq_q = p->loc_sq > 0 ? p->loc_sq : 1; /* no queries: never run */
    ld.seq_kv = p->max_blk_skv > 0 ? p->max_blk_skv : 1;
    ld.layout = FXA_LAYOUT_BHSD;
    ld.heads_per_tile = (int)gcd64(p->d.heads_per_tile > 0 ? p->d.heads_per_tile : 1, nq);
    return fxa_attn_plan_create(p->m->ctx, &ld, out, ws);
}

fxa_status fxa_ulysses_stages(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u)
{
    const fxa_attn_desc *d = &p->d;
    const int me = p->m->u;
    const int64_t per_kv = d->heads_q / d->heads_kv;
    /* Aligned: whole kv heads with all their q heads (a plan per group);
     * else (replicated kv heads) the plan's segments, one per (batch, kv
     * head), each in its kv head's group. */
    const int aligned =
        p->hq_lo[me] == p->hkv_lo[me] * per_kv && p->hq_hi[me] == p->hkv_hi[me] * per_kv;
    const int64_t most = aligned ? d->batch * u->groups : p->n_seg;
    u->stage = calloc((size_t)most + 1, sizeof *u->stage);
    u->stage_at = calloc((size_t)u->groups + 1, sizeof(int));
    u->plans = calloc((size_t)u->groups, sizeof *u->plans);
    if (!u->stage || !u->stage_at || !u->plans)
        return FXA_ERR_NO_MEMORY;
    size_t ws_most = 0;
    int n = 0;
    for (int g = 0; g < u->groups && p->n_seg > 0; g++) {
        int64_t q0;
        int64_t nq;
        int64_t k0;
        int64_t nk;
        fxa_ulysses_group(p, u->groups, me, g, &q0, &nq, &k0, &nk);
        if (aligned && nq > 0) {
            size_t ws = 0;
            const fxa_status st = group_plan(p, nq, nk, &u->plans[g], &ws);
            if (st != FXA_OK)
                return st;
            ws_most = ws > ws_most ? ws : ws_most;
            for (int64_t b = 0; b < d->batch; b++)
                u->stage[n++] = (fxa_mpi_segment){b, 1, q0, nq, k0, nk, u->plans[g], ws};
        }
        for (int i = 0; !aligned && i < p->n_seg; i++) {
            const fxa_mpi_segment *s = &p->seg[i];
            if (s->kv0 < k0 || s->kv0 >= k0 + nk)
                continue;
            u->stage[n++] = *s;
            ws_most = s->ws_bytes > ws_most ? s->ws_bytes : ws_most;
        }
        u->stage_at[g + 1] = n;
    }
    for (int g = 1; g <= u->groups; g++)
        u->stage_at[g] = u->stage_at[g] > u->stage_at[g - 1] ? u->stage_at[g] : u->stage_at[g - 1];
    u->ws = ws_most ? aligned_alloc(64, (ws_most + 63) / 64 * 64) : NULL;
    return ws_most && !u->ws ? FXA_ERR_NO_MEMORY : FXA_OK;
}

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
    const fxa_mpi_local loc = {u->q, u->k, u->v, u->out, u->lse, u->fb, u->bound};
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
            own = own == FXA_OK ? fxa_mpi_run_segment(p, &loc, &u->stage[i], u->ws, sum) : own;
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
