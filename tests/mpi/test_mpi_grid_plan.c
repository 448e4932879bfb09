/*
 * fxa_mpi_grid_plan (fxattn_mpi.h) on 2 ranks of one host:
 *  - nothing to measure: the given model comes back as it went in, and the
 *    pick is fxa_grid_best's;
 *  - everything to measure: the link inside the host, its CPU time per
 *    byte, the compute rates and the call's cost are measured (positive,
 *    the same on both ranks), the link between hosts (this job has none)
 *    keeps its given figures, P = 2 and N = 1 are the job's, and *best is
 *    the model's fastest grid of 2 ranks;
 *  - ranks that pass different models, and a fxa_grid_time struct_size
 *    below its first version's, fail on both ranks with one message; no
 *    byte past the caller's struct_size is written.
 */
#include <math.h>
#include <string.h>

#include "mpi_fixtures.h"

static int g_rank;

static void base_model(fxa_grid_model *m)
{
    fxa_grid_model_init(m);
    m->seq = 256;
    m->heads = 2;
    m->head_dim = 32;
    m->rank_flops = 5e9;
}

static void given_model(fxa_mpi *mpi)
{
    fxa_grid_model m, want;
    base_model(&m);
    m.ranks = 2;
    m.hosts = 1;
    m.measure = 0;
    want = m;
    fxa_grid_time best = {.struct_size = sizeof best}, pure = {.struct_size = sizeof pure};
    CHECK(fxa_mpi_grid_plan(mpi, &m, &best) == FXA_OK, "given: %s", fxa_mpi_last_error(mpi));
    CHECK(memcmp(&m, &want, sizeof m) == 0, "the given model changed");
    CHECK(fxa_grid_best(&want, &pure, NULL, 0) == FXA_OK, "fxa_grid_best");
    CHECK(memcmp(&best, &pure, sizeof best) == 0, "the pick is not fxa_grid_best's");
}

static void measured_model(fxa_mpi *mpi)
{
    fxa_grid_model m, given;
    base_model(&m);
    m.rank_flops = 0.0;
    given = m;
    fxa_grid_time best = {.struct_size = sizeof best};
    CHECK(fxa_mpi_grid_plan(mpi, &m, &best) == FXA_OK, "measured: %s", fxa_mpi_last_error(mpi));
    const unsigned want = FXA_GRID_MEASURE_INTRA | FXA_GRID_MEASURE_INTRA_CPU |
                          FXA_GRID_MEASURE_COMPUTE | FXA_GRID_MEASURE_CALL;
    CHECK(m.measure == want, "measured 0x%x, expected 0x%x", m.measure, want);
    CHECK(m.ranks == 2 && m.hosts == 1, "%d ranks on %d hosts", m.ranks, m.hosts);
    CHECK(memcmp(&m.inter, &given.inter, sizeof m.inter) == 0, "the absent link changed");
    CHECK(m.intra.bytes_per_second > 0 && m.intra.latency_seconds > 0 &&
              m.intra.cpu_seconds_per_byte > 0 && m.rank_flops > 0 && m.call_seconds >= 0,
          "intra %g B/s %g s %g s/B, %g FLOP/s, call %g s", m.intra.bytes_per_second,
          m.intra.latency_seconds, m.intra.cpu_seconds_per_byte, m.rank_flops, m.call_seconds);
    CHECK(m.n_step_rates == 2 && m.step_ring[0] == 1 && m.step_ring[1] == 2 &&
              m.step_flops[0] > 0 && m.step_flops[1] > 0,
          "step rates: %d", m.n_step_rates);
    const double fields[] = {m.intra.bytes_per_second,
                             m.intra.latency_seconds,
                             m.intra.cpu_seconds_per_byte,
                             m.rank_flops,
                             m.call_seconds,
                             m.step_flops[0],
                             m.step_flops[1],
                             best.seconds};
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++)
        CHECK(fxt_mpi_same_everywhere(fields[i]), "field %zu differs between the ranks", i);
    CHECK(best.ulysses * best.ring == 2, "best %d x %d", best.ulysses, best.ring);
    for (int u = 1; u <= 2; u++) {
        fxa_grid_time t = {.struct_size = sizeof t};
        CHECK(fxa_grid_cost(&m, u, 2 / u, &t, NULL, 0) == FXA_OK, "cost");
        CHECK(best.seconds <= t.seconds, "best %g s, %d x %d %g s", best.seconds, u, 2 / u,
              t.seconds);
        if (u == best.ulysses)
            CHECK(t.seconds == best.seconds, "best's time is not its grid's");
    }
}

static void misuse(fxa_mpi *mpi)
{
    fxa_grid_model m;
    base_model(&m);
    m.measure = 0;
    m.ranks = 2;
    m.hosts = 1;
    m.seq += g_rank; /* rank 1 plans another shape */
    fxa_grid_time best = {.struct_size = sizeof best};
    CHECK(fxa_mpi_grid_plan(mpi, &m, &best) == FXA_ERR_INVALID_ARG, "different models passed");
    CHECK(strstr(fxa_mpi_last_error(mpi), "disagree on the planner's model"), "message: %s",
          fxa_mpi_last_error(mpi));

    base_model(&m);
    m.measure = 0;
    m.ranks = 2;
    m.hosts = 1;
    unsigned char buf[sizeof(fxa_grid_time) + 16];
    memset(buf, 0xA5, sizeof buf);
    const size_t small = sizeof(size_t) + 4;
    memcpy(buf, &small, sizeof small);
    CHECK(fxa_mpi_grid_plan(mpi, &m, (fxa_grid_time *)(void *)buf) == FXA_ERR_INVALID_ARG,
          "a too small fxa_grid_time accepted");
    CHECK(strstr(fxa_mpi_last_error(mpi), "fxa_grid_time.struct_size"), "message: %s",
          fxa_mpi_last_error(mpi));
    for (size_t i = sizeof small; i < sizeof buf; i++)
        CHECK(buf[i] == 0xA5, "byte %zu written", i);
    const size_t full = sizeof(fxa_grid_time);
    memcpy(buf, &full, sizeof full);
    CHECK(fxa_mpi_grid_plan(mpi, &m, (fxa_grid_time *)(void *)buf) == FXA_OK, "full size: %s",
          fxa_mpi_last_error(mpi));
    for (size_t i = full; i < sizeof buf; i++)
        CHECK(buf[i] == 0xA5, "byte %zu past struct_size written", i);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    g_rank = fxt_mpi_world_rank(2);
    fxa_ctx *ctx = fxt_ctx(1);
    CHECK(ctx != NULL, "no context");
    fxa_mpi_params p;
    fxa_mpi_params_init(&p);
    p.timeout_seconds = 60.0;
    fxa_mpi *mpi = NULL;
    CHECK(fxa_mpi_create(MPI_COMM_WORLD, ctx, &p, &mpi) == FXA_OK, "create: %s",
          fxa_mpi_create_error());
    given_model(mpi);
    measured_model(mpi);
    misuse(mpi);
    fxa_mpi_destroy(mpi);
    fxa_ctx_destroy(ctx);
    return fxt_mpi_finish("test_mpi_grid_plan");
}
