/*
 * A peer that never arrives at start-up (2 ranks: rank 1 sleeps): every
 * collective libfxattn_mpi makes while creating its contexts is bounded by
 * the deadline. On rank 0, fxa_mpi_create (timeout 1 s), fxa_mpi_grid_rank
 * and fxa_mpi_default_threads (FXA_MPI_TIMEOUT=1) each return within 5 s:
 * the first two with FXA_ERR_TIMEOUT and "no progress from the other
 * ranks", the last with a thread count. Rank 0 then prints its verdict and
 * ends the job (MPI_Abort), so the test passes on its printed line
 * ("late_peer: ok N checks"), not on the job's exit status.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi_fixtures.h"

/* The call took at most 5 s (deadline 1 s, plus polling and start-up). */
static void check_bounded(const char *label, double t0)
{
    const double secs = MPI_Wtime() - t0;
    CHECK(secs < 5.0, "%s: returned after %.1f s", label, secs);
}

static void check_timeout(const char *label, fxa_status st, const char *msg)
{
    CHECK(st == FXA_ERR_TIMEOUT, "%s: status %s, not FXA_ERR_TIMEOUT (%s)", label,
          fxa_status_str(st), msg);
    CHECK(strstr(msg, "rank 0: no progress from the other ranks for 1 s") != NULL,
          "%s: message '%s'", label, msg);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (fxt_mpi_world_rank(2) == 1) {
        sleep(60); /* never arrives: rank 0 ends the job first */
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    setenv("FXA_MPI_TIMEOUT", "1", 1);
    fxa_ctx *ctx = fxt_ctx(1);
    CHECK(ctx != NULL, "no context");

    fxa_mpi_params p;
    fxa_mpi_params_init(&p);
    p.timeout_seconds = 1.0;
    fxa_mpi *m = NULL;
    double t0 = MPI_Wtime();
    fxa_status st = fxa_mpi_create(MPI_COMM_WORLD, ctx, &p, &m);
    check_bounded("fxa_mpi_create", t0);
    check_timeout("fxa_mpi_create", st, fxa_mpi_create_error());
    CHECK(m == NULL, "fxa_mpi_create: a context despite the timeout");

    int grid_rank = -1;
    t0 = MPI_Wtime();
    st = fxa_mpi_grid_rank(MPI_COMM_WORLD, FXA_MPI_PLACE_HOSTS, &grid_rank);
    check_bounded("fxa_mpi_grid_rank", t0);
    check_timeout("fxa_mpi_grid_rank", st, fxa_mpi_create_error());

    t0 = MPI_Wtime();
    const int threads = fxa_mpi_default_threads(MPI_COMM_WORLD);
    check_bounded("fxa_mpi_default_threads", t0);
    CHECK(threads >= 1, "fxa_mpi_default_threads: %d", threads);

    fxa_ctx_destroy(ctx);
    test_summary("late_peer");
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 0);
    return 0;
}
