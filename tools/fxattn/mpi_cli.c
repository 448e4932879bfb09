/* Shared pieces of the distributed subcommands (mpi_cli.h). */
#include "mpi_cli.h"

#include <mpi.h>
#include <stdio.h>

#include "cli.h"
#include "fxattn_mpi.h"

int fxt_world_init(fxt_world *w)
{
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
        return fxt_fail(FXT_EXIT_FAILURE, "MPI_Init_thread failed");
    *w = (fxt_world){0, 1, ""};
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

int fxt_world_agree(fxt_world *w, int code)
{
    int in[2] = {code != 0, w->rank};
    int out[2];
    MPI_Allreduce(in, out, 1, MPI_2INT, MPI_MAXLOC, MPI_COMM_WORLD);
    if (!out[0])
        return 0;
    const int root = out[1];
    struct {
        int code;
        char msg[600];
    } e = {code, ""};
    snprintf(e.msg, sizeof e.msg, "%s", w->msg);
    MPI_Bcast(&e, (int)sizeof e, MPI_BYTE, root, MPI_COMM_WORLD);
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
