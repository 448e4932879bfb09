/*
 * Ulysses exchanges inside a row of the grid (U ranks), by groups of heads.
 * Every member's local heads are split into G groups by kv head (each q
 * head goes with its kv head), and group g of every member travels as one
 * step, so that with R == 1 group g + 1 is on its way while group g
 * computes (ulysses_run.c). The bytes between two ranks are those of one
 * all-to-all each way:
 *   in    sequence-sharded Q, K, V (each rank: its tokens, all heads, the
 *         user's layout) to head-sharded ones (each rank: the row's tokens,
 *         its heads, BHSD). The sender packs; each (tensor, batch, head)
 *         block from a member is received straight into its place in the
 *         local tensors, and a rank's own rows are copied there directly.
 *   back  output rows (o, lse, bound, fallback, lse_parts: D + 6 floats), one message
 *         per (group, member), written to the user's output only once
 *         every rank agreed (fxa_ulysses_write).
 * Every message goes as pieces of at most u->piece elements (MPI counts are
 * int). Messages are matched by order: one tag per direction, and MPI keeps
 * the order of the messages between two ranks. Uneven head splits and
 * replicated kv heads are just different counts per member.
 */
#include <stdlib.h>
#include <string.h>

#include "ulysses.h"

enum { TAG_IN = 1, TAG_BACK = 2 };

/* Element offset of row (b, h, t) of a [B, H, S, D] tensor in layout l. */
static int64_t row_off(fxa_layout l, int64_t b, int64_t h, int64_t t, int64_t heads, int64_t seq,
                       int64_t dim)
{
    if (l == FXA_LAYOUT_BSHD)
        return ((b * seq + t) * heads + h) * dim;
    return ((b * heads + h) * seq + t) * dim;
}

/* A [B, heads, seq, D] tensor in layout l. */
typedef struct tview {
    char *base;
    fxa_layout l;
    int64_t heads;
    int64_t seq;
} tview;

/* Copy rows (b, h, t), b < batch, h < nh, t < nt, from src's head sh0 + h,
 * token st0 + t to dst's head dh0 + h, token dt0 + t. */
static void copy_block(tview dst, int64_t dh0, int64_t dt0, tview src, int64_t sh0, int64_t st0,
                       int64_t batch, int64_t nh, int64_t nt, int64_t dim, size_t es)
{
    if (batch == 0 || nh == 0 || nt == 0)
        return;
    const size_t row = (size_t)dim * es;
    const int runs = dst.l == FXA_LAYOUT_BHSD && src.l == FXA_LAYOUT_BHSD; /* nt rows in a run */
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t t = 0; t < (runs ? 1 : nt); t++) {
                const int64_t to = row_off(dst.l, b, dh0 + h, dt0 + t, dst.heads, dst.seq, dim);
                const int64_t from = row_off(src.l, b, sh0 + h, st0 + t, src.heads, src.seq, dim);
                memcpy(dst.base + (size_t)to * es, src.base + (size_t)from * es,
                       runs ? row * (size_t)nt : row);
            }
}

/* Post a send (or receive) of n elements at buf with row member v as
 * pieces of at most u->piece elements, into reqs[*at], reqs[*at + 1], ... */
static fxa_status post(fxa_mpi *m, const fxa_ulysses_bufs *u, int send, void *buf, int64_t n,
                       size_t es, int v, int tag, MPI_Request *reqs, int *at)
{
    const MPI_Datatype t = es == 4 ? MPI_FLOAT : MPI_UINT16_T;
    for (int64_t i = 0; i < n; i += u->piece) {
        const int c = (int)(n - i < u->piece ? n - i : u->piece);
        char *x = (char *)buf + (size_t)i * es;
        const int rc = send ? MPI_Isend(x, c, t, v, tag, m->row_comm, &reqs[*at])
                            : MPI_Irecv(x, c, t, v, tag, m->row_comm, &reqs[*at]);
        if (rc != MPI_SUCCESS)
            return fxa_mpi_fail(m, FXA_ERR_MPI, "%s failed in the Ulysses exchange",
                                send ? "MPI_Isend" : "MPI_Irecv");
        (*at)++;
    }
    return FXA_OK;
}

/* Wait for requests [at[v], at[v] + n[v]) of every member v (n NULL:
 * up to at[v + 1]), naming the member in a timeout. */
static fxa_status wait_members(fxa_mpi *m, MPI_Request *reqs, const int *at, const int *n,
                               const char *what)
{
    for (int v = 0; v < m->ulysses; v++) {
        const int end = n ? at[v] + n[v] : at[v + 1];
        for (int i = at[v]; i < end;) {
            const int c = end - i < FXA_MPI_MAX_WAIT ? end - i : FXA_MPI_MAX_WAIT;
            const fxa_status st = fxa_mpi_wait(m, c, reqs + i, m->c * m->ulysses + v, what);
            if (st != FXA_OK)
                return st;
            i += c;
        }
    }
    return FXA_OK;
}

/* One tensor of group g's way in with member v: receive v's rows (its n
 * tokens at t0) of this rank's local heads [h0, h0 + nh) in place in loc
 * (requests at u->in_req[*at]); pack this rank's rows of v's heads
 * [vh, vh + vnh) of user (global head numbers) at *send and send them, one
 * block per (batch, head) (requests at u->pend_req[*send_at]). */
static fxa_status in_tensor(fxa_mpi *m, fxa_ulysses_bufs *u, int v, tview loc, int64_t h0,
                            int64_t nh, int64_t t0, int64_t n, tview user, int64_t vh, int64_t vnh,
                            int64_t batch, int64_t dim, size_t es, char **send, int *at,
                            int *send_at)
{
    fxa_status st = FXA_OK;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < nh && st == FXA_OK; h++)
            st = post(m, u, 0,
                      loc.base +
                          (size_t)row_off(FXA_LAYOUT_BHSD, b, h0 + h, t0, loc.heads, loc.seq, dim) *
                              es,
                      n * dim, es, v, TAG_IN, u->in_req, at);
    const int64_t block = user.seq * dim;
    const tview packed = {*send, FXA_LAYOUT_BHSD, vnh, user.seq};
    copy_block(packed, 0, 0, user, vh, 0, batch, vnh, user.seq, dim, es);
    for (int64_t i = 0; i < batch * vnh && st == FXA_OK; i++)
        st = post(m, u, 1, *send + (size_t)(i * block) * es, block, es, v, TAG_IN, u->pend_req,
                  send_at);
    *send += (size_t)(batch * vnh * block) * es;
    return st;
}

fxa_status fxa_ulysses_in_post(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_ulysses_bufs *u,
                               int g)
{
    fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int me = m->u;
    const int64_t dim = d->head_dim;
    const int64_t nb = d->batch;
    const size_t es = p->es;
    const int64_t own_kv = p->blk_skv[m->c];
    const tview lq = {u->q, FXA_LAYOUT_BHSD, fxa_mpi_loc_hq(p), p->loc_sq};
    const tview lk = {u->k, FXA_LAYOUT_BHSD, fxa_mpi_loc_hkv(p), own_kv};
    const tview lv = {u->v, FXA_LAYOUT_BHSD, fxa_mpi_loc_hkv(p), own_kv};
    const tview uq = {(char *)a->q, d->layout, d->heads_q, p->q_len};
    const tview uk = {(char *)a->k, d->layout, d->heads_kv, p->kv_len};
    const tview uv = {(char *)a->v, d->layout, d->heads_kv, p->kv_len};
    int64_t q0;
    int64_t nq;
    int64_t k0;
    int64_t nk;
    fxa_ulysses_group(p, u->groups, me, g, &q0, &nq, &k0, &nk);
    char *send = u->in_send + (size_t)u->in_send_at[g] * es;
    int at = 0;
    if (g == 0) /* a new run (a failed one may have left requests behind) */
        memset(u->pend_n, 0, (size_t)m->ulysses * sizeof(int));
    fxa_status st = FXA_OK;
    for (int v = 0; v < m->ulysses && st == FXA_OK; v++) {
        int64_t qoff;
        int64_t qn;
        int64_t koff;
        int64_t kn;
        fxa_ulysses_member_shard(p, d->seq_q, v, &qoff, &qn);
        fxa_ulysses_member_shard(p, d->seq_kv, v, &koff, &kn);
        u->in_req_at[v] = at;
        if (v == me) {
            copy_block(lq, q0, qoff, uq, p->hq_lo[me] + q0, 0, nb, nq, qn, dim, es);
            copy_block(lk, k0, koff, uk, p->hkv_lo[me] + k0, 0, nb, nk, kn, dim, es);
            copy_block(lv, k0, koff, uv, p->hkv_lo[me] + k0, 0, nb, nk, kn, dim, es);
            continue;
        }
        int64_t vq0;
        int64_t vnq;
        int64_t vk0;
        int64_t vnk;
        fxa_ulysses_group(p, u->groups, v, g, &vq0, &vnq, &vk0, &vnk);
        int sent = u->pend_at[v] + u->pend_n[v];
        st = in_tensor(m, u, v, lq, q0, nq, qoff, qn, uq, p->hq_lo[v] + vq0, vnq, nb, dim, es,
                       &send, &at, &sent);
        if (st == FXA_OK)
            st = in_tensor(m, u, v, lk, k0, nk, koff, kn, uk, p->hkv_lo[v] + vk0, vnk, nb, dim, es,
                           &send, &at, &sent);
        if (st == FXA_OK)
            st = in_tensor(m, u, v, lv, k0, nk, koff, kn, uv, p->hkv_lo[v] + vk0, vnk, nb, dim, es,
                           &send, &at, &sent);
        u->pend_n[v] = sent - u->pend_at[v];
    }
    u->in_req_at[m->ulysses] = at; /* (after a failure nothing waits on these) */
    return st;
}

fxa_status fxa_ulysses_in_wait(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u)
{
    return wait_members(p->m, u->in_req, u->in_req_at, NULL, "the Ulysses exchange");
}

fxa_status fxa_ulysses_back_post(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u, int g)
{
    fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int n = m->ulysses;
    const int me = m->u;
    const int64_t dim = d->head_dim;
    const int64_t row = fxa_ulysses_back_row(dim);
    const int64_t nq_loc = fxa_mpi_loc_hq(p);
    int64_t q0;
    int64_t nq;
    int64_t k0;
    int64_t nk;
    fxa_ulysses_group(p, u->groups, me, g, &q0, &nq, &k0, &nk);
    fxa_status st = FXA_OK;
    for (int v = 0; v < n && st == FXA_OK; v++) {
        if (v == me)
            continue;
        int64_t off;
        int64_t qn;
        fxa_ulysses_member_shard(p, d->seq_q, v, &off, &qn);
        float *at = u->back_send + u->back_at[g * n + v];
        for (int64_t b = 0; b < d->batch; b++)
            for (int64_t h = q0; h < q0 + nq; h++)
                for (int64_t t = off; t < off + qn; t++) {
                    const int64_t r = (b * nq_loc + h) * p->loc_sq + t;
                    memcpy(at, u->out + r * dim, (size_t)dim * sizeof(float));
                    at[dim] = u->lse[r];
                    at[dim + 1] = u->bound[r];
                    at[dim + 2] = (float)u->fb[r];
                    memcpy(at + dim + 3, u->parts + 3 * r, 3 * sizeof(float));
                    at += row;
                }
        int i = u->pend_at[v] + u->pend_n[v];
        st = post(m, u, 1, u->back_send + u->back_at[g * n + v],
                  u->back_at[g * n + v + 1] - u->back_at[g * n + v], sizeof(float), v, TAG_BACK,
                  u->pend_req, &i);
        if (st == FXA_OK)
            st = post(m, u, 0, u->back_recv + u->back_from[g * n + v],
                      u->back_from[g * n + v + 1] - u->back_from[g * n + v], sizeof(float), v,
                      TAG_BACK, u->pend_req, &i);
        u->pend_n[v] = i - u->pend_at[v];
    }
    return st;
}

fxa_status fxa_ulysses_pending_wait(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u)
{
    return wait_members(p->m, u->pend_req, u->pend_at, u->pend_n, "the Ulysses exchange");
}

/* One output row (b, global head h, token t) of a: o and, where asked, lse,
 * bound, the fallback flag and lse_parts (parts: 3 floats). */
static void write_row(const fxa_mpi_attn_plan *p, const fxa_attn_args *a, int64_t b, int64_t h,
                      int64_t t, const float *o, float lse, float bound, uint8_t fb,
                      const float *parts)
{
    const fxa_attn_desc *d = &p->d;
    const int64_t r = (b * d->heads_q + h) * p->q_len + t;
    memcpy((float *)a->out + row_off(d->layout, b, h, t, d->heads_q, p->q_len, d->head_dim), o,
           (size_t)d->head_dim * sizeof(float));
    if (a->lse)
        a->lse[r] = lse;
    if (a->row_bound)
        a->row_bound[r] = bound;
    if (a->row_fallback)
        a->row_fallback[r] = fb;
    if (a->lse_parts)
        memcpy(a->lse_parts + 3 * r, parts, 3 * sizeof(float));
}

void fxa_ulysses_write(const fxa_mpi_attn_plan *p, const fxa_ulysses_bufs *u,
                       const fxa_attn_args *a)
{
    const fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int n = m->ulysses;
    const int64_t dim = d->head_dim;
    const int64_t row = fxa_ulysses_back_row(dim);
    const int64_t nq_loc = fxa_mpi_loc_hq(p);
    int64_t off;
    int64_t qn;
    fxa_ulysses_member_shard(p, d->seq_q, m->u, &off, &qn);
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < nq_loc; h++)
            for (int64_t t = 0; t < p->q_len; t++) {
                const int64_t r = (b * nq_loc + h) * p->loc_sq + off + t;
                write_row(p, a, b, p->hq_lo[m->u] + h, t, u->out + r * dim, u->lse[r], u->bound[r],
                          u->fb[r], u->parts + 3 * r);
            }
    for (int v = 0; v < n; v++)
        for (int g = 0; g < u->groups && v != m->u; g++) {
            int64_t q0;
            int64_t nq;
            int64_t k0;
            int64_t nk;
            fxa_ulysses_group(p, u->groups, v, g, &q0, &nq, &k0, &nk);
            const float *at = u->back_recv + u->back_from[g * n + v];
            for (int64_t b = 0; b < d->batch; b++)
                for (int64_t h = q0; h < q0 + nq; h++)
                    for (int64_t t = 0; t < p->q_len; t++, at += row)
                        write_row(p, a, b, p->hq_lo[v] + h, t, at, at[dim], at[dim + 1],
                                  (uint8_t)at[dim + 2], at + dim + 3);
        }
}
