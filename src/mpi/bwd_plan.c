/*
 * The distributed backward's plan (bwd.h): agree on the descriptor, split
 * heads (whole kv heads per member, or kv heads replicated over members)
 * and tokens, split each member's heads into groups, plan the local
 * backward (R == 1: each group's heads over the whole sequence, or the
 * shards with U == 1; R > 1: the ring's, bwd_ring.c) and allocate every
 * buffer the runs use.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bwd.h"
#include "base/alloc.h"
#include "mpi_begin.h"

void fxa_mpi_attn_bwd_plan_destroy(fxa_mpi_attn_bwd_plan *p)
{
    if (!p)
        return;
    fxa_attn_bwd_plan_destroy(p->local);
    for (int g = 0; p->gplan && g < p->groups; g++)
        fxa_attn_bwd_plan_destroy(p->gplan[g]);
    fxa_bwd_ring_free(p);
    FXA_FREE_EACH(p->gplan, p->ws, p->bufs, p->req, p->tables, p->offsets, p);
}

void fxa_bwd_group(const fxa_mpi_attn_bwd_plan *p, int v, int g, int64_t *q0, int64_t *nq,
                   int64_t *k0, int64_t *nk)
{
    const int64_t per_kv = p->d.heads_q / p->d.heads_kv;
    int64_t a;
    int64_t b;
    fxa_mpi_split(fxa_bwd_nk(p, v), p->groups, g, &a, &b);
    int64_t qa = (p->hkv_lo[v] + a) * per_kv;
    int64_t qb = (p->hkv_lo[v] + b) * per_kv;
    qa = qa > p->hq[v] ? qa : p->hq[v];
    qb = qb < p->hq[v + 1] ? qb : p->hq[v + 1];
    *k0 = a;
    *nk = b - a;
    *q0 = qa - p->hq[v];
    *nq = qb > qa ? qb - qa : 0;
}

static fxa_status make_plan(fxa_mpi *m, const fxa_attn_desc *d, fxa_mpi_attn_bwd_plan **out);

fxa_status fxa_mpi_attn_bwd_plan_create(fxa_mpi *m, const fxa_attn_desc *d,
                                        fxa_mpi_attn_bwd_plan **out)
{
    fxa_attn_desc full;
    const fxa_status st = fxa_mpi_plan_begin(m, d, out != NULL, 1, &full);
    if (out)
        *out = NULL;
    return st == FXA_OK ? make_plan(m, &full, out) : st;
}

/* Head and token splits. */
static void size_plan(fxa_mpi_attn_bwd_plan *p)
{
    const fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int n = m->ulysses;
    const int64_t group = d->heads_q / d->heads_kv;
    for (int v = 0; v < n; v++) {
        int64_t lo;
        int64_t hi;
        if (!p->replicated) {
            fxa_mpi_split(d->heads_kv, n, v, &lo, &hi);
            p->hkv_lo[v] = lo;
            p->hkv_hi[v] = hi;
            p->hq[v] = lo * group;
            p->hq[v + 1] = hi * group;
            continue;
        }
        int64_t h = 0; /* the kv head whose members [lo, hi) hold v */
        for (fxa_mpi_split(n, (int)d->heads_kv, 0, &lo, &hi); v >= hi;)
            fxa_mpi_split(n, (int)d->heads_kv, (int)++h, &lo, &hi);
        int64_t a;
        int64_t b;
        fxa_mpi_split(group, (int)(hi - lo), (int)(v - lo), &a, &b);
        p->hq[v] = h * group + a;
        p->hq[v + 1] = h * group + b;
        p->hkv_lo[v] = h;
        p->hkv_hi[v] = b > a ? h + 1 : h;
    }
    for (int v = 0; v < m->size; v++) {
        int64_t len;
        fxa_mpi_shard(d->seq_q, m->size, v, &p->tq[v], &len);
        p->tq[v + 1] = p->tq[v] + len;
        fxa_mpi_shard(d->seq_kv, m->size, v, &p->tk[v], &len);
        p->tk[v + 1] = p->tk[v] + len;
    }
    for (int j = 0; j < m->ring; j++)
        p->blk[j] = p->tk[(j + 1) * n] - p->tk[j * n];
    p->base = m->c * n;
    p->row_sq = p->tq[p->base + n] - p->tq[p->base];
    p->row_skv = p->blk[m->c];
}

/* G: the same on every member (it depends on the plan only). With R > 1
 * nothing overlaps the exchange (the ring follows it), so one group. */
static int choose_groups(const fxa_mpi_attn_bwd_plan *p)
{
    int64_t most_kv = 1;
    for (int v = 0; v < p->m->ulysses; v++)
        most_kv = fxa_bwd_nk(p, v) > most_kv ? fxa_bwd_nk(p, v) : most_kv;
    const int64_t hook = p->m->test_ulysses_groups;
    const int64_t g = p->m->ring > 1 ? 1 : hook > 0 ? hook : FXA_BWD_GROUPS;
    return (int)(g < most_kv ? g : most_kv);
}

/* Staging offsets and request counts of every group's sections. */
static void size_exchanges(fxa_mpi_attn_bwd_plan *p)
{
    const fxa_attn_desc *d = &p->d;
    const int n = p->m->ulysses;
    const int me = p->m->u;
    const int64_t dim = d->head_dim;
    const int64_t es = (int64_t)p->es;
    const int64_t q_row = dim * es + 8 * dim + 16; /* q, out, dout, lse, lse_parts */
    const int64_t kv_row = 2 * dim * es;           /* k, v */
    int64_t in_recv_req = 0;
    int64_t pending = 0;
    p->in_send_at[0] = p->in_recv_at[0] = p->back_send_at[0] = p->back_recv_at[0] = 0;
    for (int g = 0; g < p->groups; g++) {
        int64_t q0;
        int64_t nq;
        int64_t k0;
        int64_t nk;
        fxa_bwd_group(p, me, g, &q0, &nq, &k0, &nk);
        p->in_req_at[g] = (int)in_recv_req;
        for (int v = 0; v < n; v++) {
            int64_t vq;
            int64_t vk;
            fxa_bwd_group(p, v, g, &q0, &vq, &k0, &vk);
            const int64_t qn = p->tq[p->base + v + 1] - p->tq[p->base + v];
            const int64_t kn = p->tk[p->base + v + 1] - p->tk[p->base + v];
            const int64_t in_send = d->batch * (vq * p->q_len * q_row + vk * p->kv_len * kv_row);
            const int64_t in_recv = d->batch * (nq * qn * q_row + nk * kn * kv_row);
            const int64_t back_send = d->batch * 4 * dim * (nq * qn + 2 * nk * kn);
            const int64_t back_recv = d->batch * 4 * dim * (vq * p->q_len + 2 * vk * p->kv_len);
            const int i = g * n + v;
            p->in_send_at[i + 1] = p->in_send_at[i] + in_send;
            p->in_recv_at[i + 1] = p->in_recv_at[i] + (v == me ? 0 : in_recv);
            p->back_send_at[i + 1] = p->back_send_at[i] + back_send;
            p->back_recv_at[i + 1] = p->back_recv_at[i] + (v == me ? 0 : back_recv);
            if (v != me) {
                in_recv_req += fxa_bwd_pieces(p, in_recv);
                pending += fxa_bwd_pieces(p, in_send) + fxa_bwd_pieces(p, back_send) +
                           fxa_bwd_pieces(p, back_recv);
            }
        }
    }
    p->in_req_at[p->groups] = (int)in_recv_req;
    p->n_req = (int)(in_recv_req + pending);
}

/* The problem this rank computes on: the caller's shards (U == 1), else
 * its heads over its row's tokens (BHSD); with R == 1 every key. */
static fxa_attn_desc local_desc(const fxa_mpi_attn_bwd_plan *p)
{
    const int me = p->m->u;
    fxa_attn_desc ld = p->d;
    ld.seq_q = p->m->ulysses > 1 ? p->row_sq : p->q_len;
    ld.seq_kv = p->row_skv;
    if (p->m->ulysses > 1) {
        ld.heads_q = fxa_bwd_nq(p, me);
        ld.heads_kv = fxa_bwd_nk(p, me);
        ld.layout = FXA_LAYOUT_BHSD;
    }
    return ld;
}

/* With R == 1 the local backward plans: the shards' (U == 1) or each
 * group's (U > 1; none for a group without heads), ws_bytes the largest
 * workspace. msg says why on failure. */
static fxa_status plan_local(fxa_mpi_attn_bwd_plan *p, char *msg, size_t cap)
{
    const fxa_mpi *m = p->m;
    const fxa_attn_desc ld = local_desc(p);
    fxa_status st = FXA_OK;
    if (m->ring > 1 || ld.heads_q == 0) /* (no heads here: nothing to compute) */
        return FXA_OK;
    if (m->ulysses == 1) {
        st = fxa_attn_bwd_plan_create(m->ctx, &ld, &p->local, &p->ws_bytes);
    } else if (!(p->gplan = calloc((size_t)p->groups, sizeof *p->gplan))) {
        snprintf(msg, cap, "out of memory for the distributed backward's plan");
        return FXA_ERR_NO_MEMORY;
    }
    for (int g = 0; m->ulysses > 1 && g < p->groups && st == FXA_OK; g++) {
        fxa_attn_desc gd = ld;
        int64_t q0;
        int64_t k0;
        fxa_bwd_group(p, m->u, g, &q0, &gd.heads_q, &k0, &gd.heads_kv);
        size_t ws = 0;
        if (gd.heads_q > 0)
            st = fxa_attn_bwd_plan_create(m->ctx, &gd, &p->gplan[g], &ws);
        p->ws_bytes = ws > p->ws_bytes ? ws : p->ws_bytes;
    }
    if (st != FXA_OK)
        snprintf(msg, cap, "%s", fxa_ctx_last_error(m->ctx));
    return st;
}

/* With U > 1 the head-sharded tensors and staging. msg says why on
 * failure. */
static fxa_status plan_buffers(fxa_mpi_attn_bwd_plan *p, char *msg, size_t cap)
{
    const fxa_mpi *m = p->m;
    const int n = m->ulysses;
    const int last = p->groups * n;
    const fxa_attn_desc ld = local_desc(p);
    const fxa_status st = plan_local(p, msg, cap);
    if (st != FXA_OK)
        return st;
    const int64_t dim = p->d.head_dim;
    const int64_t qrows = n > 1 ? p->d.batch * ld.heads_q * ld.seq_q : 0;
    const int64_t krows = n > 1 ? p->d.batch * ld.heads_kv * ld.seq_kv : 0;
    /* Regions, each rounded up to 64 bytes. */
    const int64_t sz[] = {qrows * dim * (int64_t)p->es,
                          krows * dim * (int64_t)p->es,
                          krows * dim * (int64_t)p->es,
                          qrows * dim * 4,
                          qrows * dim * 4,
                          qrows * 4,
                          qrows * dim * 4,
                          krows * dim * 4,
                          krows * dim * 4,
                          n > 1 ? p->in_send_at[last] : 0,
                          n > 1 ? p->in_recv_at[last] : 0,
                          n > 1 ? p->back_send_at[last] : 0,
                          n > 1 ? p->back_recv_at[last] : 0,
                          qrows * 12};
    enum { N_REG = sizeof sz / sizeof sz[0] };
    int64_t at[N_REG + 1];
    at[0] = 0;
    for (int i = 0; i < N_REG; i++)
        at[i + 1] = at[i] + (sz[i] + 63) / 64 * 64;
    const double total =
        (double)at[N_REG] + (double)p->ws_bytes + (double)p->n_req * (double)sizeof(MPI_Request);
    const uint64_t avail = fxa_available_memory();
    if (total > (double)avail) {
        snprintf(msg, cap,
                 "needs %.1f GiB, %.1f GiB available (the distributed backward's buffers)",
                 total / 1073741824.0, (double)avail / 1073741824.0);
        return FXA_ERR_NO_MEMORY;
    }
    if (at[N_REG])
        p->bufs = aligned_alloc(64, (size_t)at[N_REG]);
    if (p->n_req)
        p->req = malloc((size_t)p->n_req * sizeof *p->req);
    if ((at[N_REG] && !p->bufs) || (p->n_req && !p->req)) {
        snprintf(msg, cap, "out of memory for the distributed backward's buffers (%.0f bytes)",
                 total);
        return FXA_ERR_NO_MEMORY;
    }
    char *b = p->bufs;
    if (b) {
        p->q = b + at[0];
        p->k = b + at[1];
        p->v = b + at[2];
        p->out = (float *)(b + at[3]);
        p->dout = (float *)(b + at[4]);
        p->lse = (float *)(b + at[5]);
        p->dq = (float *)(b + at[6]);
        p->dk = (float *)(b + at[7]);
        p->dv = (float *)(b + at[8]);
        p->send = b + at[9];
        p->recv = b + at[10];
        p->send_back = b + at[11];
        p->recv_back = b + at[12];
        p->parts = (float *)(b + at[13]);
        /* A run without lse_parts leaves their place in each section of the
         * way in unwritten: zeros travel there, never stale bytes. */
        memset(p->send, 0, (size_t)sz[9]);
    }
    return FXA_OK;
}

/* The rest of fxa_mpi_attn_bwd_plan_create, on the agreed descriptor d. */
static fxa_status make_plan(fxa_mpi *m, const fxa_attn_desc *d, fxa_mpi_attn_bwd_plan **out)
{
    char msg[512] = "";
    fxa_status st = FXA_OK;
    fxa_mpi_attn_bwd_plan *p = calloc(1, sizeof *p);
    const size_t nu = (size_t)m->size; /* U or R, whichever is P */
    if (p && (p->tables = calloc(6 * (nu + 1), sizeof(int64_t))) != NULL) {
        int64_t *t = p->tables;
        p->hq = t;
        p->hkv_lo = t + (nu + 1);
        p->hkv_hi = t + 2 * (nu + 1);
        p->tq = t + 3 * (nu + 1);
        p->tk = t + 4 * (nu + 1);
        p->blk = t + 5 * (nu + 1);
        fxa_mpi_plan_init(m, d, 1, &p->m, &p->d, &p->call, &p->es, &p->q_len, &p->kv_len);
        p->replicated = d->heads_kv < m->ulysses;
        size_plan(p);
        p->groups = m->ulysses > 1 ? choose_groups(p) : 1;
        const size_t sections = (size_t)p->groups * (size_t)m->ulysses + 1;
        p->offsets =
            calloc(1, 4 * sections * sizeof(int64_t) + ((size_t)p->groups + 1) * sizeof(int));
    }
    if (!p || !p->tables || !p->offsets) {
        st = FXA_ERR_NO_MEMORY;
        snprintf(msg, sizeof msg, "out of memory for the distributed backward's plan");
    } else {
        const size_t sections = (size_t)p->groups * (size_t)m->ulysses + 1;
        int64_t *o = p->offsets;
        p->in_send_at = o;
        p->in_recv_at = o + sections;
        p->back_send_at = o + 2 * sections;
        p->back_recv_at = o + 3 * sections;
        p->in_req_at = (int *)(o + 4 * sections);
        p->piece = m->test_ulysses_piece > 0 && m->test_ulysses_piece < FXA_BWD_PIECE
                       ? m->test_ulysses_piece
                       : FXA_BWD_PIECE;
        size_exchanges(p);
        p->ring_d = local_desc(p);
        st = plan_buffers(p, msg, sizeof msg);
        if (st == FXA_OK && m->ring > 1)
            st = fxa_bwd_ring_plan(p, msg, sizeof msg);
        if (st == FXA_OK && p->ws_bytes &&
            !(p->ws = aligned_alloc(64, (p->ws_bytes + 63) / 64 * 64))) {
            st = FXA_ERR_NO_MEMORY;
            snprintf(msg, sizeof msg, "out of memory for the local workspace (%zu bytes)",
                     p->ws_bytes);
        }
    }
    st = fxa_mpi_agree(m, st, msg);
    if (st == FXA_OK)
        *out = p;
    else
        fxa_mpi_attn_bwd_plan_destroy(p);
    return st;
}
