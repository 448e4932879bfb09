/*
 * The ring along a grid column (R ranks): queries stay, K/V blocks rotate.
 * One MPI_Allgather brings every block's summary (and every rank's status)
 * to every rank; each rank then merges them into the global bound and, hop
 * by hop, adds the block it holds into its accumulators while the next
 * `prefetch` blocks travel: nonblocking receives into rotating slots, each
 * block forwarded to the next rank as soon as it has arrived, progress
 * driven between batches of compute. A rank that fails locally keeps
 * forwarding (so no peer waits forever) and computes nothing; the caller
 * agrees on the outcome afterwards.
 *
 * Blocks are added in a fixed order: at step t, rank c adds rank (c - t)'s
 * block, and only after waiting for all of it; arrival times and the
 * prefetch depth decide when a step may start, never what it adds, so
 * repeated runs write the same bytes (tests/mpi/repeat_bytes.sh). A slot is
 * received into again only after its forward has completed.
 *
 * A block's K (and V) goes as pieces of at most INT_MAX elements (MPI
 * counts are ints), all with the block's tag: MPI does not let messages of
 * one sender and tag overtake each other, so piece i lands in receive i.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_internal.h"

typedef struct ring_reqs {
    MPI_Request *req; /* per slot: recv K, recv V, send K, send V pieces */
    int n;
} ring_reqs;

/* Elements per message: INT_MAX. Test only: FXA_MPI_TEST_MAX_ELEMENTS (a
 * positive count below that, read by fxa_mpi_create) forces small pieces,
 * so that tests of the pieces need no 8 GB blocks. */
static int64_t piece_elems(const fxa_mpi *m)
{
    const int64_t cap = m->test_max_elements;
    return cap > 0 && cap < INT_MAX ? cap : INT_MAX;
}

/* Post the receives (recv = 1) or sends of n elements at buf (es bytes
 * each) as pieces of at most cap elements, into reqs[0 ...]. */
static fxa_status post_pieces(fxa_mpi *m, int recv, char *buf, int64_t n, size_t es,
                              MPI_Datatype type, int peer, int tag, int64_t cap, MPI_Request *reqs)
{
    for (int64_t at = 0, i = 0; at < n; at += cap, i++) {
        const int c = (int)(n - at < cap ? n - at : cap);
        char *p = buf + (size_t)at * es;
        const int rc = recv ? MPI_Irecv(p, c, type, peer, tag, m->col_comm, &reqs[i])
                            : MPI_Isend(p, c, type, peer, tag, m->col_comm, &reqs[i]);
        if (rc != MPI_SUCCESS)
            return fxa_mpi_fail(m, FXA_ERR_MPI, "%s failed in the ring",
                                recv ? "MPI_Irecv" : "MPI_Isend");
    }
    return FXA_OK;
}

static void ring_progress(void *arg)
{
    ring_reqs *r = arg;
    int done;
    MPI_Testall(r->n, r->req, &done, MPI_STATUSES_IGNORE);
}

/* Summaries of this rank's own block for every segment, gathered over the
 * column: all[r * len ...] = rank r's [status, seg 0 summary, seg 1 ...].
 * pre: this rank's status so far (a failure is sent instead of summaries). */
static fxa_status gather_summaries(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, fxa_status pre,
                                   double **all_out, size_t *len_out, int *column_failed)
{
    fxa_mpi *m = p->m;
    const int64_t own = p->blk_skv[m->c];
    size_t len = 1;
    for (int i = 0; i < p->n_seg; i++)
        len += fxa_kv_summary_len(p->seg[i].plan);
    double *mine = calloc(len, sizeof(double));
    double *all = calloc(len * (size_t)p->m->ring, sizeof(double));
    fxa_status st = pre;
    if (!mine || !all) {
        free(mine);
        free(all);
        return fxa_mpi_fail(m, FXA_ERR_NO_MEMORY, "out of memory for the ring summaries");
    }
    size_t at = 1;
    for (int i = 0; i < p->n_seg && st == FXA_OK; i++) {
        const fxa_mpi_segment *s = &p->seg[i];
        const int64_t off = fxa_mpi_seg_kv(p, s, own) * (int64_t)p->es;
        st = fxa_kv_summarize(s->plan, loc->k + off, loc->v + off, own, mine + at);
        if (st != FXA_OK)
            fxa_mpi_fail(m, st, "%s", fxa_ctx_last_error(m->ctx));
        at += fxa_kv_summary_len(s->plan);
    }
    mine[0] = (double)st;
    const fxa_status sg =
        fxa_mpi_allgather(m, mine, (int)len, all, MPI_DOUBLE, m->col_comm, "the ring summaries");
    st = sg != FXA_OK ? sg : st;
    for (int r = 0; r < m->ring; r++)
        *column_failed |= all[(size_t)r * len] != 0.0;
    free(mine);
    *all_out = all;
    *len_out = len;
    return st;
}

/* Begin every segment's accumulator with the column's summaries. */
static fxa_status begin_all(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, const double *all,
                            size_t len)
{
    fxa_mpi *m = p->m;
    size_t at = 1;
    for (int i = 0; i < p->n_seg; i++) {
        const fxa_mpi_segment *s = &p->seg[i];
        const size_t sl = fxa_kv_summary_len(s->plan);
        double *sums = malloc(sl * (size_t)m->ring * sizeof(double));
        fxa_status st = sums ? FXA_OK : FXA_ERR_NO_MEMORY;
        if (st == FXA_OK) {
            for (int r = 0; r < m->ring; r++)
                memcpy(sums + (size_t)r * sl, all + (size_t)r * len + at, sl * sizeof(double));
            const int64_t q_off = fxa_mpi_seg_row(p, s) * p->d.head_dim * (int64_t)p->es;
            st = fxa_attn_acc_begin(p->accs[i], loc->q + q_off, sums, m->ring);
        }
        free(sums);
        if (st != FXA_OK)
            return fxa_mpi_fail(m, st, "%s",
                                st == FXA_ERR_NO_MEMORY ? "out of memory for the ring summaries"
                                                        : fxa_ctx_last_error(m->ctx));
        at += sl;
    }
    return FXA_OK;
}

fxa_status fxa_ring_run(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, int *column_failed,
                        fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    const int ring = m->ring;
    const int nb = m->prefetch + 1;
    const int next = (m->c + 1) % ring;
    const int prev = (m->c + ring - 1) % ring;
    const int64_t per_key = p->d.batch * fxa_mpi_loc_hkv(p) * p->d.head_dim;
    const MPI_Datatype type = p->es == 4 ? MPI_FLOAT : MPI_UINT16_T;
    const size_t es = p->es;
    const int64_t cap = piece_elems(m);
    const int64_t most = per_key * p->max_blk_skv;
    const int np = (int)(most > cap ? (most + cap - 1) / cap : 1); /* pieces per tensor */
    *column_failed = 0;
    if (p->n_seg == 0)
        return FXA_OK; /* no heads in this column: nothing to compute or send */
    ring_reqs rq = {malloc((size_t)(4 * nb) * (size_t)np * sizeof(MPI_Request)), 4 * nb * np};
    fxa_status st =
        rq.req ? FXA_OK
               : fxa_mpi_fail(m, FXA_ERR_NO_MEMORY, "out of memory for the ring's requests");
    double *all = NULL;
    size_t len = 0;
    st = gather_summaries(p, loc, st, &all, &len, column_failed);
    if (st != FXA_OK || *column_failed) {
        free(all);
        free(rq.req);
        return st;
    }
    /* A local failure here (a non-finite Q) stops compute, not forwarding;
     * a rank without query tokens (S smaller than the ranks) only forwards. */
    const int computes = p->loc_sq > 0;
    fxa_status own = computes ? begin_all(p, loc, all, len) : FXA_OK;
    free(all);
    fxa_attn_acc **accs = p->accs;
    char *slots = p->slots;
    const size_t slot_bytes = p->slot_bytes;
    for (int i = 0; i < rq.n; i++)
        rq.req[i] = MPI_REQUEST_NULL;
    for (int i = 0; i < p->n_seg; i++)
        if (accs[i])
            fxa_attn_acc_set_progress(accs[i], ring_progress, &rq);
            /* Block t is rank (c - t)'s; blocks t >= 1 live in slot t % nb. */
#define SLOT_K(t) (slots + (size_t)(2 * ((t) % nb)) * slot_bytes)
#define SLOT_V(t) (slots + (size_t)(2 * ((t) % nb) + 1) * slot_bytes)
#define REQ(t, i) (&rq.req[(size_t)(4 * ((t) % nb) + (i)) * (size_t)np])
    for (int t = 1; t <= m->prefetch && t < ring && st == FXA_OK; t++) {
        const int64_t n = per_key * p->blk_skv[(m->c - t + ring) % ring];
        st = post_pieces(m, 1, SLOT_K(t), n, es, type, prev, 2 * t, cap, REQ(t, 0));
        if (st == FXA_OK)
            st = post_pieces(m, 1, SLOT_V(t), n, es, type, prev, 2 * t + 1, cap, REQ(t, 1));
    }
    for (int t = 0; t < ring && st == FXA_OK; t++) {
        const int64_t n_kv = p->blk_skv[(m->c - t + ring) % ring];
        const char *k = t == 0 ? loc->k : SLOT_K(t);
        const char *v = t == 0 ? loc->v : SLOT_V(t);
        double t0 = MPI_Wtime();
        if (t > 0)
            st = fxa_mpi_wait(m, 2 * np, REQ(t, 0), prev, "the ring's K/V block");
        const double waited = MPI_Wtime() - t0;
        /* Forward block t: the next rank's block t + 1. */
        if (st == FXA_OK && t + 1 < ring) {
            const int64_t n = per_key * n_kv;
            /* (MPI_Isend does not write its buffer: the casts drop const only.) */
            st = post_pieces(m, 0, (char *)k, n, es, type, next, 2 * (t + 1), cap, REQ(t, 2));
            if (st == FXA_OK)
                st = post_pieces(m, 0, (char *)v, n, es, type, next, 2 * (t + 1) + 1, cap,
                                 REQ(t, 3));
        }
        const double t1 = MPI_Wtime();
        for (int i = 0; computes && i < p->n_seg && st == FXA_OK && own == FXA_OK; i++) {
            const int64_t off = fxa_mpi_seg_kv(p, &p->seg[i], n_kv) * (int64_t)p->es;
            own = fxa_attn_acc_add(accs[i], k + off, v + off, n_kv);
            if (own != FXA_OK)
                fxa_mpi_fail(m, own, "%s", fxa_ctx_last_error(m->ctx));
        }
        const double t2 = MPI_Wtime();
        /* Slot t % nb is reused for block t + nb once its forward is done. */
        if (st == FXA_OK)
            st = fxa_mpi_wait(m, 2 * np, REQ(t, 2), next, "forwarding the ring's K/V block");
        if (st == FXA_OK && t + nb < ring) {
            const int tn = t + nb;
            const int64_t n = per_key * p->blk_skv[(m->c - tn + ring) % ring];
            st = post_pieces(m, 1, SLOT_K(tn), n, es, type, prev, 2 * tn, cap, REQ(tn, 0));
            if (st == FXA_OK)
                st = post_pieces(m, 1, SLOT_V(tn), n, es, type, prev, 2 * tn + 1, cap, REQ(tn, 1));
        }
        const double wait = waited + (MPI_Wtime() - t2);
        p->step_compute[t] = t2 - t1;
        p->step_wait[t] = wait;
        if (stats) {
            stats->ring_compute_seconds += t2 - t1;
            stats->ring_wait_seconds += wait;
        }
    }
#undef SLOT_K
#undef SLOT_V
#undef REQ
    for (int i = 0; i < p->n_seg; i++)
        if (accs[i])
            fxa_attn_acc_set_progress(accs[i], NULL, NULL);
    free(rq.req);
    return st != FXA_OK ? st : own;
}
