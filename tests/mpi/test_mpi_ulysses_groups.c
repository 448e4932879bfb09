/*
 * Ulysses by groups of heads, under mpirun: `test_mpi_ulysses_groups U R`
 * on U * R ranks (U > 1). Every rank builds the same global problem and
 * runs fxa_mpi_attn_run on its shards with several group counts and message
 * piece sizes (the test-only FXA_TEST_ULYSSES_GROUPS and
 * FXA_TEST_ULYSSES_PIECE, set on every rank), and checks each rank's
 * output rows (o, lse, bound, fallback flag) bit for bit:
 *   - R == 1 (pure Ulysses, pipelined): against the single process, for
 *     every setting;
 *   - R > 1: against the run with the default settings (the exchange only
 *     moves bytes, so the pieces and groups must not change any).
 * The problems have uneven head splits (5 kv heads over 2 or 3 ranks),
 * GQA, replicated kv heads (2 kv heads over 3 ranks), both layouts, bf16.
 * Any failure on any rank fails the test (the verdict is reduced).
 */
#include <stdlib.h>
#include <string.h>

#include "mpi_fixtures.h"

static fxa_ctx *g_ctx;
static fxa_mpi *g_mpi;
static int g_rank;
static int g_size;
static int g_ring;

static void swap_rows(fxt_mpi_rows *a, fxt_mpi_rows *b)
{
    const fxt_mpi_rows t = *a;
    *a = *b;
    *b = t;
}

/* Group count and piece size (NULL: unset, the library's default). */
typedef struct setting {
    const char *groups;
    const char *piece;
} setting;

/* The grid's parameters; apply() creates g_mpi anew with them. */
static fxa_mpi_params g_mp;

/* Set the hooks and create g_mpi anew: fxa_mpi_create reads them. */
static void apply(const setting *s)
{
    if (s->groups)
        setenv("FXA_TEST_ULYSSES_GROUPS", s->groups, 1);
    else
        unsetenv("FXA_TEST_ULYSSES_GROUPS");
    if (s->piece)
        setenv("FXA_TEST_ULYSSES_PIECE", s->piece, 1);
    else
        unsetenv("FXA_TEST_ULYSSES_PIECE");
    fxa_mpi_destroy(g_mpi);
    g_mpi = fxt_mpi_grid(g_ctx, &g_mp);
}

static void run_case(const char *name, const fxa_attn_desc *desc)
{
    static const setting settings[] = {{NULL, NULL}, {"1", NULL}, {"2", NULL},
                                       {"3", "97"},  {"5", NULL}, {"64", "1000"}};
    const int n_set = (int)(sizeof settings / sizeof settings[0]);
    tcase t;
    tcase_init(&t, desc);
    fxt_rng r;
    fxt_rng_seed(&r, 977);
    for (int64_t i = 0; i < t.nq; i++)
        t.q[i] = (float)fxt_rng_normal(&r);
    for (int64_t i = 0; i < t.nkv; i++) {
        t.k[i] = (float)fxt_rng_normal(&r);
        t.v[i] = (float)fxt_rng_normal(&r);
    }
    t.k[tcase_kv_off(&t, 0, 0, t.d.seq_kv / 2)] = 200.0f; /* a sink: some rows fall back */
    tcase_round(&t);
    const fxa_attn_desc *d = &t.d;
    const int64_t g_rows = d->batch * d->heads_q * d->seq_q;
    fxt_mpi_rows ref;
    fxt_mpi_rows_alloc(&ref, t.nq, g_rows);
    CHECK(tcase_run(&t, g_ctx, d->mode, NULL, ref.out, ref.lse, ref.fb, ref.bound, NULL) == FXA_OK,
          "%s: single process: %s", name, fxa_ctx_last_error(g_ctx));
    const fxt_mpi_split sp = fxt_mpi_split_of(d, g_size, g_rank);
    const int64_t n_out = sp.nq;
    const int64_t n_rows = sp.rows;
    fxt_mpi_qkv in = fxt_mpi_take_tcase(&t, &sp);
    /* This rank's rows of the single process (out in the shard's layout). */
    fxt_mpi_rows want;
    fxt_mpi_rows_alloc(&want, n_out, n_rows);
    fxt_mpi_take_q(d, &sp, sizeof(float), ref.out, want.out);
    fxt_mpi_take_rows(d, &sp, sizeof(float), ref.lse, want.lse);
    fxt_mpi_take_rows(d, &sp, sizeof(float), ref.bound, want.bound);
    fxt_mpi_take_rows(d, &sp, 1, ref.fb, want.fb);
    fxt_mpi_rows first;
    fxt_mpi_rows_alloc(&first, n_out, n_rows);
    for (int s = 0; s < n_set; s++) {
        apply(&settings[s]);
        fxt_mpi_rows got;
        fxt_mpi_rows_alloc(&got, n_out, n_rows);
        const fxa_attn_args a = fxt_mpi_rows_args(in.q, in.k, in.v, &got);
        fxa_mpi_attn_plan *plan = NULL;
        fxa_mpi_stats ms = {.struct_size = sizeof ms};
        fxa_status st = fxa_mpi_attn_plan_create(g_mpi, d, &plan);
        if (st == FXA_OK)
            st = fxa_mpi_attn_run(plan, &a, &ms);
        /* A second run on the kept buffers gives the same bytes. */
        fxt_mpi_rows again;
        fxt_mpi_rows_alloc(&again, n_out, n_rows);
        const fxa_attn_args a2 = fxt_mpi_rows_args(in.q, in.k, in.v, &again);
        if (st == FXA_OK)
            st = fxa_mpi_attn_run(plan, &a2, NULL);
        const char *label = settings[s].groups ? settings[s].groups : "default";
        CHECK(st == FXA_OK, "%s, groups %s: %s", name, label, fxa_mpi_last_error(g_mpi));
        CHECK(st != FXA_OK || ms.fallback_rows > 0, "%s: the sink made no row fall back", name);
        CHECK(st != FXA_OK || ms.a2a_seconds > 0.0, "%s, groups %s: no exchange timed", name,
              label);
        CHECK(st != FXA_OK || fxt_mpi_rows_same(&got, &again, n_out, n_rows),
              "%s, groups %s: a second run differs", name, label);
        if (g_ring == 1)
            CHECK(st != FXA_OK || fxt_mpi_rows_same(&got, &want, n_out, n_rows),
                  "%s, groups %s, pieces %s: not the single process's bytes", name, label,
                  settings[s].piece ? settings[s].piece : "default");
        else if (s == 0)
            swap_rows(&first, &got);
        else
            CHECK(st != FXA_OK || fxt_mpi_rows_same(&got, &first, n_out, n_rows),
                  "%s, groups %s, pieces %s: not the default settings' bytes", name, label,
                  settings[s].piece ? settings[s].piece : "default");
        fxa_mpi_attn_plan_destroy(plan);
        fxt_mpi_rows_free(&got);
        fxt_mpi_rows_free(&again);
    }
    apply(&settings[0]);
    if (g_rank == 0)
        printf("%s: %d settings checked\n", name, n_set);
    fxt_mpi_rows_free(&first);
    fxt_mpi_rows_free(&want);
    fxt_mpi_rows_free(&ref);
    fxt_mpi_qkv_free(&in);
    tcase_free(&t);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const int ulysses = argc > 1 ? atoi(argv[1]) : 2;
    g_ring = argc > 2 ? atoi(argv[2]) : 1;
    g_ctx = fxt_mpi_ctx(1);
    g_mp = fxt_mpi_params(ulysses, g_ring);
    g_mpi = fxt_mpi_grid(g_ctx, &g_mp);
    fxa_attn_desc d = fxt_mpi_desc(2, 10, 5, 301, 257, 24, FXA_F32, FXA_LAYOUT_BSHD);
    run_case("uneven GQA, BSHD f32", &d);
    d = fxt_mpi_desc(1, 6, 2, 130, 97, 32, FXA_BF16, FXA_LAYOUT_BHSD);
    run_case("replicated kv heads, BHSD bf16", &d);
    d = fxt_mpi_desc(1, 40, 40, 64, 64, 16, FXA_F32, FXA_LAYOUT_BSHD);
    run_case("40 heads", &d);
    fxa_mpi_destroy(g_mpi);
    fxa_ctx_destroy(g_ctx);
    return fxt_mpi_finish("test_mpi_ulysses_groups");
}
