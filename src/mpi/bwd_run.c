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

/* Move member v's section of group g in staging at `at` (packed
 * [B][heads][tokens]) to or from the tensors: to_stage 1 packs, 0
 * unpacks. tok_side: the section holds the token side's rows of v's group-g
 * heads (the way in's sends, the way back's receives); else the head
 * side's rows (group g's block of the group-major tensor) of v's tokens.
 * The way back's dK, dV rows of a kv head held by several members are
 * summed in member order: the first member's copied, each later one's
 * added. */
static void move_section(const fxa_mpi_attn_bwd_plan *p, const side *s, int n_sides, int v, int g,
                         char *at, int to_stage, int tok_side)
{
    const int me = p->m->u;
    const int64_t nb = p->d.batch;
    int64_t gh[4]; /* q0, nq, k0, nk of whose group */
    fxa_bwd_group(p, tok_side ? v : me, g, &gh[0], &gh[1], &gh[2], &gh[3]);
    for (int i = 0; i < n_sides; i++) {
        const int kv = s[i].is_kv;
        const int64_t *ts = kv ? p->tk : p->tq;
        const int64_t h_in = gh[kv ? 2 : 0]; /* group's first head in whose heads */
        const int64_t nh = gh[kv ? 3 : 1];
        const int64_t nt = tok_side ? s[i].tok.seq : ts[p->base + v + 1] - ts[p->base + v];
        const grid stage = {at, FXA_LAYOUT_BHSD, nh, nt};
        const grid blk = {s[i].head.base + (size_t)(nb * h_in * s[i].head.seq) * s[i].rb,
                          FXA_LAYOUT_BHSD, nh, s[i].head.seq};
        const grid gr = tok_side ? s[i].tok : blk;
        const int64_t h0 = !tok_side ? 0 : (kv ? p->hkv_lo[v] : p->hq[v]) + h_in;
        const int64_t t0 = tok_side ? 0 : ts[p->base + v] - ts[p->base];
        if (to_stage)
            copy_rows(stage, 0, 0, gr, h0, t0, nb, nh, nt, s[i].rb);
        else if (tok_side && kv && later_replica(p, v))
            add_rows(gr, h0, t0, stage, 0, 0, nb, nh, nt, s[i].rb);
        else
            copy_rows(gr, h0, t0, stage, 0, 0, nb, nh, nt, s[i].rb);
        at += (size_t)(nb * nh * nt) * s[i].rb;
    }
}

/* Post a send or receive of n bytes at buf with member v, in pieces, into
 * p->req[*at], p->req[*at + 1], ... */
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

/* Collective over the row, in group order: group g's all-to-all one way.
 * Post every receive (the way in's at p->in_req_at[g], the way back's with
 * the sends after them), pack and send every member's section (this
 * rank's own is packed only). Nothing is waited for: the received sections
 * land in recv (recv_back) and this rank's own stays in send (send_back). */
static fxa_status post_group(fxa_mpi_attn_bwd_plan *p, const side *s, int n_sides, int way_in,
                             int g)
{
    fxa_mpi *m = p->m;
    const int me = m->u;
    const int n = m->ulysses;
    const int64_t *send_at = (way_in ? p->in_send_at : p->back_send_at) + g * n;
    const int64_t *recv_at = (way_in ? p->in_recv_at : p->back_recv_at) + g * n;
    char *send = way_in ? p->send : p->send_back;
    char *recv = way_in ? p->recv : p->recv_back;
    const int tag = way_in ? TAG_BWD_IN : TAG_BWD_BACK;
    int in_at = p->in_req_at[g];
    int *at = way_in ? &in_at : &p->n_posted;
    fxa_status st = FXA_OK;
    for (int v = 0; v < n && st == FXA_OK; v++)
        if (v != me)
            st = post(p, 0, recv + recv_at[v], recv_at[v + 1] - recv_at[v], v, tag, at);
    for (int v = 0; v < n && st == FXA_OK; v++) {
        move_section(p, s, n_sides, v, g, send + send_at[v], 1, way_in);
        if (v != me)
            st = post(p, 1, send + send_at[v], send_at[v + 1] - send_at[v], v, tag, &p->n_posted);
    }
    return st;
}

/* Wait for group g's receives of the way in (its sends stay pending, so
 * that no rank waits for a slower peer to take its rows), then unpack
 * every member's section into group g's block of the head-sharded
 * tensors. */
static fxa_status take_group(fxa_mpi_attn_bwd_plan *p, const side *s, int n_sides, int g)
{
    const int me = p->m->u;
    const int n = p->m->ulysses;
    const fxa_status st =
        fxa_mpi_wait(p->m, p->in_req_at[g + 1] - p->in_req_at[g], p->req + p->in_req_at[g], -1,
                     "the backward's Ulysses exchange");
    for (int v = 0; v < n && st == FXA_OK; v++) {
        char *at =
            v == me ? p->send + p->in_send_at[g * n + v] : p->recv + p->in_recv_at[g * n + v];
        move_section(p, s, n_sides, v, g, at, 0, 0);
    }
    return st;
}

/* Wait for every pending request: the sends of both ways and the receives
 * of the way back. */
static fxa_status wait_pending(fxa_mpi_attn_bwd_plan *p)
{
    const int first = p->in_req_at[p->groups];
    return fxa_mpi_wait(p->m, p->n_posted - first, p->req + first, -1,
                        "the backward's Ulysses exchange");
}

/* Local, after every rank agreed: unpack every group's way back (member
 * v's section of this rank's tokens; this rank's own from send_back) into
 * the caller's dq, dk, dv. */
static void unpack_back(const fxa_mpi_attn_bwd_plan *p, const side *s, int n_sides)
{
    const int me = p->m->u;
    const int n = p->m->ulysses;
    for (int g = 0; g < p->groups; g++)
        for (int v = 0; v < n; v++) {
            const int i = g * n + v;
            char *at =
                v == me ? p->send_back + p->back_send_at[i] : p->recv_back + p->back_recv_at[i];
            move_section(p, s, n_sides, v, g, at, 0, 1);
        }
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
                               .dq = p->dq + qr * dim,
                               .dk = p->dk + kr * dim,
                               .dv = p->dv + kr * dim};
}

/* U > 1, R > 1 (one group): the way in, the ring, the way back, each
 * agreed on. */
static fxa_status run_ulysses_ring(fxa_mpi_attn_bwd_plan *p, const side *in, int n_in,
                                   const side *back, int n_back, fxa_mpi_stats *stats, double *a2a)
{
    fxa_mpi *m = p->m;
    char msg[512];
    double t0 = MPI_Wtime();
    fxa_status st = post_group(p, in, n_in, 1, 0);
    if (st == FXA_OK)
        st = take_group(p, in, n_in, 0);
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
        st = post_group(p, back, n_back, 0, 0);
        if (st == FXA_OK)
            st = wait_pending(p);
        *a2a += MPI_Wtime() - t0;
        st = fxa_mpi_agree(m, st, m->last_error);
    }
    return st;
}

/* U > 1, R == 1: the pipeline. Group g + 1's way in is posted once group
 * g's arrived, group g's way back as soon as it computed; a local failure
 * stops compute, not the exchanges (the peers wait on this rank's rows),
 * and every rank agrees once at the end. */
static fxa_status run_ulysses_local(fxa_mpi_attn_bwd_plan *p, const side *in, int n_in,
                                    const side *back, int n_back, double *a2a)
{
    fxa_mpi *m = p->m;
    char msg[512] = "";
    fxa_status own = FXA_OK;
    double t0 = MPI_Wtime();
    fxa_status st = post_group(p, in, n_in, 1, 0);
    for (int g = 0; g < p->groups && st == FXA_OK; g++) {
        st = take_group(p, in, n_in, g);
        if (st == FXA_OK && g + 1 < p->groups)
            st = post_group(p, in, n_in, 1, g + 1);
        *a2a += MPI_Wtime() - t0;
        if (st == FXA_OK && own == FXA_OK && p->gplan && p->gplan[g]) {
            const fxa_attn_bwd_args loc = group_args(p, g);
            own = fxa_attn_bwd_run(p->gplan[g], &loc, p->ws, NULL);
            if (own != FXA_OK)
                snprintf(msg, sizeof msg, "%s", fxa_ctx_last_error(m->ctx));
        }
        t0 = MPI_Wtime();
        if (st == FXA_OK)
            st = post_group(p, back, n_back, 0, g);
    }
    if (st == FXA_OK)
        st = wait_pending(p);
    *a2a += MPI_Wtime() - t0;
    if (st != FXA_OK)
        snprintf(msg, sizeof msg, "%s", m->last_error);
    return fxa_mpi_agree(m, st != FXA_OK ? st : own, msg);
}

/* U > 1: the exchanges around the local backward or the ring; once every
 * rank agreed, the caller's gradients written. */
static fxa_status run_ulysses(fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a,
                              fxa_mpi_stats *stats)
{
    side in[6];
    side back[3];
    const int n_in = sides_in(p, a, in);
    const int n_back = sides_back(p, a, back);
    double a2a = 0.0;
    p->n_posted = p->in_req_at[p->groups]; /* the pending requests follow the way in's receives */
    const fxa_status st = p->m->ring > 1 ? run_ulysses_ring(p, in, n_in, back, n_back, stats, &a2a)
                                         : run_ulysses_local(p, in, n_in, back, n_back, &a2a);
    if (st == FXA_OK)
        unpack_back(p, back, n_back);
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
