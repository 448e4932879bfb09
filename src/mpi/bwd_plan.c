/*
 * The distributed backward's plan (bwd.h): agree on the descriptor, refuse
 * what is not implemented (replicated kv heads), split heads and tokens,
 * plan the local backward (R == 1: this rank's heads over the whole
 * sequence; R > 1: the ring's, bwd_ring.c) and allocate every buffer the
 * runs use.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/struct_size.h"
#include "bwd.h"

static uint64_t hash_desc(const fxa_attn_desc *d)
{
    /* Field by field: padding bytes must not enter the hash. */
    const int64_t ints[] = {d->batch,    d->heads_q,        d->heads_kv, d->seq_q, d->seq_kv,
                            d->head_dim, d->layout,         d->dtype,    d->mode,  d->center,
                            d->compute,  d->heads_per_tile, d->block_q};
    uint64_t h = fxa_mpi_hash(0x6b77645f61747466ull, ints, sizeof ints);
    return fxa_mpi_hash(h, &d->scale, sizeof d->scale);
}

void fxa_mpi_attn_bwd_plan_destroy(fxa_mpi_attn_bwd_plan *p)
{
    if (!p)
        return;
    fxa_attn_bwd_plan_destroy(p->local);
    fxa_bwd_ring_free(p);
    free(p->ws);
    free(p->bufs);
    free(p->req);
    free(p->tables);
    free(p);
}

/* What this descriptor and grid cannot run (msg says why), else FXA_OK. */
static fxa_status check_desc(const fxa_mpi *m, const fxa_attn_desc *d, char *msg, size_t cap)
{
    fxa_attn_strides zero;
    memset(&zero, 0, sizeof zero);
    if (d->causal || d->mask_kind != FXA_MASK_NONE) {
        snprintf(msg, cap,
                 "libfxattn_mpi takes no attention mask and no causal (mask_kind %d, causal %d)",
                 (int)d->mask_kind, d->causal);
        return FXA_ERR_UNSUPPORTED;
    }
    if (d->out_dtype != FXA_F32 || memcmp(&d->q_strides, &zero, sizeof zero) ||
        memcmp(&d->k_strides, &zero, sizeof zero) || memcmp(&d->v_strides, &zero, sizeof zero) ||
        memcmp(&d->o_strides, &zero, sizeof zero)) {
        snprintf(msg, cap,
                 "libfxattn_mpi takes contiguous BSHD or BHSD shards (strides left 0) and fp32 "
                 "output (out_dtype FXA_F32)");
        return FXA_ERR_UNSUPPORTED;
    }
    if (d->heads_kv > 0 && d->heads_kv < m->ulysses) {
        snprintf(msg, cap,
                 "the distributed backward needs whole kv heads per rank (heads_kv %lld < "
                 "ulysses %d is not implemented)",
                 (long long)d->heads_kv, m->ulysses);
        return FXA_ERR_UNSUPPORTED;
    }
    return FXA_OK;
}

/* Head and token splits, staging offsets and the request count. */
static void size_plan(fxa_mpi_attn_bwd_plan *p)
{
    const fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int n = m->ulysses;
    const int me = m->u;
    const int64_t group = d->heads_q / d->heads_kv;
    const int64_t dim = d->head_dim;
    const int64_t es = (int64_t)p->es;
    const int64_t q_row = dim * es + 8 * dim + 4; /* q, out, dout, lse */
    const int64_t kv_row = 2 * dim * es;          /* k, v */
    for (int v = 0; v < n; v++) {
        int64_t lo;
        int64_t hi;
        fxa_mpi_split(d->heads_kv, n, v, &lo, &hi);
        p->hkv[v] = lo;
        p->hkv[v + 1] = hi;
        p->hq[v] = lo * group;
        p->hq[v + 1] = hi * group;
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
    const int64_t nq = p->hq[me + 1] - p->hq[me];
    const int64_t nk = p->hkv[me + 1] - p->hkv[me];
    int64_t in_req = 0;
    int64_t back_req = 0;
    p->in_send_at[0] = p->in_recv_at[0] = p->back_send_at[0] = p->back_recv_at[0] = 0;
    for (int v = 0; v < n; v++) {
        const int64_t vq = p->hq[v + 1] - p->hq[v];
        const int64_t vk = p->hkv[v + 1] - p->hkv[v];
        const int64_t qn = p->tq[p->base + v + 1] - p->tq[p->base + v];
        const int64_t kn = p->tk[p->base + v + 1] - p->tk[p->base + v];
        const int64_t in_send = d->batch * (vq * p->q_len * q_row + vk * p->kv_len * kv_row);
        const int64_t in_recv = d->batch * (nq * qn * q_row + nk * kn * kv_row);
        const int64_t back_send = d->batch * 4 * dim * (nq * qn + 2 * nk * kn);
        const int64_t back_recv = d->batch * 4 * dim * (vq * p->q_len + 2 * vk * p->kv_len);
        p->in_send_at[v + 1] = p->in_send_at[v] + in_send;
        p->in_recv_at[v + 1] = p->in_recv_at[v] + (v == me ? 0 : in_recv);
        p->back_send_at[v + 1] = p->back_send_at[v] + back_send;
        p->back_recv_at[v + 1] = p->back_recv_at[v] + (v == me ? 0 : back_recv);
        if (v != me) {
            in_req += fxa_bwd_pieces(p, in_send) + fxa_bwd_pieces(p, in_recv);
            back_req += fxa_bwd_pieces(p, back_send) + fxa_bwd_pieces(p, back_recv);
        }
    }
    p->n_req = (int)(in_req > back_req ? in_req : back_req);
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
        ld.heads_q = p->hq[me + 1] - p->hq[me];
        ld.heads_kv = p->hkv[me + 1] - p->hkv[me];
        ld.layout = FXA_LAYOUT_BHSD;
    }
    return ld;
}

/* With R == 1 the local backward plan; with U > 1 the head-sharded
 * tensors and staging. msg says why on failure. */
static fxa_status plan_buffers(fxa_mpi_attn_bwd_plan *p, char *msg, size_t cap)
{
    const fxa_mpi *m = p->m;
    const int n = m->ulysses;
    const fxa_attn_desc ld = local_desc(p);
    if (m->ring == 1) {
        const fxa_status st = fxa_attn_bwd_plan_create(m->ctx, &ld, &p->local, &p->ws_bytes);
        if (st != FXA_OK) {
            snprintf(msg, cap, "%s", fxa_ctx_last_error(m->ctx));
            return st;
        }
    }
    const int64_t dim = p->d.head_dim;
    const int64_t qrows = n > 1 ? p->d.batch * ld.heads_q * ld.seq_q : 0;
    const int64_t krows = n > 1 ? p->d.batch * ld.heads_kv * ld.seq_kv : 0;
    const int64_t send =
        p->in_send_at[n] > p->back_send_at[n] ? p->in_send_at[n] : p->back_send_at[n];
    const int64_t recv =
        p->in_recv_at[n] > p->back_recv_at[n] ? p->in_recv_at[n] : p->back_recv_at[n];
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
                          n > 1 ? send : 0,
                          n > 1 ? recv : 0};
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
    }
    return FXA_OK;
}

fxa_status fxa_mpi_attn_bwd_plan_create(fxa_mpi *m, const fxa_attn_desc *d,
                                        fxa_mpi_attn_bwd_plan **out)
{
    if (!m)
        return FXA_ERR_INVALID_ARG;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    m->last_error[0] = '\0';
    char msg[512] = "";
    fxa_status st = FXA_OK;
    fxa_mpi_attn_bwd_plan *p = NULL;
    fxa_attn_bwd_plan *check = NULL;
    size_t ws;
    if (out)
        *out = NULL;
    fxa_attn_desc full;
    fxa_attn_desc_init(&full);
    if (!d || !out) {
        st = FXA_ERR_INVALID_ARG;
        snprintf(msg, sizeof msg, "NULL descriptor or output");
    } else if ((st = fxa_struct_in(&full, sizeof full, d, FXA_ATTN_DESC_SIZE_0_1, "fxa_attn_desc",
                                   msg, sizeof msg)) != FXA_OK) {
        /* msg says why */
    } else if ((st = fxa_attn_bwd_plan_create(m->ctx, (d = &full), &check, &ws)) != FXA_OK) {
        snprintf(msg, sizeof msg, "%s", fxa_ctx_last_error(m->ctx));
    } else {
        st = check_desc(m, d, msg, sizeof msg);
    }
    fxa_attn_bwd_plan_destroy(check);
    st = fxa_mpi_agree(m, st, msg);
    if (st != FXA_OK)
        return st;
    st = fxa_mpi_same_everywhere(m, hash_desc(d), "the attention descriptor (shapes and options)");
    if (st != FXA_OK)
        return st;
    const size_t nu = (size_t)m->size; /* U or R, whichever is P */
    p = calloc(1, sizeof *p);
    if (p && (p->tables = calloc(9 * (nu + 1), sizeof(int64_t))) != NULL) {
        int64_t *t = p->tables;
        p->hq = t;
        p->hkv = t + (nu + 1);
        p->tq = t + 2 * (nu + 1);
        p->tk = t + 3 * (nu + 1);
        p->in_send_at = t + 4 * (nu + 1);
        p->in_recv_at = t + 5 * (nu + 1);
        p->back_send_at = t + 6 * (nu + 1);
        p->back_recv_at = t + 7 * (nu + 1);
        p->blk = t + 8 * (nu + 1);
    }
    if (!p || !p->tables) {
        st = FXA_ERR_NO_MEMORY;
        snprintf(msg, sizeof msg, "out of memory for the distributed backward's plan");
    } else {
        int64_t start;
        p->m = m;
        p->d = *d;
        p->call = hash_desc(d) | 1;
        p->es = d->dtype == FXA_F32 ? 4 : 2;
        p->piece = m->test_ulysses_piece > 0 && m->test_ulysses_piece < FXA_BWD_PIECE
                       ? m->test_ulysses_piece
                       : FXA_BWD_PIECE;
        fxa_mpi_shard(d->seq_q, m->size, m->rank, &start, &p->q_len);
        fxa_mpi_shard(d->seq_kv, m->size, m->rank, &start, &p->kv_len);
        size_plan(p);
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
    if (st != FXA_OK) {
        fxa_mpi_attn_bwd_plan_destroy(p);
        return st;
    }
    *out = p;
    return FXA_OK;
}
