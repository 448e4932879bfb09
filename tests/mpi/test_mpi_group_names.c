/*
 * A context on a subgroup of a larger grid (what libfxattn_wan_mpi makes
 * for its tensor- and context-parallel groups) names ranks in its messages
 * by the numbers fxa_mpi_name_ranks gave them, not by their place in the
 * subgroup. 4 ranks: groups {0, 2} and {1, 3}, each rank named by its
 * world rank. In group {1, 3}: a bad argument on rank 3 is "rank 3: ..."
 * on both, and a run that rank 3 never joins fails rank 1 with "rank 1: no
 * progress ... for 1 s". Rank 0 ends the job after the verdict
 * (MPI_Abort: rank 1's context holds a request that never completes), so
 * the test passes on its printed line ("group_names: ok N checks").
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi/mpi_internal.h"
#include "mpi_fixtures.h"

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    const int rank = fxt_mpi_world_rank(4);
    fxa_ctx *ctx = fxt_ctx(1);
    CHECK(ctx != NULL, "no context");
    MPI_Comm group;
    MPI_Comm_split(MPI_COMM_WORLD, rank % 2, rank, &group);
    fxa_mpi_params p;
    fxa_mpi_params_init(&p);
    p.timeout_seconds = 1.0;
    p.placement = FXA_MPI_PLACE_RANKS;
    fxa_mpi *m = NULL;
    CHECK(fxa_mpi_create(group, ctx, &p, &m) == FXA_OK, "create: %s", fxa_mpi_create_error());
    CHECK(fxa_mpi_name_ranks(m, rank) == FXA_OK, "naming: %s", fxa_mpi_last_error(m));

    fxa_attn_desc d;
    fxt_attn_desc(&d, 1, 2, 2, 8, 8, 16);
    fxa_mpi_attn_plan *plan = NULL;
    CHECK(fxa_mpi_attn_plan_create(m, &d, &plan) == FXA_OK, "plan: %s", fxa_mpi_last_error(m));
    float *x = calloc(4 * 2 * 16, sizeof(float));
    float *out = calloc(4 * 2 * 16, sizeof(float));
    fxa_attn_args a = {.struct_size = sizeof a, .q = x, .k = x, .v = x, .out = out};
    if (rank == 3)
        a.out = NULL;
    fxa_status st = fxa_mpi_attn_run(plan, &a, NULL);
    if (rank % 2)
        CHECK(st == FXA_ERR_INVALID_ARG &&
                  strncmp(fxa_mpi_last_error(m), "rank 3: q, k, v and out", 23) == 0,
              "rank %d: a NULL out on rank 3 reads '%s'", rank, fxa_mpi_last_error(m));
    else
        CHECK(st == FXA_OK, "rank %d: %s", rank, fxa_mpi_last_error(m));

    a.out = out;
    if (rank == 1) {
        st = fxa_mpi_attn_run(plan, &a, NULL);
        CHECK(st == FXA_ERR_TIMEOUT &&
                  strcmp(fxa_mpi_last_error(m),
                         "rank 1: no progress from the other ranks for 1 s (agreeing on errors)") ==
                      0,
              "rank 1: a run rank 3 never joins reads '%s'", fxa_mpi_last_error(m));
    }
    int failures = g_failures, all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        if (all)
            printf("group_names: %d failed checks\n", all);
        else
            test_summary("group_names");
        fflush(stdout);
        MPI_Abort(MPI_COMM_WORLD, all ? 1 : 0);
    }
    sleep(60); /* rank 0 ends the job */
    return 1;
}
