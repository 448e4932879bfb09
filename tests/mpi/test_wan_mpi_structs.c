/*
 * libfxattn_wan_mpi's versioned structs under mpirun (P ranks, tensor
 * parallel over all of them): fxa_wan_grid sizes outside its versions are
 * refused on every rank with one message; fxa_wan_stats is written only
 * within the caller's struct_size (canaries past it kept) and a size below
 * its first version's is refused, the struct untouched; the layer's plan
 * holds its projections, so that repeated runs give the same y; runs take
 * fxa_wan_args (fxa_wan_mpi_run's bytes); a plan on a caller's fxa_mpi
 * handle gives the same y and leaves its failures' messages (plan and run)
 * in the handle, which stays usable.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_wan_mpi.h"
#include "mpi_fixtures.h"

#define DIM 32
#define HEADS 4 /* divided over up to 4 ranks */
#define CANARY 0xc3

/* 1 when bytes [from, n) of buf still hold CANARY. */
static int canaries_kept(const unsigned char *buf, size_t from, size_t n)
{
    for (size_t i = from; i < n; i++)
        if (buf[i] != CANARY)
            return 0;
    return 1;
}

int main(int argc, char **argv)
{
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    fxa_ctx *ctx = fxt_mpi_ctx(1);
    fxa_wan_desc d;
    fxa_wan_desc_init(&d);
    d.frames = 2;
    d.height = 2;
    d.width = 3;
    d.heads = HEADS;
    d.head_dim = DIM;
    fxa_wan_grid g;
    fxa_wan_grid_init(&g);
    g.tp = size;
    fxa_wan_mpi_plan *plan = NULL;
    size_t bytes = 0;
    char err[700] = "";
    /* A grid struct of a size outside its versions. */
    const size_t bad[] = {sizeof g - 4, sizeof g + 8};
    for (int i = 0; i < 2; i++) {
        g.struct_size = bad[i];
        const fxa_status st = fxa_wan_mpi_plan_create(MPI_COMM_WORLD, ctx, &d, &g, &plan, &bytes);
        CHECK(st == FXA_ERR_INVALID_ARG && plan == NULL &&
                  strstr(fxa_wan_mpi_create_error(), "fxa_wan_grid.struct_size") != NULL,
              "grid of %zu bytes: '%s'", bad[i], fxa_wan_mpi_create_error());
    }
    g.struct_size = sizeof g;
    CHECK(fxa_wan_mpi_plan_create(MPI_COMM_WORLD, ctx, &d, &g, &plan, &bytes) == FXA_OK, "plan: %s",
          fxa_wan_mpi_create_error());
    if (!plan)
        return test_summary("test_wan_mpi_structs");
    fxa_wan_mpi_shard s;
    fxa_wan_mpi_shard_of(plan, &s);
    fxa_wan_load_params lp;
    fxa_wan_load_params_init(&lp);
    lp.heads = HEADS;
    lp.hidden = HEADS * DIM;
    lp.seed = 9;
    lp.head_begin = s.head_begin;
    lp.head_count = s.head_count;
    fxa_wan_weights w;
    CHECK(fxa_wan_weights_load(NULL, &lp, &w, err, sizeof err) == FXA_OK, "weights: %s", err);
    const int64_t n = s.token_count * HEADS * DIM;
    float *x = malloc((size_t)n * sizeof(float));
    float *y = malloc((size_t)n * sizeof(float));
    float *y1 = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = fxa_wan_synth(9, FXA_WAN_SYNTH_X, (uint64_t)(s.token_begin * HEADS * DIM + i));
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    unsigned char buf[sizeof(fxa_wan_stats) + 32];
    memset(buf, CANARY, sizeof buf);
    fxa_wan_stats *st = (fxa_wan_stats *)(void *)buf;
    st->struct_size = sizeof *st;
    CHECK(fxa_wan_mpi_run(plan, &w, x, y, ws, st) == FXA_OK, "run: %s",
          fxa_wan_mpi_last_error(plan));
    const int canary = canaries_kept(buf, sizeof *st, sizeof buf);
    CHECK(canary && st->rows == (int64_t)HEADS * 12, "stats: %lld rows, canaries %s",
          (long long)st->rows, canary ? "kept" : "overwritten");
    CHECK(fxa_wan_mpi_run(plan, &w, x, y1, ws, NULL) == FXA_OK &&
              (!s.holds_y || memcmp(y, y1, (size_t)n * sizeof(float)) == 0),
          "a second run: %s", fxa_wan_mpi_last_error(plan));
    /* fxa_wan_mpi_layer_run: fxa_wan_mpi_run's bytes; a struct_size outside
     * fxa_wan_args' sizes on one rank fails every rank. */
    fxa_wan_args a = {.struct_size = sizeof a, .weights = &w, .x = x, .y = y1};
    CHECK(fxa_wan_mpi_layer_run(plan, &a, ws, NULL) == FXA_OK &&
              (!s.holds_y || memcmp(y, y1, (size_t)n * sizeof(float)) == 0),
          "fxa_wan_mpi_layer_run: %s", fxa_wan_mpi_last_error(plan));
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    a.struct_size = rank == 0 ? sizeof a + 8 : sizeof a;
    CHECK(fxa_wan_mpi_layer_run(plan, &a, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_wan_mpi_last_error(plan), "fxa_wan_args.struct_size") != NULL,
          "fxa_wan_args of %zu bytes on rank 0: '%s'", sizeof a + 8, fxa_wan_mpi_last_error(plan));
    memset(buf, CANARY, sizeof buf);
    st->struct_size = offsetof(fxa_wan_stats, rows);
    CHECK(fxa_wan_mpi_run(plan, &w, x, y, ws, st) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_wan_mpi_last_error(plan), "fxa_wan_stats.struct_size") != NULL,
          "stats of %zu bytes: '%s'", st->struct_size, fxa_wan_mpi_last_error(plan));
    CHECK(canaries_kept(buf, sizeof st->struct_size, sizeof buf),
          "a refused stats struct was written");

    fxa_mpi *m = NULL;
    CHECK(fxa_mpi_create(MPI_COMM_WORLD, ctx, NULL, &m) == FXA_OK, "handle: %s",
          fxa_mpi_create_error());
    fxa_wan_mpi_plan *on = NULL;
    size_t on_bytes = 0;
    fxa_wan_desc odd = d;
    odd.head_dim = DIM - 1;
    CHECK(fxa_wan_mpi_plan_create_on(m, &odd, &g, &on, &on_bytes) == FXA_ERR_INVALID_ARG &&
              on == NULL && strstr(fxa_mpi_last_error(m), "must be even") != NULL,
          "an odd head_dim on a handle: '%s'", fxa_mpi_last_error(m));
    CHECK(fxa_wan_mpi_plan_create_on(m, &d, &g, &on, &on_bytes) == FXA_OK && on_bytes == bytes,
          "plan on a handle: %s", fxa_mpi_last_error(m));
    if (on) {
        float *y2 = malloc((size_t)n * sizeof(float));
        a.struct_size = sizeof a;
        a.y = y2;
        CHECK(fxa_wan_mpi_layer_run(on, &a, ws, NULL) == FXA_OK &&
                  (!s.holds_y || memcmp(y, y2, (size_t)n * sizeof(float)) == 0),
              "the plan on a handle differs: %s", fxa_mpi_last_error(m));
        a.struct_size = rank == 0 ? sizeof a + 8 : sizeof a;
        CHECK(fxa_wan_mpi_layer_run(on, &a, ws, NULL) == FXA_ERR_INVALID_ARG &&
                  strstr(fxa_mpi_last_error(m), "fxa_wan_args.struct_size") != NULL,
              "a refused run on a handle: '%s'", fxa_mpi_last_error(m));
        fxa_wan_mpi_plan_destroy(on);
        free(y2);
    }
    CHECK(fxa_mpi_agree(m, FXA_OK, "") == FXA_OK, "the handle after the layer: %s",
          fxa_mpi_last_error(m));
    fxa_mpi_destroy(m);
    free(ws);
    free(x);
    free(y);
    free(y1);
    fxa_wan_weights_free(&w);
    fxa_wan_mpi_plan_destroy(plan);
    fxa_ctx_destroy(ctx);
    return fxt_mpi_finish("test_wan_mpi_structs");
}
