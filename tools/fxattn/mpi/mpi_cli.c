/* Shared pieces of the distributed subcommands (mpi_cli.h). */
#include "mpi_cli.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "fxattn_mpi.h"

int fxt_world_init(fxt_world *w, double timeout)
{
    /* Every rank sees the same options and environment: each fails alike,
     * before MPI starts. */
    if (!(timeout >= 0.0 && timeout <= 1e9))
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--timeout %g is not a positive number of seconds",
                        timeout);
    const double t = timeout > 0.0 ? timeout : fxa_mpi_default_timeout();
    if (t == 0.0)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "FXA_MPI_TIMEOUT=%s is not a positive number of seconds",
                        getenv("FXA_MPI_TIMEOUT"));
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return fxt_fail(FXT_EXIT_FAILURE, "MPI_Init_thread failed");
    *w = (fxt_world){0, 1, t, ""};
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    fxt_fail_capture(w->msg, sizeof w->msg);
    return 0;
}

void fxt_world_finalize(fxt_world *w)
{
    (void)w;
    fxt_fail_capture(NULL, 0);
    fflush(stdout);
    MPI_Finalize();
}

_Noreturn void fxt_world_abort(fxt_world *w, const char *msg)
{
    (void)w;
    fxt_fail_capture(NULL, 0);
    fxt_fail(FXT_EXIT_FAILURE, "%s", msg);
    fflush(stdout);
    fflush(stderr);
    const struct timespec linger = {2, 0};
    nanosleep(&linger, NULL);
    MPI_Abort(MPI_COMM_WORLD, FXT_EXIT_FAILURE);
    _exit(FXT_EXIT_FAILURE);
}

/* No progress for w->timeout seconds since start: end the job. */
static void check_deadline(fxt_world *w, double start, const char *what)
{
    if (MPI_Wtime() - start <= w->timeout)
        return;
    char msg[300];
    snprintf(msg, sizeof msg, "rank %d: no progress from the other ranks for %g s (%s)", w->rank,
             w->timeout, what);
    fxt_world_abort(w, msg);
}

void fxt_world_wait(fxt_world *w, MPI_Request *r, const char *what)
{
    const double start = MPI_Wtime();
    long us = 10;
    for (;;) {
        int done = 0;
        if (MPI_Test(r, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done)
            return; /* an MPI error shows up in what the caller does next */
        check_deadline(w, start, what);
        const struct timespec ts = {0, us * 1000L};
        nanosleep(&ts, NULL);
        us = us < 1000 ? 2 * us : us;
    }
}

void fxt_world_spin(fxt_world *w, MPI_Request *r, const char *what)
{
    const double start = MPI_Wtime();
    int done = 0;
    while (MPI_Test(r, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && !done)
        check_deadline(w, start, what);
}

void fxt_world_barrier(fxt_world *w, const char *what)
{
    MPI_Request r;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    fxt_world_spin(w, &r, what);
}

void fxt_world_allreduce(fxt_world *w, void *buf, int count, MPI_Datatype type, MPI_Op op,
                         const char *what)
{
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, what);
}

int fxt_world_agree(fxt_world *w, int code)
{
    int in[2] = {code != 0, w->rank};
    int out[2];
    MPI_Request r;
    MPI_Iallreduce(in, out, 1, MPI_2INT, MPI_MAXLOC, MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, "agreeing on errors");
    if (!out[0])
        return 0;
    const int root = out[1];
    struct {
        int code;
        char msg[600];
    } e = {code, ""};
    snprintf(e.msg, sizeof e.msg, "%s", w->msg);
    MPI_Ibcast(&e, (int)sizeof e, MPI_BYTE, root, MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, "the failing rank's error");
    e.msg[sizeof e.msg - 1] = '\0';
    fxt_fail_capture(NULL, 0);
    if (w->rank == 0)
        fxt_fail(e.code, "rank %d: %s", root, e.msg);
    fxt_fail_capture(w->msg, sizeof w->msg);
    return e.code ? e.code : FXT_EXIT_FAILURE;
}

int fxt_world_lib_fail(fxt_world *w, fxa_status st, const char *msg)
{
    if (st == FXA_OK)
        return 0;
    if (st == FXA_ERR_TIMEOUT)
        fxt_world_abort(w, msg);
    if (w->rank == 0) {
        char keep[sizeof w->msg];
        snprintf(keep, sizeof keep, "%s", msg);
        fxt_fail_capture(NULL, 0);
        fxt_fail(fxt_exit_code(st), "%s", keep);
        fxt_fail_capture(w->msg, sizeof w->msg);
    }
    return fxt_exit_code(st);
}

int fxt_mpi_threads_per_rank(int64_t threads)
{
    /* Collective whatever `threads` is, so that ranks stay in step. */
    const int share = fxa_mpi_default_threads(MPI_COMM_WORLD);
    return threads > 0 ? (int)threads : share;
}

int fxt_mpi_node_ranks(void)
{
    MPI_Comm node;
    int n = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) !=
        MPI_SUCCESS)
        return 1;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    return n;
}
