/*
 * One distributed backward call (bwd.h): check the arguments (agreed);
 * with U > 1 the way in inside the row (every member's heads of this
 * rank's tokens of Q, K, V, O, dO and lse to their owner, one message per
 * member each way, in pieces of at most p->piece bytes); then
 * fxa_attn_bwd_run on this rank's heads over the whole sequence (R == 1)
 * or the ring along the column (bwd_ring.c), agreed; with U > 1 the way
 * back (dQ, dK, dV rows of each member's tokens to it; agreed); then the
 * caller's dq, dk, dv written. Every buffer is the plan's: a run
 * allocates nothing.
 */
#include <stdio.h>
#include <string.h>

#include "bwd.h"
#include "mpi_begin.h"

enum { TAG_BWD_IN = 11, TAG_BWD_BACK = 12 };

/* fxa_mpi_take of this run kind. */
static fxa_status take(const void *p, const void *user_args, fxa_mpi_call *c)
{
    return fxa_bwd_take_args(p, user_args, &c->args.bwd, c->msg, sizeof c->msg);
}

/* A [B, heads, seq] grid of rows in layout l at base. */
typedef struct grid {
    char *base;
    fxa_layout l;
    int64_t heads;
    int64_t seq;
} grid;

/* Copy rows (b, h, t), b < batch, h < nh, t < nt, of rb bytes from src's
 * head sh0 + h, token st0 + t to dst's head dh0 + h, token dt0 + t. */
static void copy_rows(grid dst, int64_t dh0, int64_t dt0, grid src, int64_t sh0, int64_t st0,
                      int64_t batch, int64_t nh, int64_t nt, size_t rb)
{
    const int runs = dst.l == FXA_LAYOUT_BHSD && src.l == FXA_LAYOUT_BHSD; /* nt rows at once */
    for (int64_t b = 0; b < batch && nt > 0; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t t = 0; t < (runs ? 1 : nt); t++) {
                const int64_t to = fxa_bwd_row(dst.l, b, dh0 + h, dt0 + t, dst.heads, dst.seq);
                const int64_t from = fxa_bwd_row(src.l, b, sh0 + h, st0 + t, src.heads, src.seq);
                memcpy(dst.base + (size_t)to * rb, src.base + (size_t)from * rb,
                       runs ? rb * (size_t)nt : rb);
            }
}

/* One tensor of an exchange: the side that holds the tokens (`tok`: the
 * caller's shard, every head) and the side that holds the heads (`head`:
 * the plan's BHSD tensor, the whole sequence), with rows of rb bytes. */
typedef struct side {
    grid tok;
    grid head;
    size_t rb;
    int is_kv; /* heads and tokens of K/V (else of Q) */
} side;

/* The tensors of each way, in message order. */
static int sides_in(const fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a, side *s)
{
    const fxa_attn_desc *d = &p->d;
    const int me = p->m->u;
    const int64_t nq = fxa_bwd_nq(p, me);
    const int64_t nk = fxa_bwd_nk(p, me);
    const size_t rq = (size_t)d->head_dim * p->es;
    const size_t ro = (size_t)d->head_dim * sizeof(float);
    const fxa_layout l = d->layout;
    const fxa_layout hs = FXA_LAYOUT_BHSD;
    s[0] = (side){{(char *)a->q, l, d->heads_q, p->q_len}, {p->q, hs, nq, p->row_sq}, rq, 0};
    s[1] = (side){{(char *)a->k, l, d->heads_kv, p->kv_len}, {p->k, hs, nk, p->row_skv}, rq, 1};
    s[2] = (side){{(char *)a->v, l, d->heads_kv, p->kv_len}, {p->v, hs, nk, p->row_skv}, rq, 1};
    s[3] = (side){
        {(char *)a->out, l, d->heads_q, p->q_len}, {(char *)p->out, hs, nq, p->row_sq}, ro, 0};
    s[4] = (side){
        {(char *)a->dout, l, d->heads_q, p->q_len}, {(char *)p->dout, hs, nq, p->row_sq}, ro, 0};
    s[5] = (side){{(char *)a->lse, hs, d->heads_q, p->q_len},
                  {(char *)p->lse, hs, nq, p->row_sq},
                  sizeof(float),
                  0};
    return 6;
}

static int sides_back(const fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a, side *s)
{
    const fxa_attn_desc *d = &p->d;
    const int me = p->m->u;
    const int64_t nq = fxa_bwd_nq(p, me);
    const int64_t nk = fxa_bwd_nk(p, me);
    const size_t ro = (size_t)d->head_dim * sizeof(float);
    const fxa_layout l = d->layout;
    const fxa_layout hs = FXA_LAYOUT_BHSD;
    s[0] =
        (side){{(char *)a->dq, l, d->heads_q, p->q_len}, {(char *)p->dq, hs, nq, p->row_sq}, ro, 0};
    s[1] = (side){
        {(char *)a->dk, l, d->heads_kv, p->kv_len}, {(char *)p->dk, hs, nk, p->row_skv}, ro, 1};
    s[2] = (side){
        {(char *)a->dv, l, d->heads_kv, p->kv_len}, {(char *)p->dv, hs, nk, p->row_skv}, ro, 1};
    return 3;
}

/* dst's rows (b, h, t) += src's, as copy_rows moves them (fp32 rows of rb
 * bytes). */
static void add_rows(grid dst, int64_t dh0, int64_t dt0, grid src, int64_t sh0, int64_t st0,
                     int64_t batch, int64_t nh, int64_t nt, size_t rb)
{
    const int64_t n = (int64_t)(rb / sizeof(float));
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t t = 0; t < nt; t++) {
                const int64_t to = fxa_bwd_row(dst.l, b, dh0 + h, dt0 + t, dst.heads, dst.seq);
                const int64_t from = fxa_bwd_row(src.l, b, sh0 + h, st0 + t, src.heads, src.seq);
                float *x = (float *)(dst.base + (size_t)to * rb);
                const float *y = (const float *)(src.base + (size_t)from * rb);
                for (int64_t i = 0; i < n; i++)
                    x[i] += y[i];
            }
}

/* 1 when member v holds a replica of a kv head that an earlier member
 * holds too (replicated kv heads: a kv head's members are consecutive). */
static int later_replica(const fxa_mpi_attn_bwd_plan *p, int v)
{
    return p->replicated && v > 0 && fxa_bwd_nk(p, v) > 0 && p->hkv_lo[v - 1] == p->hkv_lo[v];
}

/* Move member v's section of staging at `at` (packed [B][heads][tokens])
 * to or from the tensors: to_stage 1 packs, 0 unpacks. tok_side: the
 * section holds the token side's rows of v's heads (the way in's sends,
 * the way back's receives); else the head side's rows of v's tokens. The
 * way back's dK, dV rows of a kv head held by several members are summed
 * in member order: the first member's copied, each later one's added. */
static void move_section(const fxa_mpi_attn_bwd_plan *p, const side *s, int n_sides, int v,
                         char *at, int to_stage, int tok_side)
{
    const int me = p->m->u;
    for (int i = 0; i < n_sides; i++) {
        const int kv = s[i].is_kv;
        const int64_t *ts = kv ? p->tk : p->tq;
        const int w = tok_side ? v : me; /* whose heads */
        const int64_t nh = kv ? fxa_bwd_nk(p, w) : fxa_bwd_nq(p, w);
        const int64_t nt = tok_side ? s[i].tok.seq : ts[p->base + v + 1] - ts[p->base + v];
        const grid stage = {at, FXA_LAYOUT_BHSD, nh, nt};
        const grid g = tok_side ? s[i].tok : s[i].head;
        const int64_t h0 = !tok_side ? 0 : kv ? p->hkv_lo[v] : p->hq[v];
        const int64_t t0 = tok_side ? 0 : ts[p->base + v] - ts[p->base];
        if (to_stage)
            copy_rows(stage, 0, 0, g, h0, t0, p->d.batch, nh, nt, s[i].rb);
        else if (tok_side && kv && later_replica(p, v))
            add_rows(g, h0, t0, stage, 0, 0, p->d.batch, nh, nt, s[i].rb);
        else
            copy_rows(g, h0, t0, stage, 0, 0, p->d.batch, nh, nt, s[i].rb);
        at += (size_t)(p->d.batch * nh * nt) * s[i].rb;
    }
}

/* Post a send or receive of n bytes at buf with member v, in pieces. */
static fxa_status post(fxa_mpi_attn_bwd_plan *p, int send, char *buf, int64_t n, int v, int tag,
                       int *at)
{
    fxa_mpi *m = p->m;
    for (int64_t i = 0; i < n; i += p->piece) {
        const int c = (int)(n - i < p->piece ? n - i : p->piece);
        const int rc = send ? MPI_Isend(buf + i, c, MPI_BYTE, v, tag, m->row_comm, &p->req[*at])
                            : MPI_Irecv(buf + i, c, MPI_BYTE, v, tag, m->row_comm, &p->req[*at]);
        if (rc != MPI_SUCCESS)
            return fxa_mpi_fail(m, FXA_ERR_MPI, "%s failed in the backward's Ulysses exchange",
                                send ? "MPI_Isend" : "MPI_Irecv");
        (*at)++;
    }
    return FXA_OK;
}

/* One all-to-all of the row: post every receive, pack and send every
 * member's section (this rank's own is packed only), wait for all. The
 * received sections stay in p->recv (and this rank's in p->send). */
static fxa_status exchange(fxa_mpi_attn_bwd_plan *p, const side *s, int n_sides, int way_in)
{
    fxa_mpi *m = p->m;
    const int me = m->u;
    const int64_t *send_at = way_in ? p->in_send_at : p->back_send_at;
    const int64_t *recv_at = way_in ? p->in_recv_at : p->back_recv_at;
    const int tag = way_in ? TAG_BWD_IN : TAG_BWD_BACK;
    int at = 0;
    fxa_status st = FXA_OK;
    for (int v = 0; v < m->ulysses && st == FXA_OK; v++)
        if (v != me)
            st = post(p, 0, p->recv + recv_at[v], recv_at[v + 1] - recv_at[v], v, tag, &at);
    for (int v = 0; v < m->ulysses && st == FXA_OK; v++) {
        move_section(p, s, n_sides, v, p->send + send_at[v], 1, way_in);
        if (v != me)
            st = post(p, 1, p->send + send_at[v], send_at[v + 1] - send_at[v], v, tag, &at);
    }
    if (st == FXA_OK)
        st = fxa_mpi_wait(m, at, p->req, -1, "the backward's Ulysses exchange");
    return st;
}

/* Unpack every member's received section (this rank's own from p->send). */
static void unpack(const fxa_mpi_attn_bwd_plan *p, const side *s, int n_sides, int way_in)
{
    const int me = p->m->u;
    for (int v = 0; v < p->m->ulysses; v++) {
        char *at = v == me ? p->send + (way_in ? p->in_send_at : p->back_send_at)[v]
                           : p->recv + (way_in ? p->in_recv_at : p->back_recv_at)[v];
        move_section(p, s, n_sides, v, at, 0, !way_in);
    }
}

/* The local backward on bwd args a; msg gets its error. */
static fxa_status run_local(fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a, char *msg,
                            size_t cap)
{
    if (!p->local)
        return FXA_OK; /* no heads here (replicated kv heads, fewer q heads than members) */
    const fxa_status st = fxa_attn_bwd_run(p->local, a, p->ws, NULL);
    if (st != FXA_OK)
        snprintf(msg, cap, "%s", fxa_ctx_last_error(p->m->ctx));
    return st;
}

/* U > 1: the way in, the local backward (R == 1) or the ring, the way
 * back, each agreed on; then the caller's gradients written. */
static fxa_status run_ulysses(fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a,
                              fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    char msg[512];
    side s[6];
    double ta = MPI_Wtime();
    int n = sides_in(p, a, s);
    fxa_status st = exchange(p, s, n, 1);
    if (st == FXA_OK)
        unpack(p, s, n, 1);
    double a2a = MPI_Wtime() - ta;
    snprintf(msg, sizeof msg, "%s", m->last_error);
    const fxa_attn_bwd_args loc = {.struct_size = sizeof loc,
                                   .q = p->q,
                                   .k = p->k,
                                   .v = p->v,
                                   .out = p->out,
                                   .dout = p->dout,
                                   .lse = p->lse,
                                   .dq = p->dq,
                                   .dk = p->dk,
                                   .dv = p->dv};
    if (st == FXA_OK && m->ring > 1) {
        st = fxa_bwd_ring_run(p, &loc, stats);
        snprintf(msg, sizeof msg, "%s", m->last_error);
    } else if (st == FXA_OK) {
        st = run_local(p, &loc, msg, sizeof msg);
    }
    st = fxa_mpi_agree(m, st, msg);
    if (st == FXA_OK && m->ring > 1)
        fxa_bwd_ring_write(p, &loc);
    if (st == FXA_OK) {
        ta = MPI_Wtime();
        n = sides_back(p, a, s);
        st = exchange(p, s, n, 0);
        a2a += MPI_Wtime() - ta;
        st = fxa_mpi_agree(m, st, m->last_error);
    }
    if (st == FXA_OK)
        unpack(p, s, n, 0);
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
