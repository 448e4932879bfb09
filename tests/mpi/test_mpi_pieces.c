/*
 * The ring's blocks in pieces (ring.c): `test_mpi_pieces PREFETCH` on P
 * ranks, a pure ring (U = 1, R = P). MPI_Isend is intercepted (the PMPI
 * profiling interface) to count the library's sends. For fp32 and bf16
 * inputs, each run with FXA_MPI_TEST_MAX_ELEMENTS (the library's test-only
 * cap on elements per message) unset, 1000 and 7 must:
 *   - write the same output and LSE bytes as the uncapped run (pieces
 *     change how blocks travel, never what is added or in which order);
 *   - send exactly 2 ceil(n / cap) messages per hop of a block of n
 *     elements (K and V), 2 per hop uncapped: the pieces really happen
 *     (cap 7 on this problem needs more requests in one wait than
 *     fxa_mpi_wait's window of 272);
 * a cap set after the grid's creation changes nothing (fxa_mpi_create reads
 * it); and a plan whose blocks exceed 2^31 elements (which the library used to
 * refuse) is accepted on a pure ring and on pure Ulysses, or refused for
 * memory only (planned only, not run; test_mpi_ulysses_groups runs the
 * Ulysses pieces).
 */
#include <stdlib.h>
#include <string.h>

#include "mpi_fixtures.h"

static long long g_isends;

/* Counts every MPI_Isend of the process (the library's ring sends). */
int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    g_isends++;
    return PMPI_Isend(buf, count, type, dest, tag, comm, req);
}

static int g_rank; /* the grid rank (one host here: the world rank) */
static int g_size;

/* The ring's sends of one rank in one run: per hop t = 0 .. R-2, it
 * forwards block (rank - t)'s K and V, each of per_key * tokens elements,
 * in ceil(n / cap) pieces. */
static long long expected_sends(int64_t seq_kv, int64_t per_key, int64_t cap)
{
    long long n_msgs = 0;
    for (int t = 0; t + 1 < g_size; t++) {
        int64_t start;
        int64_t len;
        fxa_mpi_shard(seq_kv, g_size, (g_rank - t + g_size) % g_size, &start, &len);
        const int64_t n = per_key * len;
        n_msgs += 2 * (n > 0 ? (n + cap - 1) / cap : 0);
    }
    return n_msgs;
}

/* Each cap on a grid of its own: the cap is read when the grid is created. */
static void run_dtype(fxa_ctx *ctx, const fxa_mpi_params *mp, fxa_dtype dtype)
{
    const fxa_attn_desc d = fxt_mpi_desc(1, 4, 2, 301, 299, 32, dtype, FXA_LAYOUT_BSHD);
    const fxt_mpi_split sp = fxt_mpi_split_of(&d, g_size, g_rank);
    const int64_t nq = sp.nq;
    const int64_t rows = sp.rows;
    const size_t es = dtype == FXA_F32 ? 4 : 2;
    void *q = malloc((size_t)nq * es + 1);
    void *k = malloc((size_t)sp.nkv * es + 1);
    void *v = malloc((size_t)sp.nkv * es + 1);
    fxt_rng r;
    fxt_rng_seed(&r, 77 + (uint64_t)g_rank);
    fxt_mpi_fill(&r, dtype, q, nq, 2.0);
    fxt_mpi_fill(&r, dtype, k, sp.nkv, 2.0);
    fxt_mpi_fill(&r, dtype, v, sp.nkv, 2.0);
    float *out[3];
    float *lse[3];
    const char *caps[3] = {NULL, "1000", "7"};
    const int64_t cap_n[3] = {1LL << 31, 1000, 7};
    for (int c = 0; c < 3; c++) {
        out[c] = calloc((size_t)nq + 1, sizeof(float));
        lse[c] = calloc((size_t)rows + 1, sizeof(float));
        if (caps[c])
            setenv("FXA_MPI_TEST_MAX_ELEMENTS", caps[c], 1);
        else
            unsetenv("FXA_MPI_TEST_MAX_ELEMENTS");
        fxa_mpi *m = fxt_mpi_grid(ctx, mp);
        if (!caps[c]) /* a cap set after the grid's creation does not reach its runs */
            setenv("FXA_MPI_TEST_MAX_ELEMENTS", "7", 1);
        fxa_mpi_attn_plan *plan = NULL;
        fxa_status st = fxa_mpi_attn_plan_create(m, &d, &plan);
        CHECK(st == FXA_OK, "plan: %s", fxa_mpi_last_error(m));
        const fxa_attn_args a = {
            .struct_size = sizeof a, .q = q, .k = k, .v = v, .out = out[c], .lse = lse[c]};
        const long long before = g_isends;
        if (st == FXA_OK)
            st = fxa_mpi_attn_run(plan, &a, NULL);
        const long long sends = g_isends - before;
        CHECK(st == FXA_OK, "%s cap %s: run: %s", (dtype == FXA_F32 ? "fp32" : "bf16"),
              caps[c] ? caps[c] : "none", fxa_mpi_last_error(m));
        const long long want = expected_sends(d.seq_kv, d.heads_kv * d.head_dim, cap_n[c]);
        CHECK(sends == want, "%s cap %s: rank %d sent %lld messages, expected %lld",
              (dtype == FXA_F32 ? "fp32" : "bf16"), caps[c] ? caps[c] : "none", g_rank, sends,
              want);
        if (c > 0) {
            CHECK(!memcmp(out[c], out[0], (size_t)nq * sizeof(float)) &&
                      !memcmp(lse[c], lse[0], (size_t)rows * sizeof(float)),
                  "%s cap %s: the output differs from the uncapped run",
                  (dtype == FXA_F32 ? "fp32" : "bf16"), caps[c]);
        }
        if (g_rank == 0)
            printf("%s, cap %s: rank 0 sent %lld messages\n", (dtype == FXA_F32 ? "fp32" : "bf16"),
                   caps[c] ? caps[c] : "none", sends);
        fxa_mpi_attn_plan_destroy(plan);
        fxa_mpi_destroy(m);
    }
    unsetenv("FXA_MPI_TEST_MAX_ELEMENTS");
    for (int c = 0; c < 3; c++) {
        free(out[c]);
        free(lse[c]);
    }
    free(q);
    free(k);
    free(v);
}

/* Blocks of more than 2^31 elements: 64 kv heads x 128 x 300000 tokens
 * per rank (2.46e9 elements), on m's grid (a pure ring, or pure Ulysses,
 * whose exchange then holds more than 2^31 elements per rank too). The
 * plan allocates every buffer its runs use (tens of GB here): where they
 * exceed the memory available, it fails with FXA_ERR_NO_MEMORY, saying so
 * on every rank; a limit of MPI's int counts is never the reason. */
static void plan_over_2_31(fxa_mpi *m, const char *grid)
{
    const int64_t tokens = 300000LL * g_size;
    const fxa_attn_desc d = fxt_mpi_desc(1, 64, 64, tokens, tokens, 128, FXA_BF16, FXA_LAYOUT_BSHD);
    fxa_mpi_attn_plan *plan = NULL;
    const fxa_status st = fxa_mpi_attn_plan_create(m, &d, &plan);
    CHECK((st == FXA_OK && plan) || (st == FXA_ERR_NO_MEMORY && !plan &&
                                     (strstr(fxa_mpi_last_error(m), "available") ||
                                      strstr(fxa_mpi_last_error(m), "out of memory"))),
          "%s, blocks of 2.46e9 elements: %s (%s)", grid, fxa_status_str(st),
          fxa_mpi_last_error(m));
    if (g_rank == 0)
        printf("%s, blocks of 2.46e9 elements: %s %s\n", grid, fxa_status_str(st),
               fxa_mpi_last_error(m));
    fxa_mpi_attn_plan_destroy(plan);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    fxa_ctx *ctx = fxt_mpi_ctx(1);
    fxa_mpi_params mp;
    fxa_mpi_params_init(&mp);
    mp.prefetch = argc > 1 ? atoi(argv[1]) : 0;
    fxa_mpi *m = fxt_mpi_grid(ctx, &mp);
    g_rank = fxa_mpi_rank(m);
    run_dtype(ctx, &mp, FXA_F32);
    run_dtype(ctx, &mp, FXA_BF16);
    plan_over_2_31(m, "ring");
    fxa_mpi_destroy(m);
    mp.ulysses = g_size;
    mp.ring = 1;
    m = fxt_mpi_grid(ctx, &mp);
    plan_over_2_31(m, "Ulysses");
    fxa_mpi_destroy(m);
    fxa_ctx_destroy(ctx);
    return fxt_mpi_finish("test_mpi_pieces");
}
