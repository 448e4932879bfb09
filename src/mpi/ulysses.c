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
 *   back  output rows (o, lse, bound, fallback: D + 3 floats), one message
 *         per (group, member), written to the user's output only once
 *         every rank agreed (fxa_ulysses_write).
 * Every message goes as pieces of at most u->piece elements (MPI counts are
 * int). Messages are matched by order: one tag per direction, and MPI keeps
 * the order of the messages between two ranks. Uneven head splits and
 * replicated kv heads are just different counts per member.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "ulysses.h"

enum { TAG_IN = 1, TAG_BACK = 2 };

/* Groups with R == 1 when FXA_TEST_ULYSSES_GROUPS is unset (at most the
 * local kv heads): measured on 40 heads x 128 over 2 ranks (docs/numerics.md). */
#define DEFAULT_GROUPS 4

/* Element offset of row (b, h, t) of a [B, H, S, D] tensor in layout l. */
static int64_t row_off(fxa_layout l, int64_t b, int64_t h, int64_t t, int64_t heads, int64_t seq,
                       int64_t dim)
{
    if (l == FXA_LAYOUT_BSHD)
        return ((b * seq + t) * heads + h) * dim;
    return ((b * heads + h) * seq + t) * dim;
}

/* Shard length and offset within the row of row member v. */
static void member_shard(const fxa_mpi_attn_plan *p, int64_t seq, int v, int64_t *off, int64_t *len)
{
    const fxa_mpi *m = p->m;
    int64_t row_start;
    int64_t start;
    int64_t l0;
    fxa_mpi_shard(seq, m->size, m->c * m->ulysses, &row_start, &l0);
    fxa_mpi_shard(seq, m->size, m->c * m->ulysses + v, &start, len);
    *off = start - row_start;
}

void fxa_ulysses_group(const fxa_mpi_attn_plan *p, int groups, int v, int g, int64_t *q0,
                       int64_t *nq, int64_t *k0, int64_t *nk)
{
    const int64_t per_kv = p->d.heads_q / p->d.heads_kv;
    int64_t a;
    int64_t b;
    fxa_mpi_split(p->hkv_hi[v] - p->hkv_lo[v], groups, g, &a, &b);
    int64_t qa = (p->hkv_lo[v] + a) * per_kv;
    int64_t qb = (p->hkv_lo[v] + b) * per_kv;
    qa = qa > p->hq_lo[v] ? qa : p->hq_lo[v];
    qb = qb < p->hq_hi[v] ? qb : p->hq_hi[v];
    *k0 = a;
    *nk = b - a;
    *q0 = qa - p->hq_lo[v];
    *nq = qb > qa ? qb - qa : 0;
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

static int64_t n_pieces(int64_t n, int64_t piece)
{
    return (n + piece - 1) / piece;
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
        member_shard(p, d->seq_q, v, &qoff, &qn);
        member_shard(p, d->seq_kv, v, &koff, &kn);
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
    const int64_t row = dim + 3;
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
        member_shard(p, d->seq_q, v, &off, &qn);
        float *at = u->back_send + u->back_at[g * n + v];
        for (int64_t b = 0; b < d->batch; b++)
            for (int64_t h = q0; h < q0 + nq; h++)
                for (int64_t t = off; t < off + qn; t++) {
                    const int64_t r = (b * nq_loc + h) * p->loc_sq + t;
                    memcpy(at, u->out + r * dim, (size_t)dim * sizeof(float));
                    at[dim] = u->lse[r];
                    at[dim + 1] = u->bound[r];
                    at[dim + 2] = (float)u->fb[r];
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
 * bound and the fallback flag. */
static void write_row(const fxa_mpi_attn_plan *p, const fxa_attn_args *a, int64_t b, int64_t h,
                      int64_t t, const float *o, float lse, float bound, uint8_t fb)
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
}

void fxa_ulysses_write(const fxa_mpi_attn_plan *p, const fxa_ulysses_bufs *u,
                       const fxa_attn_args *a)
{
    const fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int n = m->ulysses;
    const int64_t dim = d->head_dim;
    const int64_t nq_loc = fxa_mpi_loc_hq(p);
    int64_t off;
    int64_t qn;
    member_shard(p, d->seq_q, m->u, &off, &qn);
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < nq_loc; h++)
            for (int64_t t = 0; t < p->q_len; t++) {
                const int64_t r = (b * nq_loc + h) * p->loc_sq + off + t;
                write_row(p, a, b, p->hq_lo[m->u] + h, t, u->out + r * dim, u->lse[r], u->bound[r],
                          u->fb[r]);
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
                    for (int64_t t = 0; t < p->q_len; t++, at += dim + 3)
                        write_row(p, a, b, p->hq_lo[v] + h, t, at, at[dim], at[dim + 1],
                                  (uint8_t)at[dim + 2]);
        }
}

/* A test hook's count (0: unset) at most most, else fallback. */
static int64_t hook_count(int64_t hook, int64_t fallback, int64_t most)
{
    return hook > 0 ? (hook < most ? hook : most) : fallback;
}

/* G: the same on every member (it depends on the plan only). With R > 1
 * nothing overlaps the exchange (the ring follows it), so one group. */
static int choose_groups(const fxa_mpi_attn_plan *p)
{
    int64_t most_kv = 1;
    for (int v = 0; v < p->m->ulysses; v++) {
        const int64_t nkv = p->hkv_hi[v] - p->hkv_lo[v];
        most_kv = nkv > most_kv ? nkv : most_kv;
    }
    const int64_t g =
        hook_count(p->m->test_ulysses_groups, p->m->ring == 1 ? DEFAULT_GROUPS : 1, most_kv);
    return (int)(g < most_kv ? g : most_kv);
}

/* Sizes of every group's messages: staging offsets of the way in and back,
 * the most receives of one group's way in, pending requests per member. */
static void size_exchanges(const fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u, int *in_reqs)
{
    const fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int n = m->ulysses;
    const int64_t dim = d->head_dim;
    const int64_t row = dim + 3;
    const int64_t nb = d->batch;
    const int64_t pc = u->piece;
    *in_reqs = 0;
    u->in_send_at[0] = 0;
    u->back_at[0] = 0;
    u->back_from[0] = 0;
    for (int v = 0; v < n; v++)
        u->pend_at[v + 1] = 0;
    for (int g = 0; g < u->groups; g++) {
        int64_t q0;
        int64_t nq;
        int64_t k0;
        int64_t nk;
        fxa_ulysses_group(p, u->groups, m->u, g, &q0, &nq, &k0, &nk);
        int64_t send = 0;
        int64_t reqs = 0;
        for (int v = 0; v < n; v++) {
            const int i = g * n + v;
            int64_t off;
            int64_t qn;
            int64_t kn;
            member_shard(p, d->seq_q, v, &off, &qn);
            member_shard(p, d->seq_kv, v, &off, &kn);
            int64_t vq0;
            int64_t vnq;
            int64_t vk0;
            int64_t vnk;
            fxa_ulysses_group(p, u->groups, v, g, &vq0, &vnq, &vk0, &vnk);
            const int other = v != m->u;
            const int64_t out = other ? nb * nq * qn * row : 0;
            const int64_t back = other ? nb * vnq * p->q_len * row : 0;
            u->back_at[i + 1] = u->back_at[i] + out;
            u->back_from[i + 1] = u->back_from[i] + back;
            if (!other)
                continue;
            const int64_t sends =
                nb * (vnq * n_pieces(p->q_len * dim, pc) + 2 * vnk * n_pieces(p->kv_len * dim, pc));
            u->pend_at[v + 1] += (int)(sends + n_pieces(out, pc) + n_pieces(back, pc));
            send += nb * dim * (vnq * p->q_len + 2 * vnk * p->kv_len);
            reqs += nb * (nq * n_pieces(qn * dim, pc) + 2 * nk * n_pieces(kn * dim, pc));
        }
        u->in_send_at[g + 1] = u->in_send_at[g] + send;
        *in_reqs = (int)reqs > *in_reqs ? (int)reqs : *in_reqs;
    }
    for (int v = 0; v < n; v++)
        u->pend_at[v + 1] += u->pend_at[v];
}

fxa_status fxa_ulysses_alloc(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u)
{
    const fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int n = m->ulysses;
    const size_t dim = (size_t)d->head_dim;
    const size_t b = (size_t)d->batch;
    const size_t nkv = (size_t)fxa_mpi_loc_hkv(p);
    const size_t own_kv = (size_t)p->blk_skv[m->c];
    const size_t rows = b * (size_t)fxa_mpi_loc_hq(p) * (size_t)p->loc_sq;
    memset(u, 0, sizeof *u);
    u->groups = choose_groups(p);
    /* Pieces: MPI counts are int. FXA_TEST_ULYSSES_PIECE (tests only, read
     * by fxa_mpi_create) makes them smaller, so that the piece path runs on
     * small problems. */
    u->piece = hook_count(m->test_ulysses_piece, INT_MAX, INT_MAX);
    const size_t pairs = (size_t)u->groups * (size_t)n + 1;
    u->in_send_at = malloc(((size_t)u->groups + 1) * sizeof(int64_t));
    u->back_at = malloc(pairs * sizeof(int64_t));
    u->back_from = malloc(pairs * sizeof(int64_t));
    u->in_req_at = calloc((size_t)n + 1, sizeof(int));
    u->pend_at = calloc((size_t)n + 1, sizeof(int));
    u->pend_n = calloc((size_t)n, sizeof(int));
    if (!u->in_send_at || !u->back_at || !u->back_from || !u->in_req_at || !u->pend_at ||
        !u->pend_n) {
        fxa_ulysses_bufs_free(u);
        return FXA_ERR_NO_MEMORY;
    }
    int in_reqs;
    size_exchanges(p, u, &in_reqs);
    u->q = malloc(rows * dim * p->es + 1);
    u->k = malloc(b * nkv * own_kv * dim * p->es + 1);
    u->v = malloc(b * nkv * own_kv * dim * p->es + 1);
    u->out = malloc(rows * dim * sizeof(float) + 1);
    u->lse = malloc(rows * sizeof(float) + 1);
    u->bound = malloc(rows * sizeof(float) + 1);
    u->fb = malloc(rows + 1);
    u->in_send = malloc((size_t)u->in_send_at[u->groups] * p->es + 1);
    u->back_send = malloc((size_t)u->back_at[pairs - 1] * sizeof(float) + 1);
    u->back_recv = malloc((size_t)u->back_from[pairs - 1] * sizeof(float) + 1);
    u->in_req = malloc((size_t)in_reqs * sizeof(MPI_Request) + 1);
    u->pend_req = malloc((size_t)u->pend_at[n] * sizeof(MPI_Request) + 1);
    if (!u->q || !u->k || !u->v || !u->out || !u->lse || !u->bound || !u->fb || !u->in_send ||
        !u->back_send || !u->back_recv || !u->in_req || !u->pend_req ||
        (m->ring == 1 && fxa_ulysses_stages(p, u) != FXA_OK)) {
        fxa_ulysses_bufs_free(u);
        return FXA_ERR_NO_MEMORY;
    }
    return FXA_OK;
}

void fxa_ulysses_bufs_free(fxa_ulysses_bufs *u)
{
    for (int g = 0; u->plans && g < u->groups; g++)
        fxa_attn_plan_destroy(u->plans[g]);
    free(u->plans);
    free(u->stage);
    free(u->stage_at);
    free(u->ws);
    free(u->in_send);
    free(u->back_send);
    free(u->back_recv);
    free(u->back_at);
    free(u->back_from);
    free(u->in_req);
    free(u->in_req_at);
    free(u->pend_req);
    free(u->pend_at);
    free(u->pend_n);
    free(u->in_send_at);
    free(u->q);
    free(u->k);
    free(u->v);
    free(u->out);
    free(u->lse);
    free(u->bound);
    free(u->fb);
    memset(u, 0, sizeof *u);
}
