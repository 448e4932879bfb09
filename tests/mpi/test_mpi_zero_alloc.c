/*
 * fxa_mpi_attn_run allocates nothing once planned: `test_mpi_zero_alloc U R`
 * on U * R ranks. For each case (fp32 with whole kv heads per rank, bf16
 * with replicated kv heads, lse and row diagnostics asked for) every rank
 * plans, then runs 1 + RUNS times while a counting allocator
 * (tests/common/alloc_count.c, every thread of the process) counts, and
 * checks:
 *   - no allocation and no free outside MPI's own functions on any run,
 *     the first included (the plan leaves nothing to a first run);
 *   - every run succeeds, and the later ones write the first one's bytes
 *     (the runs really ran, the same computation).
 * The MPI functions the library calls are intercepted (the PMPI profiling
 * interface): the allocator's count pauses inside them, so that what Open
 * MPI allocates inside MPI_Isend, MPI_Irecv, MPI_Test* and the nonblocking
 * collectives is counted apart; rank 0 prints that count per function (it
 * is information about Open MPI, not checked).
 * The backward (fxa_mpi_attn_bwd_run) of every case (replicated kv heads
 * included) is counted the same way, on the forward's output and lse.
 * Any failure on any rank fails the test (the verdict is reduced).
 */
#include <stdlib.h>
#include <string.h>

#include "alloc_count.h"
#include "mpi_fixtures.h"

#define RUNS 3

static int g_rank;
static int g_counting; /* a counted run is in progress */
static int g_depth;    /* inside an intercepted MPI function */
static long g_outside; /* counted outside MPI in this window */
static void *g_first;  /* where the first of them was called */

enum { F_ISEND, F_IRECV, F_TESTSOME, F_TESTALL, F_IALLREDUCE, F_IALLGATHER, F_IBCAST, F_N };
static const char *const g_names[F_N] = {"MPI_Isend",   "MPI_Irecv",      "MPI_Testsome",
                                         "MPI_Testall", "MPI_Iallreduce", "MPI_Iallgather",
                                         "MPI_Ibcast"};
static long g_inside[F_N]; /* allocations and frees inside each function */
static long g_calls[F_N];

/* Outside MPI: the window's count is the library's. */
static void end_outside(void)
{
    const long n = fxt_alloc_count_end();
    if (n && !g_outside)
        g_first = fxt_alloc_first_caller();
    g_outside += n;
}

/* Entering an MPI function: what was counted so far is the library's. */
static void enter(int f)
{
    if (!g_counting || g_depth++ > 0)
        return;
    end_outside();
    g_calls[f]++;
    fxt_alloc_count_begin();
}

/* Leaving it: what was counted inside is Open MPI's. */
static void leave(int f)
{
    if (!g_counting || --g_depth > 0)
        return;
    g_inside[f] += fxt_alloc_count_end();
    fxt_alloc_count_begin();
}

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    enter(F_ISEND);
    const int rc = PMPI_Isend(buf, count, type, dest, tag, comm, req);
    leave(F_ISEND);
    return rc;
}

int MPI_Irecv(void *buf, int count, MPI_Datatype type, int src, int tag, MPI_Comm comm,
              MPI_Request *req)
{
    enter(F_IRECV);
    const int rc = PMPI_Irecv(buf, count, type, src, tag, comm, req);
    leave(F_IRECV);
    return rc;
}

int MPI_Testsome(int n, MPI_Request reqs[], int *done, int idx[], MPI_Status st[])
{
    enter(F_TESTSOME);
    const int rc = PMPI_Testsome(n, reqs, done, idx, st);
    leave(F_TESTSOME);
    return rc;
}

int MPI_Testall(int n, MPI_Request reqs[], int *flag, MPI_Status st[])
{
    enter(F_TESTALL);
    const int rc = PMPI_Testall(n, reqs, flag, st);
    leave(F_TESTALL);
    return rc;
}

int MPI_Iallreduce(const void *in, void *out, int n, MPI_Datatype t, MPI_Op op, MPI_Comm comm,
                   MPI_Request *req)
{
    enter(F_IALLREDUCE);
    const int rc = PMPI_Iallreduce(in, out, n, t, op, comm, req);
    leave(F_IALLREDUCE);
    return rc;
}

int MPI_Iallgather(const void *in, int n, MPI_Datatype t, void *out, int n_out, MPI_Datatype t_out,
                   MPI_Comm comm, MPI_Request *req)
{
    enter(F_IALLGATHER);
    const int rc = PMPI_Iallgather(in, n, t, out, n_out, t_out, comm, req);
    leave(F_IALLGATHER);
    return rc;
}

int MPI_Ibcast(void *buf, int n, MPI_Datatype t, int root, MPI_Comm comm, MPI_Request *req)
{
    enter(F_IBCAST);
    const int rc = PMPI_Ibcast(buf, n, t, root, comm, req);
    leave(F_IBCAST);
    return rc;
}

typedef struct zcase {
    const char *name;
    fxa_dtype dtype;
    fxa_layout layout;
    int64_t batch, heads_q, heads_kv, seq_q, seq_kv;
} zcase;

/* A counted run starts: from here the allocator's count is the library's
 * until an intercepted MPI function is entered. */
static void counted_run_begin(void)
{
    g_outside = 0;
    g_first = NULL;
    g_counting = 1;
    fxt_alloc_count_begin();
}

/* Run `run` of case c (what: "run" or "backward run") returned st: it
 * succeeded, and allocated or freed nothing outside MPI's functions. */
static void counted_run_end(fxa_mpi *m, const zcase *c, const char *what, int run, fxa_status st)
{
    end_outside();
    g_counting = 0;
    CHECK(st == FXA_OK, "%s: %s %d: %s", c->name, what, run, fxa_mpi_last_error(m));
    CHECK(g_outside == 0,
          "%s: %s %d on rank %d: %ld allocations or frees outside MPI (the first from %p)", c->name,
          what, run, g_rank, g_outside, g_first);
}

/* The backward of case c on the forward's out and lse: 1 + RUNS counted
 * runs, none allocating outside MPI, the later ones writing the first
 * one's bytes. */
static void run_bwd(fxa_mpi *m, const zcase *c, const fxa_attn_desc *d, const void *q,
                    const void *k, const void *v, const float *out, const float *lse, int64_t nq,
                    int64_t nkv)
{
    float *dout = malloc((size_t)nq * sizeof(float) + 4);
    float *g[2][3];
    for (int i = 0; i < 2; i++) {
        g[i][0] = calloc((size_t)nq + 1, sizeof(float));
        g[i][1] = calloc((size_t)nkv + 1, sizeof(float));
        g[i][2] = calloc((size_t)nkv + 1, sizeof(float));
    }
    fxt_rng r;
    fxt_rng_seed(&r, 99 + (uint64_t)g_rank);
    fxt_mpi_fill(&r, FXA_F32, dout, nq, 1.0);
    fxa_mpi_attn_bwd_plan *plan = NULL;
    fxa_status st = fxa_mpi_attn_bwd_plan_create(m, d, &plan);
    CHECK(st == FXA_OK, "%s: backward plan: %s", c->name, fxa_mpi_last_error(m));
    fxa_mpi_stats ms = {.struct_size = sizeof ms};
    for (int run = 0; run <= RUNS && st == FXA_OK; run++) {
        float **o = g[run > 0];
        const fxa_attn_bwd_args a = fxt_bwd_args(q, k, v, out, dout, lse, o[0], o[1], o[2]);
        counted_run_begin();
        st = fxa_mpi_attn_bwd_run(plan, &a, &ms);
        counted_run_end(m, c, "backward run", run, st);
        if (run == 0)
            continue;
        CHECK(!memcmp(g[0][0], g[1][0], (size_t)nq * sizeof(float)) &&
                  !memcmp(g[0][1], g[1][1], (size_t)nkv * sizeof(float)) &&
                  !memcmp(g[0][2], g[1][2], (size_t)nkv * sizeof(float)),
              "%s: backward run %d wrote other bytes than the first", c->name, run);
        memset(g[1][0], 0, (size_t)nq * sizeof(float));
    }
    fxa_mpi_attn_bwd_plan_destroy(plan);
    free(dout);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            free(g[i][j]);
}

static void run_case(fxa_mpi *m, const zcase *c)
{
    const fxa_attn_desc d = fxt_mpi_desc(c->batch, c->heads_q, c->heads_kv, c->seq_q, c->seq_kv, 32,
                                         c->dtype, c->layout);
    const fxt_mpi_split sp = fxt_mpi_split_of(&d, fxa_mpi_size(m), fxa_mpi_rank(m));
    fxt_rng r;
    fxt_rng_seed(&r, 1234 + (uint64_t)fxa_mpi_rank(m));
    const size_t es = c->dtype == FXA_F32 ? 4 : 2;
    void *q = malloc((size_t)sp.nq * es + 1);
    void *k = malloc((size_t)sp.nkv * es + 1);
    void *v = malloc((size_t)sp.nkv * es + 1);
    fxt_mpi_fill(&r, c->dtype, q, sp.nq, 1.0);
    fxt_mpi_fill(&r, c->dtype, k, sp.nkv, 1.0);
    fxt_mpi_fill(&r, c->dtype, v, sp.nkv, 1.0);
    fxa_mpi_attn_plan *plan = NULL;
    fxa_status st = fxa_mpi_attn_plan_create(m, &d, &plan);
    CHECK(st == FXA_OK, "%s: plan: %s", c->name, fxa_mpi_last_error(m));
    fxt_mpi_rows got[2];
    fxa_attn_args a[2];
    for (int i = 0; i < 2; i++) {
        fxt_mpi_rows_alloc(&got[i], sp.nq, sp.rows);
        a[i] = fxt_mpi_rows_args(q, k, v, &got[i]);
    }
    fxa_mpi_stats ms = {.struct_size = sizeof ms};
    /* Run 0 (the first) writes got[0]; the others got[1], compared with it. */
    for (int run = 0; run <= RUNS && st == FXA_OK; run++) {
        counted_run_begin();
        st = fxa_mpi_attn_run(plan, &a[run > 0], &ms);
        counted_run_end(m, c, "run", run, st);
        if (run == 0)
            continue;
        CHECK(fxt_mpi_rows_same(&got[0], &got[1], sp.nq, sp.rows),
              "%s: run %d wrote other bytes than the first", c->name, run);
        memset(got[1].out, 0, (size_t)sp.nq * sizeof(float));
    }
    fxa_mpi_attn_plan_destroy(plan);
    if (st == FXA_OK)
        run_bwd(m, c, &d, q, k, v, got[0].out, got[0].lse, sp.nq, sp.nkv);
    free(q);
    free(k);
    free(v);
    fxt_mpi_rows_free(&got[0]);
    fxt_mpi_rows_free(&got[1]);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const fxa_mpi_params mp =
        fxt_mpi_params(argc > 1 ? atoi(argv[1]) : 1, argc > 2 ? atoi(argv[2]) : size);
    fxa_ctx *ctx = fxt_mpi_ctx(2); /* a worker thread too: the allocator counts every thread */
    fxa_mpi *m = fxt_mpi_grid(ctx, &mp);
    g_rank = fxa_mpi_rank(m);
    const zcase cases[] = {
        {"fp32 BSHD, whole kv heads", FXA_F32, FXA_LAYOUT_BSHD, 1, 8, 4, 203, 197},
        {"bf16 BHSD, replicated kv heads", FXA_BF16, FXA_LAYOUT_BHSD, 2, 4, 1, 130, 161},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(m, &cases[i]);
    if (g_rank == 0) {
        printf("U%d x R%d, %d counted runs per case: inside Open MPI (not checked):\n", mp.ulysses,
               mp.ring, 1 + RUNS);
        for (int f = 0; f < F_N; f++)
            if (g_calls[f])
                printf("  %-15s %6ld calls, %4ld allocations or frees\n", g_names[f], g_calls[f],
                       g_inside[f]);
    }
    fxa_mpi_destroy(m);
    fxa_ctx_destroy(ctx);
    return fxt_mpi_finish("test_mpi_zero_alloc");
}
