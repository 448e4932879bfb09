/*
 * Distributed misuse under mpirun (4 ranks): every case must fail on every
 * rank, with the same message everywhere, within 10 seconds, without
 * writing output; the library stays usable afterwards. The versioned
 * structs (params, descriptor, args, stats) at sizes older releases had
 * and at sizes none had. With the argument
 * `die` (or `kill`), rank 1 exits (or is killed) in the middle of a
 * collective call instead: tests/mpi/rank_exits.sh then expects mpirun to
 * end the job (non-zero, no hang).
 */
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>

#include "mpi_fixtures.h"

static fxa_ctx *g_ctx;
static int g_rank;
static int g_size;

/* The same status and message on every rank, and quickly. */
static void check_everywhere(const char *label, fxa_status st, const char *msg, double t0)
{
    const double secs = MPI_Wtime() - t0;
    const uint64_t h = (uint64_t)st * 0x9E3779B97F4A7C15ull ^ (uint64_t)strlen(msg) * 31u;
    uint64_t hash = h;
    for (const char *c = msg; *c; c++)
        hash = hash * 131u + (unsigned char)*c;
    uint64_t in[2] = {hash, ~hash};
    uint64_t mx[2];
    MPI_Allreduce(in, mx, 2, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
    CHECK(st != FXA_OK, "%s: rank %d did not fail", label, g_rank);
    CHECK(mx[0] == ~mx[1], "%s: ranks report different errors (rank %d: %s)", label, g_rank, msg);
    CHECK(secs < 10.0, "%s: took %.1f s", label, secs);
    if (g_rank == 0)
        printf("  %-40s -> %s (%.3f s)\n", label, msg, secs);
}

/* fxa_mpi_create of p on comm, which must fail alike on every rank. */
static fxa_status create_fails(const char *label, MPI_Comm comm, const fxa_mpi_params *p,
                               fxa_mpi **m)
{
    const double t0 = MPI_Wtime();
    const fxa_status st = fxa_mpi_create(comm, g_ctx, p, m);
    check_everywhere(label, st, fxa_mpi_create_error(), t0);
    return st;
}

/* A plan of d (this rank's) on m, which must fail alike on every rank. */
static fxa_status plan_fails(const char *label, fxa_mpi *m, const fxa_attn_desc *d,
                             fxa_mpi_attn_plan **plan)
{
    const double t0 = MPI_Wtime();
    const fxa_status st = fxa_mpi_attn_plan_create(m, d, plan);
    check_everywhere(label, st, fxa_mpi_last_error(m), t0);
    return st;
}

/* A run of plan on m with a and stats, which must fail alike on every rank. */
static fxa_status run_fails(const char *label, fxa_mpi *m, fxa_mpi_attn_plan *plan,
                            const fxa_attn_args *a, fxa_mpi_stats *stats)
{
    const double t0 = MPI_Wtime();
    const fxa_status st = fxa_mpi_attn_run(plan, a, stats);
    check_everywhere(label, st, fxa_mpi_last_error(m), t0);
    return st;
}

static fxa_attn_desc base_desc(void)
{
    fxa_attn_desc d;
    fxt_attn_desc(&d, 1, 4, 4, 64, 64, 16);
    return d;
}

/* A params struct of a release whose struct ends at `size`: the fields it
 * has are set, 0xff bytes past them; accepted, nothing past it read. */
static void check_old_params(size_t size, const char *release)
{
    fxa_mpi_params p;
    memset(&p, 0xff, sizeof p);
    p.struct_size = size;
    p.ulysses = 1;
    p.ring = 0;
    p.prefetch = 0;
    if (size > offsetof(fxa_mpi_params, timeout_seconds))
        p.timeout_seconds = 0.0;
    fxa_mpi *m = NULL;
    const fxa_status st = fxa_mpi_create(MPI_COMM_WORLD, g_ctx, &p, &m);
    CHECK(st == FXA_OK && m != NULL, "a %s params struct is refused: %s", release,
          fxa_mpi_create_error());
    fxa_mpi_destroy(m);
}

static void test_grid(void)
{
    fxa_mpi *m = NULL;
    fxa_mpi_params p;
    fxa_mpi_params_init(&p);
    p.ulysses = 3;
    p.ring = 1;
    create_fails("U x R != P", MPI_COMM_WORLD, &p, &m);
    CHECK(m == NULL, "no handle on failure");
    p.ulysses = g_rank == 0 ? 2 : 4;
    p.ring = g_rank == 0 ? 2 : 1;
    create_fails("ranks disagree on the grid", MPI_COMM_WORLD, &p, &m);
    /* Deadlines: not a positive number of seconds, or different on one rank. */
    fxa_mpi_params_init(&p);
    p.timeout_seconds = -1.0;
    create_fails("timeout_seconds -1", MPI_COMM_WORLD, &p, &m);
    p.timeout_seconds = 2e9;
    create_fails("timeout_seconds 2e9", MPI_COMM_WORLD, &p, &m);
    CHECK(strstr(fxa_mpi_create_error(), "longer than the longest deadline, 1e9 s") != NULL,
          "timeout_seconds 2e9: %s", fxa_mpi_create_error());
    p.timeout_seconds = g_rank == 3 ? 30.0 : 0.0;
    create_fails("ranks disagree on the timeout", MPI_COMM_WORLD, &p, &m);
    /* Placement: an unknown value, or different on one rank. */
    fxa_mpi_params_init(&p);
    p.placement = 7;
    create_fails("placement 7", MPI_COMM_WORLD, &p, &m);
    p.placement = g_rank == 1 ? FXA_MPI_PLACE_RANKS : FXA_MPI_PLACE_HOSTS;
    create_fails("ranks disagree on the placement", MPI_COMM_WORLD, &p, &m);
    /* MPI_COMM_NULL on every rank: refused at once, never MPI's fatal
     * error handler. */
    fxa_status st = create_fails("MPI_COMM_NULL", MPI_COMM_NULL, &p, &m);
    CHECK(st == FXA_ERR_INVALID_ARG && strstr(fxa_mpi_create_error(), "MPI_COMM_NULL") && !m,
          "fxa_mpi_create(MPI_COMM_NULL): %s, %s", fxa_status_str(st), fxa_mpi_create_error());
    int grid_rank = -1;
    st = fxa_mpi_grid_rank(MPI_COMM_NULL, FXA_MPI_PLACE_HOSTS, &grid_rank);
    CHECK(st == FXA_ERR_INVALID_ARG && grid_rank == -1 &&
              strstr(fxa_mpi_create_error(), "MPI_COMM_NULL"),
          "fxa_mpi_grid_rank(MPI_COMM_NULL): %s, %s", fxa_status_str(st), fxa_mpi_create_error());
    CHECK(fxa_mpi_default_threads(MPI_COMM_NULL) >= 1, "fxa_mpi_default_threads(MPI_COMM_NULL)");
    st = fxa_mpi_grid_rank(MPI_COMM_WORLD, 7, &grid_rank);
    CHECK(st == FXA_ERR_INVALID_ARG && grid_rank == -1 &&
              strstr(fxa_mpi_create_error(), "placement"),
          "fxa_mpi_grid_rank with placement 7: %s, %s", fxa_status_str(st), fxa_mpi_create_error());
    /* Callers built against 0.1.1 (no placement: placed by hosts) and
     * 0.1.0 (no timeout_seconds: the default deadline). */
    check_old_params(offsetof(fxa_mpi_params, placement), "0.1.1");
    check_old_params(offsetof(fxa_mpi_params, timeout_seconds), "0.1.0");
    /* Sizes no release had: below 0.1.0's, past the current one. */
    const size_t sizes[2] = {sizeof(size_t), sizeof(fxa_mpi_params) + 8};
    for (int i = 0; i < 2; i++) {
        fxa_mpi_params_init(&p);
        p.struct_size = sizes[i];
        st = create_fails(i ? "params struct_size too large" : "params struct_size too small",
                          MPI_COMM_WORLD, &p, &m);
        CHECK(st == FXA_ERR_INVALID_ARG && !m &&
                  strstr(fxa_mpi_create_error(), "fxa_mpi_params.struct_size"),
              "params struct_size %zu: %s, %s", sizes[i], fxa_status_str(st),
              fxa_mpi_create_error());
    }
}

static void test_plans(fxa_mpi *m)
{
    fxa_attn_desc d = base_desc();
    fxa_mpi_attn_plan *plan = NULL;
    if (g_rank == 2)
        d.seq_q = 65;
    plan_fails("one rank has another shape", m, &d, &plan);
    d = base_desc();
    if (g_rank == 3)
        d.heads_kv = 3;
    plan_fails("one rank has an invalid descriptor", m, &d, &plan);
    d = base_desc();
    if (g_rank == 1)
        d.center = 0;
    plan_fails("one rank has other options", m, &d, &plan);
    /* Masks and causal are libfxattn's alone: refused on every rank. */
    d = base_desc();
    d.causal = 1;
    const fxa_status st = plan_fails("causal", m, &d, &plan);
    CHECK(st == FXA_ERR_UNSUPPORTED && strstr(fxa_mpi_last_error(m), "no attention mask"),
          "causal: %d '%s'", (int)st, fxa_mpi_last_error(m));
    CHECK(plan == NULL, "no plan on failure");
    /* fp64 plans are libfxattn's alone too */
    d = base_desc();
    d.dtype = FXA_F64;
    d.out_dtype = FXA_F64;
    d.compute = FXA_COMPUTE_FP64;
    const fxa_status st64 = plan_fails("f64 inputs", m, &d, &plan);
    CHECK(st64 == FXA_ERR_UNSUPPORTED && strstr(fxa_mpi_last_error(m), "not f64"),
          "f64 inputs: %d '%s'", (int)st64, fxa_mpi_last_error(m));
    d = base_desc();
    d.dropout_p = 0.1;
    const fxa_status st_drop = plan_fails("dropout", m, &d, &plan);
    CHECK(st_drop == FXA_ERR_UNSUPPORTED && strstr(fxa_mpi_last_error(m), "no dropout"),
          "dropout: %d '%s'", (int)st_drop, fxa_mpi_last_error(m));
}

/* This rank's shards of base_desc()'s Q, K, V (random) and an output. */
typedef struct shards {
    size_t elems;
    float *q, *k, *v, *out;
} shards;

static shards make_shards(const fxa_attn_desc *d, uint64_t seed)
{
    int64_t start;
    int64_t n;
    fxa_mpi_shard(d->seq_q, g_size, g_rank, &start, &n);
    shards s = {.elems = (size_t)(n * d->heads_q * d->head_dim)};
    s.q = malloc(s.elems * sizeof(float));
    s.k = malloc(s.elems * sizeof(float));
    s.v = malloc(s.elems * sizeof(float));
    s.out = malloc(s.elems * sizeof(float));
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    for (size_t i = 0; i < s.elems; i++) {
        s.q[i] = (float)fxt_rng_normal(&r);
        s.k[i] = (float)fxt_rng_normal(&r);
        s.v[i] = (float)fxt_rng_normal(&r);
    }
    return s;
}

static void free_shards(shards *s)
{
    free(s->q);
    free(s->k);
    free(s->v);
    free(s->out);
}

/* Bad inputs on one rank; outputs keep their sentinel everywhere. */
static void test_runs(fxa_mpi *m, const char *grid)
{
    fxa_attn_desc d = base_desc();
    fxa_mpi_attn_plan *plan = NULL;
    CHECK(fxa_mpi_attn_plan_create(m, &d, &plan) == FXA_OK, "plan: %s", fxa_mpi_last_error(m));
    shards sh = make_shards(&d, (uint64_t)g_rank + 1);
    const size_t elems = sh.elems;
    float *q = sh.q, *k = sh.k, *v = sh.v, *out = sh.out;
    const char *tensor[3] = {"Q", "K", "V"};
    float *which[3] = {q, k, v};
    for (int t = 0; t < 3; t++) {
        for (size_t i = 0; i < elems; i++)
            out[i] = -7.0f;
        const float keep = which[t][5];
        if (g_rank == 1)
            which[t][5] = NAN;
        fxa_attn_args a = {.struct_size = sizeof a, .q = q, .k = k, .v = v, .out = out};
        char label[80];
        snprintf(label, sizeof label, "%s: NaN in %s on rank 1", grid, tensor[t]);
        run_fails(label, m, plan, &a, NULL);
        CHECK(strstr(fxa_mpi_last_error(m), "rank 1: ") &&
                  strstr(fxa_mpi_last_error(m), "token 16,"),
              "%s: the owner and the global token are named: %s", label, fxa_mpi_last_error(m));
        int untouched = 1;
        for (size_t i = 0; i < elems; i++)
            untouched &= out[i] == -7.0f;
        CHECK(untouched, "%s: output written on rank %d", label, g_rank);
        which[t][5] = keep;
    }
    fxa_attn_args a = {
        .struct_size = sizeof a, .q = q, .k = k, .v = v, .out = g_rank == 2 ? NULL : out};
    char label[80];
    snprintf(label, sizeof label, "%s: NULL output on rank 2", grid);
    run_fails(label, m, plan, &a, NULL);
    /* Outputs that share memory with an input or with each other, on one
     * rank: every grid writes them only after reading every input, so
     * only a check up front refuses them. */
    float *lse = malloc(elems / (size_t)d.head_dim * sizeof(float));
    const char *alias_label[3] = {"lse inside out", "out on Q", "out on K"};
    for (int c = 0; c < 3; c++) {
        a = (fxa_attn_args){
            .struct_size = sizeof a, .q = q, .k = k, .v = v, .out = out, .lse = lse};
        if (g_rank == 3 && c == 0)
            a.lse = out + 8;
        else if (g_rank == 3)
            a.out = c == 1 ? q : k;
        snprintf(label, sizeof label, "%s: %s on rank 3", grid, alias_label[c]);
        run_fails(label, m, plan, &a, NULL);
        CHECK(strstr(fxa_mpi_last_error(m), "rank 3: ") &&
                  strstr(fxa_mpi_last_error(m), "must not share memory"),
              "%s: %s", label, fxa_mpi_last_error(m));
    }
    /* One rank runs a plan of another descriptor (the same shapes, another
     * scale): the ranks would compute different problems. */
    fxa_attn_desc other = d;
    other.scale = 0.5;
    fxa_mpi_attn_plan *plan2 = NULL;
    CHECK(fxa_mpi_attn_plan_create(m, &other, &plan2) == FXA_OK, "plan 2: %s",
          fxa_mpi_last_error(m));
    a = (fxa_attn_args){.struct_size = sizeof a, .q = q, .k = k, .v = v, .out = out};
    snprintf(label, sizeof label, "%s: another plan on rank 2", grid);
    run_fails(label, m, g_rank == 2 ? plan2 : plan, &a, NULL);
    CHECK(strstr(fxa_mpi_last_error(m), "run different plans") != NULL, "%s: %s", label,
          fxa_mpi_last_error(m));
    fxa_mpi_attn_plan_destroy(plan2);
    free(lse);
    /* Still usable: a good call succeeds on every rank. */
    a = (fxa_attn_args){.struct_size = sizeof a, .q = q, .k = k, .v = v};
    a.out = out;
    fxa_status st = fxa_mpi_attn_run(plan, &a, NULL);
    CHECK(st == FXA_OK, "%s: a good run after the failures: %s", grid, fxa_mpi_last_error(m));
    fxa_mpi_attn_plan_destroy(plan);
    free_shards(&sh);
}

/* The versioned structs a distributed plan and run read and write, at
 * every size the struct_size policy accepts or refuses: a 0.1 descriptor
 * (before the strides) plans the same problem as a current one; args and
 * stats of sizes no release had are refused on every rank, naming the
 * struct, with nothing written; stats are written within their struct_size
 * only (canaries past it stay). */
static void test_struct_sizes(fxa_mpi *m, const char *grid)
{
    fxa_attn_desc d = base_desc();
    shards sh = make_shards(&d, (uint64_t)g_rank + 11);
    const size_t elems = sh.elems;
    float *q = sh.q, *k = sh.k, *v = sh.v, *out = sh.out;
    float *out_old = malloc(elems * sizeof(float));
    char label[96];
    /* A caller built against 0.1: its descriptor ends before the strides,
     * and nothing past it is read (0xff there would be strides). */
    struct {
        fxa_attn_desc d;
    } old;
    memset(&old, 0xff, sizeof old);
    memcpy(&old.d, &d, offsetof(fxa_attn_desc, q_strides));
    old.d.struct_size = offsetof(fxa_attn_desc, q_strides);
    fxa_mpi_attn_plan *plan = NULL;
    fxa_mpi_attn_plan *plan_old = NULL;
    CHECK(fxa_mpi_attn_plan_create(m, &d, &plan) == FXA_OK, "%s: plan: %s", grid,
          fxa_mpi_last_error(m));
    CHECK(fxa_mpi_attn_plan_create(m, &old.d, &plan_old) == FXA_OK, "%s: a 0.1 descriptor: %s",
          grid, fxa_mpi_last_error(m));
    fxa_attn_args a = {.struct_size = sizeof a, .q = q, .k = k, .v = v, .out = out};
    CHECK(plan && fxa_mpi_attn_run(plan, &a, NULL) == FXA_OK, "%s: run: %s", grid,
          fxa_mpi_last_error(m));
    a.out = out_old;
    CHECK(plan_old && fxa_mpi_attn_run(plan_old, &a, NULL) == FXA_OK, "%s: run of the 0.1 plan: %s",
          grid, fxa_mpi_last_error(m));
    CHECK(!memcmp(out, out_old, elems * sizeof(float)),
          "%s: the 0.1 descriptor's plan computes another output", grid);
    fxa_mpi_attn_plan_destroy(plan_old);
    /* Descriptor sizes no release had. */
    const size_t desc_sizes[2] = {sizeof(size_t), sizeof(fxa_attn_desc) + 8};
    for (int i = 0; i < 2; i++) {
        struct {
            fxa_attn_desc d;
            char pad[8];
        } big;
        memset(&big, 0, sizeof big);
        big.d = d;
        big.d.struct_size = desc_sizes[i];
        plan_old = NULL;
        snprintf(label, sizeof label, "%s: desc struct_size %zu", grid, desc_sizes[i]);
        const fxa_status st = plan_fails(label, m, &big.d, &plan_old);
        CHECK(st == FXA_ERR_INVALID_ARG && !plan_old &&
                  strstr(fxa_mpi_last_error(m), "fxa_attn_desc.struct_size"),
              "%s: %s", label, fxa_mpi_last_error(m));
    }
    /* Args sizes no release had (0.1's is the current one): refused,
     * nothing written. */
    const size_t arg_sizes[2] = {sizeof(size_t), sizeof(fxa_attn_args) + 8};
    for (int i = 0; i < 2; i++) {
        struct {
            fxa_attn_args a;
            char pad[8];
        } big;
        memset(&big, 0, sizeof big);
        big.a = (fxa_attn_args){.struct_size = arg_sizes[i], .q = q, .k = k, .v = v, .out = out};
        for (size_t e = 0; e < elems; e++)
            out[e] = -7.0f;
        snprintf(label, sizeof label, "%s: args struct_size %zu", grid, arg_sizes[i]);
        const fxa_status st = run_fails(label, m, plan, &big.a, NULL);
        int untouched = 1;
        for (size_t e = 0; e < elems; e++)
            untouched &= out[e] == -7.0f;
        CHECK(st == FXA_ERR_INVALID_ARG && untouched &&
                  strstr(fxa_mpi_last_error(m), "fxa_attn_args.struct_size"),
              "%s: %s (output %s)", label, fxa_mpi_last_error(m),
              untouched ? "untouched" : "written");
    }
    /* Stats: written within their struct_size only; a size below the first
     * version's is refused and left as it is. */
    struct {
        fxa_mpi_stats s;
        unsigned char canary[32];
    } stats;
    memset(&stats, 0xab, sizeof stats);
    stats.s.struct_size = sizeof stats.s;
    a = (fxa_attn_args){.struct_size = sizeof a, .q = q, .k = k, .v = v, .out = out};
    fxa_status st = fxa_mpi_attn_run(plan, &a, &stats.s);
    int canaries = 1;
    for (size_t i = 0; i < sizeof stats.canary; i++)
        canaries &= stats.canary[i] == 0xab;
    CHECK(st == FXA_OK && canaries && stats.s.struct_size == sizeof stats.s &&
              stats.s.rows == d.batch * d.heads_q * d.seq_q,
          "%s: stats written past their struct_size or wrong: %s, rows %lld", grid,
          fxa_mpi_last_error(m), (long long)stats.s.rows);
    memset(&stats, 0xab, sizeof stats);
    stats.s.struct_size = sizeof(size_t);
    snprintf(label, sizeof label, "%s: stats struct_size %zu", grid, sizeof(size_t));
    st = run_fails(label, m, plan, &a, &stats.s);
    const unsigned char *bytes = (const unsigned char *)&stats.s.rows;
    int untouched = 1;
    for (size_t i = 0; i < sizeof stats - sizeof(size_t); i++)
        untouched &= bytes[i] == 0xab;
    CHECK(st == FXA_ERR_INVALID_ARG && untouched &&
              strstr(fxa_mpi_last_error(m), "fxa_mpi_stats.struct_size"),
          "%s: %s (stats %s)", label, fxa_mpi_last_error(m), untouched ? "untouched" : "written");
    fxa_mpi_attn_plan_destroy(plan);
    free_shards(&sh);
    free(out_old);
}

/* Rank 1 leaves in the middle of a collective call: by exiting, or killed
 * by a signal. */
static void die_midway(fxa_mpi *m, int killed)
{
    fxa_attn_desc d = base_desc();
    fxa_mpi_attn_plan *plan = NULL;
    if (g_rank == 1) {
        fprintf(stderr, "rank 1 %s on purpose\n", killed ? "is killed" : "exits");
        fflush(stderr);
        if (killed)
            raise(SIGKILL);
        _exit(3);
    }
    fxa_mpi_attn_plan_create(m, &d, &plan);
    fprintf(stderr, "rank %d: the job should have been ended\n", g_rank);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    g_rank = fxt_mpi_world_rank(4);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    g_ctx = fxt_mpi_ctx(1);
    const int grids[3][2] = {{1, 4}, {4, 1}, {2, 2}};
    fxa_mpi *m = NULL;
    fxa_mpi_params p;
    fxa_mpi_params_init(&p);
    if (argc > 1 && (strcmp(argv[1], "die") == 0 || strcmp(argv[1], "kill") == 0)) {
        fxa_mpi_create(MPI_COMM_WORLD, g_ctx, &p, &m);
        die_midway(m, strcmp(argv[1], "kill") == 0);
        MPI_Finalize();
        return 0; /* not reached on a healthy MPI: the job is ended first */
    }
    test_grid();
    for (int g = 0; g < 3; g++) {
        p.ulysses = grids[g][0];
        p.ring = grids[g][1];
        char name[16];
        snprintf(name, sizeof name, "U%dxR%d", p.ulysses, p.ring);
        if (fxa_mpi_create(MPI_COMM_WORLD, g_ctx, &p, &m) != FXA_OK) {
            CHECK(0, "create %s: %s", name, fxa_mpi_create_error());
            continue;
        }
        if (g == 0)
            test_plans(m);
        test_runs(m, name);
        test_struct_sizes(m, name);
        fxa_mpi_destroy(m);
    }
    fxa_ctx_destroy(g_ctx);
    return fxt_mpi_finish("test_mpi_misuse");
}
