/*
 * Distributed attention under mpirun: `test_mpi_attn U R` on U * R ranks.
 * Every rank builds the same global problem, computes the single-process
 * result with fxa_attn_run, runs fxa_mpi_attn_run on its shards and checks:
 *   - the assembled global output against the fp64 reference (the envelope
 *     of testutil.h) and its own shard against the single-process one:
 *     bit-identical for pure Ulysses (same summation order), within a few
 *     fp32 roundings otherwise;
 *   - per-row fallback flags equal to the single process's everywhere
 *     (a sink on one rank only), a huge V on one rank only, global centring,
 *     ragged sequences (Sq != Skv, not divisible), GQA with replicated kv
 *     heads, uneven head splits, bf16;
 *   - the rows' lse_parts (the backward's softmax state): bit-identical to
 *     the single process's for pure Ulysses; with a ring (its own sums)
 *     the base-2 LSE they give, m + log2(l) + tau log2(e) c, is the run's
 *     lse within 8 roundings at its magnitude (and at least 2^-20).
 * Each rank shards by its grid rank (fxa_mpi_rank). With FXA_MPI_TEST_HOSTS
 * (the library's test-only host labels per world rank, e.g. "0,1,0,1": the
 * hosts of mpirun --map-by node) it also checks the placement: the grid
 * ranks are a permutation, world rank 0 is grid rank 0, every Ulysses row
 * lies on one host (when U divides each host's ranks), ranks of a host
 * keep their order, fxa_mpi_grid_rank agrees, and FXA_MPI_PLACE_RANKS
 * keeps the world's order.
 * Any failure on any rank fails the test (the verdict is reduced).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_fixtures.h"

static fxa_ctx *g_ctx;
static fxa_mpi *g_mpi;
static int g_rank;      /* in MPI_COMM_WORLD */
static int g_grid_rank; /* in the grid: the rank to shard by */
static int g_size;
static int g_ulysses;
static int g_ring;

typedef struct problem {
    const char *name;
    fxa_attn_desc d;
    double q_scale;
    int sink;        /* a huge key in the last rank's K shard */
    int huge_v;      /* a 1e30 value in rank 0's V shard */
    double k_offset; /* common key offset (centring matters) */
} problem;

static void fill(tcase *t, const problem *pr)
{
    fxt_rng r;
    fxt_rng_seed(&r, 4242);
    for (int64_t i = 0; i < t->nq; i++)
        t->q[i] = (float)(pr->q_scale * fxt_rng_normal(&r));
    for (int64_t i = 0; i < t->nkv; i++) {
        t->k[i] =
            (float)(fxt_rng_normal(&r) + pr->k_offset * (double)((i % t->d.head_dim) % 3 == 0));
        t->v[i] = (float)fxt_rng_normal(&r);
    }
    int64_t start;
    int64_t len;
    if (pr->sink) {
        fxa_mpi_shard(t->d.seq_kv, g_size, g_size - 1, &start, &len);
        float *k = t->k + tcase_kv_off(t, 0, 0, start + len / 2);
        for (int64_t c = 0; c < t->d.head_dim; c++)
            k[c] *= 1000.0f;
    }
    if (pr->huge_v) {
        fxa_mpi_shard(t->d.seq_kv, g_size, 0, &start, &len);
        t->v[tcase_kv_off(t, 0, t->d.heads_kv - 1, start) + 1] = 1e30f;
    }
    tcase_round(t);
}

static void run_problem(const problem *pr)
{
    tcase t;
    tcase_init(&t, &pr->d);
    fill(&t, pr);
    const fxa_attn_desc *d = &t.d;
    const int64_t rows = d->batch * d->heads_q * d->seq_q;
    /* Single process. */
    float *ref = calloc((size_t)t.nq, sizeof(float));
    float *ref_lse = calloc((size_t)rows, sizeof(float));
    uint8_t *ref_fb = calloc((size_t)rows, 1);
    float *ref_parts = calloc((size_t)(3 * rows), sizeof(float));
    fxa_attn_stats ref_st = {.struct_size = sizeof ref_st};
    CHECK(tcase_run_parts(&t, g_ctx, ref, ref_lse, ref_fb, ref_parts, &ref_st) == FXA_OK,
          "%s: single-process run: %s", pr->name, fxa_ctx_last_error(g_ctx));
    if (pr->k_offset != 0.0) {
        /* The case is only a test of global centring if centring matters. */
        fxa_attn_desc raw = *d;
        fxa_attn_stats raw_st = {.struct_size = sizeof raw_st};
        raw.center = 0;
        CHECK(tcase_run(&t, g_ctx, d->mode, &raw, ref, NULL, NULL, NULL, &raw_st) == FXA_OK &&
                  raw_st.fallback_rows > 0 && ref_st.fallback_rows == 0,
              "%s: without centring rows must fall back (%lld), with it none (%lld)", pr->name,
              (long long)raw_st.fallback_rows, (long long)ref_st.fallback_rows);
        CHECK(tcase_run(&t, g_ctx, d->mode, NULL, ref, NULL, NULL, NULL, NULL) == FXA_OK, "rerun");
    }
    /* This rank's shards. */
    const fxt_mpi_split sp = fxt_mpi_split_of(d, g_size, g_grid_rank);
    fxt_mpi_qkv in = fxt_mpi_take_tcase(&t, &sp);
    float *out = calloc((size_t)sp.nq + 1, sizeof(float));
    float *lse = calloc((size_t)sp.rows + 1, sizeof(float));
    float *parts = calloc((size_t)(3 * sp.rows) + 1, sizeof(float));
    uint8_t *fb = calloc((size_t)sp.rows + 1, 1);
    fxa_mpi_attn_plan *plan = NULL;
    fxa_status st = fxa_mpi_attn_plan_create(g_mpi, d, &plan);
    CHECK(st == FXA_OK, "%s: plan: %s", pr->name, fxa_mpi_last_error(g_mpi));
    fxa_mpi_stats ms = {.struct_size = sizeof ms};
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = in.q,
                             .k = in.k,
                             .v = in.v,
                             .out = out,
                             .lse = lse,
                             .row_fallback = fb,
                             .lse_parts = parts};
    /* A stats struct of a size this library does not know is refused (on
     * every rank: they all pass it) and left as it is. */
    fxa_mpi_stats bad = {.struct_size = sizeof bad + 8, .rows = -5};
    st = plan ? fxa_mpi_attn_run(plan, &a, &bad) : FXA_ERR_INVALID_ARG;
    CHECK(st == FXA_ERR_INVALID_ARG && bad.rows == -5 &&
              strstr(fxa_mpi_last_error(g_mpi), "fxa_mpi_stats.struct_size") != NULL,
          "%s: stats of an unknown size: %s, '%s'", pr->name, fxa_status_str(st),
          fxa_mpi_last_error(g_mpi));
    st = plan ? fxa_mpi_attn_run(plan, &a, &ms) : FXA_ERR_INVALID_ARG;
    CHECK(st == FXA_OK, "%s: run: %s", pr->name, fxa_mpi_last_error(g_mpi));
    CHECK(ms.struct_size == sizeof ms, "%s: the run changed stats.struct_size", pr->name);
    CHECK(st != FXA_OK || ms.compute == ref_st.compute, "%s: stats name compute %d, one process %d",
          pr->name, (int)ms.compute, (int)ref_st.compute);
    int n_steps = -1;
    const double *step_c = NULL;
    const double *step_w = NULL;
    fxa_mpi_attn_step_times(plan, &n_steps, &step_c, &step_w);
    double sum_c = 0.0;
    for (int i = 0; i < n_steps; i++)
        sum_c += step_c[i];
    CHECK(st != FXA_OK || (n_steps == (g_ring > 1 ? g_ring : 0) && ms.ring_steps == n_steps &&
                           sum_c == ms.ring_compute_seconds),
          "%s: %d ring steps timed (stats %d, %g vs %g s)", pr->name, n_steps, ms.ring_steps, sum_c,
          ms.ring_compute_seconds);
    /* Assemble the global output (disjoint shards: a sum is a concatenation). */
    float *mine = calloc((size_t)t.nq, sizeof(float));
    float *full = calloc((size_t)t.nq, sizeof(float));
    float *lse_mine = calloc((size_t)rows, sizeof(float));
    float *lse_full = calloc((size_t)rows, sizeof(float));
    fxt_mpi_put_q(d, &sp, sizeof(float), mine, out);
    fxt_mpi_put_rows(d, &sp, sizeof(float), lse_mine, lse);
    MPI_Allreduce(mine, full, (int)t.nq, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(lse_mine, lse_full, (int)rows, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    terr e;
    tcase_errors(&t, full, lse_full, &e);
    if (g_rank == 0) {
        char label[96];
        snprintf(label, sizeof label, "%s U%d R%d", pr->name, g_ulysses, g_ring);
        terr_print(label, &e);
        printf(
            "    fallback %lld/%lld (single %lld), a2a %.3f s, ring compute %.3f s, wait %.3f s\n",
            (long long)ms.fallback_rows, (long long)ms.rows, (long long)ref_st.fallback_rows,
            ms.a2a_seconds, ms.ring_compute_seconds, ms.ring_wait_seconds);
    }
    CHECK(st != FXA_OK || terr_within_envelope(&e), "%s: outside the fp64 envelope", pr->name);
    /* This rank's shard against the single process. */
    int fb_same = 1;
    int bits_same = 1;
    int parts_same = 1;
    double parts_err = 0.0; /* the parts' LSE against lse, in units of the allowance */
    const double tau2 =
        (d->scale != 0.0f ? d->scale : 1.0 / sqrt((double)d->head_dim)) * 1.4426950408889634;
    double max_diff = 0.0;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads_q; h++)
            for (int64_t i = 0; i < sp.qn; i++) {
                const int64_t r = (b * d->heads_q + h) * d->seq_q + sp.q0 + i;
                const int64_t rl = (b * d->heads_q + h) * sp.qn + i;
                fb_same &= ref_fb[r] == fb[rl];
                bits_same &= test_f32_bits(ref_lse[r]) == test_f32_bits(lse[rl]);
                const float *pr3 = parts + 3 * rl;
                parts_same &= !memcmp(pr3, ref_parts + 3 * r, 3 * sizeof(float));
                const double lse2 = (double)pr3[0] + log2((double)pr3[1]) + tau2 * pr3[2];
                const double want = (double)lse[rl] * 1.4426950408889634;
                const double allow = fmax(8.0 * 0x1p-24 * fabs(want), 0x1p-20);
                parts_err = fmax(parts_err, fabs(lse2 - want) / allow);
                const float *x = full + tcase_q_off(&t, b, h, sp.q0 + i);
                const float *y = ref + tcase_q_off(&t, b, h, sp.q0 + i);
                for (int64_t c = 0; c < d->head_dim; c++) {
                    bits_same &= test_f32_bits(x[c]) == test_f32_bits(y[c]);
                    const double diff = fabs((double)x[c] - (double)y[c]);
                    max_diff = diff > max_diff ? diff : max_diff;
                }
            }
    CHECK(st != FXA_OK || fb_same, "%s: fallback rows differ from the single process", pr->name);
    CHECK(st != FXA_OK || ms.fallback_rows == ref_st.fallback_rows,
          "%s: %lld fallback rows, single process %lld", pr->name, (long long)ms.fallback_rows,
          (long long)ref_st.fallback_rows);
    CHECK(st != FXA_OK || parts_err <= 1.0,
          "%s: lse_parts give an LSE %g allowances from the run's lse", pr->name, parts_err);
    if (g_ring == 1) {
        CHECK(st != FXA_OK || bits_same, "%s: pure Ulysses must be bit-identical (max diff %g)",
              pr->name, max_diff);
        CHECK(st != FXA_OK || parts_same, "%s: pure Ulysses lse_parts differ from one process",
              pr->name);
    } else {
        /* Reordered fp32 sums over Skv terms of |v| <= Vmax: a few ulps of Vmax. */
        const double tol = 64.0 * 0x1p-24 * (e.vmax > 1.0 ? e.vmax : 1.0);
        CHECK(st != FXA_OK || max_diff <= tol, "%s: differs from the single process by %g > %g",
              pr->name, max_diff, tol);
    }
    fxa_mpi_attn_plan_destroy(plan);
    fxt_mpi_qkv_free(&in);
    free(out);
    free(lse);
    free(parts);
    free(ref_parts);
    free(fb);
    free(ref);
    free(ref_lse);
    free(ref_fb);
    free(mine);
    free(full);
    free(lse_mine);
    free(lse_full);
    tcase_free(&t);
}

/* FXA_MPI_TEST_HOSTS's label of world rank r (the test sets every entry). */
static int host_label(const char *list, int r)
{
    for (int i = 0; i < r && list; i++)
        if ((list = strchr(list, ',')))
            list++;
    return list ? atoi(list) : -1;
}

/* The placement by the test's host labels (see the top of the file). */
static void check_placement(const char *list)
{
    int *grid = malloc((size_t)g_size * sizeof(int));
    int *seen = calloc((size_t)g_size, sizeof(int));
    MPI_Allgather(&g_grid_rank, 1, MPI_INT, grid, 1, MPI_INT, MPI_COMM_WORLD);
    int *label_at = malloc((size_t)g_size * sizeof(int)); /* by grid rank */
    int *count = calloc((size_t)g_size + 1, sizeof(int)); /* ranks per label */
    int perm = 1;
    for (int r = 0; r < g_size; r++) {
        perm &= grid[r] >= 0 && grid[r] < g_size && !seen[grid[r]];
        if (perm) {
            seen[grid[r]] = 1;
            label_at[grid[r]] = host_label(list, r);
        }
        const int l = host_label(list, r);
        count[l >= 0 && l < g_size ? l : g_size]++;
    }
    CHECK(perm && grid[0] == 0, "the grid ranks are not a permutation keeping rank 0");
    int divides = 1;
    for (int l = 0; l < g_size; l++)
        divides &= count[l] % g_ulysses == 0;
    for (int gr = 0; perm && divides && gr < g_size; gr++)
        CHECK(label_at[gr] == label_at[gr - gr % g_ulysses],
              "grid rank %d (host %d) is in a Ulysses row of host %d", gr, label_at[gr],
              label_at[gr - gr % g_ulysses]);
    for (int a = 0; perm && a < g_size; a++)
        for (int b = a + 1; b < g_size; b++)
            CHECK(host_label(list, a) != host_label(list, b) || grid[a] < grid[b],
                  "world ranks %d < %d of one host are grid ranks %d > %d", a, b, grid[a], grid[b]);
    int alone = -1;
    CHECK(fxa_mpi_grid_rank(MPI_COMM_WORLD, FXA_MPI_PLACE_HOSTS, &alone) == FXA_OK &&
              alone == g_grid_rank,
          "fxa_mpi_grid_rank %d, the context's %d: %s", alone, g_grid_rank, fxa_mpi_create_error());
    fxa_mpi_params mp = fxt_mpi_params(g_ulysses, g_ring);
    mp.placement = FXA_MPI_PLACE_RANKS;
    fxa_mpi *in_order = NULL;
    CHECK(fxa_mpi_create(MPI_COMM_WORLD, g_ctx, &mp, &in_order) == FXA_OK &&
              fxa_mpi_rank(in_order) == g_rank,
          "FXA_MPI_PLACE_RANKS: grid rank %d for world rank %d (%s)",
          in_order ? fxa_mpi_rank(in_order) : -1, g_rank, fxa_mpi_create_error());
    fxa_mpi_destroy(in_order);
    if (g_rank == 0)
        printf("placement by hosts %s: world rank r -> grid rank", list);
    for (int r = 0; g_rank == 0 && r < g_size; r++)
        printf(" %d", grid[r]);
    if (g_rank == 0)
        printf("\n");
    free(grid);
    free(seen);
    free(label_at);
    free(count);
}

static problem make(const char *name, int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv,
                    int64_t dim)
{
    problem p = {.name = name, .q_scale = 1.0};
    fxt_attn_desc(&p.d, b, hq, hkv, sq, skv, dim);
    return p;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    g_ulysses = argc > 1 ? atoi(argv[1]) : 1;
    g_ring = argc > 2 ? atoi(argv[2]) : g_size;
    g_ctx = fxt_mpi_ctx(1);
    fxa_mpi_params mp = fxt_mpi_params(g_ulysses, g_ring);
    mp.prefetch = argc > 3 ? atoi(argv[3]) : 0;
    g_mpi = fxt_mpi_grid(g_ctx, &mp);
    g_grid_rank = fxa_mpi_rank(g_mpi);
    const char *hosts = getenv("FXA_MPI_TEST_HOSTS");
    if (hosts && *hosts)
        check_placement(hosts);
    else
        CHECK(g_grid_rank == g_rank, "one host: grid rank %d for world rank %d", g_grid_rank,
              g_rank);
    problem p = make("ragged GQA", 2, 6, 3, 1001, 777, 40);
    run_problem(&p);
    p = make("40 heads", 1, 40, 40, 96, 96, 16);
    run_problem(&p);
    p = make("replicated kv heads bf16", 1, 8, 2, 130, 201, 32);
    p.d.dtype = FXA_BF16;
    p.d.layout = FXA_LAYOUT_BHSD;
    run_problem(&p);
    p = make("sink on the last rank", 1, 2, 2, 256, 256, 64);
    p.sink = 1;
    run_problem(&p);
    p = make("huge V on rank 0", 1, 3, 3, 200, 300, 32);
    p.huge_v = 1;
    run_problem(&p);
    p = make("global centring", 1, 4, 4, 300, 300, 64);
    p.k_offset = 40.0;
    p.q_scale = 3.0;
    run_problem(&p);
    p = make("2048 tokens", 1, 5, 5, 2048, 2048, 16);
    run_problem(&p);
    p = make("online mode, f16", 1, 4, 2, 150, 150, 24);
    p.d.mode = FXA_MODE_ONLINE;
    p.d.dtype = FXA_F16;
    run_problem(&p);
    fxa_mpi_destroy(g_mpi);
    fxa_ctx_destroy(g_ctx);
    return fxt_mpi_finish("test_mpi_attn");
}
