/*
 * fxattn_mpi: context-parallel fixed-max attention on MPI (libfxattn_mpi).
 *
 * The global problem is the one fxa_attn_run would compute on one process;
 * its query and key sequences are split over the P ranks of a communicator
 * in grid-rank order (fxa_mpi_shard: contiguous shards, the first S mod P
 * ranks one token longer; with a reproducible descriptor
 * fxa_canonical_shard, shards of whole canonical groups; the grid rank fxa_mpi_rank places ranks by host,
 * see fxa_mpi_placement), and each rank passes its shards of Q, K, V and of
 * the output. The ranks form a U x R grid (grid rank = ring_index * U +
 * ulysses_index): Ulysses all-to-alls inside each row of U adjacent ranks
 * switch from sequence to head sharding (head counts that U does not divide
 * are split unevenly; K/V heads are replicated where Hkv < U), and the ring
 * rotates K/V along each column of R ranks while the queries stay put.
 * Fixed-max rows add the ring's partials by plain addition and normalise
 * once; rows that fail the gate run online softmax across the hops. The
 * bound's global quantities (key count, key sum and radius, max key norm,
 * Vmax per head) travel in one MPI_Allgather per call.
 *
 * Threads: only the thread that calls these functions talks to MPI (MPI
 * must be initialised with at least MPI_THREAD_FUNNELED when the fxa_ctx has
 * several threads); compute threads come from the fxa_ctx. The library never
 * calls MPI_Init or MPI_Finalize, and works on a duplicate of the caller's
 * communicator with MPI_ERRORS_RETURN, so MPI failures come back as
 * FXA_ERR_MPI.
 *
 * Rank numbers in the library's messages ("rank N: ...") are grid ranks
 * (fxa_mpi_rank). Collective calls must be made by every rank of the
 * communicator in the same order; misuse (different shapes or options on
 * different ranks, a bad input on one rank) returns the same error on
 * every rank instead of hanging. Local calls involve no communication. A peer that stops making
 * progress (a cut link, a frozen or dead rank) fails the waiting ranks'
 * calls with FXA_ERR_TIMEOUT after fxa_mpi_params.timeout_seconds ("rank
 * N: no progress from rank M for T s"); the context is then unusable (every
 * call fails at once), and the caller should end the job (MPI_Abort): the
 * communicator holds operations that will never complete. Creating a
 * context is bounded too: the duplicate is made with MPI_Comm_idup, and
 * every blocking MPI_Comm_split / MPI_Comm_split_type (MPI has no
 * nonblocking form) comes after a polled barrier, so a peer that never
 * arrives fails fxa_mpi_create, fxa_mpi_grid_rank and the layer's plan with
 * FXA_ERR_TIMEOUT. (A peer that stops between that barrier and the split
 * itself is not caught; the CLI bounds those calls with a watchdog.)
 */
#ifndef FXATTN_MPI_H
#define FXATTN_MPI_H

#include <mpi.h>

#include "fxattn.h"
#include "fxattn_grid.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fxa_mpi fxa_mpi;

/*
 * Grid placement. The grid's rank (fxa_mpi_rank) is the rank to shard by:
 * the user's shards of a rank are fxa_mpi_shard(seq, P, fxa_mpi_rank(m)),
 * which differs from MPI_Comm_rank(comm) when the placement reorders.
 *
 * FXA_MPI_PLACE_HOSTS (0, the default): the ranks are grouped by host (the
 * MPI_COMM_TYPE_SHARED groups of comm), hosts in the order of their lowest
 * rank, and in rank order within a host. Whatever order the launcher gave
 * the ranks (mpirun --map-by node interleaves hosts), each Ulysses row of
 * U ranks then lies inside one host when U divides every host's rank
 * count, and the ring runs across hosts. The order is the same on every
 * rank; comm's rank 0 stays grid rank 0; ranks already grouped by host (one
 * host, --map-by slot) keep their order.
 * FXA_MPI_PLACE_RANKS: grid rank = MPI_Comm_rank(comm).
 */
typedef enum fxa_mpi_placement {
    FXA_MPI_PLACE_HOSTS = 0,
    FXA_MPI_PLACE_RANKS = 1,
} fxa_mpi_placement;

typedef struct fxa_mpi_params {
    size_t struct_size; /* sizeof(fxa_mpi_params) */
    int ulysses;        /* U >= 1 */
    int ring;           /* R >= 1; U * R must equal the communicator's size */
    int prefetch; /* ring blocks in flight ahead of compute, clamped to [1, min(R-1, 64)]; 0 = 1 */
    /* Deadline: a wait on a peer (a ring block, an exchange, a collective)
     * that sees no progress for this many seconds fails the call with
     * FXA_ERR_TIMEOUT on this rank, and the context is unusable after.
     * 0 = the environment's FXA_MPI_TIMEOUT, else 60. Added in 0.1.1: a
     * struct_size that ends before it takes the default. */
    double timeout_seconds;
    /* Where each rank sits in the grid. Added in 0.2: a struct_size that
     * ends before it takes FXA_MPI_PLACE_HOSTS. */
    fxa_mpi_placement placement;
} fxa_mpi_params;

/* Defaults: U = 1, R = 0 (= the communicator's size: a pure ring),
 * prefetch 1, timeout 0 (FXA_MPI_TIMEOUT or 60 s), placement by hosts.
 * Local. */
FXA_API void fxa_mpi_params_init(fxa_mpi_params *p);

/* The deadline that timeout_seconds = 0 stands for: FXA_MPI_TIMEOUT from
 * the environment when set (a positive number of seconds), else 60; 0 when
 * FXA_MPI_TIMEOUT is set but is not a positive number. Local. */
FXA_API double fxa_mpi_default_timeout(void);

/* Collective over comm. Duplicates comm (reordered by the placement) and
 * splits it into the grid's rows and columns. Every rank gets the same error when U * R != P or the ranks
 * disagree on the parameters. ctx (not owned) computes; keep it alive. On
 * error *out is NULL and fxa_mpi_create_error() says why. MPI_COMM_NULL
 * or an intercommunicator: FXA_ERR_INVALID_ARG at once on the ranks that
 * pass it (their peers' calls then end at the deadline). */
FXA_API fxa_status fxa_mpi_create(MPI_Comm comm, fxa_ctx *ctx, const fxa_mpi_params *p,
                                  fxa_mpi **out);
/* Collective (frees the communicators). NULL is a no-op. Destroy the
 * context's plans first: a plan keeps a pointer to its context and must
 * not be used after it. */
FXA_API void fxa_mpi_destroy(fxa_mpi *m);
/* Why the last fxa_mpi_create on this thread failed. Local. */
FXA_API const char *fxa_mpi_create_error(void);
/* The last error of a call on m (the same text on every rank). Local. */
FXA_API const char *fxa_mpi_last_error(const fxa_mpi *m);
/* This rank's grid rank (its place in the duplicated, placed
 * communicator: the rank to shard by) and the number of ranks. Local. */
FXA_API int fxa_mpi_rank(const fxa_mpi *m);
FXA_API int fxa_mpi_size(const fxa_mpi *m);

/* Collective over comm: the grid rank fxa_mpi_create(comm, ...) with this
 * placement gives this rank (the same for any grid shape), for callers
 * that shard before creating a context. FXA_ERR_INVALID_ARG for an unknown
 * placement or a communicator that fxa_mpi_create refuses, FXA_ERR_MPI when MPI fails, FXA_ERR_TIMEOUT when a peer makes
 * no progress for fxa_mpi_default_timeout() seconds;
 * fxa_mpi_create_error() says why. */
FXA_API fxa_status fxa_mpi_grid_rank(MPI_Comm comm, fxa_mpi_placement placement, int *grid_rank);

/* Collective over comm. The thread count this rank should use by default:
 * its share of the CPUs its affinity mask holds, each CPU divided among the
 * ranks on the same node (MPI_COMM_TYPE_SHARED) whose masks hold it, so
 * unbound ranks on N CPUs get N / ranks and ranks bound to their own cores
 * get those; a cgroup CPU quota is split evenly among the node's ranks.
 * At least 1. Its exchanges wait at most fxa_mpi_default_timeout() seconds
 * without progress; past that, the even split of this rank's CPUs.
 * MPI_COMM_NULL or an intercommunicator: all of this rank's CPUs. */
FXA_API int fxa_mpi_default_threads(MPI_Comm comm);

/* Wait for n requests of any communicator the way the library's own waits
 * do: polling, with pauses of 10 us doubling up to 160 us between polls
 * (spin 0) or none (spin != 0, for waits that are timed or start a timed
 * section). FXA_OK when every request completed, FXA_ERR_MPI when MPI
 * failed testing them, FXA_ERR_TIMEOUT when none completed for
 * timeout_seconds (0: fxa_mpi_default_timeout()); the requests stay posted
 * then. FXA_ERR_INVALID_ARG for a negative n, NULL requests or a timeout
 * outside [0, 1e9]. Local; no message. */
FXA_API fxa_status fxa_mpi_wait_all(int n, MPI_Request *reqs, double timeout_seconds, int spin);

/* Token range [*start, *start + *len) of shard `rank` of a sequence of seq
 * tokens over n_ranks ranks. Local. */
FXA_API void fxa_mpi_shard(int64_t seq, int n_ranks, int rank, int64_t *start, int64_t *len);

/*
 * Collective error agreement: every rank passes its own status (and a
 * message when it failed); all ranks return the status of the lowest failing
 * rank, and fxa_mpi_last_error(m) holds "rank N: <its message>". For callers
 * that read inputs per rank (the CLI): a bad file on one rank then fails on
 * every rank.
 */
FXA_API fxa_status fxa_mpi_agree(fxa_mpi *m, fxa_status local, const char *local_msg);

/*
 * For libraries built on a context (libfxattn_wan_mpi's layer and
 * tensor-parallel projection), which run collectives of their own:
 */
/* The context's communicator: the duplicate of the caller's, in grid-rank
 * order, with MPI_ERRORS_RETURN; owned by m. Wait on its requests with
 * fxa_mpi_wait_on. Local. */
FXA_API MPI_Comm fxa_mpi_comm(const fxa_mpi *m);
/* The fxa_ctx m computes on (fxa_mpi_create's). Local. */
FXA_API fxa_ctx *fxa_mpi_ctx(const fxa_mpi *m);
/* Wait for n requests (on fxa_mpi_comm(m) or a communicator made from it)
 * under m's deadline, polling: FXA_ERR_TIMEOUT when none completes for
 * timeout_seconds (m is unusable after: "rank N: no progress from the
 * other ranks for T s (what)"), FXA_ERR_MPI when MPI fails; the message in
 * fxa_mpi_last_error(m). A context already unusable fails at once. */
FXA_API fxa_status fxa_mpi_wait_on(fxa_mpi *m, int n, MPI_Request *reqs, const char *what);
/* Collective: FXA_OK when every rank passes the same n bytes at data (a
 * hash compared in one allreduce), else FXA_ERR_INVALID_ARG on every rank
 * with "ranks disagree on <what>". */
FXA_API fxa_status fxa_mpi_check_same(fxa_mpi *m, const void *data, size_t n, const char *what);
/* Collective: messages of m name each rank by the `name` it passes (a
 * context on a subgroup of a larger grid: its rank in that grid) instead of
 * its grid rank in m. */
FXA_API fxa_status fxa_mpi_name_ranks(fxa_mpi *m, int name);
/* Local: msg becomes fxa_mpi_last_error(m), for a library whose operator on
 * m failed alike on every rank (its own agreement) with a message of its
 * own. Added in 0.3. */
FXA_API void fxa_mpi_report(fxa_mpi *m, const char *msg);

typedef struct fxa_mpi_attn_plan fxa_mpi_attn_plan;

/*
 * Collective. d describes the global problem (seq_q, seq_kv over all ranks);
 * layout, dtype and options as in fxa_attn_desc (the scheduling fields apply
 * to each rank's local work; d->struct_size from 0.1's size on, as in
 * fxa_attn_plan_create). Every rank must pass the same descriptor: a hash
 * of it is compared across ranks.
 * The plan does all validation and sub-planning and owns every buffer its
 * runs use, allocated here (fxa_mpi_attn_run takes no workspace):
 *   - the local attention plans of this rank's heads and, without a ring,
 *     their workspace;
 *   - with a ring (R > 1): one accumulator per local problem (about
 *     B * Hq/U * Sq/R * (D + 5) * 4 bytes), 2 (prefetch + 1) slots of the
 *     largest K/V block in flight, the MPI request arrays of every slot's
 *     messages and the buffers of the ring's summaries;
 *   - with Ulysses (U > 1): the head-sharded Q, K, V and outputs of the
 *     row's tokens, the staging of both exchanges, their offsets and MPI
 *     request arrays and, without a ring, the pipeline's per-group plans.
 * Buffers larger than fxa_available_memory() (or an allocation that
 * fails) give FXA_ERR_NO_MEMORY on every rank, fxa_mpi_last_error(m)
 * naming what did not fit.
 */
FXA_API fxa_status fxa_mpi_attn_plan_create(fxa_mpi *m, const fxa_attn_desc *d,
                                            fxa_mpi_attn_plan **out);
/* Local. Frees the plan and every buffer it owns. NULL is a no-op. */
FXA_API void fxa_mpi_attn_plan_destroy(fxa_mpi_attn_plan *plan);

/* What one distributed run did (this rank's view unless said global). */
typedef struct fxa_mpi_stats {
    size_t struct_size;          /* set by the caller (sizeof); written within it only */
    int64_t rows;                /* global B * Hq * Sq */
    int64_t fallback_rows;       /* global */
    double vmax;                 /* global */
    double max_bound;            /* global */
    double seconds;              /* wall time of the call on this rank */
    double a2a_seconds;          /* Ulysses all-to-alls (forward and back) */
    double ring_compute_seconds; /* summed over ring steps */
    double ring_wait_seconds;    /* blocked on ring transfers */
    int ring_steps;
    /* Added in 0.3: the compute every rank ran (FXA_COMPUTE_AUTO resolved
     * across the ranks). */
    fxa_compute compute;
} fxa_mpi_stats;

/* Per ring step of this rank's last fxa_mpi_attn_run: compute seconds and
 * seconds blocked on the step's transfers (arrays of *n_steps entries, owned
 * by the plan, valid until the next run). Local. */
FXA_API void fxa_mpi_attn_step_times(const fxa_mpi_attn_plan *plan, int *n_steps,
                                     const double **compute, const double **wait);

/*
 * Collective. args holds this rank's shards: q [B, Sq_r, Hq, D] (BSHD) or
 * [B, Hq, Sq_r, D] (BHSD) with Sq_r from fxa_mpi_shard(seq_q, P, rank), k
 * and v likewise with seq_kv, out like q (fp32), and the optional lse,
 * row_fallback and row_bound as [B, Hq, Sq_r] and lse_parts as [B, Hq,
 * Sq_r][3] (each row's global softmax state, for the backward; with R == 1
 * and whole kv heads the bytes of one process). A non-finite input on any
 * rank, or outputs that share memory with the inputs or with each other,
 * fail the call on every rank before any output is written, and so do
 * ranks that pass plans of different descriptors (FXA_ERR_INVALID_ARG).
 * args->struct_size and stats->struct_size follow the struct_size policy
 * (fxattn.h, "Conventions": 0.1's size to the current one, else
 * FXA_ERR_INVALID_ARG). stats may be NULL. Runs on the plan's buffers and
 * the caller's tensors: the call allocates nothing (what MPI allocates
 * inside its own functions aside: Open MPI's nonblocking collectives do).
 * Every failure is explained by fxa_mpi_last_error (the same status and
 * message on every rank, but for a peer's deadline: see above).
 */
FXA_API fxa_status fxa_mpi_attn_run(fxa_mpi_attn_plan *plan, const fxa_attn_args *args,
                                    fxa_mpi_stats *stats);

typedef struct fxa_mpi_attn_bwd_plan fxa_mpi_attn_bwd_plan;

/*
 * The backward of fxa_mpi_attn_run (collective). d: the forward's global
 * descriptor (fxa_mpi_attn_plan_create's rules; every rank passes the same
 * one, compared by a hash), on any U x R grid. With heads_kv >= U each
 * member of a row holds whole kv heads and their query heads; with
 * heads_kv < U the members are split over the kv heads, each holding one
 * kv head (replicated) and a share of its query heads, and a kv head's dK,
 * dV is the sum of its members' parts, added in member order. The plan owns every buffer its runs use, allocated here.
 * U > 1: this rank's heads' Q, K, V, O, dO, lse and dQ, dK, dV over its
 * row's tokens (BHSD), the staging of both exchanges and their MPI
 * requests. R > 1: one local backward plan per ring block, two slots of a
 * K/V block, its dK/dV accumulator received and sent, one block's dK/dV
 * part, dQ's part and sum. Both: the local workspace. Buffers larger than
 * fxa_available_memory() give FXA_ERR_NO_MEMORY on every rank.
 */
FXA_API fxa_status fxa_mpi_attn_bwd_plan_create(fxa_mpi *m, const fxa_attn_desc *d,
                                                fxa_mpi_attn_bwd_plan **out);
/* Local. Frees the plan and every buffer it owns. NULL is a no-op. */
FXA_API void fxa_mpi_attn_bwd_plan_destroy(fxa_mpi_attn_bwd_plan *plan);

/*
 * Collective. args holds this rank's shards as for fxa_mpi_attn_run: q, k,
 * v, out (fp32) and dout (fp32, out's shape) of its tokens, lse [B, Hq,
 * Sq_r] (this rank's shard of the forward's lse), the optional lse_parts
 * [B, Hq, Sq_r][3] (this rank's shard of the forward's: P is then the
 * forward's own at any score magnitude, as in fxa_attn_bwd_run; with U > 1
 * they travel with the lse, and every rank with query tokens passes them
 * or none does, else FXA_ERR_INVALID_ARG on every rank), and the fp32
 * outputs dq, dk, dv shaped like q, k, v (grad_dtype FXA_F32; another is
 * FXA_ERR_UNSUPPORTED on every rank).
 * Ulysses (U > 1): all-to-alls inside each row move the shards to head
 * sharding over the row's tokens, and bring dq, dk, dv back at the end.
 * R == 1: fxa_attn_bwd_run computes this rank's heads over the whole
 * sequence: the bytes of fxa_attn_bwd_run on the gathered tensors, for any
 * U and thread count (dK, dV of replicated kv heads: within the rounding
 * of the sum over the members' parts).
 * Ring (R > 1): K/V blocks travel each column with their dK/dV
 * accumulators while the queries, O, dO, lse and dQ stay;
 * fxa_attn_bwd_run on (this rank's queries, one key block) gives exact
 * parts (the global lse and O fix P and D), summed in a fixed order: dQ
 * over the blocks from this rank's own, a block's dK, dV over the ranks
 * from its owner on. The same bytes on every run; equal to one process
 * within that summation's rounding.
 * Outputs are written only when every rank succeeded; every failure (a
 * NULL tensor, a non-finite input, plans of different descriptors) is the
 * same status and message on every rank (fxa_mpi_last_error). stats
 * (optional): rows, seconds, a2a_seconds (Ulysses), ring_steps,
 * ring_compute_seconds and ring_wait_seconds (ring). Allocates nothing.
 */
FXA_API fxa_status fxa_mpi_attn_bwd_run(fxa_mpi_attn_bwd_plan *plan, const fxa_attn_bwd_args *args,
                                        fxa_mpi_stats *stats);

/*
 * Collective over m's communicator: which U x R grid to run (the cost
 * model of fxattn_grid.h, docs/cluster.md) for model's shape on this job.
 * model (in and out; every rank passes the same one, compared by a hash):
 * the shape (seq, heads, head_dim, dtype), ranks and hosts (0: the job's:
 * its size and its MPI_COMM_TYPE_SHARED groups) and the figures not
 * measured; model->measure says what to measure on this job:
 * FXA_GRID_MEASURE_INTRA / _INTER: latency and bandwidth by a ping-pong
 * between grid rank 0 and the first rank on its host / on another host
 * (8-byte and 4 MiB messages); _INTRA_CPU / _INTER_CPU: the CPU time per
 * byte of a 4 MiB exchange both ways on that link; _COMPUTE: rank_flops
 * and the ring step rates by fxa_grid_measure on m's context, every rank
 * at once, the slowest rank's, shared among the model's ranks per host
 * instead of the job's; _CALL: call_seconds, the fixed cost of a small
 * fxa_mpi_attn_run on m's grid beyond what the model predicts for it. A
 * link this job lacks keeps the given figures. On success every rank gets
 * the same model (the measured figures filled in, model->measure set to
 * what was measured, with FXA_GRID_UNEVEN_HOSTS when the job's hosts run
 * different numbers of ranks) and the fastest grid in *best (the smaller U
 * on ties; fxa_grid_cost gives any other). Waits poll against m's
 * deadline. Errors (a model out of range, ranks that pass different
 * models, a failed measurement): the same on every rank,
 * fxa_mpi_last_error(m). Plan on a context made for planning (for example
 * the default ring of P ranks), then create one with the chosen grid.
 */
FXA_API fxa_status fxa_mpi_grid_plan(fxa_mpi *m, fxa_grid_model *model, fxa_grid_time *best);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_MPI_H */
