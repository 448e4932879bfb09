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

#include "fxattn_mpi.h"
#include "testutil.h"

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

/* Copy the shard [t0, t0 + n) of a [B, H, S, D] tensor in layout l (es
 * bytes per element) into dst laid out with S = n. */
static void take_shard(fxa_layout l, int64_t batch, int64_t heads, int64_t seq, int64_t dim,
                       const void *src, int64_t t0, int64_t n, size_t es, void *dst)
{
    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t t = 0; t < n; t++) {
                const int64_t from = l == FXA_LAYOUT_BSHD ? ((b * seq + t0 + t) * heads + h) * dim
                                                          : ((b * heads + h) * seq + t0 + t) * dim;
                const int64_t to = l == FXA_LAYOUT_BSHD ? ((b * n + t) * heads + h) * dim
                                                        : ((b * heads + h) * n + t) * dim;
                memcpy((char *)dst + (size_t)to * es, (const char *)src + (size_t)from * es,
                       (size_t)dim * es);
            }
}

/* n random inputs of dtype t at x. */
static void fill(fxt_rng *r, fxa_dtype t, void *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float f = (float)fxt_rng_normal(r);
        if (t == FXA_F32)
            ((float *)x)[i] = f;
        else
            ((uint16_t *)x)[i] = fxa_f32_to_bf16(f);
    }
}

static fxa_attn_desc make(int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t dim,
                          fxa_dtype t, fxa_layout l)
{
    fxa_attn_desc d;
    fxa_attn_desc_init(&d);
    d.batch = b;
    d.heads_q = hq;
    d.heads_kv = hkv;
    d.seq_q = sq;
    d.seq_kv = skv;
    d.head_dim = dim;
    d.dtype = t;
    d.layout = l;
    return d;
}

/* Every rank got status st; 1 when all got the same. */
static int same_everywhere(int st)
{
    int lo = 0;
    int hi = 0;
    MPI_Allreduce(&st, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&st, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

/* The case d; with_parts: the forward's lse_parts enter both backwards. */
static void run_case(const char *name, const fxa_attn_desc *d, int with_parts)
{
    const size_t es = d->dtype == FXA_F32 ? 4 : 2;
    const int64_t dim = d->head_dim;
    const int64_t nq = d->batch * d->heads_q * d->seq_q * dim;
    const int64_t nkv = d->batch * d->heads_kv * d->seq_kv * dim;
    const int64_t rows = d->batch * d->heads_q * d->seq_q;
    char *q = malloc((size_t)nq * es);
    char *k = malloc((size_t)nkv * es);
    char *v = malloc((size_t)nkv * es);
    float *out = calloc((size_t)nq, 4);
    float *dout = malloc((size_t)nq * 4);
    float *lse = calloc((size_t)rows, 4);
    float *parts = with_parts ? calloc((size_t)(3 * rows), 4) : NULL;
    float *dq = calloc((size_t)nq, 4);
    float *dk = calloc((size_t)nkv, 4);
    float *dv = calloc((size_t)nkv, 4);
    fxt_rng r;
    fxt_rng_seed(&r, 777);
    fill(&r, d->dtype, q, nq);
    fill(&r, d->dtype, k, nkv);
    fill(&r, d->dtype, v, nkv);
    fill(&r, FXA_F32, dout, nq);
    /* The single-process forward and backward (every rank, same bytes). */
    fxa_attn_plan *fp = NULL;
    size_t fws = 0;
    fxa_status st = fxa_attn_plan_create(g_ctx, d, &fp, &fws);
    void *ws = st == FXA_OK ? aligned_alloc(64, (fws + 63) / 64 * 64 + 64) : NULL;
    const fxa_attn_args fa = {.struct_size = sizeof fa,
                              .q = q,
                              .k = k,
                              .v = v,
                              .out = out,
                              .lse = lse,
                              .lse_parts = parts};
    if (st == FXA_OK)
        st = fxa_attn_run(fp, &fa, ws, NULL);
    CHECK(st == FXA_OK, "%s: forward: %s", name, fxa_ctx_last_error(g_ctx));
    fxa_attn_plan_destroy(fp);
    free(ws);
    fxa_attn_bwd_plan *bp = NULL;
    size_t bws = 0;
    st = fxa_attn_bwd_plan_create(g_ctx, d, &bp, &bws);
    ws = st == FXA_OK ? aligned_alloc(64, (bws + 63) / 64 * 64 + 64) : NULL;
    const fxa_attn_bwd_args ba = {.struct_size = sizeof ba,
                                  .q = q,
                                  .k = k,
                                  .v = v,
                                  .out = out,
                                  .dout = dout,
                                  .lse = lse,
                                  .dq = dq,
                                  .dk = dk,
                                  .dv = dv,
                                  .lse_parts = parts};
    if (st == FXA_OK)
        st = fxa_attn_bwd_run(bp, &ba, ws, NULL);
    CHECK(st == FXA_OK, "%s: backward: %s", name, fxa_ctx_last_error(g_ctx));
    fxa_attn_bwd_plan_destroy(bp);
    free(ws);
    /* This rank's shards. */
    int64_t q0, qn, k0, kn;
    fxa_mpi_shard(d->seq_q, g_size, g_rank, &q0, &qn);
    fxa_mpi_shard(d->seq_kv, g_size, g_rank, &k0, &kn);
    const int64_t sq = d->batch * d->heads_q * qn * dim;
    const int64_t skv = d->batch * d->heads_kv * kn * dim;
    char *s_q = malloc((size_t)sq * es + 1);
    char *s_k = malloc((size_t)skv * es + 1);
    char *s_v = malloc((size_t)skv * es + 1);
    float *s_out = malloc((size_t)sq * 4 + 4);
    float *s_dout = malloc((size_t)sq * 4 + 4);
    float *s_lse = malloc((size_t)(d->batch * d->heads_q * qn) * 4 + 4);
    float *s_parts = with_parts ? malloc((size_t)(3 * d->batch * d->heads_q * qn) * 4 + 4) : NULL;
    float *ref_dq = malloc((size_t)sq * 4 + 4);
    float *ref_dk = malloc((size_t)skv * 4 + 4);
    float *ref_dv = malloc((size_t)skv * 4 + 4);
    float *g[2][3];
    for (int i = 0; i < 2; i++) {
        g[i][0] = malloc((size_t)sq * 4 + 4);
        g[i][1] = malloc((size_t)skv * 4 + 4);
        g[i][2] = malloc((size_t)skv * 4 + 4);
        memset(g[i][0], 0x7f, (size_t)sq * 4 + 4);
        memset(g[i][1], 0x7f, (size_t)skv * 4 + 4);
        memset(g[i][2], 0x7f, (size_t)skv * 4 + 4);
    }
    const fxa_layout l = d->layout;
    take_shard(l, d->batch, d->heads_q, d->seq_q, dim, q, q0, qn, es, s_q);
    take_shard(l, d->batch, d->heads_kv, d->seq_kv, dim, k, k0, kn, es, s_k);
    take_shard(l, d->batch, d->heads_kv, d->seq_kv, dim, v, k0, kn, es, s_v);
    take_shard(l, d->batch, d->heads_q, d->seq_q, dim, out, q0, qn, 4, s_out);
    take_shard(l, d->batch, d->heads_q, d->seq_q, dim, dout, q0, qn, 4, s_dout);
    take_shard(FXA_LAYOUT_BHSD, d->batch, d->heads_q, d->seq_q, 1, lse, q0, qn, 4, s_lse);
    if (with_parts)
        take_shard(FXA_LAYOUT_BHSD, d->batch, d->heads_q, d->seq_q, 3, parts, q0, qn, 4, s_parts);
    take_shard(l, d->batch, d->heads_q, d->seq_q, dim, dq, q0, qn, 4, ref_dq);
    take_shard(l, d->batch, d->heads_kv, d->seq_kv, dim, dk, k0, kn, 4, ref_dk);
    take_shard(l, d->batch, d->heads_kv, d->seq_kv, dim, dv, k0, kn, 4, ref_dv);
    fxa_mpi_attn_bwd_plan *plan = NULL;
    st = fxa_mpi_attn_bwd_plan_create(g_mpi, d, &plan);
    CHECK(st == FXA_OK, "%s: plan: %s", name, fxa_mpi_last_error(g_mpi));
    /* A NULL tensor on rank 0 (whose shards are never empty; an empty
     * shard may pass NULL): every rank fails, nothing written. */
    fxa_attn_bwd_args a = {.struct_size = sizeof a,
                           .q = s_q,
                           .k = s_k,
                           .v = s_v,
                           .out = s_out,
                           .dout = s_dout,
                           .lse = s_lse,
                           .dq = g[0][0],
                           .dk = g[0][1],
                           .dv = g[0][2],
                           .lse_parts = s_parts};
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
        CHECK(same_everywhere((int)bp_st), "%s: lse_parts: ranks got different statuses", name);
        a.lse_parts = s_parts;
    }
    if (g_rank == 0)
        a.dout = NULL;
    fxa_status bad = st == FXA_OK ? fxa_mpi_attn_bwd_run(plan, &a, NULL) : FXA_ERR_INVALID_ARG;
    CHECK(bad == FXA_ERR_INVALID_ARG, "%s: NULL dout on rank 0: status %d", name, (int)bad);
    CHECK(strstr(fxa_mpi_last_error(g_mpi), "NULL tensor"), "%s: message '%s'", name,
          fxa_mpi_last_error(g_mpi));
    CHECK(((const unsigned char *)g[0][0])[0] == 0x7f, "%s: dq written by a failed run", name);
    a.dout = s_dout;
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
    CHECK(same_everywhere((int)bad), "%s: grad_dtype: ranks got different statuses", name);
    a.grad_dtype = FXA_F32;
    /* A NaN in rank 0's dO: every rank fails (the ring keeps going), fast. */
    if (g_rank == 0)
        s_dout[0] = NAN;
    const double t_bad = MPI_Wtime();
    bad = st == FXA_OK ? fxa_mpi_attn_bwd_run(plan, &a, NULL) : FXA_ERR_INVALID_ARG;
    CHECK(bad == FXA_ERR_INVALID_ARG, "%s: NaN in dout on rank 0: status %d (%s)", name, (int)bad,
          fxa_mpi_last_error(g_mpi));
    CHECK(strstr(fxa_mpi_last_error(g_mpi), "rank 0: dout has a non-finite value (nan) at batch 0, "
                                            "token 0, head 0, dim 0"),
          "%s: message '%s'", name, fxa_mpi_last_error(g_mpi));
    CHECK(MPI_Wtime() - t_bad < 10.0, "%s: a NaN took %g s to fail", name, MPI_Wtime() - t_bad);
    CHECK(((const unsigned char *)g[0][0])[0] == 0x7f, "%s: dq written by a failed run", name);
    CHECK(same_everywhere((int)bad), "%s: NaN: ranks got different statuses", name);
    if (g_rank == 0)
        s_dout[0] = dout[0]; /* rank 0's shard starts at token 0 */
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
    CHECK(same_everywhere((int)st), "%s: ranks got different statuses", name);
    if (st == FXA_OK) {
        const int exact = g_ring == 1;
        const int kv_exact = exact && d->heads_kv >= g_ulysses; /* no replicas to sum */
        CHECK(close_enough(name, "dq", g[0][0], ref_dq, sq, exact),
              "%s: rank %d dq differs from one process", name, g_rank);
        CHECK(close_enough(name, "dk", g[0][1], ref_dk, skv, kv_exact),
              "%s: rank %d dk differs from one process", name, g_rank);
        CHECK(close_enough(name, "dv", g[0][2], ref_dv, skv, kv_exact),
              "%s: rank %d dv differs from one process", name, g_rank);
        for (int j = 0; j < 3; j++)
            CHECK(!memcmp(g[0][j], g[1][j], (size_t)(j ? skv : sq) * 4),
                  "%s: rank %d: a second run wrote other bytes (tensor %d)", name, g_rank, j);
        /* The gradients are not trivially zero. */
        double norm = 0.0;
        for (int64_t i = 0; i < nq; i++)
            norm += (double)dq[i] * dq[i];
        CHECK(norm > 0.0, "%s: zero dq", name);
    }
    fxa_mpi_attn_bwd_plan_destroy(plan);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            free(g[i][j]);
    free(s_q), free(s_k), free(s_v), free(s_out), free(s_dout), free(s_lse), free(s_parts);
    free(ref_dq), free(ref_dk), free(ref_dv);
    free(q), free(k), free(v), free(out), free(dout), free(lse), free(parts), free(dq), free(dk),
        free(dv);
}

/* Inputs that only rank 0's local backward refuses (its ||q|| ||k|| past
 * 2^120: FXA_ERR_UNSUPPORTED): every rank gets that status, in seconds
 * (on a ring the other ranks' local runs succeed and the ring goes on). */
static void check_local_refusal(void)
{
    const fxa_attn_desc d = make(1, 4, 4, 64, 64, 16, FXA_F32, FXA_LAYOUT_BSHD);
    int64_t q0, qn, k0, kn;
    fxa_mpi_shard(d.seq_q, g_size, g_rank, &q0, &qn);
    fxa_mpi_shard(d.seq_kv, g_size, g_rank, &k0, &kn);
    const int64_t nq = d.heads_q * qn * d.head_dim;
    const int64_t nk = d.heads_kv * kn * d.head_dim;
    const int64_t rows = d.heads_q * qn;
    float *t = calloc((size_t)(5 * nq + 2 * nk + rows + 4 * nk), sizeof(float));
    float *q = t, *out = q + nq, *dout = out + nq, *dq = dout + nq, *lse = dq + nq;
    float *k = lse + rows, *v = k + nk, *dk = v + nk, *dv = dk + nk;
    fxt_rng r;
    fxt_rng_seed(&r, 5 + (uint64_t)g_rank);
    fill(&r, FXA_F32, t, 5 * nq + 2 * nk + rows);
    if (g_rank == 0) {
        q[0] = 1e19f; /* 2^63: with k[0], ||q|| ||k|| > 2^126 */
        k[0] = 1e19f;
    }
    fxa_mpi_attn_bwd_plan *plan = NULL;
    fxa_status st = fxa_mpi_attn_bwd_plan_create(g_mpi, &d, &plan);
    CHECK(st == FXA_OK, "bound: plan: %s", fxa_mpi_last_error(g_mpi));
    const fxa_attn_bwd_args a = {.struct_size = sizeof a,
                                 .q = q,
                                 .k = k,
                                 .v = v,
                                 .out = out,
                                 .dout = dout,
                                 .lse = lse,
                                 .dq = dq,
                                 .dk = dk,
                                 .dv = dv};
    const double t0 = MPI_Wtime();
    if (st == FXA_OK)
        st = fxa_mpi_attn_bwd_run(plan, &a, NULL);
    CHECK(st == FXA_ERR_UNSUPPORTED, "bound on rank 0: status %d (%s)", (int)st,
          fxa_mpi_last_error(g_mpi));
    CHECK(!strncmp(fxa_mpi_last_error(g_mpi), "rank 0: ", 8), "bound: message '%s'",
          fxa_mpi_last_error(g_mpi));
    CHECK(MPI_Wtime() - t0 < 10.0, "bound: %g s to fail", MPI_Wtime() - t0);
    CHECK(same_everywhere((int)st), "bound: ranks got different statuses");
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
    fxa_ctx_params cp;
    fxa_ctx_params_init(&cp);
    cp.n_threads = 2;
    if (fxa_ctx_create(&cp, &g_ctx) != FXA_OK) {
        fprintf(stderr, "context: %s\n", fxa_ctx_create_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    fxa_mpi_params mp;
    fxa_mpi_params_init(&mp);
    mp.ulysses = ulysses;
    mp.ring = ring;
    if (fxa_mpi_create(MPI_COMM_WORLD, g_ctx, &mp, &g_mpi) != FXA_OK) {
        fprintf(stderr, "fxa_mpi_create: %s\n", fxa_mpi_create_error());
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    g_rank = fxa_mpi_rank(g_mpi);
    g_size = fxa_mpi_size(g_mpi);
    const fxa_attn_desc ragged = make(2, 8, 4, 101, 77, 40, FXA_F32, FXA_LAYOUT_BSHD);
    const fxa_attn_desc bf16 = make(1, 5, 5, 130, 201, 32, FXA_BF16, FXA_LAYOUT_BHSD);
    const fxa_attn_desc tiny = make(1, 4, 4, 3, 5, 16, FXA_F32, FXA_LAYOUT_BSHD);
    g_ring = ring;
    g_ulysses = ulysses;
    {
        run_case("ragged GQA", &ragged, 0);
        run_case("ragged GQA, lse parts", &ragged, 1);
        run_case("bf16 BHSD, uneven heads", &bf16, 0);
        run_case("fewer query tokens than ranks", &tiny, 0);
        fxa_attn_desc bc = make(2, 8, 4, 70, 61, 32, FXA_BF16, FXA_LAYOUT_BSHD);
        bc.compute = FXA_COMPUTE_BF16;
        run_case("bf16 compute, GQA BSHD", &bc, 0);
        fxa_attn_desc sat = make(1, 4, 2, 40, 37, 16, FXA_F32, FXA_LAYOUT_BHSD);
        sat.scale = 1e4f;
        run_case("saturated softmax, lse parts", &sat, 1);
        check_local_refusal();
        if (ulysses > 1) { /* kv heads replicated over the members */
            const fxa_attn_desc mqa = make(1, 4, 1, 64, 48, 16, FXA_F32, FXA_LAYOUT_BSHD);
            const fxa_attn_desc gqa2 = make(2, 8, 2, 50, 70, 16, FXA_F32, FXA_LAYOUT_BHSD);
            const fxa_attn_desc few = make(1, 2, 1, 20, 23, 8, FXA_BF16, FXA_LAYOUT_BSHD);
            run_case("replicated kv heads, MQA", &mqa, 0);
            run_case("replicated kv heads, MQA, lse parts", &mqa, 1);
            run_case("replicated kv heads, 2 kv heads", &gqa2, 0);
            run_case("replicated kv heads, fewer q heads than members", &few, 0);
            fxa_attn_desc bmqa = make(1, 6, 1, 45, 52, 32, FXA_BF16, FXA_LAYOUT_BHSD);
            bmqa.compute = FXA_COMPUTE_BF16;
            run_case("replicated kv heads, bf16 compute, MQA", &bmqa, 0);
        }
    }
    fxa_mpi_destroy(g_mpi);
    fxa_ctx_destroy(g_ctx);
    int failures = g_failures;
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    const int rc = test_summary("test_mpi_bwd");
    MPI_Finalize();
    return all ? 1 : rc;
}
