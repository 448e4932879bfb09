/*
 * The fixed-max constants and gates (src/attn/bound.c), and attacks on them:
 * rows swept across each gate (every decision must follow the documented
 * rule, every result must stay exact), the rounding-allowance condition of
 * the centred gate, and the case that shows why the looser gate is for
 * centred rows only.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_diag.h"
#include "testutil.h"

static fxa_ctx *g_ctx;

/* maxdiffusion's table for Vmax = 256: N, C, W, gate. */
static void test_constants(void)
{
    static const struct {
        int64_t n;
        int c;
        int gate;
    } table[] = {{1, 119, 122},     {512, 110, 117},   {1024, 109, 117},
                 {4096, 107, 116},  {8192, 106, 115},  {16384, 105, 115},
                 {32760, 104, 114}, {75600, 102, 113}, {151200, 101, 113}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const int c = fxa_fixed_m_c(table[i].n, 256.0);
        CHECK(c == table[i].c, "C(%lld) = %d, expected %d", (long long)table[i].n, c, table[i].c);
        CHECK(fxa_fixed_m_gate_strict(c) == table[i].gate, "gate(%lld) = %d, expected %d",
              (long long)table[i].n, fxa_fixed_m_gate_strict(c), table[i].gate);
    }
    CHECK(fxa_fixed_m_c(4096, 0.0) == 115, "Vmax below 1 counts as 1");
    CHECK(fxa_fixed_m_c(4096, 1.0) == 115, "Vmax 1");
    CHECK(fxa_fixed_m_c(4096, 1.0000001) == 114, "Vmax just above 1");
    CHECK(fxa_fixed_m_c(4096, 2.0) == 114, "Vmax 2");
    CHECK(fxa_fixed_m_c(4096, 2.5) == 113, "Vmax 2.5");
    CHECK(fxa_fixed_m_c(4097, 1.0) == 114, "N just above a power of two");
    /* The invariants behind the gates, over N and Vmax. */
    int ok_overflow = 1;
    int ok_flush = 1;
    int ok_centred = 1;
    for (int64_t n = 1; n < ((int64_t)1 << 40); n = n * 3 + 1) {
        for (double vmax = 0.5; vmax < 1e35; vmax *= 37.0) {
            const int c = fxa_fixed_m_c(n, vmax);
            const int gs = fxa_fixed_m_gate_strict(c);
            const int gc = fxa_fixed_m_gate_centered(c, n);
            /* N 2^C Vmax' <= 2^127 */
            ok_overflow &= log2((double)n) + c + log2(fmax(vmax, 1.0)) <= 127.0 + 1e-9;
            /* the smallest exponent C - ceil(U) - U at ceil(U) = gate stays >= -125 */
            ok_flush &= c - 2 * gs >= -125;
            /* centred: relative flushed mass 2^(ceil(log2 N) - 125 - C + gate) <= 2^-24,
             * unless the centred gate falls back to the strict one */
            ok_centred &= gc == gs || ceil(log2((double)n)) - 125 - c + gc <= -24;
            ok_centred &= gc >= gs;
        }
    }
    CHECK(ok_overflow, "no accumulator can overflow for any N, Vmax");
    CHECK(ok_flush, "the strict gate keeps every exponent >= -125");
    CHECK(ok_centred, "the centred gate keeps the flushed mass below 2^-24");
}

static void fill_keys(tcase *t, fxt_rng *r, double offset, double spread)
{
    const int64_t dim = t->d.head_dim;
    for (int64_t j = 0; j < t->d.seq_kv; j++) {
        float *k = t->k + j * dim;
        float *v = t->v + j * dim;
        k[0] = (float)(offset + (j % 2 ? spread : -spread));
        for (int64_t c = 1; c < dim; c++)
            k[c] = (float)(0.3 * fxt_rng_normal(r));
        for (int64_t c = 0; c < dim; c++)
            v[c] = (float)(2.0 * fxt_rng_uniform(r) - 1.0);
    }
}

/* Largest ||k_j - kbar|| (kbar = 0 when not centring), in double. */
static double key_radius(const tcase *t, int center)
{
    const int64_t dim = t->d.head_dim;
    double kbar[FXA_MAX_HEAD_DIM] = {0};
    double r2 = 0.0;
    for (int64_t j = 0; center && j < t->d.seq_kv; j++)
        for (int64_t c = 0; c < dim; c++)
            kbar[c] += t->k[j * dim + c] / (double)t->d.seq_kv;
    for (int64_t j = 0; j < t->d.seq_kv; j++) {
        double nn = 0.0;
        for (int64_t c = 0; c < dim; c++)
            nn += pow(t->k[j * dim + c] - kbar[c], 2.0);
        r2 = fmax(r2, nn);
    }
    return sqrt(r2);
}

/* Queries whose bounds sweep gate-6 .. gate+6: half aligned with the key
 * axis (large true max), half orthogonal to it (bound far above the true
 * max). Every decision must be fixed iff ceil(U) <= gate; all exact. */
static void sweep_gate(int center)
{
    fxa_attn_desc d;
    tcase t;
    fxt_rng r;
    const int64_t n = 2048;
    const int64_t rows = 128; /* all rows are checked against fp64 */
    const int64_t dim = 64;
    fxt_rng_seed(&r, 31 + (uint64_t)center);
    fxa_attn_desc_init(&d);
    d.batch = d.heads_q = d.heads_kv = 1;
    d.seq_q = rows;
    d.seq_kv = n;
    d.head_dim = dim;
    d.center = center;
    d.scale = log(2.0); /* lambda = 1 */
    tcase_init(&t, &d);
    fill_keys(&t, &r, center ? 3.0 : 0.0, 1.0);
    double vmax = 0.0;
    for (int64_t i = 0; i < t.nkv; i++)
        vmax = fmax(vmax, fabs(t.v[i]));
    const int c = fxa_fixed_m_c(n, vmax);
    const int gate = center ? fxa_fixed_m_gate_centered(c, n) : fxa_fixed_m_gate_strict(c);
    const double radius = key_radius(&t, center);
    for (int64_t i = 0; i < rows; i++) {
        const double u = gate - 6.0 + 12.0 * (double)(i / 2) / (double)(rows / 2);
        const double qn = u / radius;
        float *q = t.q + i * dim;
        if (i % 2 == 0) {
            q[0] = (float)qn;
        } else {
            q[1] = (float)(qn * 0.6);
            q[2] = (float)(qn * 0.8);
        }
    }
    float *out = calloc((size_t)t.nq, sizeof(float));
    float *lse = calloc((size_t)rows, sizeof(float));
    float *bound = calloc((size_t)rows, sizeof(float));
    uint8_t *fb = calloc((size_t)rows, 1);
    fxa_status rc = tcase_run(&t, g_ctx, FXA_MODE_AUTO, NULL, out, lse, fb, bound, NULL);
    CHECK(rc == FXA_OK, "sweep run: %s", fxa_ctx_last_error(g_ctx));
    int decisions_ok = 1;
    int at_gate = 0;
    int above_gate = 0;
    for (int64_t i = 0; i < rows; i++) {
        decisions_ok &= fb[i] == (bound[i] > (float)gate);
        at_gate += bound[i] == (float)gate && !fb[i];
        above_gate += bound[i] == (float)(gate + 1) && fb[i];
    }
    char label[80];
    terr e;
    snprintf(label, sizeof label, "sweep across the %s gate (%d)", center ? "centred" : "strict",
             gate);
    tcase_errors(&t, out, lse, &e);
    terr_print(label, &e);
    CHECK(decisions_ok, "%s: a row's decision does not follow ceil(U) <= gate", label);
    CHECK(at_gate > 0 && above_gate > 0, "%s: the sweep must hit the gate (%d) and gate+1 (%d)",
          label, at_gate, above_gate);
    CHECK(terr_within_envelope(&e), "%s: outside the envelope", label);
    free(out);
    free(lse);
    free(bound);
    free(fb);
    tcase_free(&t);
}

/* The centred gate needs the bound's rounding allowance lambda ||q|| eps to be
 * at most 1: keys with a huge common offset (1e5) make fp32 scores lose
 * absolute accuracy, and then the max centred score may be below zero. Such
 * rows must use the strict gate (and fall back between the two gates); with
 * a modest offset (1e2) the same rows pass the centred gate. */
static void centred_allowance(double offset, int expect_fallback)
{
    fxa_attn_desc d;
    tcase t;
    fxt_rng r;
    const int64_t n = 1024;
    const int64_t dim = 64;
    const int64_t rows = 8;
    fxt_rng_seed(&r, 37);
    fxa_attn_desc_init(&d);
    d.batch = d.heads_q = d.heads_kv = 1;
    d.seq_q = rows;
    d.seq_kv = n;
    d.head_dim = dim;
    d.scale = log(2.0);
    tcase_init(&t, &d);
    fill_keys(&t, &r, offset, 1.0);
    const double radius = key_radius(&t, 1);
    for (int64_t i = 0; i < rows; i++) {
        t.q[i * dim + 1 + i] = (float)(160.0 / radius); /* U ~ 160: between the gates */
    }
    float *out = calloc((size_t)t.nq, sizeof(float));
    float *lse = calloc((size_t)rows, sizeof(float));
    float *bound = calloc((size_t)rows, sizeof(float));
    uint8_t fb[8];
    fxa_status rc = tcase_run(&t, g_ctx, FXA_MODE_AUTO, NULL, out, lse, fb, bound, NULL);
    CHECK(rc == FXA_OK, "run: %s", fxa_ctx_last_error(g_ctx));
    const int c = fxa_fixed_m_c(n, 1.0);
    int between = 1;
    int decided = 1;
    for (int64_t i = 0; i < rows; i++) {
        between &= bound[i] > (float)fxa_fixed_m_gate_strict(c) &&
                   bound[i] <= (float)fxa_fixed_m_gate_centered(c, n);
        decided &= fb[i] == expect_fallback;
    }
    char label[80];
    terr e;
    snprintf(label, sizeof label, "centred gate, key offset %g", offset);
    tcase_errors(&t, out, lse, &e);
    terr_print(label, &e);
    CHECK(between, "%s: bounds must lie between the strict and the centred gate", label);
    CHECK(decided, "%s: expected fallback %d", label, expect_fallback);
    CHECK(terr_within_envelope(&e), "%s: outside the envelope", label);
    free(out);
    free(lse);
    free(bound);
    tcase_free(&t);
}

/* Why the looser gate is for centred rows only: uncentred anti-aligned keys
 * put every logit near -U. With U between the gates, the shift ceil(U) - C
 * would push every term below 2^-126 (all mass lost, output 0) if the
 * centred gate were applied. The strict gate sends these rows to online
 * softmax; centring the same keys makes them safe for the fixed path. */
static void anti_aligned_between_gates(int center)
{
    fxa_attn_desc d;
    tcase t;
    fxt_rng r;
    const int64_t n = 1024;
    const int64_t dim = 64;
    fxt_rng_seed(&r, 41);
    fxa_attn_desc_init(&d);
    d.batch = d.heads_q = d.heads_kv = 1;
    d.seq_q = 4;
    d.seq_kv = n;
    d.head_dim = dim;
    d.center = center;
    d.scale = log(2.0);
    tcase_init(&t, &d);
    for (int64_t j = 0; j < n; j++) {
        t.k[j * dim] = -1.0f + (float)(0.05 * fxt_rng_uniform(&r));
        for (int64_t c = 1; c < dim; c++)
            t.k[j * dim + c] = (float)(0.01 * fxt_rng_normal(&r));
        for (int64_t c = 0; c < dim; c++)
            t.v[j * dim + c] = (float)(2.0 * fxt_rng_uniform(&r) - 1.0);
    }
    for (int64_t i = 0; i < 4; i++)
        t.q[i * dim] = 160.0f + (float)i;
    float out[4 * 64];
    float lse[4];
    uint8_t fb[4];
    fxa_status rc = tcase_run(&t, g_ctx, FXA_MODE_AUTO, NULL, out, lse, fb, NULL, NULL);
    CHECK(rc == FXA_OK, "run: %s", fxa_ctx_last_error(g_ctx));
    char label[80];
    terr e;
    snprintf(label, sizeof label, "anti-aligned keys between the gates, center=%d", center);
    tcase_errors(&t, out, lse, &e);
    terr_print(label, &e);
    CHECK(terr_within_envelope(&e), "%s: outside the envelope", label);
    for (int i = 0; i < 4; i++)
        CHECK(fb[i] == (center ? 0 : 1), "%s: row %d fallback %d", label, i, fb[i]);
    tcase_free(&t);
}

int main(void)
{
    test_require_isa("test_attn_gates");
    CHECK(fxa_ctx_create(NULL, &g_ctx) == FXA_OK, "context");
    test_constants();
    sweep_gate(0);
    sweep_gate(1);
    centred_allowance(1e5, 1);
    centred_allowance(1e2, 0);
    anti_aligned_between_gates(0);
    anti_aligned_between_gates(1);
    fxa_ctx_destroy(g_ctx);
    return test_summary("test_attn_gates");
}
