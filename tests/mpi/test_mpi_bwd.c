/*
 * The distributed backward under mpirun: `test_mpi_bwd U R` on U * R ranks.
 * Every rank builds the same global problem (the forward's O and lse by
 * fxa_attn_run, a random dO), computes the single-process gradients with
 * fxa_attn_bwd_run, runs fxa_mpi_attn_bwd_run on its shards and checks:
 *   - its dq, dk, dv shards against the single process's: bit-identical on
 *     Ulysses grids (R == 1: the same arithmetic per head, whatever the head
 *     group it is computed in: the pipeline by groups of heads); with a ring
 *     (R > 1, 2-D grids too) within the rounding of the sum over key blocks (dQ) and
 *     query shards (dK, dV): |diff| <= 1e-5 max |gradient| of the tensor
 *     (each of the R partial sums rounds at 2^-24 of a magnitude at most a
 *     few times the tensor's largest); for GQA with uneven head splits,
 *     ragged sequences, fewer query tokens than ranks, bf16 BHSD, and bf16
 *     compute (GQA, BSHD); a second run writes the same bytes; the
 *     statistics;
 *   - replicated kv heads (heads_kv < U: MQA, GQA with 2 kv heads, fewer q
 *     heads than members): dq as above (bit-identical with R == 1: a q
 *     head's arithmetic is its own), dk and dv within the same 1e-5 bound
 *     on every grid (a kv head's dK, dV is the sum of its members' parts,
 *     each the sum over that member's q heads: at most U partial sums of
 *     one rounding each more than one process's), and repeated runs the
 *     same bytes (the members' parts added in member order); fp32 and
 *     bf16 compute (MQA);
 *   - bf16 compute is held to the same rules as fp32: its bf16 roundings
 *     (dO, P, dS) are per element, each a function of one query row and
 *     one key (q_i.k_j, dO_i.v_j, delta_i, lse_i), so every grid rounds
 *     the same values; only the fp32 sums over keys, query shards and
 *     replicas are regrouped, as with fp32 compute (measured: at most
 *     ~10 x 2^-24 of the largest, as fp32; a flipped bf16 rounding would
 *     show as ~2^-9 of a term);
 *   - with the forward's lse_parts (ragged GQA, MQA with replicated kv
 *     heads, and saturated softmax, scale 1e4, where every row runs online
 *     softmax and the lse alone would put P off by |lse| 2^-24): the same
 *     rules against the single process's backward on the same parts;
 *     lse_parts on some ranks and not others fails on every rank where
 *     they travel (U > 1);
 *   - a NULL tensor on one rank, or a NaN in one rank's dO, fails the run
 *     on every rank (in seconds: no rank waits for a deadline) and leaves
 *     every rank's outputs untouched; so does a local backward that only
 *     rank 0 refuses (a bound), the ring going on for the others.
 * Any failure on any rank fails the test (the verdict is reduced).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_fixtures.h"

static fxa_ctx *g_ctx;
static fxa_mpi *g_mpi;
static int g_rank; /* grid rank: the rank to shard by */
static int g_size;
static int g_ring;    /* R */
static int g_ulysses; /* U */

/* 1 when got equals want to the bytes (exact) or within the rounding of
 * the ring's or the replicas' sums (1e-5 of want's largest magnitude);
 * names the first miss. */
static int close_enough(const char *name, const char *what, const float *got, const float *want,
                        int64_t n, int exact)
{
    if (exact)
        return !memcmp(got, want, (size_t)n * sizeof(float));
    double most = 0.0;
    for (int64_t i = 0; i < n; i++)
        most = fabs((double)want[i]) > most ? fabs((double)want[i]) : most;
    for (int64_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - (double)want[i]) <= 1e-5 * most)) {
            fprintf(stderr, "%s: %s[%lld] = %.9g, one process %.9g (largest %.3g)\n", name, what,
                    (long long)i, (double)got[i], (double)want[i], most);
            return 0;
        }
    return 1;
}

/* A backward's tensors: the inputs q, k, v (the case's dtype), the
 * forward's out, lse and lse_parts (NULL: not used), dO and the gradients
 * (fp32). */
typedef struct tensors {
    void *q, *k, *v;
    float *out, *dout, *lse, *parts, *dq, *dk, *dv;
} tensors;

/* Zero-filled tensors of nq elements of Q, nkv of K and `rows` rows (es
 * bytes per input element; room for one more, so empty shards allocate). */
static tensors tensors_alloc(size_t es, int64_t nq, int64_t nkv, int64_t rows, int with_parts)
{
    tensors t = {calloc((size_t)nq + 1, es),
                 calloc((size_t)nkv + 1, es),
                 calloc((size_t)nkv + 1, es),
                 calloc((size_t)nq + 1, 4),
                 calloc((size_t)nq + 1, 4),
                 calloc((size_t)rows + 1, 4),
                 with_parts ? calloc((size_t)(3 * rows) + 1, 4) : NULL,
                 calloc((size_t)nq + 1, 4),
                 calloc((size_t)nkv + 1, 4),
                 calloc((size_t)nkv + 1, 4)};
    return t;
}

static void tensors_free(tensors *t)
{
    free(t->q), free(t->k), free(t->v), free(t->out), free(t->dout), free(t->lse), free(t->parts);
    free(t->dq), free(t->dk), free(t->dv);
}

/* This rank's shards of the global tensors g of d. */
static tensors tensors_take(const fxa_attn_desc *d, const fxt_mpi_split *s, const tensors *g)
{
    const size_t es = d->dtype == FXA_F32 ? 4 : 2;
    tensors t = tensors_alloc(es, s->nq, s->nkv, s->rows, g->parts != NULL);
    fxt_mpi_take_q(d, s, es, g->q, t.q);
    fxt_mpi_take_kv(d, s, es, g->k, t.k);
    fxt_mpi_take_kv(d, s, es, g->v, t.v);
    fxt_mpi_take_q(d, s, 4, g->out, t.out);
    fxt_mpi_take_q(d, s, 4, g->dout, t.dout);
    fxt_mpi_take_rows(d, s, 4, g->lse, t.lse);
    if (g->parts)
        fxt_mpi_take_rows(d, s, 3 * 4, g->parts, t.parts);
    fxt_mpi_take_q(d, s, 4, g->dq, t.dq);
    fxt_mpi_take_kv(d, s, 4, g->dk, t.dk);
    fxt_mpi_take_kv(d, s, 4, g->dv, t.dv);
    return t;
}

/* The single process's forward (out, lse, parts) and backward (dq, dk,
 * dv) of d on t's inputs and dO. */
static void one_process(const char *name, const fxa_attn_desc *d, tensors *t)
{
    fxa_attn_plan *fp = NULL;
    size_t fws = 0;
    fxa_status st = fxa_attn_plan_create(g_ctx, d, &fp, &fws);
    void *ws = st == FXA_OK ? aligned_alloc(64, (fws + 63) / 64 * 64 + 64) : NULL;
    const fxa_attn_args fa = {.struct_size = sizeof fa,
                              .q = t->q,
                              .k = t->k,
                              .v = t->v,
                              .out = t->out,
                              .lse = t->lse,
                              .lse_parts = t->parts};
    if (st == FXA_OK)
        st = fxa_attn_run(fp, &fa, ws, NULL);
    CHECK(st == FXA_OK, "%s: forward: %s", name, fxa_ctx_last_error(g_ctx));
    fxa_attn_plan_destroy(fp);
    free(ws);
    fxa_attn_bwd_plan *bp = NULL;
    size_t bws = 0;
    st = fxa_attn_bwd_plan_create(g_ctx, d, &bp, &bws);
    ws = st == FXA_OK ? aligned_alloc(64, (bws + 63) / 64 * 64 + 64) : NULL;
    fxa_attn_bwd_args ba =
        fxt_bwd_args(t->q, t->k, t->v, t->out, t->dout, t->lse, t->dq, t->dk, t->dv);
    ba.lse_parts = t->parts;
    if (st == FXA_OK)
        st = fxa_attn_bwd_run(bp, &ba, ws, NULL);
    CHECK(st == FXA_OK, "%s: backward: %s", name, fxa_ctx_last_error(g_ctx));
    fxa_attn_bwd_plan_destroy(bp);
    free(ws);
}

/* The case d; with_parts: the forward's lse_parts enter both backwards. */
static void run_case(const char *name, const fxa_attn_desc *d, int with_parts)
{
    const int64_t nq = d->batch * d->heads_q * d->seq_q * d->head_dim;
    const int64_t nkv = d->batch * d->heads_kv * d->seq_kv * d->head_dim;
    const int64_t rows = d->batch * d->heads_q * d->seq_q;
    tensors all = tensors_alloc(d->dtype == FXA_F32 ? 4 : 2, nq, nkv, rows, with_parts);
    fxt_rng r;
    fxt_rng_seed(&r, 777);
    fxt_mpi_fill(&r, d->dtype, all.q, nq, 1.0);
    fxt_mpi_fill(&r, d->dtype, all.k, nkv, 1.0);
    fxt_mpi_fill(&r, d->dtype, all.v, nkv, 1.0);
    fxt_mpi_fill(&r, FXA_F32, all.dout, nq, 1.0);
    one_process(name, d, &all); /* every rank, the same bytes */
    /* This rank's shards; its dq, dk, dv: the single process's. */
    const fxt_mpi_split sp = fxt_mpi_split_of(d, g_size, g_rank);
    const int64_t sq = sp.nq;
    const int64_t skv = sp.nkv;
    tensors mine = tensors_take(d, &sp, &all);
    float *g[2][3];
    for (int i = 0; i < 2; i++) {
        g[i][0] = malloc((size_t)sq * 4 + 4);
        g[i][1] = malloc((size_t)skv * 4 + 4);
        g[i][2] = malloc((size_t)skv * 4 + 4);
        memset(g[i][0], 0x7f, (size_t)sq * 4 + 4);
        memset(g[i][1], 0x7f, (size_t)skv * 4 + 4);
        memset(g[i][2], 0x7f, (size_t)skv * 4 + 4);
    }
    fxa_mpi_attn_bwd_plan *plan = NULL;
    fxa_status st = fxa_mpi_attn_bwd_plan_create(g_mpi, d, &plan);
    CHECK(st == FXA_OK, "%s: plan: %s", name, fxa_mpi_last_error(g_mpi));
    /* A NULL tensor on rank 0 (whose shards are never empty; an empty
     * shard may pass NULL): every rank fails, nothing written. */
    fxa_attn_bwd_args a = fxt_bwd_args(mine.q, mine.k, mine.v, mine.out, mine.dout, mine.lse,
                                       g[0][0], g[0][1], g[0][2]);
    a.lse_parts = mine.parts;
    if (with_parts && g_ulysses > 1) {
        /* lse_parts missing on rank 0 only: they travel, so every rank fails. */
        if (g_rank == 0)
            a.lse_parts = NULL;
        fxa_status bp_st =
            st == FXA_OK ? fxa_mpi_attn_bwd_run(plan, &a, NULL) : FXA_ERR_INVALID_ARG;
        CHECK(bp_st == FXA_ERR_INVALID_ARG &&
                  strstr(fxa_mpi_last_error(g_mpi), "lse_parts given on some ranks and not"),
              "%s: lse_parts on some ranks only: status %d, '%s'", name, (int)bp_st,
              fxa_mpi_last_error(g_mpi));
        CHECK(((const unsigned char *)g[0][0])[0] == 0x7f, "%s: dq written by a failed run", name);
        CHECK(fxt_mpi_same_everywhere((int)bp_st), "%s: lse_parts: ranks got different statuses",
              name);
        a.lse_parts = mine.parts;
    }
    if (g_rank == 0)
        a.dout = NULL;
    fxa_status bad = st == FXA_OK ? fxa_mpi_attn_bwd_run(plan, &a, NULL) : FXA_ERR_INVALID_ARG;
    CHECK(bad == FXA_ERR_INVALID_ARG, "%s: NULL dout on rank 0: status %d", name, (int)bad);
    CHECK(strstr(fxa_mpi_last_error(g_mpi), "NULL tensor"), "%s: message '%s'", name,
          fxa_mpi_last_error(g_mpi));
    CHECK(((const unsigned char *)g[0][0])[0] == 0x7f, "%s: dq written by a failed run", name);
    a.dout = mine.dout;
    /* bf16 gradients asked for on the last rank: the distributed backward
     * writes fp32 only; every rank fails, nothing written. */
    if (g_rank == g_size - 1)
        a.grad_dtype = FXA_BF16;
    bad = st == FXA_OK ? fxa_mpi_attn_bwd_run(plan, &a, NULL) : FXA_ERR_UNSUPPORTED;
    CHECK(bad == FXA_ERR_UNSUPPORTED, "%s: bf16 gradients on rank %d: status %d", name, g_size - 1,
          (int)bad);
    CHECK(strstr(fxa_mpi_last_error(g_mpi), "grad_dtype 1: the distributed backward writes fp32"),
          "%s: message '%s'", name, fxa_mpi_last_error(g_mpi));
    CHECK(((const unsigned char *)g[0][0])[0] == 0x7f, "%s: dq written by a failed run", name);
    CHECK(fxt_mpi_same_everywhere((int)bad), "%s: grad_dtype: ranks got different statuses", name);
    a.grad_dtype = FXA_F32;
    /* A NaN in rank 0's dO: every rank fails (the ring keeps going), fast. */
    if (g_rank == 0)
        mine.dout[0] = NAN;
    const double t_bad = MPI_Wtime();
    bad = st == FXA_OK ? fxa_mpi_attn_bwd_run(plan, &a, NULL) : FXA_ERR_INVALID_ARG;
    CHECK(bad == FXA_ERR_INVALID_ARG, "%s: NaN in dout on rank 0: status %d (%s)", name, (int)bad,
          fxa_mpi_last_error(g_mpi));
    CHECK(strstr(fxa_mpi_last_error(g_mpi), "rank 0: dout has a non-finite value (nan) at batch 0, "
                                            "token 0, head 0, dim 0"),
          "%s: message '%s'", name, fxa_mpi_last_error(g_mpi));
    CHECK(MPI_Wtime() - t_bad < 10.0, "%s: a NaN took %g s to fail", name, MPI_Wtime() - t_bad);
    CHECK(((const unsigned char *)g[0][0])[0] == 0x7f, "%s: dq written by a failed run", name);
    CHECK(fxt_mpi_same_everywhere((int)bad), "%s: NaN: ranks got different statuses", name);
    if (g_rank == 0)
        mine.dout[0] = all.dout[0]; /* rank 0's shard starts at token 0 */
    for (int i = 0; i < 2 && st == FXA_OK; i++) {
        a.dq = g[i][0];
        a.dk = g[i][1];
        a.dv = g[i][2];
        fxa_mpi_stats ms = {.struct_size = sizeof ms};
        st = fxa_mpi_attn_bwd_run(plan, &a, &ms);
        CHECK(st == FXA_OK, "%s: run %d: %s", name, i, fxa_mpi_last_error(g_mpi));
        CHECK(ms.rows == rows, "%s: stats rows %lld", name, (long long)ms.rows);
        CHECK(ms.ring_steps == (g_ring > 1 ? g_ring : 0), "%s: stats ring_steps %d", name,
              ms.ring_steps);
        CHECK(ms.seconds > 0.0 && ms.a2a_seconds >= 0.0 && ms.a2a_seconds <= ms.seconds,
              "%s: stats seconds %g a2a %g", name, ms.seconds, ms.a2a_seconds);
    }
    CHECK(fxt_mpi_same_everywhere((int)st), "%s: ranks got different statuses", name);
    if (st == FXA_OK) {
        const int exact = g_ring == 1;
        const int kv_exact = exact && d->heads_kv >= g_ulysses; /* no replicas to sum */
        CHECK(close_enough(name, "dq", g[0][0], mine.dq, sq, exact),
              "%s: rank %d dq differs from one process", name, g_rank);
        CHECK(close_enough(name, "dk", g[0][1], mine.dk, skv, kv_exact),
              "%s: rank %d dk differs from one process", name, g_rank);
        CHECK(close_enough(name, "dv", g[0][2], mine.dv, skv, kv_exact),
              "%s: rank %d dv differs from one process", name, g_rank);
        for (int j = 0; j < 3; j++)
            CHECK(!memcmp(g[0][j], g[1][j], (size_t)(j ? skv : sq) * 4),
                  "%s: rank %d: a second run wrote other bytes (tensor %d)", name, g_rank, j);
        /* The gradients are not trivially zero. */
        double norm = 0.0;
        for (int64_t i = 0; i < nq; i++)
            norm += (double)all.dq[i] * all.dq[i];
        CHECK(norm > 0.0, "%s: zero dq", name);
    }
    fxa_mpi_attn_bwd_plan_destroy(plan);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            free(g[i][j]);
    tensors_free(&mine);
    tensors_free(&all);
}

/* Inputs that only rank 0's local backward refuses (its ||q|| ||k|| past
 * 2^120: FXA_ERR_UNSUPPORTED): every rank gets that status, in seconds
 * (on a ring the other ranks' local runs succeed and the ring goes on). */
static void check_local_refusal(void)
{
    const fxa_attn_desc d = fxt_mpi_desc(1, 4, 4, 64, 64, 16, FXA_F32, FXA_LAYOUT_BSHD);
    const fxt_mpi_split sp = fxt_mpi_split_of(&d, g_size, g_rank);
    const int64_t nq = sp.nq;
    const int64_t nk = sp.nkv;
    const int64_t rows = sp.rows;
    float *t = calloc((size_t)(5 * nq + 2 * nk + rows + 4 * nk), sizeof(float));
    float *q = t, *out = q + nq, *dout = out + nq, *dq = dout + nq, *lse = dq + nq;
    float *k = lse + rows, *v = k + nk, *dk = v + nk, *dv = dk + nk;
    fxt_rng r;
    fxt_rng_seed(&r, 5 + (uint64_t)g_rank);
    fxt_mpi_fill(&r, FXA_F32, t, 5 * nq + 2 * nk + rows, 1.0);
    if (g_rank == 0) {
        q[0] = 1e19f; /* 2^63: with k[0], ||q|| ||k|| > 2^126 */
        k[0] = 1e19f;
    }
    fxa_mpi_attn_bwd_plan *plan = NULL;
    fxa_status st = fxa_mpi_attn_bwd_plan_create(g_mpi, &d, &plan);
    CHECK(st == FXA_OK, "bound: plan: %s", fxa_mpi_last_error(g_mpi));
    const fxa_attn_bwd_args a = fxt_bwd_args(q, k, v, out, dout, lse, dq, dk, dv);
    const double t0 = MPI_Wtime();
    if (st == FXA_OK)
        st = fxa_mpi_attn_bwd_run(plan, &a, NULL);
    CHECK(st == FXA_ERR_UNSUPPORTED, "bound on rank 0: status %d (%s)", (int)st,
          fxa_mpi_last_error(g_mpi));
    CHECK(!strncmp(fxa_mpi_last_error(g_mpi), "rank 0: ", 8), "bound: message '%s'",
          fxa_mpi_last_error(g_mpi));
    CHECK(MPI_Wtime() - t0 < 10.0, "bound: %g s to fail", MPI_Wtime() - t0);
    CHECK(fxt_mpi_same_everywhere((int)st), "bound: ranks got different statuses");
    fxa_mpi_attn_bwd_plan_destroy(plan);
    free(t);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int world;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    const int ulysses = argc > 1 ? atoi(argv[1]) : world;
    const int ring = argc > 2 ? atoi(argv[2]) : 1;
    g_ctx = fxt_mpi_ctx(2);
    const fxa_mpi_params mp = fxt_mpi_params(ulysses, ring);
    g_mpi = fxt_mpi_grid(g_ctx, &mp);
    g_rank = fxa_mpi_rank(g_mpi);
    g_size = fxa_mpi_size(g_mpi);
    const fxa_attn_desc ragged = fxt_mpi_desc(2, 8, 4, 101, 77, 40, FXA_F32, FXA_LAYOUT_BSHD);
    const fxa_attn_desc bf16 = fxt_mpi_desc(1, 5, 5, 130, 201, 32, FXA_BF16, FXA_LAYOUT_BHSD);
    const fxa_attn_desc tiny = fxt_mpi_desc(1, 4, 4, 3, 5, 16, FXA_F32, FXA_LAYOUT_BSHD);
    g_ring = ring;
    g_ulysses = ulysses;
    {
        run_case("ragged GQA", &ragged, 0);
        run_case("ragged GQA, lse parts", &ragged, 1);
        run_case("bf16 BHSD, uneven heads", &bf16, 0);
        run_case("fewer query tokens than ranks", &tiny, 0);
        fxa_attn_desc bc = fxt_mpi_desc(2, 8, 4, 70, 61, 32, FXA_BF16, FXA_LAYOUT_BSHD);
        bc.compute = FXA_COMPUTE_BF16;
        run_case("bf16 compute, GQA BSHD", &bc, 0);
        fxa_attn_desc sat = fxt_mpi_desc(1, 4, 2, 40, 37, 16, FXA_F32, FXA_LAYOUT_BHSD);
        sat.scale = 1e4f;
        run_case("saturated softmax, lse parts", &sat, 1);
        check_local_refusal();
        if (ulysses > 1) { /* kv heads replicated over the members */
            const fxa_attn_desc mqa = fxt_mpi_desc(1, 4, 1, 64, 48, 16, FXA_F32, FXA_LAYOUT_BSHD);
            const fxa_attn_desc gqa2 = fxt_mpi_desc(2, 8, 2, 50, 70, 16, FXA_F32, FXA_LAYOUT_BHSD);
            const fxa_attn_desc few = fxt_mpi_desc(1, 2, 1, 20, 23, 8, FXA_BF16, FXA_LAYOUT_BSHD);
            run_case("replicated kv heads, MQA", &mqa, 0);
            run_case("replicated kv heads, MQA, lse parts", &mqa, 1);
            run_case("replicated kv heads, 2 kv heads", &gqa2, 0);
            run_case("replicated kv heads, fewer q heads than members", &few, 0);
            fxa_attn_desc bmqa = fxt_mpi_desc(1, 6, 1, 45, 52, 32, FXA_BF16, FXA_LAYOUT_BHSD);
            bmqa.compute = FXA_COMPUTE_BF16;
            run_case("replicated kv heads, bf16 compute, MQA", &bmqa, 0);
        }
    }
    fxa_mpi_destroy(g_mpi);
    fxa_ctx_destroy(g_ctx);
    return fxt_mpi_finish("test_mpi_bwd");
}
