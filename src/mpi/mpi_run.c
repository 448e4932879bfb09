/*
 * One distributed attention call: check the arguments (agreed), then
 *   - pure Ulysses (R == 1, U > 1): the pipelined run of ulysses_run.c
 *     (heads travel in and back by groups while other groups compute);
 *   - otherwise: the Ulysses way in (U > 1), local attention (R == 1) or
 *     the ring (R > 1), normalisation of the ring accumulators, the way back;
 * agree on the outcome, then write the output. No output is written unless
 * every rank succeeded.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/spans.h"
#include "core/struct_size.h"
#include "mpi_internal.h"
#include "ulysses.h"

/* Whether element i of a tensor of dtype t is finite (bit tests). */
static int finite_at(const void *x, fxa_dtype t, size_t i)
{
    if (t == FXA_F32) {
        uint32_t b;
        memcpy(&b, (const float *)x + i, sizeof b);
        return (b & 0x7f800000u) != 0x7f800000u;
    }
    const uint16_t h = ((const uint16_t *)x)[i];
    return t == FXA_BF16 ? (h & 0x7f80u) != 0x7f80u : (h & 0x7c00u) != 0x7c00u;
}

/* 1 when elements [i0, i1) are all finite: branch-free, vectorised. */
static int span_finite(const void *x, fxa_dtype t, size_t i0, size_t i1)
{
    unsigned bad = 0;
    if (t == FXA_F32) {
        for (size_t i = i0; i < i1; i++) {
            uint32_t b;
            memcpy(&b, (const float *)x + i, sizeof b);
            bad |= (b & 0x7f800000u) == 0x7f800000u;
        }
    } else {
        const uint16_t *h = x;
        const uint16_t mask = t == FXA_BF16 ? 0x7f80u : 0x7c00u;
        for (size_t i = i0; i < i1; i++)
            bad |= (h[i] & mask) == mask;
    }
    return !bad;
}

static float value_at(const void *x, fxa_dtype t, size_t i)
{
    if (t == FXA_F32)
        return ((const float *)x)[i];
    const uint16_t h = ((const uint16_t *)x)[i];
    return t == FXA_BF16 ? fxa_bf16_to_f32(h) : fxa_f16_to_f32(h);
}

/* The first non-finite element of a shard of n tokens starting at global
 * token t0, reported in global coordinates (before any exchange moves it). */
static int report_non_finite(const fxa_mpi_attn_plan *p, const void *x, char name, int64_t heads,
                             int64_t t0, int64_t n, char *msg, size_t cap)
{
    const fxa_attn_desc *d = &p->d;
    const size_t total = (size_t)(d->batch * heads * n * d->head_dim);
    size_t first = total;
    for (size_t i0 = 0; i0 < total && first == total; i0 += 4096) {
        const size_t i1 = i0 + 4096 < total ? i0 + 4096 : total;
        if (span_finite(x, d->dtype, i0, i1))
            continue;
        for (first = i0; finite_at(x, d->dtype, first); first++)
            ;
    }
    for (size_t i = first; i < total; i++) {
        const int64_t c = (int64_t)i % d->head_dim;
        const int64_t r = (int64_t)i / d->head_dim;
        int64_t b;
        int64_t h;
        int64_t t;
        if (d->layout == FXA_LAYOUT_BSHD) {
            h = r % heads;
            t = r / heads % n;
            b = r / heads / n;
        } else {
            t = r % n;
            h = r / n % heads;
            b = r / n / heads;
        }
        snprintf(msg, cap,
                 "%c has a non-finite value (%g) at batch %lld, token %lld, head %lld, dim %lld",
                 name, (double)value_at(x, d->dtype, i), (long long)b, (long long)(t0 + t),
                 (long long)h, (long long)c);
        return 1;
    }
    return 0;
}

/* The first non-finite input of this rank's shards, in global coordinates. */
static int find_non_finite(const fxa_mpi_attn_plan *p, const fxa_attn_args *a, char *msg,
                           size_t cap)
{
    int64_t q0;
    int64_t k0;
    int64_t n;
    fxa_mpi_shard(p->d.seq_q, p->m->size, p->m->rank, &q0, &n);
    fxa_mpi_shard(p->d.seq_kv, p->m->size, p->m->rank, &k0, &n);
    return report_non_finite(p, a->q, 'Q', p->d.heads_q, q0, p->q_len, msg, cap) ||
           report_non_finite(p, a->k, 'K', p->d.heads_kv, k0, p->kv_len, msg, cap) ||
           report_non_finite(p, a->v, 'V', p->d.heads_kv, k0, p->kv_len, msg, cap);
}

/* The outputs of this rank's shard share no byte with its inputs or with
 * each other (whatever the grid: the Ulysses way back and the ring's
 * normalisation write them after every input has been read, so an overlap
 * would otherwise pass there and not on one rank). */
static fxa_status check_disjoint(const fxa_mpi_attn_plan *p, const fxa_attn_args *a, char *msg,
                                 size_t cap)
{
    const fxa_attn_desc *d = &p->d;
    const size_t rows = (size_t)(d->batch * d->heads_q * p->q_len);
    const size_t keys = (size_t)(d->batch * d->heads_kv * p->kv_len * d->head_dim) * p->es;
    const fxa_span in[3] = {
        {"Q", a->q, rows * (size_t)d->head_dim * p->es}, {"K", a->k, keys}, {"V", a->v, keys}};
    const fxa_span out[4] = {{"out", a->out, rows * (size_t)d->head_dim * sizeof(float)},
                             {"lse", a->lse, rows * sizeof(float)},
                             {"row_fallback", a->row_fallback, rows},
                             {"row_bound", a->row_bound, rows * sizeof(float)}};
    const fxa_span *x, *y;
    if (fxa_spans_clash(out, 4, in, 3, &x, &y)) {
        snprintf(msg, cap,
                 "%s overlaps %s: the outputs must not share memory with the inputs or with "
                 "each other",
                 x->name, y->name);
        return FXA_ERR_INVALID_ARG;
    }
    return FXA_OK;
}

/* Pointers, and with U > 1 finiteness: a non-finite value must be found on
 * the rank that owns it, before the exchange moves it elsewhere. (With
 * U == 1 the local passes find it; the error path then names it in global
 * coordinates with find_non_finite.) */
static fxa_status check_args(const fxa_mpi_attn_plan *p, const fxa_attn_args *a, char *msg,
                             size_t cap)
{
    if (!a || a->struct_size < sizeof *a) {
        snprintf(msg, cap, "attention args missing or too old");
        return FXA_ERR_INVALID_ARG;
    }
    if ((p->q_len > 0 && (!a->q || !a->out)) || (p->kv_len > 0 && (!a->k || !a->v))) {
        snprintf(msg, cap, "q, k, v and out must not be NULL");
        return FXA_ERR_INVALID_ARG;
    }
    if (check_disjoint(p, a, msg, cap) != FXA_OK)
        return FXA_ERR_INVALID_ARG;
    if (p->m->ulysses > 1 && find_non_finite(p, a, msg, cap))
        return FXA_ERR_INVALID_ARG;
    return FXA_OK;
}

fxa_status fxa_mpi_run_segment(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc,
                               const fxa_mpi_segment *s, void *ws, fxa_attn_stats *sum)
{
    const int64_t row = fxa_mpi_seg_row(p, s);
    const int64_t kv = fxa_mpi_seg_kv(p, s, p->blk_skv[0]);
    const fxa_attn_args a = {
        .struct_size = sizeof a,
        .q = loc->q + row * p->d.head_dim * (int64_t)p->es,
        .k = loc->k + kv * (int64_t)p->es,
        .v = loc->v + kv * (int64_t)p->es,
        .out = loc->out + row * p->d.head_dim,
        .lse = loc->lse ? loc->lse + row : NULL,
        .row_fallback = loc->fb ? loc->fb + row : NULL,
        .row_bound = loc->bound ? loc->bound + row : NULL,
    };
    fxa_attn_stats one = {.struct_size = sizeof one};
    const fxa_status st = fxa_attn_run(s->plan, &a, ws, &one);
    if (st != FXA_OK)
        return fxa_mpi_fail(p->m, st, "%s", fxa_ctx_last_error(p->m->ctx));
    sum->fallback_rows += one.fallback_rows;
    sum->vmax = one.vmax > sum->vmax ? one.vmax : sum->vmax;
    sum->max_bound = one.max_bound > sum->max_bound ? one.max_bound : sum->max_bound;
    return FXA_OK;
}

/* R == 1: each segment is a whole local problem for fxa_attn_run (none
 * when this rank holds no query token: its plans stand for one). */
static fxa_status run_local(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, fxa_attn_stats *sum)
{
    fxa_status st = FXA_OK;
    for (int i = 0; p->loc_sq > 0 && i < p->n_seg && st == FXA_OK; i++) {
        const fxa_mpi_segment *s = &p->seg[i];
        void *ws = s->ws_bytes ? aligned_alloc(64, (s->ws_bytes + 63) / 64 * 64) : NULL;
        st = s->ws_bytes && !ws ? fxa_mpi_fail(p->m, FXA_ERR_NO_MEMORY, "out of memory")
                                : fxa_mpi_run_segment(p, loc, s, ws, sum);
        free(ws);
    }
    return st;
}

/* R > 1, after agreement: normalise every accumulator into the outputs
 * (none without query tokens: fxa_ring_run began none). */
static fxa_status finish_ring(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc, fxa_attn_stats *sum)
{
    fxa_mpi *m = p->m;
    for (int i = 0; p->loc_sq > 0 && i < p->n_seg; i++) {
        const int64_t row = fxa_mpi_seg_row(p, &p->seg[i]);
        const fxa_attn_args a = {
            .struct_size = sizeof a,
            .out = loc->out + row * p->d.head_dim,
            .lse = loc->lse ? loc->lse + row : NULL,
            .row_fallback = loc->fb ? loc->fb + row : NULL,
            .row_bound = loc->bound ? loc->bound + row : NULL,
        };
        fxa_attn_stats one = {.struct_size = sizeof one};
        fxa_status st = fxa_attn_acc_finish(p->accs[i], &a, &one);
        if (st != FXA_OK)
            return fxa_mpi_fail(m, FXA_ERR_INTERNAL, "%s", fxa_ctx_last_error(m->ctx));
        sum->fallback_rows += one.fallback_rows;
        sum->vmax = one.vmax > sum->vmax ? one.vmax : sum->vmax;
        sum->max_bound = one.max_bound > sum->max_bound ? one.max_bound : sum->max_bound;
    }
    return FXA_OK;
}

fxa_status fxa_mpi_plan_buffers(fxa_mpi_attn_plan *p)
{
    const fxa_mpi *m = p->m;
    if (p->buffers_ready)
        return FXA_OK;
    if (m->ulysses > 1) {
        fxa_ulysses_bufs *ub = calloc(1, sizeof *ub);
        if (!ub || fxa_ulysses_alloc(p, ub) != FXA_OK) {
            free(ub);
            return FXA_ERR_NO_MEMORY;
        }
        p->ulysses_bufs = ub;
    }
    if (m->ring > 1 && p->n_seg > 0) {
        p->accs = calloc((size_t)p->n_seg, sizeof *p->accs);
        if (!p->accs)
            return FXA_ERR_NO_MEMORY;
        for (int i = 0; i < p->n_seg; i++)
            if (fxa_attn_acc_create(p->seg[i].plan, &p->accs[i]) != FXA_OK)
                return FXA_ERR_NO_MEMORY;
        const int64_t per_key = p->d.batch * fxa_mpi_loc_hkv(p) * p->d.head_dim;
        p->slot_bytes = (size_t)(per_key * p->max_blk_skv) * p->es;
        p->slots = malloc(2 * (size_t)(m->prefetch + 1) * p->slot_bytes + 1);
        if (!p->slots)
            return FXA_ERR_NO_MEMORY;
    }
    p->buffers_ready = 1;
    return FXA_OK;
}

void fxa_mpi_plan_buffers_free(fxa_mpi_attn_plan *p)
{
    for (int i = 0; p->accs && i < p->n_seg; i++)
        fxa_attn_acc_destroy(p->accs[i]);
    free(p->accs);
    free(p->slots);
    if (p->ulysses_bufs)
        fxa_ulysses_bufs_free(p->ulysses_bufs);
    free(p->ulysses_bufs);
    p->accs = NULL;
    p->slots = NULL;
    p->ulysses_bufs = NULL;
    p->buffers_ready = 0;
}

/* Global statistics: every rank calls this, stats or not. */
static fxa_status reduce_stats(fxa_mpi_attn_plan *p, const fxa_attn_stats *sum,
                               fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    /* Fallback rows are counted where they are computed (the head owner). */
    long long fb = sum->fallback_rows;
    double mx[2] = {sum->vmax, sum->max_bound};
    long long fb_all = 0;
    double mx_all[2] = {0.0, 0.0};
    fxa_status st =
        fxa_mpi_allreduce(m, &fb, &fb_all, 1, MPI_LONG_LONG, MPI_SUM, m->comm, "the statistics");
    if (st == FXA_OK)
        st = fxa_mpi_allreduce(m, mx, mx_all, 2, MPI_DOUBLE, MPI_MAX, m->comm, "the statistics");
    if (st != FXA_OK)
        return st;
    if (stats) {
        stats->rows = p->d.batch * p->d.heads_q * p->d.seq_q;
        stats->fallback_rows = fb_all;
        stats->vmax = mx_all[0];
        stats->max_bound = mx_all[1];
    }
    return FXA_OK;
}

/* Pure Ulysses: the pipelined run, agreed on, then the output written. */
static fxa_status run_ulysses(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_attn_stats *sum,
                              fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    fxa_ulysses_bufs *ub = p->ulysses_bufs;
    double a2a = 0.0;
    const fxa_status own = fxa_ulysses_run(p, a, ub, sum, &a2a);
    if (stats)
        stats->a2a_seconds += a2a;
    const fxa_status st = fxa_mpi_agree(m, own, m->last_error);
    if (st == FXA_OK)
        fxa_ulysses_write(p, ub, a);
    return st;
}

/* Every group's way in (U > 1), one after the other, sends included. */
static fxa_status ulysses_in(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_ulysses_bufs *ub)
{
    fxa_status st = FXA_OK;
    for (int g = 0; g < ub->groups && st == FXA_OK; g++) {
        st = fxa_ulysses_in_post(p, a, ub, g);
        if (st == FXA_OK)
            st = fxa_ulysses_in_wait(p, ub);
    }
    return st == FXA_OK ? fxa_ulysses_pending_wait(p, ub) : st;
}

/* Every group's way back (U > 1), agreed on, then the output written. */
static fxa_status ulysses_back(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_ulysses_bufs *ub)
{
    fxa_status st = FXA_OK;
    for (int g = 0; g < ub->groups && st == FXA_OK; g++)
        st = fxa_ulysses_back_post(p, ub, g);
    if (st == FXA_OK)
        st = fxa_ulysses_pending_wait(p, ub);
    st = fxa_mpi_agree(p->m, st, p->m->last_error);
    if (st == FXA_OK)
        fxa_ulysses_write(p, ub, a);
    return st;
}

/* U == 1, or R > 1: the Ulysses way in, local attention or the ring
 * (agreed on), the ring's normalisation (agreed on), the way back. */
static fxa_status run_grid(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_attn_stats *sum,
                           fxa_mpi_stats *stats)
{
    fxa_mpi *m = p->m;
    fxa_ulysses_bufs *ub = p->ulysses_bufs;
    char msg[512];
    fxa_mpi_local loc;
    fxa_status st = FXA_OK;
    if (m->ulysses > 1) {
        const double ta = MPI_Wtime();
        st = ulysses_in(p, a, ub);
        if (stats)
            stats->a2a_seconds += MPI_Wtime() - ta;
        loc = (fxa_mpi_local){ub->q, ub->k, ub->v, ub->out, ub->lse, ub->fb, ub->bound};
    } else {
        loc = (fxa_mpi_local){a->q, a->k, a->v, a->out, a->lse, a->row_fallback, a->row_bound};
    }
    /* Local work: this rank's own status; a peer's failure shows up in the
     * agreement below. */
    if (st == FXA_OK) {
        int column_failed = 0;
        const fxa_status own =
            m->ring == 1 ? run_local(p, &loc, sum) : fxa_ring_run(p, &loc, &column_failed, stats);
        snprintf(msg, sizeof msg, "%s", m->last_error);
        if (own == FXA_ERR_INVALID_ARG && m->ulysses == 1)
            find_non_finite(p, a, msg, sizeof msg);
        st = fxa_mpi_agree(m, own, msg);
    }
    if (st == FXA_OK && m->ring > 1) {
        const fxa_status own = finish_ring(p, &loc, sum);
        st = fxa_mpi_agree(m, own, m->last_error);
    }
    if (st == FXA_OK && m->ulysses > 1) {
        const double ta = MPI_Wtime();
        st = ulysses_back(p, a, ub);
        if (stats)
            stats->a2a_seconds += MPI_Wtime() - ta;
    }
    return st;
}

fxa_status fxa_mpi_attn_run(fxa_mpi_attn_plan *p, const fxa_attn_args *a, fxa_mpi_stats *user_stats)
{
    if (!p)
        return FXA_ERR_INVALID_ARG;
    fxa_mpi *m = p->m;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    const double t0 = MPI_Wtime();
    char msg[512] = "";
    m->last_error[0] = '\0';
    /* The statistics gather in `local` and reach the caller's struct within
     * its struct_size at the end. */
    fxa_mpi_stats local = {.struct_size = sizeof local};
    fxa_mpi_stats *stats = user_stats ? &local : NULL;
    local.ring_steps = m->ring > 1 ? m->ring : 0;
    fxa_status st =
        user_stats ? fxa_struct_size_check(fxa_struct_size_of(user_stats), FXA_MPI_STATS_SIZE_0_1,
                                           sizeof local, "fxa_mpi_stats", msg, sizeof msg)
                   : FXA_OK;
    const int stats_ok = user_stats && st == FXA_OK; /* one of unknown size is not written */
    if (st == FXA_OK)
        st = check_args(p, a, msg, sizeof msg);
    if (st == FXA_OK && (st = fxa_mpi_plan_buffers(p)) != FXA_OK) {
        fxa_mpi_plan_buffers_free(p);
        snprintf(msg, sizeof msg, "out of memory for the distributed buffers");
    }
    st = fxa_mpi_agree_call(m, st, msg, p->call);
    fxa_attn_stats sum = {.struct_size = sizeof sum};
    if (st == FXA_OK && m->ulysses > 1 && m->ring == 1)
        st = run_ulysses(p, a, &sum, stats);
    else if (st == FXA_OK)
        st = run_grid(p, a, &sum, stats);
    if (st == FXA_OK)
        st = reduce_stats(p, &sum, stats);
    local.seconds = MPI_Wtime() - t0;
    if (stats_ok)
        fxa_struct_out(user_stats, &local, sizeof local);
    return st;
}
