/*
 * The Ulysses exchange's plan (ulysses.h): how every member's local heads
 * split into groups, the offsets and request counts of every group's
 * messages both ways, the buffers (head-sharded tensors, staging, request
 * arrays) and, with R == 1, the pipeline's local problems and their plans.
 * All of it is allocated with the distributed plan.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ulysses.h"
#include "base/alloc.h"

/* Groups with R == 1 when FXA_TEST_ULYSSES_GROUPS is unset (at most the
 * local kv heads): measured on 40 heads x 128 over 2 ranks (docs/numerics.md). */
#define DEFAULT_GROUPS 4

void fxa_ulysses_member_shard(const fxa_mpi_attn_plan *p, int64_t seq, int v, int64_t *off,
                              int64_t *len)
{
    const fxa_mpi *m = p->m;
    int64_t row_start;
    int64_t start;
    int64_t l0;
    fxa_mpi_shard_of(&p->d, seq, m->size, m->c * m->ulysses, &row_start, &l0);
    fxa_mpi_shard_of(&p->d, seq, m->size, m->c * m->ulysses + v, &start, len);
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

static int64_t n_pieces(int64_t n, int64_t piece)
{
    return (n + piece - 1) / piece;
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
    const int64_t row = fxa_ulysses_back_row(dim);
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
            fxa_ulysses_member_shard(p, d->seq_q, v, &off, &qn);
            fxa_ulysses_member_shard(p, d->seq_kv, v, &off, &kn);
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

/* R == 1: the pipeline's local problems, group by group: with aligned
 * heads (whole kv heads with all their q heads) a plan per group, one
 * stage per batch; else (replicated kv heads) the plan's segments, one per
 * (batch, kv head), each in its kv head's group. The largest stage's
 * workspace becomes the plan's. */
static fxa_status plan_stages(fxa_mpi_attn_plan *p, fxa_ulysses_bufs *u, char *msg, size_t cap)
{
    const fxa_attn_desc *d = &p->d;
    const int me = p->m->u;
    const int64_t per_kv = d->heads_q / d->heads_kv;
    const int aligned =
        p->hq_lo[me] == p->hkv_lo[me] * per_kv && p->hq_hi[me] == p->hkv_hi[me] * per_kv;
    const int64_t most = aligned ? d->batch * u->groups : p->n_seg;
    u->stage = calloc((size_t)most + 1, sizeof *u->stage);
    u->stage_at = calloc((size_t)u->groups + 1, sizeof(int));
    u->plans = calloc((size_t)u->groups, sizeof *u->plans);
    if (!u->stage || !u->stage_at || !u->plans) {
        snprintf(msg, cap, "out of memory for the Ulysses pipeline");
        return FXA_ERR_NO_MEMORY;
    }
    int n = 0;
    for (int g = 0; g < u->groups && p->n_seg > 0; g++) {
        int64_t q0;
        int64_t nq;
        int64_t k0;
        int64_t nk;
        fxa_ulysses_group(p, u->groups, me, g, &q0, &nq, &k0, &nk);
        if (aligned && nq > 0) {
            size_t ws = 0;
            const fxa_status st =
                fxa_mpi_local_plan(p, 1, nq, nk, FXA_LAYOUT_BHSD, &u->plans[g], &ws);
            if (st != FXA_OK) {
                snprintf(msg, cap, "%s", fxa_ctx_last_error(p->m->ctx));
                return st;
            }
            p->ws_bytes = ws > p->ws_bytes ? ws : p->ws_bytes;
            for (int64_t b = 0; b < d->batch; b++)
                u->stage[n++] = (fxa_mpi_segment){b, 1, q0, nq, k0, nk, u->plans[g], ws};
        }
        for (int i = 0; !aligned && i < p->n_seg; i++) {
            const fxa_mpi_segment *s = &p->seg[i];
            if (s->kv0 < k0 || s->kv0 >= k0 + nk)
                continue;
            u->stage[n++] = *s;
            p->ws_bytes = s->ws_bytes > p->ws_bytes ? s->ws_bytes : p->ws_bytes;
        }
        u->stage_at[g + 1] = n;
    }
    for (int g = 1; g <= u->groups; g++)
        u->stage_at[g] = u->stage_at[g] > u->stage_at[g - 1] ? u->stage_at[g] : u->stage_at[g - 1];
    return FXA_OK;
}

fxa_status fxa_ulysses_plan(fxa_mpi_attn_plan *p, char *msg, size_t cap)
{
    const fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int n = m->ulysses;
    const size_t dim = (size_t)d->head_dim;
    const size_t b = (size_t)d->batch;
    const size_t nkv = (size_t)fxa_mpi_loc_hkv(p);
    const size_t own_kv = (size_t)p->blk_skv[m->c];
    const size_t rows = b * (size_t)fxa_mpi_loc_hq(p) * (size_t)p->loc_sq;
    fxa_ulysses_bufs *u = calloc(1, sizeof *u);
    p->ulysses_bufs = u;
    if (!u) {
        snprintf(msg, cap, "out of memory for the Ulysses exchange");
        return FXA_ERR_NO_MEMORY;
    }
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
        snprintf(msg, cap, "out of memory for the Ulysses exchange");
        return FXA_ERR_NO_MEMORY;
    }
    int in_reqs;
    size_exchanges(p, u, &in_reqs);
    const double tensors = (double)rows * (double)dim * (double)(p->es + sizeof(float)) +
                           2.0 * (double)(b * nkv * own_kv * dim * p->es) +
                           (double)rows * (5 * sizeof(float) + 1);
    const double staging =
        (double)u->in_send_at[u->groups] * (double)p->es +
        (double)(u->back_at[pairs - 1] + u->back_from[pairs - 1]) * sizeof(float);
    const fxa_status sm = fxa_mpi_plan_take(p, tensors + staging,
                                            "the Ulysses exchange's tensors and staging", msg, cap);
    if (sm != FXA_OK)
        return sm;
    u->q = malloc(rows * dim * p->es + 1);
    u->k = malloc(b * nkv * own_kv * dim * p->es + 1);
    u->v = malloc(b * nkv * own_kv * dim * p->es + 1);
    u->out = malloc(rows * dim * sizeof(float) + 1);
    u->lse = malloc(rows * sizeof(float) + 1);
    u->parts = malloc(3 * rows * sizeof(float) + 1);
    u->bound = malloc(rows * sizeof(float) + 1);
    u->fb = malloc(rows + 1);
    u->in_send = malloc((size_t)u->in_send_at[u->groups] * p->es + 1);
    u->back_send = malloc((size_t)u->back_at[pairs - 1] * sizeof(float) + 1);
    u->back_recv = malloc((size_t)u->back_from[pairs - 1] * sizeof(float) + 1);
    u->in_req = malloc((size_t)in_reqs * sizeof(MPI_Request) + 1);
    u->pend_req = malloc((size_t)u->pend_at[n] * sizeof(MPI_Request) + 1);
    if (!u->q || !u->k || !u->v || !u->out || !u->lse || !u->parts || !u->bound || !u->fb ||
        !u->in_send || !u->back_send || !u->back_recv || !u->in_req || !u->pend_req) {
        snprintf(msg, cap, "out of memory for the Ulysses buffers (%zu bytes of head-sharded Q)",
                 rows * dim * p->es);
        return FXA_ERR_NO_MEMORY;
    }
    return m->ring == 1 ? plan_stages(p, u, msg, cap) : FXA_OK;
}

void fxa_ulysses_plan_free(fxa_mpi_attn_plan *p)
{
    fxa_ulysses_bufs *u = p->ulysses_bufs;
    if (!u)
        return;
    for (int g = 0; u->plans && g < u->groups; g++)
        fxa_attn_plan_destroy(u->plans[g]);
    FXA_FREE_EACH(u->plans, u->stage, u->stage_at, u->in_send, u->back_send, u->back_recv,
                  u->back_at, u->back_from, u->in_req, u->in_req_at, u->pend_req, u->pend_at,
                  u->pend_n, u->in_send_at, u->q, u->k, u->v, u->out, u->lse, u->parts, u->bound,
                  u->fb, u);
    p->ulysses_bufs = NULL;
}
