/*
 * Extreme finite inputs: exact or refused, never silently wrong.
 *
 *  A. Power-of-two rescaling. q 2^a, k 2^b and scale 2^-(a+b) have exactly
 *     the scores of (q, k, scale); with a + b up to ~240 the products q.k
 *     overflow fp32 (norms ~1e19 and beyond) or the scale does (up to ~1e36
 *     and past FLT_MAX for lambda = scale log2 e), and every fp32 quantity
 *     the library forms scales by a power of two too. So fxattn must accept
 *     the case and return the unscaled run's output and LSE bit for bit
 *     (fxa_attn_run and the blockwise engine), whose output itself must be
 *     within the acceptance envelope of the fp64 reference.
 *  B. Scale sweeps on collinear keys (scores scale * |q| |k| t_j, the t_j
 *     spaced 1/(2N) apart) with |q|, |k| in 1e-20..1e20 and the scale in
 *     1e-40..1e300, including FLT_MAX: either refused with a message naming
 *     the bound (and only when the raw bound does exceed fp32, or the LSE
 *     bound does), or out and LSE equal the fp64 reference within a bound
 *     derived from the fp32 score error delta = scale |q| max|k| (D+2) 2^-23:
 *     soft rows |out - ref| <= max|v| (e^(2 delta) - 1 + 2^-18), rows whose
 *     top gap G exceeds 2 delta + 30 nats |out - ref| <= max|v| (2 N
 *     e^-(G - 2 delta) + 2^-18); |lse - ref| <= delta + 2^-20 max(1, |ref|).
 *  C. Tiny inputs (q, k elements 1e-39..1e-45, subnormal in fp32) and sums
 *     of squares near overflow (every element of q and k near 2^63, so
 *     ||q||^2 ~ 2^126 D): within the acceptance envelope of the fp64
 *     reference.
 * FXA_PROPERTY_SEED replays one seed.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp64_attn.h"
#include "fxattn.h"
#include "testutil.h"

static fxa_ctx *g_ctx;
static int g_refused_b, g_checked_b, g_unverifiable_b;

static double log_uniform(fxt_rng *r, double lo_exp10, double hi_exp10)
{
    return pow(10.0, lo_exp10 + (hi_exp10 - lo_exp10) * fxt_rng_uniform(r));
}

/* Exact power-of-two scaling of n fp32 values (and their 16-bit copies). */
static void scale_pow2(float *x, uint16_t *x16, int64_t n, int e, fxa_dtype dtype)
{
    for (int64_t i = 0; i < n; i++) {
        x[i] = ldexpf(x[i], e);
        if (dtype == FXA_BF16)
            x16[i] = fxa_f32_to_bf16(x[i]);
    }
}

/* log2 of max |x| and of the smallest non-zero |x|. */
static void exp_range(const float *x, int64_t n, int *hi, int *lo)
{
    float mx = 0.0f, mn = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        const float a = fabsf(x[i]);
        mx = a > mx ? a : mx;
        mn = a > 0.0f && a < mn ? a : mn;
    }
    *hi = mx > 0.0f ? ilogbf(mx) : 0;
    *lo = mn < INFINITY ? ilogbf(mn) : 0;
}

typedef struct run_res {
    fxa_status st;
    float *out;
    float *lse;
    fxa_attn_stats stats;
} run_res;

static void res_alloc(run_res *r, const tcase *t)
{
    const int64_t rows = t->d.batch * t->d.heads_q * t->d.seq_q;
    r->out = calloc((size_t)t->nq, sizeof(float));
    r->lse = calloc((size_t)rows, sizeof(float));
}

static void res_free(run_res *r)
{
    free(r->out);
    free(r->lse);
}

/* The blockwise engine over two blocks of keys (BSHD, batch 1: a token
 * range is contiguous), or one block otherwise. */
static fxa_status run_blockwise(const tcase *t, run_res *r)
{
    const fxa_attn_desc d = t->d;
    const int two = d.layout == FXA_LAYOUT_BSHD && d.batch == 1 && d.seq_kv > 1;
    const int64_t n1 = two ? d.seq_kv / 2 : d.seq_kv;
    const int64_t n2 = d.seq_kv - n1;
    const size_t es = d.dtype == FXA_F32 ? 4 : 2;
    const char *k = d.dtype == FXA_F32 ? (const char *)t->k : (const char *)t->k16;
    const char *v = d.dtype == FXA_F32 ? (const char *)t->v : (const char *)t->v16;
    const size_t off2 = (size_t)(n1 * d.heads_kv * d.head_dim) * es;
    fxa_attn_desc pd = d;
    pd.seq_kv = n1 > n2 ? n1 : n2;
    fxa_attn_plan *plan = NULL;
    size_t ws = 0;
    fxa_status st = fxa_attn_plan_create(g_ctx, &pd, &plan, &ws);
    if (st != FXA_OK)
        return st;
    const size_t len = fxa_kv_summary_len(plan);
    double *sums = calloc(2 * len, sizeof(double));
    fxa_attn_acc *acc = NULL;
    st = fxa_kv_summarize(plan, k, v, n1, sums);
    if (st == FXA_OK && two)
        st = fxa_kv_summarize(plan, k + off2, v + off2, n2, sums + len);
    if (st == FXA_OK)
        st = fxa_attn_acc_create(plan, &acc);
    if (st == FXA_OK)
        st = fxa_attn_acc_begin(acc, d.dtype == FXA_F32 ? (const void *)t->q : (const void *)t->q16,
                                sums, two ? 2 : 1);
    if (st == FXA_OK && two) /* the second block first: any order is allowed */
        st = fxa_attn_acc_add(acc, k + off2, v + off2, n2);
    if (st == FXA_OK)
        st = fxa_attn_acc_add(acc, k, v, n1);
    if (st == FXA_OK) {
        const fxa_attn_args a = {.struct_size = sizeof a, .out = r->out, .lse = r->lse};
        r->stats.struct_size = sizeof r->stats;
        st = fxa_attn_acc_finish(acc, &a, &r->stats);
    }
    fxa_attn_acc_destroy(acc);
    fxa_attn_plan_destroy(plan);
    free(sums);
    return st;
}

static void random_desc(fxt_rng *r, fxa_attn_desc *d)
{
    static const int64_t sq[] = {1, 7, 130, 300};
    static const int64_t skv[] = {1, 5, 129, 600};
    static const int64_t dims[] = {4, 16, 64, 128};
    fxa_attn_desc_init(d);
    d->batch = 1 + (int64_t)(fxt_rng_next(r) % 2);
    d->heads_kv = 1 + (int64_t)(fxt_rng_next(r) % 2);
    d->heads_q = d->heads_kv * (1 + (int64_t)(fxt_rng_next(r) % 2));
    d->seq_q = sq[fxt_rng_next(r) % 4];
    d->seq_kv = skv[fxt_rng_next(r) % 4];
    d->head_dim = dims[fxt_rng_next(r) % 4];
    d->layout = fxt_rng_next(r) % 2 ? FXA_LAYOUT_BSHD : FXA_LAYOUT_BHSD;
    d->dtype = fxt_rng_next(r) % 3 == 0 ? FXA_BF16 : FXA_F32;
    d->compute = d->dtype == FXA_BF16 && fxt_rng_next(r) % 2 ? FXA_COMPUTE_BF16 : FXA_COMPUTE_FP32;
    d->mode = fxt_rng_next(r) % 3 == 0 ? FXA_MODE_ONLINE : FXA_MODE_AUTO;
    d->center = (int)(fxt_rng_next(r) % 4 != 0);
    d->scale = (0.5 + fxt_rng_uniform(r)) / sqrt((double)d->head_dim);
}

/* A. */
static void case_rescale(uint64_t seed)
{
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    fxa_attn_desc d;
    random_desc(&r, &d);
    tcase t;
    tcase_init(&t, &d);
    const double sink = fxt_rng_next(&r) % 3 == 0 ? 30.0 : 0.0; /* some rows fall back */
    for (int64_t i = 0; i < t.nq; i++)
        t.q[i] = (float)(fxt_rng_normal(&r) * (i < d.head_dim ? 1.0 + sink : 1.0));
    for (int64_t i = 0; i < t.nkv; i++) {
        t.k[i] = (float)(fxt_rng_normal(&r) + 0.5);
        t.v[i] = (float)fxt_rng_normal(&r);
    }
    tcase_round(&t);
    run_res r0, r1, b0, b1;
    res_alloc(&r0, &t);
    res_alloc(&r1, &t);
    res_alloc(&b0, &t);
    res_alloc(&b1, &t);
    r0.st = tcase_run(&t, g_ctx, d.mode, NULL, r0.out, r0.lse, NULL, NULL, &r0.stats);
    b0.st = run_blockwise(&t, &b0);
    CHECK(r0.st == FXA_OK && b0.st == FXA_OK, "seed %llu: ordinary run: %s",
          (unsigned long long)seed, fxa_ctx_last_error(g_ctx));
    terr e;
    tcase_errors(&t, r0.out, r0.lse, &e);
    /* The output's envelope (the LSE of centred rows carries the rounding
     * of scale q.kbar, which the envelope's floor does not cover when
     * |scale q.kbar| >> |lse|; the rescaled run must match it bit for bit). */
    CHECK(d.compute == FXA_COMPUTE_BF16 || e.out_fxa <= 1.5 * e.out_on32 + 0x1p-22 * e.vmax,
          "seed %llu: ordinary run outside the envelope: out err %.3g (online32 %.3g), lse err "
          "%.3g (online32 %.3g), D %lld, Sq %lld, Skv %lld, dtype %d, mode %d, center %d",
          (unsigned long long)seed, e.out_fxa, e.out_on32, e.lse_fxa, e.lse_on32,
          (long long)d.head_dim, (long long)d.seq_q, (long long)d.seq_kv, (int)d.dtype, (int)d.mode,
          d.center);
    /* Exponents that keep every element normal and finite. */
    int qhi, qlo, khi, klo;
    exp_range(t.q, t.nq, &qhi, &qlo);
    exp_range(t.k, t.nkv, &khi, &klo);
    const int a_lo = -120 - qlo, a_hi = 124 - qhi, b_lo = -120 - klo, b_hi = 124 - khi;
    const int a = a_lo + (int)(fxt_rng_next(&r) % (uint64_t)(a_hi - a_lo + 1));
    const int b = b_lo + (int)(fxt_rng_next(&r) % (uint64_t)(b_hi - b_lo + 1));
    scale_pow2(t.q, t.q16, t.nq, a, d.dtype);
    scale_pow2(t.k, t.k16, t.nkv, b, d.dtype);
    t.d.scale = ldexp(d.scale, -(a + b));
    r1.st = tcase_run(&t, g_ctx, d.mode, NULL, r1.out, r1.lse, NULL, NULL, &r1.stats);
    CHECK(r1.st == FXA_OK, "seed %llu: q 2^%d, k 2^%d, scale %g refused: %s",
          (unsigned long long)seed, a, b, t.d.scale, fxa_ctx_last_error(g_ctx));
    b1.st = run_blockwise(&t, &b1);
    CHECK(b1.st == FXA_OK, "seed %llu: blockwise, q 2^%d, k 2^%d refused: %s",
          (unsigned long long)seed, a, b, fxa_ctx_last_error(g_ctx));
    const size_t rows = (size_t)(d.batch * d.heads_q * d.seq_q);
    if (r0.st == FXA_OK && r1.st == FXA_OK) {
        CHECK(memcmp(r0.out, r1.out, (size_t)t.nq * sizeof(float)) == 0 &&
                  memcmp(r0.lse, r1.lse, rows * sizeof(float)) == 0 &&
                  r0.stats.fallback_rows == r1.stats.fallback_rows,
              "seed %llu: q 2^%d, k 2^%d, scale 2^%d: not bit-identical to the unscaled run",
              (unsigned long long)seed, a, b, -(a + b));
    }
    if (b0.st == FXA_OK && b1.st == FXA_OK)
        CHECK(memcmp(b0.out, b1.out, (size_t)t.nq * sizeof(float)) == 0 &&
                  memcmp(b0.lse, b1.lse, rows * sizeof(float)) == 0,
              "seed %llu: blockwise, q 2^%d, k 2^%d: not bit-identical to the unscaled run",
              (unsigned long long)seed, a, b);
    res_free(&r0);
    res_free(&r1);
    res_free(&b0);
    res_free(&b1);
    tcase_free(&t);
}

/* B. */
static void case_sweep(uint64_t seed)
{
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    static const int64_t dims[] = {4, 8, 64, 128};
    fxa_attn_desc d;
    fxa_attn_desc_init(&d);
    d.batch = 1;
    d.heads_q = d.heads_kv = 1;
    d.seq_q = 1 + (int64_t)(fxt_rng_next(&r) % 3);
    d.seq_kv = 1 + (int64_t)(fxt_rng_next(&r) % 40);
    d.head_dim = dims[fxt_rng_next(&r) % 4];
    d.mode = fxt_rng_next(&r) % 4 == 0 ? FXA_MODE_ONLINE : FXA_MODE_AUTO;
    d.center = (int)(fxt_rng_next(&r) % 3 != 0);
    const uint64_t pick = fxt_rng_next(&r) % 8;
    d.scale = pick == 0 ? (double)FLT_MAX : pick == 1 ? 1e300 : log_uniform(&r, -40.0, 40.0);
    const double qmag = log_uniform(&r, -20.0, 20.0);
    const double kmag = log_uniform(&r, -20.0, 20.0);
    const int64_t n = d.seq_kv, dim = d.head_dim;
    tcase t;
    tcase_init(&t, &d);
    double u[256], un = 0.0;
    for (int64_t c = 0; c < dim; c++) {
        u[c] = fxt_rng_normal(&r);
        un += u[c] * u[c];
    }
    for (int64_t c = 0; c < dim; c++)
        u[c] /= sqrt(un);
    for (int64_t i = 0; i < d.seq_q; i++) {
        const double sign = fxt_rng_next(&r) % 2 ? 1.0 : -1.0;
        for (int64_t c = 0; c < dim; c++)
            t.q[i * dim + c] = (float)(sign * qmag * u[c]);
    }
    const uint64_t rot = fxt_rng_next(&r) % (uint64_t)n;
    for (int64_t j = 0; j < n; j++) {
        const double tj = 0.5 + 0.5 * (double)(((uint64_t)j + rot) % (uint64_t)n) / (double)n;
        for (int64_t c = 0; c < dim; c++) {
            t.k[j * dim + c] = (float)(kmag * tj * u[c]);
            t.v[j * dim + c] = (float)fxt_rng_normal(&r);
        }
    }
    double qmax = 0.0, kmax = 0.0, vmax = 0.0;
    for (int64_t i = 0; i < d.seq_q; i++) {
        double s = 0.0;
        for (int64_t c = 0; c < dim; c++)
            s += (double)t.q[i * dim + c] * t.q[i * dim + c];
        qmax = fmax(qmax, sqrt(s));
    }
    for (int64_t j = 0; j < n; j++) {
        double s = 0.0;
        for (int64_t c = 0; c < dim; c++) {
            s += (double)t.k[j * dim + c] * t.k[j * dim + c];
            vmax = fmax(vmax, fabs((double)t.v[j * dim + c]));
        }
        kmax = fmax(kmax, sqrt(s));
    }
    run_res res;
    res_alloc(&res, &t);
    res.st = tcase_run(&t, g_ctx, d.mode, NULL, res.out, res.lse, NULL, NULL, &res.stats);
    const double raw = d.scale * qmax * kmax;
    if (res.st != FXA_OK) {
        const char *msg = fxa_ctx_last_error(g_ctx);
        g_refused_b++;
        CHECK(res.st == FXA_ERR_INVALID_ARG &&
                  (strstr(msg, "exceeds the fp32 range") || strstr(msg, "cannot be formed")),
              "seed %llu: refused without naming the bound: %s", (unsigned long long)seed, msg);
        /* Refusals only where a bound does pass fp32 (raw base-2 scores or
         * the LSE, which needs scale |q| |k| ~ FLT_MAX). */
        CHECK(raw * 1.4426950408889634 > 0x1.fep127 || raw > 0.5 * (double)FLT_MAX ||
                  strstr(msg, "cannot be formed"),
              "seed %llu: refused although scale |q| |k| = %g fits: %s", (unsigned long long)seed,
              raw, msg);
        res_free(&res);
        tcase_free(&t);
        return;
    }
    const double delta = raw * (double)(dim + 2) * 0x1p-23;
    for (int64_t i = 0; i < d.seq_q; i++) {
        double ref[256], ref_lse;
        fxt_fp64_attn_row(&t.d, t.q, t.k, t.v, 0, 0, i, ref, &ref_lse);
        /* Gap between the two largest exact scores (nats). */
        double s1 = -INFINITY, s2 = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t c = 0; c < dim; c++)
                s += (double)t.q[i * dim + c] * t.k[j * dim + c];
            s *= d.scale;
            if (s > s1) {
                s2 = s1;
                s1 = s;
            } else if (s > s2) {
                s2 = s;
            }
        }
        const double gap = n > 1 ? s1 - s2 : INFINITY;
        double tol;
        if (delta <= 0x1p-12)
            tol = vmax * (expm1(2.0 * delta) + 0x1p-18);
        else if (gap > 2.0 * delta + 30.0)
            tol = vmax * (2.0 * (double)n * exp(-(gap - 2.0 * delta)) + 0x1p-18);
        else {
            g_unverifiable_b++; /* fp32 cannot resolve these scores: finiteness only */
            tol = INFINITY;
        }
        double err = 0.0;
        int finite = isfinite(res.lse[i]);
        for (int64_t c = 0; c < dim; c++) {
            finite = finite && isfinite(res.out[i * dim + c]);
            err = fmax(err, fabs((double)res.out[i * dim + c] - ref[c]));
        }
        const double lse_err = fabs((double)res.lse[i] - ref_lse);
        const double lse_tol = delta + 0x1p-20 * fmax(1.0, fabs(ref_lse));
        g_checked_b++;
        CHECK(finite && err <= tol && lse_err <= lse_tol,
              "seed %llu row %lld: |q| %.3g |k| %.3g scale %.3g (D %lld, N %lld, center %d, "
              "mode %d): out err %.3g (tol %.3g), lse %.9g vs %.9g (tol %.3g)",
              (unsigned long long)seed, (long long)i, qmax, kmax, d.scale, (long long)dim,
              (long long)n, d.center, (int)d.mode, err, tol, (double)res.lse[i], ref_lse, lse_tol);
    }
    res_free(&res);
    tcase_free(&t);
}

/* C. */
static void case_tiny_and_near_overflow(uint64_t seed, int tiny)
{
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    fxa_attn_desc d;
    random_desc(&r, &d);
    d.dtype = FXA_F32;
    d.compute = FXA_COMPUTE_FP32;
    tcase t;
    tcase_init(&t, &d);
    for (int64_t i = 0; i < t.nq; i++)
        t.q[i] = tiny ? (float)(fxt_rng_normal(&r) * 1e-40)
                      : (float)(0x1p63 * (1.0 + 0.5 * fxt_rng_uniform(&r)));
    for (int64_t i = 0; i < t.nkv; i++) {
        t.k[i] = tiny ? (float)(fxt_rng_normal(&r) * 1e-40)
                      : (float)(0x1p63 * (1.0 + 0.5 * fxt_rng_uniform(&r)));
        t.v[i] = (float)fxt_rng_normal(&r);
    }
    if (!tiny)
        t.d.scale = ldexp(d.scale, -130); /* scores ~ 2^126 D scale 2^-130: ordinary */
    run_res res;
    res_alloc(&res, &t);
    res.st = tcase_run(&t, g_ctx, d.mode, NULL, res.out, res.lse, NULL, NULL, &res.stats);
    CHECK(res.st == FXA_OK, "seed %llu (%s): %s", (unsigned long long)seed,
          tiny ? "tiny" : "near overflow", fxa_ctx_last_error(g_ctx));
    if (res.st == FXA_OK) {
        terr e;
        tcase_errors(&t, res.out, res.lse, &e);
        /* The independent fp32 online softmax overflows on these q.k: the
         * envelope's floor (2^-22 max|v|, 2^-21 max(1,|lse|)) against fp64
         * plus the fp32 score error of ||q|| ||k|| ~ 2^126 D scale scores. */
        const double delta = tiny ? 0.0
                                  : t.d.scale * 0x1p126 * 2.25 * (double)d.head_dim *
                                        (double)(d.head_dim + 2) * 0x1p-23;
        CHECK(e.out_fxa <= 0x1p-20 * e.vmax + e.vmax * expm1(2.0 * delta) &&
                  e.lse_fxa <= 0x1p-20 * fmax(1.0, e.lse_mag) + delta,
              "seed %llu (%s): out err %.3g, lse err %.3g (max|v| %.3g)", (unsigned long long)seed,
              tiny ? "tiny" : "near overflow", e.out_fxa, e.lse_fxa, e.vmax);
    }
    res_free(&res);
    tcase_free(&t);
}

int main(void)
{
    test_require_isa("test_attn_extreme");
    CHECK(fxa_ctx_create(NULL, &g_ctx) == FXA_OK, "context");
    const char *replay = getenv("FXA_PROPERTY_SEED");
    const uint64_t first = replay ? strtoull(replay, NULL, 10) : 1;
    const uint64_t count = replay ? 1 : 60;
    for (uint64_t s = first; s < first + count; s++) {
        case_rescale(s);
        case_sweep(1000 + s);
        case_sweep(2000 + s);
        case_sweep(3000 + s);
        if (s % 4 == 0) {
            case_tiny_and_near_overflow(4000 + s, 1);
            case_tiny_and_near_overflow(5000 + s, 0);
        }
    }
    printf("  sweeps: %d rows checked against fp64, %d of them only for finiteness (fp32 "
           "cannot resolve their scores), %d cases refused\n",
           g_checked_b, g_unverifiable_b, g_refused_b);
    CHECK(g_checked_b > 0 && g_refused_b > 0, "the sweeps covered both outcomes");
    fxa_ctx_destroy(g_ctx);
    return test_summary("test_attn_extreme");
}
