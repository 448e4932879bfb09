/*
 * A peer frozen in the middle of a distributed backward: `test_mpi_bwd_stall
 * U R` on 2 ranks (2 1: Ulysses 2, 1 2: ring 2), deadline 2 s
 * (fxa_mpi_params.timeout_seconds). Both ranks loop fxa_mpi_attn_bwd_run on
 * one thread (a run takes a few tenths of a second); on rank 1 a thread
 * waits until two runs are done, then half the second run's time more, and
 * stops the whole process (SIGSTOP), so the freeze lands inside a run
 * however loaded the machine is. On rank 0:
 *   - at least one run succeeded before the freeze (it was in the loop);
 *   - the run in flight fails with FXA_ERR_TIMEOUT and "rank 0: no progress
 *     from ... for 2 s", after at least the deadline (a wait's clock starts
 *     inside the run) and within the deadline + 4 s + its longest good run
 *     of its start (the freeze comes at most one run after it started);
 *   - it leaves dq, dk, dv untouched (0x7f bytes: outputs are written only
 *     once every rank agreed);
 *   - the context is unusable after: the next run fails at once with
 *     FXA_ERR_TIMEOUT, outputs untouched.
 * Rank 0 then prints its verdict and ends the job (MPI_Abort, which kills
 * the stopped rank), so the test passes on its printed line ("bwd_stall:
 * ok N checks"), not on the job's exit status.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi_fixtures.h"

static const double DEADLINE = 2.0;

/* Rank 1's runs done, and the second one's length in microseconds. */
static atomic_int g_runs_done;
static atomic_long g_second_run_us;

/* Rank 1's thread: stops its process half a run into its third run. */
static void *freeze_later(void *unused)
{
    (void)unused;
    while (atomic_load(&g_runs_done) < 2)
        usleep(1000);
    usleep((useconds_t)(atomic_load(&g_second_run_us) / 2));
    kill(getpid(), SIGSTOP);
    return NULL;
}

/* 1 when every byte of the n at p is 0x7f. */
static int untouched(const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((const unsigned char *)p)[i] != 0x7f)
            return 0;
    return 1;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    fxt_mpi_world_rank(2);
    if (argc != 3) {
        fprintf(stderr, "usage: mpirun -np 2 test_mpi_bwd_stall U R (U * R = 2)\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fxa_mpi_params mp = fxt_mpi_params(atoi(argv[1]), atoi(argv[2]));
    mp.timeout_seconds = DEADLINE;
    fxa_mpi *m = fxt_mpi_grid(fxt_mpi_ctx(1), &mp);
    const int rank = fxa_mpi_rank(m);

    /* 4 heads x 64 over 2560 tokens, fp32, BSHD: this rank's 1280. */
    const fxa_attn_desc d = fxt_mpi_desc(1, 4, 4, 2560, 2560, 64, FXA_F32, FXA_LAYOUT_BSHD);
    const fxt_mpi_split sp = fxt_mpi_split_of(&d, 2, rank);
    const size_t n = (size_t)sp.nq; /* of Q, K, V and each output */
    const size_t rows = (size_t)sp.rows;
    float *buf = malloc((8 * n + rows) * sizeof(float));
    float *q = buf, *k = q + n, *v = k + n, *out = v + n, *dout = out + n;
    float *dq = dout + n, *dk = dq + n, *dv = dk + n, *lse = dv + n;
    fxt_rng r;
    fxt_rng_seed(&r, 11 + (uint64_t)rank);
    fxt_mpi_fill(&r, FXA_F32, buf, (int64_t)(5 * n), 1.0);

    fxa_mpi_attn_plan *fp = NULL;
    fxa_mpi_attn_bwd_plan *bp = NULL;
    const fxa_attn_args fa = {
        .struct_size = sizeof fa, .q = q, .k = k, .v = v, .out = out, .lse = lse};
    if (fxa_mpi_attn_plan_create(m, &d, &fp) != FXA_OK ||
        fxa_mpi_attn_run(fp, &fa, NULL) != FXA_OK ||
        fxa_mpi_attn_bwd_plan_create(m, &d, &bp) != FXA_OK) {
        fprintf(stderr, "rank %d: setup: %s\n", rank, fxa_mpi_last_error(m));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    const fxa_attn_bwd_args a = fxt_bwd_args(q, k, v, out, dout, lse, dq, dk, dv);
    MPI_Barrier(MPI_COMM_WORLD);
    const double start = MPI_Wtime();
    if (rank == 1) {
        pthread_t th;
        if (pthread_create(&th, NULL, freeze_later, NULL) != 0)
            MPI_Abort(MPI_COMM_WORLD, 1);
        /* Runs until stopped; rank 0 ends the job. Bounded all the same. */
        for (;;) {
            const double t = MPI_Wtime();
            if (t - start > 50.0 || fxa_mpi_attn_bwd_run(bp, &a, NULL) != FXA_OK)
                break;
            if (atomic_load(&g_runs_done) == 1)
                atomic_store(&g_second_run_us, (long)((MPI_Wtime() - t) * 1e6));
            atomic_fetch_add(&g_runs_done, 1);
        }
        fprintf(stderr, "rank 1: still running after its freeze\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }

    /* Rank 0: run until a run fails (or 30 s pass). */
    int ok_runs = 0;
    fxa_status st = FXA_OK;
    double run_start = start;
    double longest = 0.0;
    while (st == FXA_OK && MPI_Wtime() - start < 30.0) {
        memset(dq, 0x7f, 3 * n * sizeof(float));
        run_start = MPI_Wtime();
        st = fxa_mpi_attn_bwd_run(bp, &a, NULL);
        ok_runs += st == FXA_OK;
        if (st == FXA_OK && MPI_Wtime() - run_start > longest)
            longest = MPI_Wtime() - run_start;
    }
    const double failed_at = MPI_Wtime();
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fxa_mpi_last_error(m));
    printf("rank 0: %d runs before the freeze (%.2f s each); the run from %.2f s failed at "
           "%.2f s: %s\n",
           ok_runs, ok_runs ? (run_start - start) / ok_runs : 0.0, run_start - start,
           failed_at - start, msg);
    CHECK(ok_runs >= 1, "no run succeeded before the freeze");
    CHECK(st == FXA_ERR_TIMEOUT, "status %s, not FXA_ERR_TIMEOUT", fxa_status_str(st));
    CHECK(!strncmp(msg, "rank 0: no progress from ", 25) && strstr(msg, " for 2 s ("),
          "message '%s'", msg);
    CHECK(failed_at - run_start >= DEADLINE - 0.01,
          "the run failed after %.2f s, before the %g s deadline", failed_at - run_start, DEADLINE);
    CHECK(failed_at - run_start <= DEADLINE + 4.0 + longest,
          "the run failed %.2f s after its start (deadline %g s, longest good run %.2f s)",
          failed_at - run_start, DEADLINE, longest);
    CHECK(untouched(dq, 3 * n * sizeof(float)), "a timed-out run wrote dq, dk or dv");

    memset(dq, 0x7f, 3 * n * sizeof(float));
    const double again = MPI_Wtime();
    st = fxa_mpi_attn_bwd_run(bp, &a, NULL);
    CHECK(st == FXA_ERR_TIMEOUT, "the next run: status %s", fxa_status_str(st));
    CHECK(MPI_Wtime() - again < 0.5, "the next run took %.2f s", MPI_Wtime() - again);
    CHECK(untouched(dq, 3 * n * sizeof(float)), "the next run wrote dq, dk or dv");

    test_summary("bwd_stall");
    fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, 0);
    return 0;
}
