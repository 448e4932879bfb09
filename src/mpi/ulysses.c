/*
 * Ulysses exchanges inside a row of the grid (U ranks): one all-to-all
 * turns sequence-sharded Q, K, V (each rank: its tokens, all heads, the
 * user's layout) into head-sharded ones (each rank: the row's tokens, its
 * heads, BHSD), and one turns the output rows (o, lse, bound, fallback)
 * back. Uneven head splits and replicated kv heads are just different
 * counts per destination.
 */
#include <stdlib.h>
#include <string.h>

#include "ulysses.h"

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

/* Copy rows (b, h in [h0, h1), t in [0, n)) between a tensor and a packed
 * run of rows (row bytes each), in (b, h, t) order. to_packed selects the
 * direction. */
static char *copy_rows(char *packed, char *tensor, int to_packed, fxa_layout l, int64_t batch,
                       int64_t h0, int64_t h1, int64_t heads, int64_t t0, int64_t n, int64_t seq,
                       int64_t dim, size_t es)
{
    const size_t row = (size_t)dim * es;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = h0; h < h1; h++)
            for (int64_t t = 0; t < n; t++) {
                char *x = tensor + (size_t)row_off(l, b, h, t0 + t, heads, seq, dim) * es;
                if (to_packed)
                    memcpy(packed, x, row);
                else
                    memcpy(x, packed, row);
                packed += row;
            }
    return packed;
}

static fxa_status alltoallv(fxa_mpi *m, const void *send, const int *sc, const int *sd, void *recv,
                            const int *rc, const int *rd, MPI_Datatype type)
{
    return fxa_mpi_alltoallv(m, send, sc, sd, recv, rc, rd, type, m->row_comm,
                             "the Ulysses exchange");
}

/* Counts and displacements (in elements) from per-member counts. */
static void displs(const int64_t *count, int n, int *c, int *dsp)
{
    int64_t at = 0;
    for (int i = 0; i < n; i++) {
        c[i] = (int)count[i];
        dsp[i] = (int)at;
        at += count[i];
    }
}

fxa_status fxa_ulysses_forward(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_ulysses_bufs *u)
{
    fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int n = m->ulysses;
    const int me = m->u;
    const int64_t dim = d->head_dim;
    const int64_t nq = p->hq_hi[me] - p->hq_lo[me];
    const int64_t nkv = p->hkv_hi[me] - p->hkv_lo[me];
    const int64_t own_kv = p->blk_skv[m->c];
    int64_t *sc = calloc((size_t)n * 2, sizeof(int64_t));
    int *ic = calloc((size_t)n * 4, sizeof(int));
    fxa_status st = FXA_OK;
    if (!sc || !ic) {
        free(sc);
        free(ic);
        return fxa_mpi_fail(m, FXA_ERR_NO_MEMORY, "out of memory for the Ulysses exchange");
    }
    for (int v = 0; v < n; v++) {
        int64_t off;
        int64_t qn;
        int64_t kn;
        member_shard(p, d->seq_q, v, &off, &qn);
        member_shard(p, d->seq_kv, v, &off, &kn);
        sc[v] = d->batch * dim *
                ((p->hq_hi[v] - p->hq_lo[v]) * p->q_len +
                 2 * (p->hkv_hi[v] - p->hkv_lo[v]) * p->kv_len);
        sc[n + v] = d->batch * dim * (nq * qn + 2 * nkv * kn);
    }
    char *send = u->send;
    char *recv = u->recv;
    char *at = send;
    for (int v = 0; v < n; v++) {
        at = copy_rows(at, (char *)a->q, 1, d->layout, d->batch, p->hq_lo[v], p->hq_hi[v],
                       d->heads_q, 0, p->q_len, p->q_len, dim, p->es);
        at = copy_rows(at, (char *)a->k, 1, d->layout, d->batch, p->hkv_lo[v], p->hkv_hi[v],
                       d->heads_kv, 0, p->kv_len, p->kv_len, dim, p->es);
        at = copy_rows(at, (char *)a->v, 1, d->layout, d->batch, p->hkv_lo[v], p->hkv_hi[v],
                       d->heads_kv, 0, p->kv_len, p->kv_len, dim, p->es);
    }
    displs(sc, n, ic, ic + n);
    displs(sc + n, n, ic + 2 * n, ic + 3 * n);
    st = alltoallv(m, send, ic, ic + n, recv, ic + 2 * n, ic + 3 * n,
                   p->es == 4 ? MPI_FLOAT : MPI_UINT16_T);
    if (st != FXA_OK)
        goto done;
    at = recv;
    for (int v = 0; v < n; v++) {
        int64_t qoff;
        int64_t qn;
        int64_t koff;
        int64_t kn;
        member_shard(p, d->seq_q, v, &qoff, &qn);
        member_shard(p, d->seq_kv, v, &koff, &kn);
        at = copy_rows(at, u->q, 0, FXA_LAYOUT_BHSD, d->batch, 0, nq, nq, qoff, qn, p->loc_sq, dim,
                       p->es);
        at = copy_rows(at, u->k, 0, FXA_LAYOUT_BHSD, d->batch, 0, nkv, nkv, koff, kn, own_kv, dim,
                       p->es);
        at = copy_rows(at, u->v, 0, FXA_LAYOUT_BHSD, d->batch, 0, nkv, nkv, koff, kn, own_kv, dim,
                       p->es);
    }
done:
    free(sc);
    free(ic);
    return st;
}

fxa_status fxa_ulysses_backward(fxa_mpi_attn_plan *p, const fxa_ulysses_bufs *u,
                                const fxa_attn_args *a)
{
    fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int n = m->ulysses;
    const int me = m->u;
    const int64_t dim = d->head_dim;
    const int64_t row = dim + 3;
    const int64_t nq = p->hq_hi[me] - p->hq_lo[me];
    int64_t *sc = calloc((size_t)n * 2, sizeof(int64_t));
    int *ic = calloc((size_t)n * 4, sizeof(int));
    if (!sc || !ic) {
        free(sc);
        free(ic);
        return fxa_mpi_fail(m, FXA_ERR_NO_MEMORY, "out of memory for the Ulysses exchange");
    }
    for (int v = 0; v < n; v++) {
        int64_t off;
        int64_t qn;
        member_shard(p, d->seq_q, v, &off, &qn);
        sc[v] = d->batch * nq * qn * row;
        sc[n + v] = d->batch * (p->hq_hi[v] - p->hq_lo[v]) * p->q_len * row;
    }
    float *send = (float *)u->send;
    float *recv = (float *)u->recv;
    fxa_status st = FXA_OK;
    float *at = send;
    for (int v = 0; v < n; v++) {
        int64_t off;
        int64_t qn;
        member_shard(p, d->seq_q, v, &off, &qn);
        for (int64_t b = 0; b < d->batch; b++)
            for (int64_t h = 0; h < nq; h++)
                for (int64_t t = off; t < off + qn; t++) {
                    const int64_t r = (b * nq + h) * p->loc_sq + t;
                    memcpy(at, u->out + r * dim, (size_t)dim * sizeof(float));
                    at[dim] = u->lse[r];
                    at[dim + 1] = u->bound[r];
                    at[dim + 2] = (float)u->fb[r];
                    at += row;
                }
    }
    displs(sc, n, ic, ic + n);
    displs(sc + n, n, ic + 2 * n, ic + 3 * n);
    st = alltoallv(m, send, ic, ic + n, recv, ic + 2 * n, ic + 3 * n, MPI_FLOAT);
    if (st != FXA_OK)
        goto done;
    at = recv;
    for (int v = 0; v < n; v++) {
        for (int64_t b = 0; b < d->batch; b++)
            for (int64_t h = p->hq_lo[v]; h < p->hq_hi[v]; h++)
                for (int64_t t = 0; t < p->q_len; t++) {
                    const int64_t r = (b * d->heads_q + h) * p->q_len + t;
                    memcpy((float *)a->out + row_off(d->layout, b, h, t, d->heads_q, p->q_len, dim),
                           at, (size_t)dim * sizeof(float));
                    if (a->lse)
                        a->lse[r] = at[dim];
                    if (a->row_bound)
                        a->row_bound[r] = at[dim + 1];
                    if (a->row_fallback)
                        a->row_fallback[r] = (uint8_t)at[dim + 2];
                    at += row;
                }
    }
done:
    free(sc);
    free(ic);
    return st;
}

fxa_status fxa_ulysses_alloc(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u)
{
    const fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int me = m->u;
    const size_t dim = (size_t)d->head_dim;
    const size_t b = (size_t)d->batch;
    const size_t nq = (size_t)(p->hq_hi[me] - p->hq_lo[me]);
    const size_t nkv = (size_t)(p->hkv_hi[me] - p->hkv_lo[me]);
    const size_t own_kv = (size_t)p->blk_skv[m->c];
    const size_t rows = b * nq * (size_t)p->loc_sq;
    size_t send = 0;
    size_t recv = 0;
    for (int v = 0; v < m->ulysses; v++) {
        int64_t off;
        int64_t qn;
        int64_t kn;
        member_shard(p, d->seq_q, v, &off, &qn);
        member_shard(p, d->seq_kv, v, &off, &kn);
        const size_t vq = (size_t)(p->hq_hi[v] - p->hq_lo[v]);
        const size_t vkv = (size_t)(p->hkv_hi[v] - p->hkv_lo[v]);
        send += b * dim * (vq * (size_t)p->q_len + 2 * vkv * (size_t)p->kv_len) * p->es;
        recv += b * dim * (nq * (size_t)qn + 2 * nkv * (size_t)kn) * p->es;
    }
    /* The way back: output rows of D + 3 floats. */
    const size_t back_send = rows * (dim + 3) * sizeof(float);
    const size_t back_recv = b * (size_t)d->heads_q * (size_t)p->q_len * (dim + 3) * sizeof(float);
    send = send > back_send ? send : back_send;
    recv = recv > back_recv ? recv : back_recv;
    memset(u, 0, sizeof *u);
    u->q = malloc(rows * dim * p->es + 1);
    u->k = malloc(b * nkv * own_kv * dim * p->es + 1);
    u->v = malloc(b * nkv * own_kv * dim * p->es + 1);
    u->out = malloc(rows * dim * sizeof(float) + 1);
    u->lse = malloc(rows * sizeof(float) + 1);
    u->bound = malloc(rows * sizeof(float) + 1);
    u->fb = malloc(rows + 1);
    u->send = malloc(send + 1);
    u->recv = malloc(recv + 1);
    if (!u->q || !u->k || !u->v || !u->out || !u->lse || !u->bound || !u->fb || !u->send ||
        !u->recv) {
        fxa_ulysses_bufs_free(u);
        return FXA_ERR_NO_MEMORY;
    }
    return FXA_OK;
}

void fxa_ulysses_bufs_free(fxa_ulysses_bufs *u)
{
    free(u->send);
    free(u->recv);
    free(u->q);
    free(u->k);
    free(u->v);
    free(u->out);
    free(u->lse);
    free(u->bound);
    free(u->fb);
    memset(u, 0, sizeof *u);
}
