/*
 * The distributed backward's Ulysses exchanges (bwd.h), inside the row,
 * by groups of heads: group g of every member travels as one all-to-all
 * each way, one message per member (in pieces of at most p->piece bytes),
 * from staging packed [B][heads][tokens] per tensor. The way in takes
 * every member's group-g heads of this rank's tokens of Q, K, V, O, dO and
 * lse to their owner, the way back the dQ, dK, dV rows of each member's
 * tokens to it. Messages are matched by order: one tag per way, and MPI
 * keeps the order of the messages between two ranks.
 */
#include <string.h>

#include "bwd.h"

enum { TAG_BWD_IN = 11, TAG_BWD_BACK = 12 };

/* Copy rows (b, h, t), b < batch, h < nh, t < nt, of rb bytes from src's
 * head sh0 + h, token st0 + t to dst's head dh0 + h, token dt0 + t. */
static void copy_rows(fxa_bwd_grid dst, int64_t dh0, int64_t dt0, fxa_bwd_grid src, int64_t sh0,
                      int64_t st0, int64_t batch, int64_t nh, int64_t nt, size_t rb)
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

/* The tensors of each way, in message order. */
int fxa_bwd_sides_in(const fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a, fxa_bwd_side *s)
{
    const fxa_attn_desc *d = &p->d;
    const int me = p->m->u;
    const int64_t nq = fxa_bwd_nq(p, me);
    const int64_t nk = fxa_bwd_nk(p, me);
    const size_t rq = (size_t)d->head_dim * p->es;
    const size_t ro = (size_t)d->head_dim * sizeof(float);
    const fxa_layout l = d->layout;
    const fxa_layout hs = FXA_LAYOUT_BHSD;
    s[0] =
        (fxa_bwd_side){{(char *)a->q, l, d->heads_q, p->q_len}, {p->q, hs, nq, p->row_sq}, rq, 0};
    s[1] = (fxa_bwd_side){
        {(char *)a->k, l, d->heads_kv, p->kv_len}, {p->k, hs, nk, p->row_skv}, rq, 1};
    s[2] = (fxa_bwd_side){
        {(char *)a->v, l, d->heads_kv, p->kv_len}, {p->v, hs, nk, p->row_skv}, rq, 1};
    s[3] = (fxa_bwd_side){
        {(char *)a->out, l, d->heads_q, p->q_len}, {(char *)p->out, hs, nq, p->row_sq}, ro, 0};
    s[4] = (fxa_bwd_side){
        {(char *)a->dout, l, d->heads_q, p->q_len}, {(char *)p->dout, hs, nq, p->row_sq}, ro, 0};
    s[5] = (fxa_bwd_side){{(char *)a->lse, hs, d->heads_q, p->q_len},
                          {(char *)p->lse, hs, nq, p->row_sq},
                          sizeof(float),
                          0};
    if (!p->with_parts)
        return 6;
    s[6] = (fxa_bwd_side){{(char *)a->lse_parts, hs, d->heads_q, p->q_len},
                          {(char *)p->parts, hs, nq, p->row_sq},
                          3 * sizeof(float),
                          0};
    return 7;
}

int fxa_bwd_sides_back(const fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a, fxa_bwd_side *s)
{
    const fxa_attn_desc *d = &p->d;
    const int me = p->m->u;
    const int64_t nq = fxa_bwd_nq(p, me);
    const int64_t nk = fxa_bwd_nk(p, me);
    const size_t ro = (size_t)d->head_dim * sizeof(float);
    const fxa_layout l = d->layout;
    const fxa_layout hs = FXA_LAYOUT_BHSD;
    s[0] = (fxa_bwd_side){
        {(char *)a->dq, l, d->heads_q, p->q_len}, {(char *)p->dq, hs, nq, p->row_sq}, ro, 0};
    s[1] = (fxa_bwd_side){
        {(char *)a->dk, l, d->heads_kv, p->kv_len}, {(char *)p->dk, hs, nk, p->row_skv}, ro, 1};
    s[2] = (fxa_bwd_side){
        {(char *)a->dv, l, d->heads_kv, p->kv_len}, {(char *)p->dv, hs, nk, p->row_skv}, ro, 1};
    return 3;
}

/* dst's rows (b, h, t) += src's, as copy_rows moves them (fp32 rows of rb
 * bytes). */
static void add_rows(fxa_bwd_grid dst, int64_t dh0, int64_t dt0, fxa_bwd_grid src, int64_t sh0,
                     int64_t st0, int64_t batch, int64_t nh, int64_t nt, size_t rb)
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
static void move_section(const fxa_mpi_attn_bwd_plan *p, const fxa_bwd_side *s, int n_sides, int v,
                         int g, char *at, int to_stage, int tok_side)
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
        const fxa_bwd_grid stage = {at, FXA_LAYOUT_BHSD, nh, nt};
        const fxa_bwd_grid blk = {s[i].head.base + (size_t)(nb * h_in * s[i].head.seq) * s[i].rb,
                                  FXA_LAYOUT_BHSD, nh, s[i].head.seq};
        const fxa_bwd_grid gr = tok_side ? s[i].tok : blk;
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
fxa_status fxa_bwd_post_group(fxa_mpi_attn_bwd_plan *p, const fxa_bwd_side *s, int n_sides,
                              int way_in, int g)
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
fxa_status fxa_bwd_take_group(fxa_mpi_attn_bwd_plan *p, const fxa_bwd_side *s, int n_sides, int g)
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
fxa_status fxa_bwd_wait_pending(fxa_mpi_attn_bwd_plan *p)
{
    const int first = p->in_req_at[p->groups];
    return fxa_mpi_wait(p->m, p->n_posted - first, p->req + first, -1,
                        "the backward's Ulysses exchange");
}

/* Local, after every rank agreed: unpack every group's way back (member
 * v's section of this rank's tokens; this rank's own from send_back) into
 * the caller's dq, dk, dv. */
void fxa_bwd_unpack_back(const fxa_mpi_attn_bwd_plan *p, const fxa_bwd_side *s, int n_sides)
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
