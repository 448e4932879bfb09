/*
 * The cost model (fxattn_grid.h): a case worked by hand (docs/cluster.md:
 * 2 ranks on 1 host, S=1024, H=2, D=64, fp32, 5 GFLOP/s per rank, inside
 * the host 1e9 B/s and 10 us), the best grid is the fastest, bad models
 * and grids are refused with a message, a struct_size below the first
 * version's is refused, copy-out writes no byte past the caller's
 * struct_size, and fxa_grid_measure fills positive rates for every
 * divisor R of P. NULL pointers are refused (FXA_ERR_INVALID_ARG) or
 * ignored (the initialiser), without a crash.
 */
#include <math.h>
#include <string.h>

#include "fxattn_grid.h"
#include "testutil.h"

/* m initialised (fxa_grid_model_init) for S = seq, H = heads, D = head_dim on P = ranks. */
static void init_model(fxa_grid_model *m, int64_t seq, int64_t heads, int64_t head_dim, int ranks)
{
    fxa_grid_model_init(m);
    m->seq = seq;
    m->heads = heads;
    m->head_dim = head_dim;
    m->ranks = ranks;
}

/* The case worked by hand (docs/cluster.md). */
static void hand_model(fxa_grid_model *m)
{
    init_model(m, 1024, 2, 64, 2);
    m->hosts = 1;
    m->rank_flops = 5e9;
    m->intra = (fxa_grid_link){1e-5, 1e9, 0.0};
}

static double seconds(const fxa_grid_model *m, int u, int r)
{
    fxa_grid_time t = {.struct_size = sizeof t};
    char err[200];
    CHECK(fxa_grid_cost(m, u, r, &t, err, sizeof err) == FXA_OK, "%d x %d: %s", u, r, err);
    CHECK(t.ulysses == u && t.ring == r, "grid %d x %d", t.ulysses, t.ring);
    CHECK(fabs(t.compute_seconds + t.comm_seconds - t.seconds) <= 1e-12 * t.seconds, "sum");
    return t.seconds;
}

static void near(double got, double want, const char *what)
{
    CHECK(fabs(got - want) <= 1e-9 * want, "%s: %.12g, expected %.12g", what, got, want);
}

int main(void)
{
    fxa_grid_model m;
    hand_model(&m);
    /* ring 1 x 2: 2 steps of 4*2*512^2*64 / 5e9 s (the transfer hidden)
     * plus one all-gather latency; Ulysses 2 x 1: the whole compute, two
     * exchanges (393216 and 137216 bytes, half crossing) and the latency;
     * all-gather: two rounds of 10 us + 262144 B / 1e9 and local compute. */
    near(seconds(&m, 1, 2), 0.0536870912 + 1e-5, "ring");
    near(seconds(&m, 2, 1), 0.0536870912 + 2e-5 + 5.30432e-4 + 1e-5, "ulysses");
    near(seconds(&m, 0, 0), 2 * (1e-5 + 262144 / 1e9) + 0.0536870912, "all-gather");

    fxa_grid_time best = {.struct_size = sizeof best};
    CHECK(fxa_grid_best(&m, &best, NULL, 0) == FXA_OK, "best");
    CHECK(best.ulysses == 1 && best.ring == 2, "best %d x %d", best.ulysses, best.ring);
    near(best.seconds, seconds(&m, 1, 2), "best's time");

    char err[200] = "";
    fxa_grid_time t = {.struct_size = sizeof t};
    CHECK(fxa_grid_cost(&m, 2, 2, &t, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "not one of 2 ranks"),
          "a grid of 4 ranks: %s", err);
    fxa_grid_model bad = m;
    bad.hosts = 3;
    CHECK(fxa_grid_cost(&bad, 1, 2, &t, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "divide"),
          "3 hosts of 2 ranks: %s", err);
    bad = m;
    bad.intra.bytes_per_second = NAN;
    CHECK(fxa_grid_best(&bad, &t, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "bandwidth"),
          "NaN bandwidth: %s", err);
    bad = m;
    bad.struct_size = sizeof bad - 1;
    CHECK(fxa_grid_best(&bad, &t, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "fxa_grid_model.struct_size"),
          "a short model: %s", err);

    /* Copy-out: the caller's bytes only; a short struct is refused whole. */
    unsigned char buf[sizeof(fxa_grid_time) + 16];
    memset(buf, 0xA5, sizeof buf);
    size_t n = sizeof(fxa_grid_time);
    memcpy(buf, &n, sizeof n);
    CHECK(fxa_grid_best(&m, (fxa_grid_time *)(void *)buf, NULL, 0) == FXA_OK, "full");
    for (size_t i = n; i < sizeof buf; i++)
        CHECK(buf[i] == 0xA5, "byte %zu past struct_size written", i);
    n = sizeof(size_t) + sizeof(int);
    memset(buf, 0xA5, sizeof buf);
    memcpy(buf, &n, sizeof n);
    CHECK(fxa_grid_best(&m, (fxa_grid_time *)(void *)buf, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "fxa_grid_time.struct_size"),
          "a short output: %s", err);
    for (size_t i = sizeof n; i < sizeof buf; i++)
        CHECK(buf[i] == 0xA5, "byte %zu written on failure", i);

    /* Measured rates: one per divisor of P = 4. */
    fxa_ctx *ctx = fxt_ctx(1);
    CHECK(ctx != NULL, "context");
    init_model(&m, 256, 2, 32, 4);
    m.dtype = FXA_BF16;
    CHECK(fxa_grid_measure(ctx, &m) == FXA_OK, "measure: %s", fxa_ctx_last_error(ctx));
    CHECK(m.rank_flops > 0 && isfinite(m.rank_flops), "rank_flops %g", m.rank_flops);
    CHECK(m.n_step_rates == 3, "%d step rates", m.n_step_rates);
    for (int i = 0; i < 3; i++)
        CHECK(m.step_ring[i] == (1 << i) && m.step_flops[i] > 0, "step %d", i);
    m.seq = 0;
    CHECK(fxa_grid_measure(ctx, &m) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "seq"),
          "seq 0: %s", fxa_ctx_last_error(ctx));
    fxa_grid_model_init(NULL);
    CHECK(fxa_grid_cost(NULL, 1, 1, &t, NULL, 0) == FXA_ERR_INVALID_ARG, "NULL model");
    CHECK(fxa_grid_best(&m, NULL, NULL, 0) == FXA_ERR_INVALID_ARG, "NULL output");
    CHECK(fxa_grid_measure(NULL, &m) == FXA_ERR_INVALID_ARG, "NULL context");
    CHECK(fxa_grid_measure(ctx, NULL) == FXA_ERR_INVALID_ARG, "NULL model to measure");
    fxa_ctx_destroy(ctx);
    return test_summary("test_grid_cost");
}
