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
 * Reproducible plans (fxa_attn_desc.reproducible) add the blocks in key
 * order instead: at step t every rank adds rank t's block, which travels
 * from rank t along the same links (each rank forwards it to the next until
 * it reaches rank t - 1), so every rank's rows see the keys in the order one
 * process sees them; the prescaling takes the largest query norm of the
 * whole column (gathered with the summaries). With blocks on canonical group
 * edges (fxa_mpi_shard_canonical) the result is one process's, bit for bit.
 * The cost: rank c's first step waits for block 0 to travel c hops.
 *
 * A block's K (and V) goes as pieces of at most INT_MAX elements (MPI
 * counts are ints), all with the block's tag: MPI does not let messages of
 * one sender and tag overtake each other, so piece i lands in receive i.
 * Every buffer is the plan's (ring_plan.c): a run allocates nothing.
 */
#include <string.h>

#include "attn/acc_api.h"
#include "ring.h"

/* The column's neighbours: blocks come from prev and go to next. */
static int ring_prev(const fxa_mpi *m)
{
    return (m->c + m->ring - 1) % m->ring;
}

static int ring_next(const fxa_mpi *m)
{
    return (m->c + 1) % m->ring;
}

/* The rank whose block step t adds: rank (c - t) around the ring, rank t
 * in key order (reproducible plans). */
static int block_at(const fxa_mpi_attn_plan *p, int t)
{
    const fxa_mpi *m = p->m;
    return p->d.reproducible ? t : (m->c - t + m->ring) % m->ring;
}

/* Keys of block t (0 <= t < R). */
static int64_t block_keys(const fxa_mpi_attn_plan *p, int t)
{
    return p->blk_skv[block_at(p, t)];
}

/* Step t adds this rank's own block (nothing to receive). */
static int own_block(const fxa_mpi_attn_plan *p, int t)
{
    return block_at(p, t) == p->m->c;
}

/* Step t passes its block on: unless the next rank is where it came from. */
static int forwards(const fxa_mpi_attn_plan *p, int t)
{
    return block_at(p, t) != ring_next(p->m);
}

/* The tag of step t's block (K; V is one more) as the next rank receives
 * it: its step t + 1 around the ring, its step t in key order. */
static int forward_tag(const fxa_mpi_attn_plan *p, int t)
{
    return 2 * (p->d.reproducible ? t : t + 1);
}

/* Where block t >= 1 lives: slot t % depth, its K (v = 0) or V (v = 1). */
static char *slot(const fxa_ring_bufs *r, int t, int v)
{
    return r->slots + (size_t)(2 * (t % r->depth) + v) * r->slot_bytes;
}

/* The requests of slot t % depth: kind 0 and 1 receive its K and V, kind
 * 2 and 3 forward them. */
static MPI_Request *slot_reqs(const fxa_ring_bufs *r, int t, int kind)
{
    return &r->req[(size_t)(4 * (t % r->depth) + kind) * (size_t)r->pieces];
}

/* Post the receives (recv = 1) or sends of n elements at buf as pieces of
 * at most the plan's piece, into reqs[0 ...]. */
static fxa_status post_pieces(fxa_mpi_attn_plan *p, int recv, char *buf, int64_t n, int peer,
                              int tag, MPI_Request *reqs)
{
    fxa_mpi *m = p->m;
    const fxa_ring_bufs *r = p->ring_bufs;
    for (int64_t at = 0, i = 0; at < n; at += r->piece, i++) {
        const int c = (int)(n - at < r->piece ? n - at : r->piece);
        char *x = buf + (size_t)at * p->es;
        const int rc = recv ? MPI_Irecv(x, c, r->type, peer, tag, m->col_comm, &reqs[i])
                            : MPI_Isend(x, c, r->type, peer, tag, m->col_comm, &reqs[i]);
        if (rc != MPI_SUCCESS)
            return fxa_mpi_fail(m, FXA_ERR_MPI, "%s failed in the ring",
                                recv ? "MPI_Irecv" : "MPI_Isend");
    }
    return FXA_OK;
}

/* Post the receives of block t (from the previous rank) into its slot. */
static fxa_status receive_block(fxa_mpi_attn_plan *p, int t)
{
    const fxa_ring_bufs *r = p->ring_bufs;
    const int64_t n = r->per_key * block_keys(p, t);
    const int prev = ring_prev(p->m);
    fxa_status st = post_pieces(p, 1, slot(r, t, 0), n, prev, 2 * t, slot_reqs(r, t, 0));
    if (st == FXA_OK)
        st = post_pieces(p, 1, slot(r, t, 1), n, prev, 2 * t + 1, slot_reqs(r, t, 1));
    return st;
}

/* Forward block t (k and v) to the next rank. */
static fxa_status forward_block(fxa_mpi_attn_plan *p, int t, const char *k, const char *v)
{
    const fxa_ring_bufs *r = p->ring_bufs;
    const int64_t n = r->per_key * block_keys(p, t);
    const int next = ring_next(p->m);
    const int tag = forward_tag(p, t);
    /* (MPI_Isend does not write its buffer: the casts drop const only.) */
    fxa_status st = post_pieces(p, 0, (char *)k, n, next, tag, slot_reqs(r, t, 2));
    if (st == FXA_OK)
        st = post_pieces(p, 0, (char *)v, n, next, tag + 1, slot_reqs(r, t, 3));
    return st;
}

/* Add block t (k and v) into every segment's accumulator. A failure (a
 * block refused) is this rank's own: it stops compute, not the ring. */
static fxa_status add_block(fxa_mpi_attn_plan *p, int t, const char *k, const char *v)
{
    const fxa_ring_bufs *r = p->ring_bufs;
    const int64_t n_kv = block_keys(p, t);
    for (int i = 0; i < p->n_seg; i++) {
        const int64_t off = fxa_mpi_seg_kv(p, &p->seg[i], n_kv) * (int64_t)p->es;
        const fxa_status st = fxa_attn_acc_add(r->accs[i], k + off, v + off, n_kv);
        if (st != FXA_OK)
            return fxa_mpi_fail(p->m, st, "%s", fxa_ctx_last_error(p->m->ctx));
    }
    return FXA_OK;
}

/* While a block computes, drive the ring's transfers: over TCP, MPI moves
 * data only inside MPI calls. */
static void ring_progress(void *arg)
{
    fxa_ring_bufs *r = arg;
    int done;
    MPI_Testall(r->n_req, r->req, &done, MPI_STATUSES_IGNORE);
}

static void set_progress(fxa_mpi_attn_plan *p, void (*fn)(void *), void *arg)
{
    for (int i = 0; i < p->n_seg; i++)
        fxa_attn_acc_set_progress(p->ring_bufs->accs[i], fn, arg);
}

/* Where segment i's rows start in the local Q, in bytes. */
static int64_t q_offset(const fxa_mpi_attn_plan *p, int i)
{
    return fxa_mpi_seg_row(p, &p->seg[i]) * p->d.head_dim * (int64_t)p->es;
}

/* Reproducible plans: each segment's largest query norms per (batch, kv
 * head) after its summary, r->mine from `at` on (zeros without queries). */
static fxa_status note_q_norms(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, size_t at)
{
    fxa_ring_bufs *r = p->ring_bufs;
    for (int i = 0; i < p->n_seg; i++) {
        const size_t len = fxa_kv_summary_len(p->seg[i].plan);
        const size_t heads = (size_t)(p->seg[i].n_batch * p->seg[i].n_kv);
        double *qmax = r->mine + at + len;
        if (p->loc_sq == 0)
            memset(qmax, 0, heads * sizeof(double));
        else if (fxa_attn_acc_q_norm(r->accs[i], loc->q + q_offset(p, i), qmax) != FXA_OK)
            return fxa_mpi_fail(p->m, FXA_ERR_INTERNAL, "%s", fxa_ctx_last_error(p->m->ctx));
        at += len + heads;
    }
    return FXA_OK;
}

/* Summaries of this rank's own block for every segment, gathered over the
 * column: r->all[r * len ...] = rank r's [status, seg 0 summary, seg 1 ...]
 * (a failure is sent instead of summaries; reproducible plans follow each
 * segment's summary with its largest query norms). */
static fxa_status gather_summaries(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc,
                                   int *column_failed)
{
    fxa_mpi *m = p->m;
    fxa_ring_bufs *r = p->ring_bufs;
    const int64_t own = p->blk_skv[m->c];
    fxa_status st = FXA_OK;
    size_t at = 1;
    for (int i = 0; i < p->n_seg && st == FXA_OK; i++) {
        const int64_t off = fxa_mpi_seg_kv(p, &p->seg[i], own) * (int64_t)p->es;
        st = fxa_kv_summarize(p->seg[i].plan, loc->k + off, loc->v + off, own, r->mine + at);
        if (st != FXA_OK)
            fxa_mpi_fail(m, st, "%s", fxa_ctx_last_error(m->ctx));
        at += fxa_ring_seg_len(p, i);
    }
    if (st == FXA_OK && p->d.reproducible)
        st = note_q_norms(p, loc, 1);
    r->mine[0] = (double)st;
    const fxa_status sg = fxa_mpi_allgather(m, r->mine, (int)r->sum_len, r->all, MPI_DOUBLE,
                                            m->col_comm, "the ring summaries");
    st = sg != FXA_OK ? sg : st;
    for (int c = 0; c < m->ring; c++)
        *column_failed |= r->all[(size_t)c * r->sum_len] != 0.0;
    return st;
}

/* Begin every segment's accumulator with the column's summaries (in rank
 * order: key order); reproducible plans with the column's largest query
 * norms too. */
static fxa_status begin_all(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc)
{
    fxa_mpi *m = p->m;
    fxa_ring_bufs *r = p->ring_bufs;
    size_t at = 1;
    for (int i = 0; i < p->n_seg; i++) {
        const fxa_mpi_segment *s = &p->seg[i];
        const size_t len = fxa_kv_summary_len(s->plan);
        const size_t heads = (size_t)(s->n_batch * s->n_kv);
        for (int c = 0; c < m->ring; c++)
            memcpy(r->sums + (size_t)c * len, r->all + (size_t)c * r->sum_len + at,
                   len * sizeof(double));
        fxa_status st;
        if (p->d.reproducible) {
            double *qmax = r->sums + (size_t)m->ring * len;
            memset(qmax, 0, heads * sizeof(double));
            for (int c = 0; c < m->ring; c++)
                for (size_t h = 0; h < heads; h++) {
                    const double q = r->all[(size_t)c * r->sum_len + at + len + h];
                    qmax[h] = q > qmax[h] ? q : qmax[h];
                }
            st = fxa_attn_acc_begin_global(r->accs[i], loc->q + q_offset(p, i), r->sums, m->ring,
                                           qmax);
        } else {
            st = fxa_attn_acc_begin(r->accs[i], loc->q + q_offset(p, i), r->sums, m->ring);
        }
        if (st != FXA_OK)
            return fxa_mpi_fail(m, st, "%s", fxa_ctx_last_error(m->ctx));
        at += fxa_ring_seg_len(p, i);
    }
    return FXA_OK;
}

/* Step t: wait for its block (unless it is this rank's own), forward it,
 * add it (when this rank computes and has not failed: *own), wait for the
 * forward, then receive block t + depth into the slot it freed. */
static fxa_status ring_step(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, int t, int computes,
                            fxa_status *own, fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    const fxa_ring_bufs *r = p->ring_bufs;
    const int mine = own_block(p, t);
    const char *k = mine ? loc->k : slot(r, t, 0);
    const char *v = mine ? loc->v : slot(r, t, 1);
    const double t0 = MPI_Wtime();
    fxa_status st = FXA_OK;
    if (!mine)
        st = fxa_mpi_wait(m, 2 * r->pieces, slot_reqs(r, t, 0), ring_prev(m),
                          "the ring's K/V block");
    const double waited = MPI_Wtime() - t0;
    if (st == FXA_OK && forwards(p, t))
        st = forward_block(p, t, k, v);
    const double t1 = MPI_Wtime();
    if (st == FXA_OK && computes && *own == FXA_OK)
        *own = add_block(p, t, k, v);
    const double t2 = MPI_Wtime();
    if (st == FXA_OK)
        st = fxa_mpi_wait(m, 2 * r->pieces, slot_reqs(r, t, 2), ring_next(m),
                          "forwarding the ring's K/V block");
    if (st == FXA_OK && t + r->depth < m->ring && !own_block(p, t + r->depth))
        st = receive_block(p, t + r->depth);
    const double wait = waited + (MPI_Wtime() - t2);
    p->step_compute[t] = t2 - t1;
    p->step_wait[t] = wait;
    if (stats) {
        stats->ring_compute_seconds += t2 - t1;
        stats->ring_wait_seconds += wait;
    }
    return st;
}

fxa_status fxa_ring_run(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, int *column_failed,
                        fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    fxa_ring_bufs *r = p->ring_bufs;
    *column_failed = 0;
    if (p->n_seg == 0)
        return FXA_OK; /* no heads in this column: nothing to compute or send */
    fxa_status st = gather_summaries(p, loc, column_failed);
    if (st != FXA_OK || *column_failed)
        return st;
    /* A local failure here (a non-finite Q) stops compute, not forwarding;
     * a rank without query tokens (S smaller than the ranks) only forwards. */
    const int computes = p->loc_sq > 0;
    fxa_status own = computes ? begin_all(p, loc) : FXA_OK;
    for (int i = 0; i < r->n_req; i++)
        r->req[i] = MPI_REQUEST_NULL;
    set_progress(p, ring_progress, r);
    for (int t = 0; t <= m->prefetch && t < m->ring && st == FXA_OK; t++)
        if (!own_block(p, t))
            st = receive_block(p, t);
    for (int t = 0; t < m->ring && st == FXA_OK; t++)
        st = ring_step(p, loc, t, computes, &own, stats);
    set_progress(p, NULL, NULL);
    return st != FXA_OK ? st : own;
}

fxa_status fxa_ring_finish(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, fxa_attn_stats *sum)
{
    fxa_mpi *m = p->m;
    for (int i = 0; p->loc_sq > 0 && i < p->n_seg; i++) {
        const int64_t row = fxa_mpi_seg_row(p, &p->seg[i]);
        const fxa_attn_args a = {
            .struct_size = sizeof a,
            .out = loc->out + row * p->d.head_dim,
            .lse = loc->lse ? loc->lse + row : NULL,
            .lse_parts = loc->parts ? loc->parts + 3 * row : NULL,
            .row_fallback = loc->fb ? loc->fb + row : NULL,
            .row_bound = loc->bound ? loc->bound + row : NULL,
        };
        fxa_attn_stats one = {.struct_size = sizeof one};
        if (fxa_attn_acc_finish(p->ring_bufs->accs[i], &a, &one) != FXA_OK)
            return fxa_mpi_fail(m, FXA_ERR_INTERNAL, "%s", fxa_ctx_last_error(m->ctx));
        fxa_mpi_add_stats(sum, &one);
    }
    return FXA_OK;
}
