/*
 * fxa_mpi_wait_all (fxattn_mpi.h), the library's polled wait that the CLI
 * uses, on 2 ranks: an exchange completes (FXA_OK, sleeping and spinning);
 * a receive that no rank sends times out after the deadline
 * (FXA_ERR_TIMEOUT, not before 0.2 s, well within 5 s) and stays posted
 * (cancelled here); bad arguments are refused.
 */
#include "mpi_fixtures.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const int rank = fxt_mpi_world_rank(2);
    for (int spin = 0; spin < 2; spin++) {
        int out = rank + 10, in = -1;
        MPI_Request r[2];
        MPI_Irecv(&in, 1, MPI_INT, 1 - rank, 1, MPI_COMM_WORLD, &r[0]);
        MPI_Isend(&out, 1, MPI_INT, 1 - rank, 1, MPI_COMM_WORLD, &r[1]);
        CHECK(fxa_mpi_wait_all(2, r, 5.0, spin) == FXA_OK, "exchange (spin %d)", spin);
        CHECK(in == 11 - rank, "received %d", in);
    }
    int never = 0;
    MPI_Request r;
    MPI_Irecv(&never, 1, MPI_INT, 1 - rank, 2, MPI_COMM_WORLD, &r);
    const double t0 = MPI_Wtime();
    CHECK(fxa_mpi_wait_all(1, &r, 0.2, 0) == FXA_ERR_TIMEOUT, "a receive nobody sends");
    const double waited = MPI_Wtime() - t0;
    CHECK(waited >= 0.2 && waited < 5.0, "timed out after %g s", waited);
    CHECK(r != MPI_REQUEST_NULL, "the request is not left posted");
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
    CHECK(fxa_mpi_wait_all(-1, &r, 1.0, 0) == FXA_ERR_INVALID_ARG, "n -1");
    CHECK(fxa_mpi_wait_all(1, NULL, 1.0, 0) == FXA_ERR_INVALID_ARG, "NULL requests");
    CHECK(fxa_mpi_wait_all(1, &r, -1.0, 0) == FXA_ERR_INVALID_ARG, "timeout -1");
    CHECK(fxa_mpi_wait_all(0, NULL, 1.0, 0) == FXA_OK, "no requests");
    return fxt_mpi_finish("test_mpi_wait_all");
}
