/* Shared pieces of the distributed subcommands (attn, bench, layer under
 * mpirun): threads per rank and errors that every rank agrees on. */
#ifndef FXT_MPI_CLI_H
#define FXT_MPI_CLI_H

#include <mpi.h>
#include <stdint.h>

#include "cli.h"
#include "fxattn.h"
#include "fxattn_mpi.h"

/* This process in MPI_COMM_WORLD, and its captured error: while a command
 * runs under MPI, fxt_fail stores its message in msg (fxt_fail_capture)
 * instead of printing it. */
typedef struct fxt_world {
    int rank;
    int size;
    double timeout; /* seconds a wait may see no progress (--timeout) */
    char msg[600];
} fxt_world;

/* Initialise MPI (MPI_THREAD_FUNNELED), fill w and start capturing errors.
 * timeout: --timeout's value, 0 when not given (fxa_mpi_default_timeout()).
 * Returns 0 or an exit code. */
int fxt_world_init(fxt_world *w, double timeout);

/* The shard of grid rank `rank` of seq tokens over n ranks as libfxattn_mpi
 * splits a problem of d: fxa_canonical_shard for reproducible ones, else
 * fxa_mpi_shard. */
static inline void fxt_shard(const fxa_attn_desc *d, int64_t seq, int n, int rank, int64_t *start,
                             int64_t *len)
{
    if (d->reproducible)
        fxa_canonical_shard(seq, n, rank, start, len);
    else
        fxa_mpi_shard(seq, n, rank, start, len);
}

/* Around a blocking MPI call of the CLI (MPI_Init, MPI_Finalize, a
 * communicator's creation, a library call that creates one): unless
 * fxt_world_unguard follows within the deadline (--timeout), a thread
 * prints "fxattn: error: rank N: no progress from the other ranks for T s
 * (what)" and ends this process (_exit): mpirun then ends every rank, a
 * stopped one too. Started by fxt_world_init, ended by
 * fxt_world_finalize; nothing without it. */
void fxt_world_guard(const char *what);
void fxt_world_unguard(void);

/* Wait for a nonblocking collective of the CLI, polling (libfxattn_mpi's
 * fxa_mpi_wait_all): when it sees no progress for w->timeout seconds,
 * fxt_world_abort with "rank N: no progress from the other ranks for T s
 * (what)". */
void fxt_world_wait(fxt_world *w, MPI_Request *r, const char *what);

/* The same without sleeping between polls, for waits that are timed or
 * start a timed section (a sleep would count as time or skew the start). */
void fxt_world_spin(fxt_world *w, MPI_Request *r, const char *what);

/* A barrier over MPI_COMM_WORLD, waited with fxt_world_spin: ranks leave it
 * together, and a peer that never arrives ends the job instead of hanging
 * it. */
void fxt_world_barrier(fxt_world *w, const char *what);

/* An in-place MPI_Iallreduce over MPI_COMM_WORLD, waited with
 * fxt_world_wait. */
void fxt_world_allreduce(fxt_world *w, void *buf, int count, MPI_Datatype type, MPI_Op op,
                         const char *what);

/* A peer stopped making progress: print msg on this rank ("fxattn: error:
 * ..."), give the other ranks, whose deadlines end about now, 2 s to report
 * theirs, and end the job (MPI_Abort: ranks that are frozen are killed). */
_Noreturn void fxt_world_abort(fxt_world *w, const char *msg);
/* Stop capturing, flush stdout, MPI_Finalize. */
void fxt_world_finalize(fxt_world *w);

/* Collective: agree on an exit code across MPI_COMM_WORLD. The lowest
 * failing rank's code and message win; rank 0 prints "fxattn: error: rank
 * N: ..." once. Returns the agreed code (0 when every rank passed 0). */
int fxt_world_agree(fxt_world *w, int code);

/* Collective over MPI_COMM_WORLD, the first of a distributed command:
 * every rank's options agree. opts: the command's table (cmd_opts.h)
 * holding this rank's parsed values, each compared by a hash of its
 * canonical text. One option is per rank and may differ: --threads (hosts
 * may have different cores). On a disagreement every rank returns
 * FXT_EXIT_BAD_INPUT and rank 0 prints once which option (the first of the
 * table that differs) and which ranks: "ranks disagree on --block: 1 on
 * rank 0, 2 on rank 1". Returns 0 or that code. */
int fxt_world_agree_options(fxt_world *w, const fxt_opt *opts);

/* Collective over MPI_COMM_WORLD: every rank passes the same count (at
 * most FXT_WORLD_MAX_HASHES) hashes, hashes[i] of what[i] ("the bytes read
 * from x.npy"). Otherwise every rank returns FXT_EXIT_BAD_INPUT and rank 0
 * prints once "ranks read different <what[i]>: rank R differs from rank 0"
 * for the first i that differs. Returns 0 or that code. */
#define FXT_WORLD_MAX_HASHES 8
int fxt_world_agree_hashes(fxt_world *w, const uint64_t *hashes, const char *const *what,
                           int count);

/* After a collective library call whose status and message are already the
 * same on every rank: rank 0 prints it; returns the exit code (0 if OK).
 * FXA_ERR_TIMEOUT (not agreed: the communicator is stuck) ends the job
 * through fxt_world_abort. */
int fxt_world_lib_fail(fxt_world *w, fxa_status st, const char *msg);

/* `threads` when > 0, else this rank's share of the CPUs it may use
 * (fxa_mpi_default_threads). Collective over MPI_COMM_WORLD. */
int fxt_mpi_threads_per_rank(int64_t threads);

/* The ranks of MPI_COMM_WORLD on this node (MPI_COMM_TYPE_SHARED; 1 when
 * the split fails). Collective over MPI_COMM_WORLD. */
int fxt_mpi_node_ranks(void);

/* The option `opt` (attn and bench: "--grid", layer: "--cp-grid") with
 * value `grid`: NULL (nothing to do) or "auto": measure this job's links
 * and compute rate (plan_mpi.c), plan d's attention over the job's ranks
 * and set *ulysses and *ring to the best grid (printed on rank 0). Bad
 * values or the option with --ulysses / --ring: the same error on every
 * rank. Collective over MPI_COMM_WORLD. Returns 0 or the agreed exit code
 * (the error printed once by rank 0, fxt_world_agree). */
int fxt_mpi_grid_auto(fxt_world *w, const char *opt, const char *grid, const fxa_attn_desc *d,
                      int threads, int *ulysses, int *ring);

#endif
