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

#include "fxattn_mpi.h"
#include "testutil.h"

static fxa_ctx *g_ctx;
static fxa_mpi *g_mpi;
static int g_rank;
static int g_size;
static int g_ring;

/* Shard [t0, t0 + n) of a [B, heads, seq, D] tensor (layout of d, es bytes
 * per element), into dst with S = n; from_shard swaps the direction. */
static void shard_copy(const fxa_attn_desc *d, int64_t heads, int64_t seq, int64_t t0, int64_t n,
                       size_t es, const void *global, void *shard, int from_shard)
{
    const size_t row = (size_t)d->head_dim * es;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t t = 0; t < n; t++) {
                const int bshd = d->layout == FXA_LAYOUT_BSHD;
                const int64_t g = bshd ? ((b * seq + t0 + t) * heads + h) * d->head_dim
                                       : ((b * heads + h) * seq + t0 + t) * d->head_dim;
                const int64_t s = bshd ? ((b * n + t) * heads + h) * d->head_dim
                                       : ((b * heads + h) * n + t) * d->head_dim;
                if (from_shard)
                    memcpy((char *)global + (size_t)g * es, (const char *)shard + (size_t)s * es,
                           row);
                else
                    memcpy((char *)shard + (size_t)s * es, (const char *)global + (size_t)g * es,
                           row);
            }
}

/* One rank's output rows. */
typedef struct rows {
    float *out; /* [B, Hq, Sq_r, D] in the case's layout */
    float *lse; /* [B, Hq, Sq_r] */
    float *bound;
    uint8_t *fb;
} rows;

static void rows_alloc(rows *r, int64_t n_out, int64_t n_rows)
{
    r->out = calloc((size_t)n_out + 1, sizeof(float));
    r->lse = calloc((size_t)n_rows + 1, sizeof(float));
    r->bound = calloc((size_t)n_rows + 1, sizeof(float));
    r->fb = calloc((size_t)n_rows + 1, 1);
}

static void rows_free(rows *r)
{
    free(r->out);
    free(r->lse);
    free(r->bound);
    free(r->fb);
}

static int rows_same(const rows *a, const rows *b, int64_t n_out, int64_t n_rows)
{
    return !memcmp(a->out, b->out, (size_t)n_out * sizeof(float)) &&
           !memcmp(a->lse, b->lse, (size_t)n_rows * sizeof(float)) &&
           !memcmp(a->bound, b->bound, (size_t)n_rows * sizeof(float)) &&
           !memcmp(a->fb, b->fb, (size_t)n_rows);
}

static void swap_rows(rows *a, rows *b)
{
    const rows t = *a;
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
    g_mpi = NULL;
    if (fxa_mpi_create(MPI_COMM_WORLD, g_ctx, &g_mp, &g_mpi) != FXA_OK) {
        fprintf(stderr, "rank %d: fxa_mpi_create: %s\n", g_rank, fxa_mpi_create_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
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
    const size_t es = d->dtype == FXA_F32 ? 4 : 2;
    const int wide = d->dtype != FXA_F32;
    const int64_t g_rows = d->batch * d->heads_q * d->seq_q;
    rows ref;
    rows_alloc(&ref, t.nq, g_rows);
    CHECK(tcase_run(&t, g_ctx, d->mode, NULL, ref.out, ref.lse, ref.fb, ref.bound, NULL) == FXA_OK,
          "%s: single process: %s", name, fxa_ctx_last_error(g_ctx));
    int64_t q0;
    int64_t qn;
    int64_t k0;
    int64_t kn;
    fxa_mpi_shard(d->seq_q, g_size, g_rank, &q0, &qn);
    fxa_mpi_shard(d->seq_kv, g_size, g_rank, &k0, &kn);
    const int64_t n_out = d->batch * d->heads_q * qn * d->head_dim;
    const int64_t n_rows = d->batch * d->heads_q * qn;
    char *q = malloc((size_t)n_out * es + 1);
    char *k = malloc((size_t)(d->batch * d->heads_kv * kn * d->head_dim) * es + 1);
    char *v = malloc((size_t)(d->batch * d->heads_kv * kn * d->head_dim) * es + 1);
    shard_copy(d, d->heads_q, d->seq_q, q0, qn, es, wide ? (void *)t.q16 : (void *)t.q, q, 0);
    shard_copy(d, d->heads_kv, d->seq_kv, k0, kn, es, wide ? (void *)t.k16 : (void *)t.k, k, 0);
    shard_copy(d, d->heads_kv, d->seq_kv, k0, kn, es, wide ? (void *)t.v16 : (void *)t.v, v, 0);
    /* This rank's rows of the single process (out in the shard's layout). */
    rows want;
    rows_alloc(&want, n_out, n_rows);
    shard_copy(d, d->heads_q, d->seq_q, q0, qn, sizeof(float), ref.out, want.out, 0);
    for (int64_t bh = 0; bh < d->batch * d->heads_q; bh++) {
        memcpy(want.lse + bh * qn, ref.lse + bh * d->seq_q + q0, (size_t)qn * sizeof(float));
        memcpy(want.bound + bh * qn, ref.bound + bh * d->seq_q + q0, (size_t)qn * sizeof(float));
        memcpy(want.fb + bh * qn, ref.fb + bh * d->seq_q + q0, (size_t)qn);
    }
    rows first;
    rows_alloc(&first, n_out, n_rows);
    for (int s = 0; s < n_set; s++) {
        apply(&settings[s]);
        rows got;
        rows_alloc(&got, n_out, n_rows);
        const fxa_attn_args a = {.struct_size = sizeof a,
                                 .q = q,
                                 .k = k,
                                 .v = v,
                                 .out = got.out,
                                 .lse = got.lse,
                                 .row_fallback = got.fb,
                                 .row_bound = got.bound};
        fxa_mpi_attn_plan *plan = NULL;
        fxa_mpi_stats ms = {.struct_size = sizeof ms};
        fxa_status st = fxa_mpi_attn_plan_create(g_mpi, d, &plan);
        if (st == FXA_OK)
            st = fxa_mpi_attn_run(plan, &a, &ms);
        /* A second run on the kept buffers gives the same bytes. */
        rows again;
        rows_alloc(&again, n_out, n_rows);
        const fxa_attn_args a2 = {.struct_size = sizeof a2,
                                  .q = q,
                                  .k = k,
                                  .v = v,
                                  .out = again.out,
                                  .lse = again.lse,
                                  .row_fallback = again.fb,
                                  .row_bound = again.bound};
        if (st == FXA_OK)
            st = fxa_mpi_attn_run(plan, &a2, NULL);
        const char *label = settings[s].groups ? settings[s].groups : "default";
        CHECK(st == FXA_OK, "%s, groups %s: %s", name, label, fxa_mpi_last_error(g_mpi));
        CHECK(st != FXA_OK || ms.fallback_rows > 0, "%s: the sink made no row fall back", name);
        CHECK(st != FXA_OK || ms.a2a_seconds > 0.0, "%s, groups %s: no exchange timed", name,
              label);
        CHECK(st != FXA_OK || rows_same(&got, &again, n_out, n_rows),
              "%s, groups %s: a second run differs", name, label);
        if (g_ring == 1)
            CHECK(st != FXA_OK || rows_same(&got, &want, n_out, n_rows),
                  "%s, groups %s, pieces %s: not the single process's bytes", name, label,
                  settings[s].piece ? settings[s].piece : "default");
        else if (s == 0)
            swap_rows(&first, &got);
        else
            CHECK(st != FXA_OK || rows_same(&got, &first, n_out, n_rows),
                  "%s, groups %s, pieces %s: not the default settings' bytes", name, label,
                  settings[s].piece ? settings[s].piece : "default");
        fxa_mpi_attn_plan_destroy(plan);
        rows_free(&got);
        rows_free(&again);
    }
    apply(&settings[0]);
    if (g_rank == 0)
        printf("%s: %d settings checked\n", name, n_set);
    rows_free(&first);
    rows_free(&want);
    rows_free(&ref);
    free(q);
    free(k);
    free(v);
    tcase_free(&t);
}

static fxa_attn_desc make(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t dim)
{
    fxa_attn_desc d;
    fxa_attn_desc_init(&d);
    d.batch = b;
    d.heads_q = hq;
    d.heads_kv = hkv;
    d.seq_q = sq;
    d.seq_kv = skv;
    d.head_dim = dim;
    return d;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    const int ulysses = argc > 1 ? atoi(argv[1]) : 2;
    g_ring = argc > 2 ? atoi(argv[2]) : 1;
    fxa_ctx_params cp;
    fxa_ctx_params_init(&cp);
    cp.n_threads = 1;
    if (fxa_ctx_create(&cp, &g_ctx) != FXA_OK) {
        fprintf(stderr, "context: %s\n", fxa_ctx_create_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fxa_mpi_params_init(&g_mp);
    g_mp.ulysses = ulysses;
    g_mp.ring = g_ring;
    if (fxa_mpi_create(MPI_COMM_WORLD, g_ctx, &g_mp, &g_mpi) != FXA_OK) {
        fprintf(stderr, "rank %d: fxa_mpi_create: %s\n", g_rank, fxa_mpi_create_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fxa_attn_desc d = make(2, 10, 5, 301, 257, 24);
    run_case("uneven GQA, BSHD f32", &d);
    d = make(1, 6, 2, 130, 97, 32);
    d.layout = FXA_LAYOUT_BHSD;
    d.dtype = FXA_BF16;
    run_case("replicated kv heads, BHSD bf16", &d);
    d = make(1, 40, 40, 64, 64, 16);
    run_case("40 heads", &d);
    fxa_mpi_destroy(g_mpi);
    fxa_ctx_destroy(g_ctx);
    int failures = g_failures;
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    int rc = test_summary("test_mpi_ulysses_groups");
    MPI_Finalize();
    return all ? 1 : rc;
}
