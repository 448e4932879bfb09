/*
 * The distributed backward's ring (R > 1) along each column of the grid,
 * on ring_d's problem: the caller's shards (U == 1) or this rank's heads
 * over its row's tokens after the Ulysses exchange (U > 1). Ring rank c
 * keeps its queries, O, dO and lse, and its dQ; the K/V blocks travel the
 * ring (from rank c - 1 to c + 1) together with their dK/dV accumulators. At
 * step s rank c holds block j = c - s (mod R): fxa_attn_bwd_run on (its
 * queries, block j) gives exact parts of the gradients (D = rowsum(dO * O)
 * and P = exp(tau q.k - lse) need only the global O and lse), so
 *   dQ_c  = sum over s of the parts, in step order (block c first);
 *   dK_j, dV_j = sum over the ranks the block visits, in ring order
 *          (rank j first); after step R - 1 the accumulator goes to rank
 *          c + 1, which is block j's owner.
 * Both orders are fixed: repeated runs write the same bytes. K/V of step
 * s + 1 travel while step s computes; the accumulator of block j arrives
 * while its next holder computes its part.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bwd.h"

enum { TAG_RING_KV = 21, TAG_RING_ACC = 22 };

/* Elements of a block of n keys (one of K, V, dK, dV). */
static int64_t kv_elems(const fxa_mpi_attn_bwd_plan *p, int64_t n)
{
    return p->ring_d.batch * p->ring_d.heads_kv * n * p->ring_d.head_dim;
}

static int64_t blk_len(const fxa_mpi_attn_bwd_plan *p, int j)
{
    return p->blk[j];
}

void fxa_bwd_ring_free(fxa_mpi_attn_bwd_plan *p)
{
    for (int j = 0; p->blk_plan && j < p->m->ring; j++)
        fxa_attn_bwd_plan_destroy(p->blk_plan[j]);
    free(p->blk_plan);
    free(p->kv_req);
    free(p->ring_bufs);
}

fxa_status fxa_bwd_ring_plan(fxa_mpi_attn_bwd_plan *p, char *msg, size_t cap)
{
    fxa_mpi *m = p->m;
    const int r = m->ring;
    p->blk_plan = calloc((size_t)r, sizeof *p->blk_plan);
    if (!p->blk_plan) {
        snprintf(msg, cap, "out of memory for the ring's plans");
        return FXA_ERR_NO_MEMORY;
    }
    int64_t most = 0;
    for (int j = 0; j < r; j++) {
        most = blk_len(p, j) > most ? blk_len(p, j) : most;
        if (p->ring_d.seq_q == 0 || p->ring_d.heads_q == 0 || blk_len(p, j) == 0)
            continue;
        fxa_attn_desc ld = p->ring_d;
        ld.seq_kv = blk_len(p, j);
        size_t ws = 0;
        const fxa_status st = fxa_attn_bwd_plan_create(m->ctx, &ld, &p->blk_plan[j], &ws);
        if (st != FXA_OK) {
            snprintf(msg, cap, "%s", fxa_ctx_last_error(m->ctx));
            return st;
        }
        p->ws_bytes = ws > p->ws_bytes ? ws : p->ws_bytes;
    }
    const int64_t kv = 2 * kv_elems(p, most) * (int64_t)p->es; /* K then V, bytes */
    const int64_t acc = 2 * kv_elems(p, most) * 4;             /* dK then dV */
    const int64_t q =
        p->ring_d.batch * p->ring_d.heads_q * p->ring_d.seq_q * p->ring_d.head_dim * 4;
    const int64_t sz[] = {kv, kv, acc, acc, acc, q, q};
    enum { N_REG = sizeof sz / sizeof sz[0] };
    int64_t at[N_REG + 1];
    at[0] = 0;
    for (int i = 0; i < N_REG; i++)
        at[i + 1] = at[i] + (sz[i] + 63) / 64 * 64;
    p->n_kv_req = (int)(2 * fxa_bwd_pieces(p, kv));
    p->n_acc_req = (int)(2 * fxa_bwd_pieces(p, acc));
    /* The workspace counts here; the plan allocates it last. */
    const double total = (double)at[N_REG] + (double)p->ws_bytes +
                         (double)(p->n_kv_req + p->n_acc_req) * (double)sizeof(MPI_Request);
    const uint64_t avail = fxa_available_memory();
    if (total > (double)avail) {
        snprintf(msg, cap, "needs %.1f GiB, %.1f GiB available (the ring backward's buffers)",
                 total / 1073741824.0, (double)avail / 1073741824.0);
        return FXA_ERR_NO_MEMORY;
    }
    /* At least one line: a rank without heads (replicated kv heads) copies
     * zero bytes, from and to valid pointers. */
    p->ring_bufs = aligned_alloc(64, (size_t)(at[N_REG] ? at[N_REG] : 64));
    p->kv_req = malloc((size_t)(p->n_kv_req + p->n_acc_req + 1) * sizeof *p->kv_req);
    if (!p->ring_bufs || !p->kv_req) {
        snprintf(msg, cap, "out of memory for the ring backward's buffers (%.0f bytes)", total);
        return FXA_ERR_NO_MEMORY;
    }
    p->acc_req = p->kv_req + p->n_kv_req;
    char *b = p->ring_bufs;
    p->kv_slot[0] = b + at[0];
    p->kv_slot[1] = b + at[1];
    p->acc_in = (float *)(b + at[2]);
    p->acc_out = (float *)(b + at[3]);
    p->kv_part = (float *)(b + at[4]);
    p->dq_part = (float *)(b + at[5]);
    p->dq_acc = (float *)(b + at[6]);
    return FXA_OK;
}

/* Post a send or receive of n bytes at buf with column rank peer, in
 * pieces, into reqs[*at], reqs[*at + 1], ... */
static fxa_status post(fxa_mpi_attn_bwd_plan *p, int send, void *buf, int64_t n, int peer, int tag,
                       MPI_Request *reqs, int *at)
{
    fxa_mpi *m = p->m;
    for (int64_t i = 0; i < n; i += p->piece) {
        const int c = (int)(n - i < p->piece ? n - i : p->piece);
        char *x = (char *)buf + i;
        const int rc = send ? MPI_Isend(x, c, MPI_BYTE, peer, tag, m->col_comm, &reqs[*at])
                            : MPI_Irecv(x, c, MPI_BYTE, peer, tag, m->col_comm, &reqs[*at]);
        if (rc != MPI_SUCCESS)
            return fxa_mpi_fail(m, FXA_ERR_MPI, "%s failed in the ring backward",
                                send ? "MPI_Isend" : "MPI_Irecv");
        (*at)++;
    }
    return FXA_OK;
}

/* dst[i] = a[i] + b[i] (a NULL: dst = b) for n floats. */
static void add(float *dst, const float *a, const float *b, int64_t n)
{
    if (!a) {
        memcpy(dst, b, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++)
        dst[i] = a[i] + b[i];
}

/* Step s's part: this rank's queries against the block at kv (j's keys):
 * dQ's part into dq_part, dK then dV into kv_part. */
static fxa_status part(fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a, int j, const char *kv)
{
    const int64_t n = kv_elems(p, blk_len(p, j));
    const fxa_attn_bwd_args la = {.struct_size = sizeof la,
                                  .q = a->q,
                                  .k = kv,
                                  .v = kv + (size_t)n * p->es,
                                  .out = a->out,
                                  .dout = a->dout,
                                  .lse = a->lse,
                                  .lse_parts = a->lse_parts,
                                  .dq = p->dq_part,
                                  .dk = p->kv_part,
                                  .dv = p->kv_part + n};
    const fxa_status st = fxa_attn_bwd_run(p->blk_plan[j], &la, p->ws, NULL);
    if (st != FXA_OK)
        fxa_mpi_fail(p->m, st, "%s", fxa_ctx_last_error(p->m->ctx));
    return st;
}

fxa_status fxa_bwd_ring_run(fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a,
                            fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    const int r = m->ring;
    const int c = m->c;
    const int prev = (c + r - 1) % r;
    const int next = (c + 1) % r;
    const int64_t nq = p->ring_d.batch * p->ring_d.heads_q * p->ring_d.seq_q * p->ring_d.head_dim;
    const int64_t own = kv_elems(p, blk_len(p, c));
    /* This rank's block (K then V) into slot 0: what travels. */
    memcpy(p->kv_slot[0], a->k, (size_t)own * p->es);
    memcpy(p->kv_slot[0] + (size_t)own * p->es, a->v, (size_t)own * p->es);
    int n_acc_send = 0; /* the accumulator sent last step, still pending */
    int first_q = 1;    /* dq_acc holds no part yet */
    /* A local run that fails (a non-finite input, a bound) keeps the ring
     * going, its blocks passed on as they came, so that every rank reaches
     * the agreement: own holds its status, st the exchange's. */
    fxa_status own_st = FXA_OK;
    fxa_status st = FXA_OK;
    for (int s = 0; s < r && st == FXA_OK; s++) {
        const int j = (c - s + r) % r;
        const int64_t n = kv_elems(p, blk_len(p, j));
        char *kv = p->kv_slot[s % 2];
        int n_kv = 0;
        int n_acc_recv = 0;
        const double tw = MPI_Wtime();
        if (s < r - 1) {
            const int jn = (c - s - 1 + r) % r;
            st = post(p, 0, p->kv_slot[(s + 1) % 2],
                      2 * kv_elems(p, blk_len(p, jn)) * (int64_t)p->es, prev, TAG_RING_KV,
                      p->kv_req, &n_kv);
            if (st == FXA_OK)
                st = post(p, 1, kv, 2 * n * (int64_t)p->es, next, TAG_RING_KV, p->kv_req, &n_kv);
        }
        MPI_Request *acc_recv = p->acc_req + n_acc_send;
        if (st == FXA_OK && s > 0)
            st = post(p, 0, p->acc_in, 2 * n * 4, prev, TAG_RING_ACC, acc_recv, &n_acc_recv);
        double wait = MPI_Wtime() - tw;
        const double tc = MPI_Wtime();
        /* no queries here, no keys in block j, or a failed local run */
        int empty = !p->blk_plan[j] || own_st != FXA_OK;
        if (st == FXA_OK && !empty) {
            own_st = part(p, a, j, kv);
            empty = own_st != FXA_OK;
        }
        if (st == FXA_OK && !empty) {
            add(p->dq_acc, first_q ? NULL : p->dq_acc, p->dq_part, nq);
            first_q = 0;
        }
        if (stats)
            stats->ring_compute_seconds += MPI_Wtime() - tc;
        const double tw2 = MPI_Wtime();
        if (st == FXA_OK && n_acc_recv)
            st = fxa_mpi_wait(m, n_acc_recv, acc_recv, prev, "the ring backward");
        /* The accumulator sent last step (it had this step's compute to
         * go) leaves acc_out before this step's overwrites it. */
        if (st == FXA_OK && n_acc_send)
            st = fxa_mpi_wait(m, n_acc_send, p->acc_req, next, "the ring backward");
        n_acc_send = 0;
        if (st == FXA_OK) {
            float *out = p->acc_out;
            if (empty && s == 0)
                memset(out, 0, (size_t)(2 * n) * sizeof(float));
            else if (empty)
                memcpy(out, p->acc_in, (size_t)(2 * n) * sizeof(float));
            else
                add(out, s > 0 ? p->acc_in : NULL, p->kv_part, 2 * n);
            st = post(p, 1, out, 2 * n * 4, next, TAG_RING_ACC, p->acc_req, &n_acc_send);
        }
        if (st == FXA_OK && n_kv)
            st = fxa_mpi_wait(m, n_kv, p->kv_req, prev, "the ring backward");
        wait += MPI_Wtime() - tw2;
        if (stats)
            stats->ring_wait_seconds += wait;
    }
    /* This rank's own block's accumulator, back from its last holder. */
    int n_last = 0;
    MPI_Request *last = p->acc_req + n_acc_send;
    if (st == FXA_OK)
        st = post(p, 0, p->acc_in, 2 * own * 4, prev, TAG_RING_ACC, last, &n_last);
    if (st == FXA_OK)
        st = fxa_mpi_wait(m, n_last, last, prev, "the ring backward");
    if (st == FXA_OK && n_acc_send)
        st = fxa_mpi_wait(m, n_acc_send, p->acc_req, next, "the ring backward");
    if (st == FXA_OK && first_q)
        memset(p->dq_acc, 0, (size_t)nq * sizeof(float)); /* no keys anywhere met */
    return st != FXA_OK ? st : own_st;
}

void fxa_bwd_ring_write(const fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a)
{
    const int64_t nq = p->ring_d.batch * p->ring_d.heads_q * p->ring_d.seq_q * p->ring_d.head_dim;
    const int64_t own = kv_elems(p, blk_len(p, p->m->c));
    memcpy(a->dq, p->dq_acc, (size_t)nq * sizeof(float));
    memcpy(a->dk, p->acc_in, (size_t)own * sizeof(float));
    memcpy(a->dv, p->acc_in + own, (size_t)own * sizeof(float));
}
