/* The distributed context and plan behind the fxattn_mpi handles. */
#ifndef FXA_MPI_INTERNAL_H
#define FXA_MPI_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

#include "fxattn_mpi.h"
#include "base/internal_api.h"

/* The first released size of fxa_mpi_params (0.1.0: it ended before
 * timeout_seconds), for the struct_size policy of base/struct_size.h
 * (which holds FXA_MPI_STATS_SIZE_0_1). */
#define FXA_MPI_PARAMS_SIZE_0_1 offsetof(fxa_mpi_params, timeout_seconds)

struct fxa_mpi {
    MPI_Comm comm;     /* duplicate of the caller's in grid order, MPI_ERRORS_RETURN */
    MPI_Comm row_comm; /* the U ranks of this rank's Ulysses group */
    MPI_Comm col_comm; /* the R ranks of this rank's ring */
    fxa_ctx *ctx;
    int rank; /* the grid rank (placed: fxa_mpi_placement) */
    int size;
    int ulysses; /* U */
    int ring;    /* R */
    int u;       /* index in the row: rank % U */
    int c;       /* index in the ring: rank / U */
    int prefetch;
    double timeout; /* seconds a wait may see no progress (fxa_mpi_wait) */
    int broken;     /* a wait timed out: the communicators are unusable */
    /* Test hooks, read from the environment once by fxa_mpi_create (0:
     * unset) and only by plans, never on a run path:
     * FXA_MPI_TEST_MAX_ELEMENTS caps the ring's message pieces
     * (ring_plan.c); FXA_TEST_ULYSSES_GROUPS and FXA_TEST_ULYSSES_PIECE set
     * the Ulysses exchange's groups and pieces (ulysses_plan.c), and
     * FXA_TEST_ULYSSES_PIECE the backward's messages, in bytes (bwd_plan.c). */
    int64_t test_max_elements;
    int64_t test_ulysses_groups;
    int64_t test_ulysses_piece;
    int *names; /* NULL: messages name ranks by grid rank; else names[r] (fxa_mpi_name_ranks) */
    char last_error[512];
};

/* The number that messages give rank r of m. */
static inline int fxa_mpi_name(const fxa_mpi *m, int r)
{
    return m->names && r >= 0 && r < m->size ? m->names[r] : r;
}

/* One local attention problem after the Ulysses exchange: batches
 * [batch0, batch0 + n_batch), local q heads [q0, q0 + n_q) and local kv heads
 * [kv0, kv0 + n_kv) of the local tensors. */
typedef struct fxa_mpi_segment {
    int64_t batch0;
    int64_t n_batch;
    int64_t q0;
    int64_t n_q;
    int64_t kv0;
    int64_t n_kv;
    fxa_attn_plan *plan; /* seq_q = local queries, seq_kv = local keys (or largest ring block) */
    size_t ws_bytes;     /* its workspace (R == 1) */
} fxa_mpi_segment;

struct fxa_ring_bufs;    /* ring.h */
struct fxa_ulysses_bufs; /* ulysses.h */

/* A distributed plan and every buffer its runs use: fxa_mpi_attn_plan_create
 * sizes and allocates all of them (mpi_plan.c, ring_plan.c,
 * ulysses_plan.c), fxa_mpi_attn_run allocates nothing. */
struct fxa_mpi_attn_plan {
    fxa_mpi *m;
    fxa_attn_desc d; /* global */
    uint64_t call;   /* names its runs in the first agreement (never 0) */
    size_t es;       /* bytes per input element */
    int64_t q_len;   /* this rank's query and key shards */
    int64_t kv_len;
    /* Ulysses head split: rank u of the row holds q heads [hq_lo[u], hq_hi[u])
     * and kv heads [hkv_lo[u], hkv_hi[u]). */
    int64_t *hq_lo, *hq_hi, *hkv_lo, *hkv_hi;
    /* After the exchange: the row's tokens (its ring block) for those heads. */
    int64_t loc_sq;   /* queries of this rank's ring block */
    int64_t *blk_skv; /* [R] keys of each ring block */
    int64_t max_blk_skv;
    fxa_layout loc_layout; /* the user's with U == 1, else BHSD */
    fxa_mpi_segment *seg;
    int n_seg;
    double *step_compute; /* [R]: the last run's ring steps */
    double *step_wait;
    void *tables; /* owns hq_lo, hq_hi, hkv_lo, hkv_hi, blk_skv, step_compute, step_wait */
    /* R == 1: the workspace of the largest local run (64-byte aligned). */
    void *ws;
    size_t ws_bytes;
    /* The memory the plan may still take (fxa_available_memory() when it
     * began) and what it has taken (fxa_mpi_plan_take). */
    uint64_t mem_avail;
    double mem_taken;
    struct fxa_ring_bufs *ring_bufs;       /* R > 1 */
    struct fxa_ulysses_bufs *ulysses_bufs; /* U > 1 */
};

/* Before allocating bytes of run buffers (what names them): FXA_OK while
 * the plan's buffers fit in the memory available when it began, else
 * FXA_ERR_NO_MEMORY and "needs X GiB, Y GiB available (what)" in msg (as
 * an attention plan refuses a workspace larger than that). */
static inline fxa_status fxa_mpi_plan_take(fxa_mpi_attn_plan *p, double bytes, const char *what,
                                           char *msg, size_t cap)
{
    p->mem_taken += bytes;
    if (p->mem_taken <= (double)p->mem_avail)
        return FXA_OK;
    snprintf(msg, cap, "needs %.1f GiB, %.1f GiB available (%s)", p->mem_taken / 1073741824.0,
             (double)p->mem_avail / 1073741824.0, what);
    return FXA_ERR_NO_MEMORY;
}

/* Record an error on m (printf style) and return st. */
__attribute__((format(printf, 3, 4))) static inline fxa_status
fxa_mpi_fail(fxa_mpi *m, fxa_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->last_error, sizeof m->last_error, fmt, ap);
    va_end(ap);
    return st;
}

/* [lo, hi) of part i of n items split over parts (the first n mod parts one
 * larger). */
void fxa_mpi_split(int64_t n, int parts, int i, int64_t *lo, int64_t *hi);

/* Shard `rank` of seq tokens for a plan of d: fxa_canonical_shard for
 * reproducible descriptors, else fxa_mpi_shard. */
void fxa_mpi_shard_of(const fxa_attn_desc *d, int64_t seq, int n_ranks, int rank, int64_t *start,
                      int64_t *len);

/* FNV-1a over bytes, chained. */
FXA_INTERNAL uint64_t fxa_mpi_hash(uint64_t h, const void *data, size_t n);

/* Wait for the n requests, polling (mpi_wait.c): when none completes for
 * m->timeout seconds, fails with FXA_ERR_TIMEOUT, "rank N: no progress
 * from rank M for T s (what)" (peer M, or "the other ranks" when peer < 0),
 * and marks m broken: every later call on m fails at once with that error,
 * without communicating. Any n: polled in windows of FXA_MPI_MAX_WAIT. */
#define FXA_MPI_MAX_WAIT 272
FXA_INTERNAL fxa_status fxa_mpi_wait(fxa_mpi *m, int n, MPI_Request *reqs, int peer,
                                     const char *what);

/* fxa_mpi_wait without pausing between polls, for waits that are timed
 * or start a timed section (a pause would count as time or skew the
 * start). */
FXA_INTERNAL fxa_status fxa_mpi_spin(fxa_mpi *m, int n, MPI_Request *reqs, int peer,
                                     const char *what);

/* The blocking collectives the library uses, as their nonblocking forms
 * waited on with fxa_mpi_wait (what names the step in errors). */
FXA_INTERNAL fxa_status fxa_mpi_allreduce(fxa_mpi *m, const void *in, void *out, int n,
                                          MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                                          const char *what);
fxa_status fxa_mpi_bcast(fxa_mpi *m, void *buf, int n, MPI_Datatype t, int root, MPI_Comm comm,
                         const char *what);
fxa_status fxa_mpi_allgather(fxa_mpi *m, const void *in, int n, void *out, MPI_Datatype t,
                             MPI_Comm comm, const char *what);

/* Collective over comm: every rank has arrived (MPI_Ibarrier waited with
 * fxa_mpi_wait), so that the blocking communicator creation (MPI has no
 * nonblocking MPI_Comm_split) that follows waits on no rank that stopped
 * before it: a missing peer fails the call with FXA_ERR_TIMEOUT instead. */
fxa_status fxa_mpi_arrive(fxa_mpi *m, MPI_Comm comm, const char *what);

/* Collective over comm: m->comm = a duplicate of comm (MPI_Comm_idup,
 * waited with fxa_mpi_wait; m->rank and m->timeout set). On failure
 * m->comm is MPI_COMM_NULL (a duplicate still pending when the deadline
 * passed is left to the end of the job). */
fxa_status fxa_mpi_dup(fxa_mpi *m, MPI_Comm comm);

/* fxa_mpi_agree that also checks that every rank is in the same call:
 * `call` names it (fxa_mpi_agree passes 0; a plan's run, the plan's
 * descriptor hash), and ranks that pass different values all fail with
 * FXA_ERR_INVALID_ARG and one message, in the same single allreduce. */
fxa_status fxa_mpi_agree_call(fxa_mpi *m, fxa_status local, const char *local_msg, uint64_t call);

/* FXA_OK when comm can carry the library's collectives (not
 * MPI_COMM_NULL, not an intercommunicator); else FXA_ERR_INVALID_ARG and
 * why in msg. Local: a rank given MPI_COMM_NULL has no peers to tell. */
fxa_status fxa_mpi_check_comm(MPI_Comm comm, char *msg, size_t cap);

/* Collective over m->comm: fails on every rank unless all ranks pass the
 * same hash (what names the mismatch). */
FXA_INTERNAL fxa_status fxa_mpi_same_everywhere(fxa_mpi *m, uint64_t hash, const char *what);

/* Local q heads and kv heads of this rank after the Ulysses exchange. */
static inline int64_t fxa_mpi_loc_hq(const fxa_mpi_attn_plan *p)
{
    return p->hq_hi[p->m->u] - p->hq_lo[p->m->u];
}

static inline int64_t fxa_mpi_loc_hkv(const fxa_mpi_attn_plan *p)
{
    return p->hkv_hi[p->m->u] - p->hkv_lo[p->m->u];
}

/* Where segment s starts in the local tensors, in elements: query rows
 * (times D for Q and the output), and K/V rows of a block of n keys. With
 * U == 1 the single segment starts at 0 in the user's layout. */
static inline int64_t fxa_mpi_seg_row(const fxa_mpi_attn_plan *p, const fxa_mpi_segment *s)
{
    return (s->batch0 * fxa_mpi_loc_hq(p) + s->q0) * p->loc_sq;
}

static inline int64_t fxa_mpi_seg_kv(const fxa_mpi_attn_plan *p, const fxa_mpi_segment *s,
                                     int64_t n)
{
    return (s->batch0 * fxa_mpi_loc_hkv(p) + s->kv0) * n * p->d.head_dim;
}

/* The local problem's tensors (loc_layout) and outputs. */
typedef struct fxa_mpi_local {
    const char *q;
    const char *k; /* this rank's own ring block */
    const char *v;
    float *out;
    float *lse;   /* may be NULL with U == 1 */
    float *parts; /* [rows][3] lse_parts; may be NULL with U == 1 */
    uint8_t *fb;
    float *bound;
} fxa_mpi_local;

/* Copy-in of the caller's args into *a (the struct_size policy of
 * base/struct_size.h over zeros), then the checks a rank makes before any
 * communication: pointers, outputs that share memory with the inputs or
 * with each other, and with U > 1 finiteness (a non-finite value must be
 * found on the rank that owns it, before the exchange moves it). Local:
 * msg says why, the caller agrees (mpi_args.c). */
fxa_status fxa_mpi_take_args(const fxa_mpi_attn_plan *p, const fxa_attn_args *user,
                             fxa_attn_args *a, char *msg, size_t cap);

/* The first non-finite input of this rank's shards, named in global
 * coordinates in msg: 1 when there is one (mpi_args.c). */
int fxa_mpi_find_non_finite(const fxa_mpi_attn_plan *p, const fxa_attn_args *a, char *msg,
                            size_t cap);

/* The plan of a local problem of batch B, nq q heads on nk kv heads, the
 * ring block's queries and the largest ring block's keys, in layout l
 * (segment.c). A failure leaves the context's message. */
fxa_status fxa_mpi_local_plan(const fxa_mpi_attn_plan *p, int64_t batch, int64_t nq, int64_t nk,
                              fxa_layout l, fxa_attn_plan **out, size_t *ws_bytes);

/* Segment s of the local problem loc (R == 1: a whole problem) by
 * fxa_attn_run with workspace ws (s's bytes, 64-byte aligned); its fallback
 * rows, vmax and bound go into sum. A failure is recorded on p->m
 * (fxa_mpi_fail). (segment.c) */
fxa_status fxa_mpi_run_segment(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc,
                               const fxa_mpi_segment *s, void *ws, fxa_attn_stats *sum);

/* Add one local run's statistics into sum (segment.c). */
void fxa_mpi_add_stats(fxa_attn_stats *sum, const fxa_attn_stats *one);

#endif
