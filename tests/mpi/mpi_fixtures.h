/*
 * Fixtures of the tests that run under mpirun: the job's world, context and
 * grid (each ends the job when it cannot be made), the verdict over every
 * rank, and a problem split over the ranks: each rank's tokens, its shards
 * of global tensors and its output rows.
 */
#ifndef FXT_MPI_FIXTURES_H
#define FXT_MPI_FIXTURES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_mpi.h"
#include "testutil.h"

/* This rank's world rank; ends the job unless the world has `ranks` ranks. */
static inline int fxt_mpi_world_rank(int ranks)
{
    int rank = 0;
    int size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != ranks) {
        fprintf(stderr, "run on %d ranks\n", ranks);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return rank;
}

/* A context of n_threads workers; ends the job when it cannot be made. */
static inline fxa_ctx *fxt_mpi_ctx(int n_threads)
{
    fxa_ctx *ctx = fxt_ctx(n_threads);
    if (!ctx)
        MPI_Abort(MPI_COMM_WORLD, 1);
    return ctx;
}

/* The default grid parameters with U = ulysses and R = ring. */
static inline fxa_mpi_params fxt_mpi_params(int ulysses, int ring)
{
    fxa_mpi_params p;
    fxa_mpi_params_init(&p);
    p.ulysses = ulysses;
    p.ring = ring;
    return p;
}

/* The grid mp (NULL: the defaults) over MPI_COMM_WORLD on ctx; ends the job,
 * after printing the library's message, when it cannot be made. */
static inline fxa_mpi *fxt_mpi_grid(fxa_ctx *ctx, const fxa_mpi_params *mp)
{
    fxa_mpi *m = NULL;
    if (fxa_mpi_create(MPI_COMM_WORLD, ctx, mp, &m) != FXA_OK) {
        int rank = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        fprintf(stderr, "rank %d: fxa_mpi_create: %s\n", rank, fxa_mpi_create_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return m;
}

/* 1 when x is the same on every rank (collective). */
static inline int fxt_mpi_same_everywhere(double x)
{
    double lo = x;
    double hi = x;
    MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

/* Prints this rank's summary, finalizes MPI and returns the exit status:
 * 1 when any rank failed a check or ran none (collective). */
static inline int fxt_mpi_finish(const char *name)
{
    const int rc = test_summary(name);
    int worst = 0;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return worst;
}

/* fxt_attn_desc's shape with dtype t and layout l. */
static inline fxa_attn_desc fxt_mpi_desc(int64_t batch, int64_t heads_q, int64_t heads_kv,
                                         int64_t seq_q, int64_t seq_kv, int64_t head_dim,
                                         fxa_dtype t, fxa_layout l)
{
    fxa_attn_desc d;
    fxt_attn_desc(&d, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim);
    d.dtype = t;
    d.layout = l;
    return d;
}

/* n values spread * N(0, 1) from r into x, as fp32 (t FXA_F32) or bf16. */
static inline void fxt_mpi_fill(fxt_rng *r, fxa_dtype t, void *x, int64_t n, double spread)
{
    for (int64_t i = 0; i < n; i++) {
        const float f = (float)(spread * fxt_rng_normal(r));
        if (t == FXA_F32)
            ((float *)x)[i] = f;
        else
            ((uint16_t *)x)[i] = fxa_f32_to_bf16(f);
    }
}

/* This rank's share of a problem (fxa_mpi_shard): query tokens [q0, q0 +
 * qn) and key tokens [k0, k0 + kn); its shards hold nq elements of Q (and
 * of the output), nkv of K and of V, and `rows` query rows. */
typedef struct fxt_mpi_split {
    int64_t q0, qn, k0, kn;
    int64_t nq, nkv, rows;
} fxt_mpi_split;

static inline fxt_mpi_split fxt_mpi_split_of(const fxa_attn_desc *d, int size, int rank)
{
    fxt_mpi_split s;
    fxa_mpi_shard(d->seq_q, size, rank, &s.q0, &s.qn);
    fxa_mpi_shard(d->seq_kv, size, rank, &s.k0, &s.kn);
    s.rows = d->batch * d->heads_q * s.qn;
    s.nq = s.rows * d->head_dim;
    s.nkv = d->batch * d->heads_kv * s.kn * d->head_dim;
    return s;
}

/* Between a [batch, heads, seq] tensor of `unit`-byte items in layout l
 * and its shard of tokens [t0, t0 + n), laid out alike with seq n: from
 * the tensor into the shard, or the other way when to_tensor. */
static inline void fxt_mpi_copy_tokens(fxa_layout l, int64_t batch, int64_t heads, int64_t seq,
                                       size_t unit, int64_t t0, int64_t n, int to_tensor,
                                       const void *from, void *to)
{
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t t = 0; t < n; t++) {
                const int bshd = l == FXA_LAYOUT_BSHD;
                const int64_t g =
                    bshd ? (b * seq + t0 + t) * heads + h : (b * heads + h) * seq + t0 + t;
                const int64_t s = bshd ? (b * n + t) * heads + h : (b * heads + h) * n + t;
                const size_t src = (size_t)(to_tensor ? s : g) * unit;
                const size_t dst = (size_t)(to_tensor ? g : s) * unit;
                memcpy((char *)to + dst, (const char *)from + src, unit);
            }
}

/* This rank's shard of a Q-shaped tensor of d (es bytes per element). */
static inline void fxt_mpi_take_q(const fxa_attn_desc *d, const fxt_mpi_split *s, size_t es,
                                  const void *tensor, void *shard)
{
    fxt_mpi_copy_tokens(d->layout, d->batch, d->heads_q, d->seq_q, (size_t)d->head_dim * es, s->q0,
                        s->qn, 0, tensor, shard);
}

/* This rank's shard of a K- or V-shaped tensor of d (es bytes per element). */
static inline void fxt_mpi_take_kv(const fxa_attn_desc *d, const fxt_mpi_split *s, size_t es,
                                   const void *tensor, void *shard)
{
    fxt_mpi_copy_tokens(d->layout, d->batch, d->heads_kv, d->seq_kv, (size_t)d->head_dim * es,
                        s->k0, s->kn, 0, tensor, shard);
}

/* This rank's rows of a per-row [batch, heads_q, seq_q] array of d (bytes
 * per row: an lse, a flag, lse_parts' three floats). */
static inline void fxt_mpi_take_rows(const fxa_attn_desc *d, const fxt_mpi_split *s, size_t bytes,
                                     const void *all, void *shard)
{
    fxt_mpi_copy_tokens(FXA_LAYOUT_BHSD, d->batch, d->heads_q, d->seq_q, bytes, s->q0, s->qn, 0,
                        all, shard);
}

/* The inverses: this rank's shard of the output, and of a per-row array,
 * into the global tensor. */
static inline void fxt_mpi_put_q(const fxa_attn_desc *d, const fxt_mpi_split *s, size_t es,
                                 void *tensor, const void *shard)
{
    fxt_mpi_copy_tokens(d->layout, d->batch, d->heads_q, d->seq_q, (size_t)d->head_dim * es, s->q0,
                        s->qn, 1, shard, tensor);
}

static inline void fxt_mpi_put_rows(const fxa_attn_desc *d, const fxt_mpi_split *s, size_t bytes,
                                    void *all, const void *shard)
{
    fxt_mpi_copy_tokens(FXA_LAYOUT_BHSD, d->batch, d->heads_q, d->seq_q, bytes, s->q0, s->qn, 1,
                        shard, all);
}

/* This rank's shards of Q, K and V, allocated here (d's dtype). */
typedef struct fxt_mpi_qkv {
    void *q, *k, *v;
} fxt_mpi_qkv;

/* The shards of global q, k, v of d. */
static inline fxt_mpi_qkv fxt_mpi_take_qkv(const fxa_attn_desc *d, const fxt_mpi_split *s,
                                           const void *q, const void *k, const void *v)
{
    const size_t es = d->dtype == FXA_F32 ? 4 : 2;
    fxt_mpi_qkv x = {malloc((size_t)s->nq * es + 1), malloc((size_t)s->nkv * es + 1),
                     malloc((size_t)s->nkv * es + 1)};
    fxt_mpi_take_q(d, s, es, q, x.q);
    fxt_mpi_take_kv(d, s, es, k, x.k);
    fxt_mpi_take_kv(d, s, es, v, x.v);
    return x;
}

/* The shards of a case's inputs: its 16-bit encodings unless fp32. */
static inline fxt_mpi_qkv fxt_mpi_take_tcase(const tcase *t, const fxt_mpi_split *s)
{
    if (t->d.dtype == FXA_F32)
        return fxt_mpi_take_qkv(&t->d, s, t->q, t->k, t->v);
    return fxt_mpi_take_qkv(&t->d, s, t->q16, t->k16, t->v16);
}

static inline void fxt_mpi_qkv_free(fxt_mpi_qkv *x)
{
    free(x->q);
    free(x->k);
    free(x->v);
}

/* A run's output rows: out ([B, Hq, S, D] in the case's layout) and per
 * row the lse, the bound and the fallback flag, zero-filled. */
typedef struct fxt_mpi_rows {
    float *out;
    float *lse;
    float *bound;
    uint8_t *fb;
} fxt_mpi_rows;

static inline void fxt_mpi_rows_alloc(fxt_mpi_rows *r, int64_t n_out, int64_t n_rows)
{
    r->out = calloc((size_t)n_out + 1, sizeof(float));
    r->lse = calloc((size_t)n_rows + 1, sizeof(float));
    r->bound = calloc((size_t)n_rows + 1, sizeof(float));
    r->fb = calloc((size_t)n_rows + 1, 1);
}

static inline void fxt_mpi_rows_free(fxt_mpi_rows *r)
{
    free(r->out);
    free(r->lse);
    free(r->bound);
    free(r->fb);
}

/* 1 when a and b hold the same bytes. */
static inline int fxt_mpi_rows_same(const fxt_mpi_rows *a, const fxt_mpi_rows *b, int64_t n_out,
                                    int64_t n_rows)
{
    return !memcmp(a->out, b->out, (size_t)n_out * sizeof(float)) &&
           !memcmp(a->lse, b->lse, (size_t)n_rows * sizeof(float)) &&
           !memcmp(a->bound, b->bound, (size_t)n_rows * sizeof(float)) &&
           !memcmp(a->fb, b->fb, (size_t)n_rows);
}

/* A run's arguments: inputs q, k, v, every output into r. */
static inline fxa_attn_args fxt_mpi_rows_args(const void *q, const void *k, const void *v,
                                              const fxt_mpi_rows *r)
{
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = q,
                             .k = k,
                             .v = v,
                             .out = r->out,
                             .lse = r->lse,
                             .row_fallback = r->fb,
                             .row_bound = r->bound};
    return a;
}

#endif
