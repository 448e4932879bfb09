/*
 * Tensor-parallel projection under mpirun (P ranks): each rank holds a
 * contiguous share of the heads (and the matching weight rows, bias and
 * gamma) and must produce exactly its share of the single-process output:
 * the only difference is the order in which the ranks' double sums of
 * squares add, which can move an RMS by one fp32 ulp, so outputs agree to a
 * few ulps of their magnitude (most bit for bit). Misuse fails everywhere.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_proj.h"
#include "fxattn_wan_mpi.h"
#include "mpi_fixtures.h"

static int g_rank;
static int g_size;

typedef struct full {
    fxa_proj_desc d;
    int64_t n_out, hin, dim, hq, hkv;
    float *x, *w, *bias, *gq, *gk, *cs, *sn, *q, *k, *v;
} full;

static void split(int64_t n, int parts, int i, int64_t *lo, int64_t *hi)
{
    *lo = i * (n / parts) + (i < n % parts ? i : n % parts);
    *hi = *lo + n / parts + (i < n % parts ? 1 : 0);
}

static void make_full(full *f, fxa_ctx *ctx, int64_t tokens, int64_t hin, int64_t hq, int64_t hkv,
                      int64_t dim)
{
    fxt_rng r;
    fxt_rng_seed(&r, 31337);
    fxa_proj_desc_init(&f->d);
    f->d.tokens = tokens;
    f->d.in_features = hin;
    f->d.heads_q = hq;
    f->d.heads_kv = hkv;
    f->d.head_dim = dim;
    f->d.norm = 1;
    f->d.rope = 1;
    f->hin = hin;
    f->dim = dim;
    f->hq = hq;
    f->hkv = hkv;
    f->n_out = (hq + 2 * hkv) * dim;
    f->x = malloc((size_t)(tokens * hin) * 4);
    f->w = malloc((size_t)(f->n_out * hin) * 4);
    f->bias = malloc((size_t)f->n_out * 4);
    f->gq = malloc((size_t)(hq * dim) * 4);
    f->gk = malloc((size_t)(hkv * dim) * 4);
    f->cs = malloc((size_t)(tokens * dim) * 4);
    f->sn = malloc((size_t)(tokens * dim) * 4);
    f->q = malloc((size_t)(tokens * hq * dim) * 4);
    f->k = malloc((size_t)(tokens * hkv * dim) * 4);
    f->v = malloc((size_t)(tokens * hkv * dim) * 4);
    for (int64_t i = 0; i < tokens * hin; i++)
        f->x[i] = (float)fxt_rng_normal(&r);
    for (int64_t i = 0; i < f->n_out * hin; i++)
        f->w[i] = (float)(fxt_rng_normal(&r) / sqrt((double)hin));
    for (int64_t i = 0; i < f->n_out; i++)
        f->bias[i] = (float)(0.1 * fxt_rng_normal(&r));
    for (int64_t i = 0; i < hq * dim; i++)
        f->gq[i] = (float)(0.5 + fxt_rng_uniform(&r));
    for (int64_t i = 0; i < hkv * dim; i++)
        f->gk[i] = (float)(0.5 + fxt_rng_uniform(&r));
    CHECK(fxa_wan_rope_tables(1, 1, tokens, dim, 1e4, f->cs, f->sn) == FXA_OK, "rope");
    const fxa_proj_args a = {.struct_size = sizeof a,
                             .x = f->x,
                             .w = f->w,
                             .bias = f->bias,
                             .gamma_q = f->gq,
                             .gamma_k = f->gk,
                             .rope_cos = f->cs,
                             .rope_sin = f->sn,
                             .q_out = f->q,
                             .k_out = f->k,
                             .v_out = f->v};
    CHECK(fxt_proj_once(ctx, &f->d, &a) == FXA_OK, "single process: %s", fxa_ctx_last_error(ctx));
}

/* The tensor-parallel projection d of a over m: plan, run on a fresh
 * workspace, destroy. */
static fxa_status tp_run(fxa_mpi *m, const fxa_proj_desc *d, const fxa_proj_args *a, int64_t hq,
                         int64_t hkv)
{
    fxa_mpi_proj_plan *plan = NULL;
    size_t bytes = 0;
    fxa_status st = fxa_mpi_proj_plan_create(m, d, hq, hkv, &plan, &bytes);
    if (st != FXA_OK)
        return st;
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    st = fxa_mpi_proj_run(plan, a, ws);
    free(ws);
    fxa_mpi_proj_plan_destroy(plan);
    return st;
}

/* Compare this rank's heads [h0, h1) of a segment (token-major). */
static void compare(const char *what, const float *mine, const float *all, int64_t tokens,
                    int64_t heads_all, int64_t h0, int64_t h1, int64_t dim, int64_t *same,
                    int64_t *total, double *worst)
{
    const int64_t nh = h1 - h0;
    double mag = 0.0;
    for (int64_t i = 0; i < tokens * heads_all * dim; i++)
        mag = fabs(all[i]) > mag ? fabs(all[i]) : mag;
    for (int64_t s = 0; s < tokens; s++)
        for (int64_t h = 0; h < nh; h++)
            for (int64_t i = 0; i < dim; i++) {
                const float x = mine[(s * nh + h) * dim + i];
                const float y = all[(s * heads_all + h0 + h) * dim + i];
                *same += test_f32_bits(x) == test_f32_bits(y);
                (*total)++;
                const double e = fabs((double)x - (double)y) / mag;
                *worst = e > *worst ? e : *worst;
            }
    (void)what;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    fxa_ctx *ctx = fxt_mpi_ctx(1);
    fxa_mpi *m = fxt_mpi_grid(ctx, NULL);
    full f;
    make_full(&f, ctx, 33, 96, 6, 3, 16);
    int64_t qa, qb, ka, kb;
    split(f.hq, g_size, g_rank, &qa, &qb);
    split(f.hkv, g_size, g_rank, &ka, &kb);
    const int64_t nq = qb - qa, nk = kb - ka, dim = f.dim, hin = f.hin, S = f.d.tokens;
    /* This rank's weight rows: its Q heads, its K heads, its V heads. */
    const int64_t rows = (nq + 2 * nk) * dim;
    float *w = malloc((size_t)(rows * hin + 1) * 4);
    float *bias = malloc((size_t)(rows + 1) * 4);
    const int64_t seg_row0[3] = {qa * dim, (f.hq + ka) * dim, (f.hq + f.hkv + ka) * dim};
    const int64_t seg_rows[3] = {nq * dim, nk * dim, nk * dim};
    int64_t at = 0;
    for (int seg = 0; seg < 3; seg++) {
        memcpy(w + at * hin, f.w + seg_row0[seg] * hin, (size_t)(seg_rows[seg] * hin) * 4);
        memcpy(bias + at, f.bias + seg_row0[seg], (size_t)seg_rows[seg] * 4);
        at += seg_rows[seg];
    }
    float *q = malloc((size_t)(S * nq * dim + 1) * 4);
    float *k = malloc((size_t)(S * nk * dim + 1) * 4);
    float *v = malloc((size_t)(S * nk * dim + 1) * 4);
    fxa_proj_desc d = f.d;
    d.heads_q = nq;
    d.heads_kv = nk;
    fxa_proj_args a = {.struct_size = sizeof a,
                       .x = f.x,
                       .w = w,
                       .bias = bias,
                       .gamma_q = f.gq + qa * dim,
                       .gamma_k = f.gk + ka * dim,
                       .rope_cos = f.cs,
                       .rope_sin = f.sn,
                       .q_out = q,
                       .k_out = k,
                       .v_out = v};
    fxa_status st = tp_run(m, &d, &a, f.hq, f.hkv);
    CHECK(st == FXA_OK, "TP run: %s", fxa_mpi_last_error(m));
    int64_t same = 0, total = 0;
    double worst = 0.0;
    if (st == FXA_OK) {
        compare("q", q, f.q, S, f.hq, qa, qb, dim, &same, &total, &worst);
        compare("k", k, f.k, S, f.hkv, ka, kb, dim, &same, &total, &worst);
        compare("v", v, f.v, S, f.hkv, ka, kb, dim, &same, &total, &worst);
    }
    printf(
        "  rank %d of %d: heads q [%lld,%lld) kv [%lld,%lld): %lld of %lld outputs bit-identical, "
        "worst |diff| %.2e of max|out|\n",
        g_rank, g_size, (long long)qa, (long long)qb, (long long)ka, (long long)kb, (long long)same,
        (long long)total, worst);
    /* One fp32 ulp of r moves an output by about 2^-23 of its magnitude. */
    CHECK(worst <= 0x1p-21, "TP output differs from the single process by %.3g", worst);
    /* Misuse: a NaN on the last rank fails every rank with its message. */
    const float keep = f.x[7];
    if (g_rank == g_size - 1)
        f.x[7] = NAN;
    st = tp_run(m, &d, &a, f.hq, f.hkv);
    char want[64];
    snprintf(want, sizeof want, "rank %d: x has a non-finite value", g_size - 1);
    CHECK(st == FXA_ERR_INVALID_ARG && strstr(fxa_mpi_last_error(m), want),
          "NaN on the last rank: status %d, '%s'", (int)st, fxa_mpi_last_error(m));
    f.x[7] = keep;
    /* Misuse: different token counts (with more than one rank). */
    fxa_proj_desc d2 = d;
    if (g_rank == 0)
        d2.tokens = S - 1;
    st = tp_run(m, &d2, &a, f.hq, f.hkv);
    CHECK(g_size == 1
              ? st == FXA_OK
              : st == FXA_ERR_INVALID_ARG && strstr(fxa_mpi_last_error(m), "ranks disagree"),
          "different tokens: '%s'", fxa_mpi_last_error(m));
    /* Still usable. */
    CHECK(tp_run(m, &d, &a, f.hq, f.hkv) == FXA_OK, "a good run after misuse");
    float *const bufs[] = {w,    bias, q,    k,    v,   f.x, f.w, f.bias,
                           f.gq, f.gk, f.cs, f.sn, f.q, f.k, f.v};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    fxa_mpi_destroy(m);
    fxa_ctx_destroy(ctx);
    return fxt_mpi_finish("test_mpi_proj");
}
