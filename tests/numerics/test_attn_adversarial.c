/*
 * Adversarial inputs, each of which breaks some fixed-max kernel upstream.
 * Every case must stay exact (within the fp32 online-softmax envelope of
 * testutil.h), and where the fast path or the fallback is the point of the
 * case, the per-row fallback flags are asserted too.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_diag.h"
#include "testutil.h"

static fxa_ctx *g_ctx;

/* t: a zero-filled case of one batch with `heads` query and kv heads (the
 * descriptor's other fields at their defaults, free to set in t->d before a
 * run); returns a generator seeded with seed for its inputs. */
static fxt_rng case_open(tcase *t, uint64_t seed, int64_t heads, int64_t sq, int64_t skv,
                         int64_t dim)
{
    fxa_attn_desc d;
    fxt_attn_desc(&d, 1, heads, heads, sq, skv, dim);
    tcase_init(t, &d);
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    return r;
}

/* Run auto mode, check the envelope; out/fb (may be NULL) receive results. */
static void run_checked(const char *label, tcase *t, float *out_keep, uint8_t *fb_keep,
                        fxa_attn_stats *st_keep)
{
    float *out = calloc((size_t)t->nq, sizeof(float));
    float *lse = calloc((size_t)(t->d.batch * t->d.heads_q * t->d.seq_q), sizeof(float));
    uint8_t *fb = calloc((size_t)(t->d.batch * t->d.heads_q * t->d.seq_q), 1);
    fxa_attn_stats st = {.struct_size = sizeof st};
    terr e;
    fxa_status rc = tcase_run(t, g_ctx, t->d.mode, NULL, out, lse, fb, NULL, &st);
    CHECK(rc == FXA_OK, "%s: run failed: %s", label, fxa_ctx_last_error(g_ctx));
    int finite = 1;
    for (int64_t i = 0; i < t->nq; i++)
        finite &= isfinite(out[i]) != 0;
    CHECK(finite, "%s: non-finite output", label);
    tcase_errors(t, out, lse, &e);
    terr_print(label, &e);
    printf("    fallback rows %lld of %lld, C %d, max bound %.0f\n", (long long)st.fallback_rows,
           (long long)st.rows, st.c_min, st.max_bound);
    CHECK(terr_within_envelope(&e), "%s: outside the envelope", label);
    if (out_keep)
        memcpy(out_keep, out, (size_t)t->nq * sizeof(float));
    if (fb_keep)
        memcpy(fb_keep, fb, (size_t)(t->d.batch * t->d.heads_q * t->d.seq_q));
    if (st_keep)
        *st_keep = st;
    free(out);
    free(lse);
    free(fb);
}

static int count_ones(const uint8_t *x, int64_t n)
{
    int c = 0;
    for (int64_t i = 0; i < n; i++)
        c += x[i];
    return c;
}

/* Seed 003: q = [231, 2, 0...], keys +-e2 (half each), V = +-1, lambda = 1.
 * The softmax is 2^2 : 2^-2, so out = (4 - 1/4) / (4 + 1/4) = 15/17. The old
 * 232-wide window admitted this row and flushed the negative half (1.0). */
static void test_mass_loss(double q0, int center, int expect_fallback)
{
    fxa_attn_desc d;
    tcase t;
    char label[96];
    const int64_t n = 4096;
    fxt_attn_desc(&d, 1, 1, 1, 1, n, 64);
    d.scale = log(2.0); /* lambda = scale * log2(e) = 1 */
    d.center = center;
    tcase_init(&t, &d);
    t.q[0] = (float)q0;
    t.q[1] = 2.0f;
    for (int64_t j = 0; j < n; j++) {
        const float sign = j % 2 ? -1.0f : 1.0f;
        t.k[j * 64 + 1] = sign;
        for (int c = 0; c < 64; c++)
            t.v[j * 64 + c] = sign;
    }
    float out[64];
    uint8_t fb;
    snprintf(label, sizeof label, "mass loss q0=%g center=%d", q0, center);
    run_checked(label, &t, out, &fb, NULL);
    double worst = 0.0;
    for (int c = 0; c < 64; c++)
        worst = fmax(worst, fabs(out[c] - 15.0 / 17.0));
    CHECK(worst < 4e-7, "%s: out %.9f, expected 15/17 (err %.3g)", label, out[0], worst);
    CHECK(fb == expect_fallback, "%s: fallback %d, expected %d", label, fb, expect_fallback);
    tcase_free(&t);
}

/* One key with 1000x the typical norm in head 0; head 1 is ordinary. In head
 * 0 the rows with ordinary queries must fall back, the rows with tiny queries
 * (their bound stays small) must not; no row of head 1 may fall back. */
static void test_sink(void)
{
    tcase t;
    const int64_t s = 512;
    const int64_t dim = 64;
    fxt_rng r = case_open(&t, 7, 2, s, s, dim);
    for (int64_t h = 0; h < 2; h++) {
        for (int64_t i = 0; i < s; i++) {
            float *q = t.q + tcase_q_off(&t, 0, h, i);
            float *k = t.k + tcase_kv_off(&t, 0, h, i);
            float *v = t.v + tcase_kv_off(&t, 0, h, i);
            const double qs = (h == 0 && i % 2) ? 1e-3 : 1.0;
            for (int64_t c = 0; c < dim; c++) {
                q[c] = (float)(qs * fxt_rng_normal(&r));
                k[c] = (float)fxt_rng_normal(&r);
                v[c] = (float)fxt_rng_normal(&r);
            }
        }
    }
    float *sink = t.k + tcase_kv_off(&t, 0, 0, 100);
    for (int64_t c = 0; c < dim; c++)
        sink[c] *= 1000.0f;
    uint8_t *fb = calloc((size_t)(2 * s), 1);
    fxa_attn_stats st = {.struct_size = sizeof st};
    run_checked("attention sink in head 0", &t, NULL, fb, &st);
    int sink_rows_ok = 1;
    int tiny_rows_ok = 1;
    for (int64_t i = 0; i < s; i++) {
        if (i % 2)
            tiny_rows_ok &= fb[i] == 0;
        else
            sink_rows_ok &= fb[i] == 1;
    }
    CHECK(sink_rows_ok, "every ordinary query of the sink head falls back");
    CHECK(tiny_rows_ok, "tiny queries of the sink head stay on the fixed path");
    CHECK(count_ones(fb + s, s) == 0, "no row of the ordinary head falls back");
    CHECK(st.fallback_rows == s / 2, "stats count %lld fallback rows, expected %lld",
          (long long)st.fallback_rows, (long long)(s / 2));
    free(fb);
    tcase_free(&t);
}

/* Seed 000's failure mode: one big key orthogonal to every query makes the
 * bound overshoot each row's true max by ~110 nats (159 in base 2). The
 * Trainium kernel zeroes such rows. Here, with centring the rows pass the
 * centred gate and run fixed-max (the shift is far from the true max, yet
 * no term flushes); without centring they fall back. Both exact. */
static void test_overshoot(int center)
{
    tcase t;
    const int64_t n = 1024;
    const int64_t dim = 64;
    fxt_rng r = case_open(&t, 11, 1, 64, n, dim);
    t.d.center = center;
    const double lambda = (1.0 / 8.0) * 1.4426950408889634;
    for (int64_t i = 0; i < 64; i++) {
        float *q = t.q + i * dim;
        double nn = 0.0;
        for (int64_t c = 0; c < 32; c++) {
            q[c] = (float)fxt_rng_normal(&r);
            nn += (double)q[c] * q[c];
        }
        const double want = 2.0 / lambda; /* lambda ||q|| = 2 */
        for (int64_t c = 0; c < 32; c++)
            q[c] = (float)(q[c] * want / sqrt(nn));
    }
    for (int64_t j = 0; j < n; j++) {
        for (int64_t c = 0; c < 32; c++)
            t.k[j * dim + c] = (float)(0.5 * fxt_rng_normal(&r));
        for (int64_t c = 0; c < dim; c++)
            t.v[j * dim + c] = (float)fxt_rng_normal(&r);
    }
    t.k[5 * dim + 63] = 81.0f; /* bound ~ 2 * 81 = 162 base-2 units */
    uint8_t fb[64];
    char label[64];
    snprintf(label, sizeof label, "bound overshoots by ~110 nats, center=%d", center);
    run_checked(label, &t, NULL, fb, NULL);
    if (center)
        CHECK(count_ones(fb, 64) == 0, "%s: rows take the fixed path", label);
    else
        CHECK(count_ones(fb, 64) == 64, "%s: rows fall back", label);
    tcase_free(&t);
}

/* Anti-aligned keys, no centring: every logit is far below zero (about -115
 * in base 2) and the bound sits just under the strict gate. The fixed path
 * must keep every term (e >= -125): exact, no fallback. */
static void test_anti_aligned(void)
{
    tcase t;
    const int64_t n = 4096;
    const int64_t dim = 64;
    fxt_rng r = case_open(&t, 13, 1, 16, n, dim);
    const int gate = fxa_fixed_m_gate_strict(fxa_fixed_m_c(n, 1.0)); /* 120 */
    t.d.center = 0;
    t.d.scale = log(2.0); /* lambda = 1 */
    for (int64_t i = 0; i < 16; i++)
        t.q[i * dim] = (float)(gate - 1.5); /* q = (gate - 1.5) e1 */
    for (int64_t j = 0; j < n; j++) {
        t.k[j * dim] = -1.0f + (float)(0.01 * fxt_rng_uniform(&r)); /* -1 .. -0.99 */
        for (int64_t c = 1; c < dim; c++)
            t.k[j * dim + c] = (float)(0.001 * fxt_rng_normal(&r));
        for (int64_t c = 0; c < dim; c++)
            t.v[j * dim + c] = (float)(2.0 * fxt_rng_uniform(&r) - 1.0); /* Vmax <= 1 */
    }
    uint8_t fb[16];
    fxa_attn_stats st = {.struct_size = sizeof st};
    run_checked("anti-aligned keys, logits < -100, no centring", &t, NULL, fb, &st);
    CHECK(count_ones(fb, 16) == 0, "anti-aligned rows run fixed-max under the strict gate");
    CHECK(st.max_bound >= gate - 1 && st.max_bound <= gate,
          "the bound sits at the gate: %.0f vs %d", st.max_bound, gate);
    tcase_free(&t);
}

static void fill_normal(tcase *t, fxt_rng *r, double qs, double ks, double vs)
{
    for (int64_t i = 0; i < t->nq; i++)
        t->q[i] = (float)(qs * fxt_rng_normal(r));
    for (int64_t i = 0; i < t->nkv; i++) {
        t->k[i] = (float)(ks * fxt_rng_normal(r));
        t->v[i] = (float)(vs * fxt_rng_normal(r));
    }
}

/* V of magnitude 1e30: C shrinks by 100, nothing overflows. */
static void test_huge_v(void)
{
    tcase t;
    fxa_attn_stats st = {.struct_size = sizeof st};
    fxt_rng r = case_open(&t, 17, 2, 300, 3000, 128);
    fill_normal(&t, &r, 1.0, 1.0, 1e30);
    run_checked("V of magnitude 1e30", &t, NULL, NULL, &st);
    CHECK(st.c_min == fxa_fixed_m_c(3000, st.vmax) && st.c_min < 20, "C %d with Vmax %g", st.c_min,
          st.vmax);
    CHECK(st.fallback_rows < st.rows, "the fixed path still runs with huge V");
    tcase_free(&t);
}

/* All-zero queries: every score is 0, the output is the mean of V. */
static void test_zero_queries(void)
{
    tcase t;
    const int64_t n = 1001;
    fxt_rng r = case_open(&t, 19, 1, 3, n, 64);
    fill_normal(&t, &r, 0.0, 3.0, 1.0);
    float out[3 * 64];
    uint8_t fb[3];
    run_checked("all-zero queries", &t, out, fb, NULL);
    double worst = 0.0;
    for (int64_t c = 0; c < 64; c++) {
        double mean = 0.0;
        for (int64_t j = 0; j < n; j++)
            mean += t.v[j * 64 + c];
        mean /= (double)n;
        for (int64_t i = 0; i < 3; i++)
            worst = fmax(worst, fabs(out[i * 64 + c] - mean));
    }
    CHECK(worst < 1e-5, "zero queries give the mean of V (err %.3g)", worst);
    CHECK(count_ones(fb, 3) == 0, "zero queries have bound 0 and run fixed-max");
    tcase_free(&t);
}

/* fp16 inputs near the fp16 maximum: scores around 1e10 fall back to online
 * softmax, which must still be exact (the max key wins). */
static void test_fp16_max(void)
{
    tcase t;
    fxt_rng r = case_open(&t, 23, 2, 40, 500, 64);
    t.d.dtype = FXA_F16;
    for (int64_t i = 0; i < t.nq; i++)
        t.q[i] = (float)((fxt_rng_uniform(&r) < 0.5 ? -1 : 1) *
                         (30000.0 + 35504.0 * fxt_rng_uniform(&r)));
    for (int64_t i = 0; i < t.nkv; i++) {
        t.k[i] = (float)((fxt_rng_uniform(&r) < 0.5 ? -1 : 1) *
                         (30000.0 + 35504.0 * fxt_rng_uniform(&r)));
        t.v[i] = (float)((fxt_rng_uniform(&r) < 0.5 ? -1 : 1) * 65504.0 * fxt_rng_uniform(&r));
    }
    tcase_round(&t);
    fxa_attn_stats st = {.struct_size = sizeof st};
    run_checked("fp16 inputs near 65504", &t, NULL, NULL, &st);
    CHECK(st.fallback_rows == st.rows, "scores of ~1e10 cannot pass any gate");
    tcase_free(&t);
}

/* A single query row against many keys, hot and cold heads. */
static void test_single_query(void)
{
    tcase t;
    fxt_rng r = case_open(&t, 29, 4, 1, 4099, 128);
    fill_normal(&t, &r, 3.0, 1.5, 1.0);
    run_checked("Sq = 1", &t, NULL, NULL, NULL);
    tcase_free(&t);
}

int main(void)
{
    test_require_isa("test_attn_adversarial");
    g_ctx = fxt_ctx(0);
    CHECK(g_ctx != NULL, "context");
    test_mass_loss(231.0, 1, 1);
    test_mass_loss(231.0, 0, 1);
    test_mass_loss(150.0, 1, 0); /* passes the centred gate: fixed and exact */
    test_mass_loss(150.0, 0, 1); /* fails the strict gate without centring */
    test_sink();
    test_overshoot(1);
    test_overshoot(0);
    test_anti_aligned();
    test_huge_v();
    test_zero_queries();
    test_fp16_max();
    test_single_query();
    fxa_ctx_destroy(g_ctx);
    return test_summary("test_attn_adversarial");
}
