/*
 * test_attn_check: the check plan (fxa_check_plan_create, fxa_check_run in
 * fxattn_diag.h), the per-head report of `fxattn check`, against an
 * independent fp64 computation here.
 *
 *  - Norms (|q| min/median/max, max |k|, the radius around the fp64 key
 *    mean), Vmax, C and the gates, and the overshoot of the bound over each
 *    sampled row's true max (raw and centred; every one >= 0) agree with
 *    this file's own loops; the bounds and fallback counts equal what
 *    fxa_attn_bounds itself reports (row_bound, row_fallback) with centring
 *    on and off, bit for bit. GQA, two batches, a hot head that partly
 *    falls back, keys off-centre so that centring matters.
 *  - sample_rows: 0 is FXA_CHECK_SAMPLE_ROWS, 1 samples row 0, more than Sq
 *    samples every row; negative is refused.
 *  - The same bits for 1 and 3 threads, for a transposed (BHSD-ordered)
 *    view described by strides, for the BHSD layout preset on that buffer,
 *    and, for bf16 and f16 inputs, strided vs contiguous.
 *  - bf16 inputs give the bounds, flags, stats and report of their fp32
 *    widening, bit for bit, with fp32 and bf16 compute.
 *  - v NULL: vmax 1, C as for Vmax 1, everything else as with V all zeros.
 *  - One plan runs again on other inputs with the report of a fresh plan;
 *    fxa_attn_check (plan, workspace, run in one call) gives the same bits.
 *  - Refusals leave heads_out as it was and explain themselves: a
 *    head_struct_size out of range (message names fxa_check_head), NaN in Q
 *    or K (the bound pass's message), NULL pointers, a bad descriptor, V
 *    given to a plan without V or missing from one with V, a missing or
 *    misaligned workspace, heads_out or the workspace over an input.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn.h"
#include "fxattn_diag.h"
#include "testutil.h"

enum { B = 2, HQ = 4, HKV = 2, SQ = 45, SKV = 70, D = 24, HOT = 3 };
#define NQ ((size_t)B * SQ * HQ * D)
#define NKV ((size_t)B * SKV * HKV * D)
#define ROWS ((size_t)B * HQ * SQ)

static fxa_ctx *g_ctx;  /* 2 threads */
static fxa_ctx *g_ctx1; /* 1 thread */
static fxa_ctx *g_ctx3; /* 3 threads */
static float g_q[NQ], g_k[NKV], g_v[NKV];

/* BSHD offsets. */
static size_t q_at(int b, int h, int s)
{
    return (((size_t)b * SQ + (size_t)s) * HQ + (size_t)h) * D;
}

static size_t kv_at(int b, int h, int s)
{
    return (((size_t)b * SKV + (size_t)s) * HKV + (size_t)h) * D;
}

static void init_desc(fxa_attn_desc *d, fxa_dtype dtype)
{
    fxt_attn_desc(d, B, HQ, HKV, SQ, SKV, D);
    d->dtype = dtype;
}

/* A context of `threads` workers; exits (status 1) when there is none. */
static fxa_ctx *make_ctx(int threads)
{
    fxa_ctx *ctx = fxt_ctx(threads);
    if (!ctx)
        exit(1);
    return ctx;
}

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* Element n/2 of x sorted (the upper median, as documented). */
static double upper_median(double *x, size_t n)
{
    qsort(x, n, sizeof *x, cmp_double);
    return x[n / 2];
}

static int near(double got, double want)
{
    return fabs(got - want) <= 1e-10 * (1.0 + fabs(want));
}

/* fxa_attn_bounds on the f32 BSHD tensors with centring `center`. */
static void bounds(int center, const float *v, float *bound, uint8_t *fb)
{
    fxa_attn_desc d;
    init_desc(&d, FXA_F32);
    d.center = center;
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_plan_create(g_ctx, &d, &plan, &ws_bytes) == FXA_OK, "plan: %s",
          fxa_ctx_last_error(g_ctx));
    void *ws = ws_bytes ? aligned_alloc(64, (ws_bytes + 63) & ~(size_t)63) : NULL;
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = g_q,
                             .k = g_k,
                             .v = v,
                             .row_bound = bound,
                             .row_fallback = fb};
    CHECK(fxa_attn_bounds(plan, &a, ws, NULL) == FXA_OK, "bounds: %s", fxa_ctx_last_error(g_ctx));
    free(ws);
    fxa_attn_plan_destroy(plan);
}

/* The report of head h recomputed here from the f32 BSHD tensors and the
 * bound pass's rows, then compared with got. */
static void verify_head(const char *label, int h, const fxa_check_head *got, int sample_rows,
                        const float *bound_c, const uint8_t *fb_c, const float *bound_r,
                        const uint8_t *fb_r, int has_v)
{
    const int kvh = h / (HQ / HKV);
    const double lambda = (1.0 / sqrt((double)D)) * 1.4426950408889634;
    const int want_s = sample_rows ? sample_rows : FXA_CHECK_SAMPLE_ROWS;
    const int samples = want_s < SQ ? want_s : SQ;
    double qn[B * SQ], bc[B * SQ], br[B * SQ];
    double over[B * SQ], over_raw[B * SQ];
    double kmax = 0.0, radius = 0.0, vmax = 0.0;
    int64_t n_fb_c = 0, n_fb_r = 0;
    int n_over = 0;
    for (int b = 0; b < B; b++) {
        double mean[D] = {0};
        for (int j = 0; j < SKV; j++)
            for (int c = 0; c < D; c++)
                mean[c] += (double)g_k[kv_at(b, kvh, j) + (size_t)c];
        for (int c = 0; c < D; c++)
            mean[c] /= SKV;
        for (int j = 0; j < SKV; j++) {
            const float *kj = g_k + kv_at(b, kvh, j);
            double n2 = 0.0, r2 = 0.0;
            for (int c = 0; c < D; c++) {
                n2 += (double)kj[c] * kj[c];
                r2 += ((double)kj[c] - mean[c]) * ((double)kj[c] - mean[c]);
                vmax = fmax(vmax, fabs((double)g_v[kv_at(b, kvh, j) + (size_t)c]));
            }
            kmax = fmax(kmax, sqrt(n2));
            radius = fmax(radius, sqrt(r2));
        }
        for (int i = 0; i < SQ; i++) {
            const size_t row = ((size_t)b * HQ + (size_t)h) * SQ + (size_t)i;
            double n2 = 0.0;
            for (int c = 0; c < D; c++)
                n2 += (double)g_q[q_at(b, h, i) + (size_t)c] * g_q[q_at(b, h, i) + (size_t)c];
            qn[b * SQ + i] = sqrt(n2);
            bc[b * SQ + i] = bound_c[row];
            br[b * SQ + i] = bound_r[row];
            n_fb_c += fb_c[row];
            n_fb_r += fb_r[row];
        }
        for (int s = 0; s < samples; s++) {
            const int i = samples > 1 ? s * (SQ - 1) / (samples - 1) : 0;
            const size_t row = ((size_t)b * HQ + (size_t)h) * SQ + (size_t)i;
            const float *qi = g_q + q_at(b, h, i);
            double best = -INFINITY, best_c = -INFINITY;
            for (int j = 0; j < SKV; j++) {
                double dot = 0.0, dot_c = 0.0;
                for (int c = 0; c < D; c++) {
                    dot += (double)qi[c] * g_k[kv_at(b, kvh, j) + (size_t)c];
                    dot_c += (double)qi[c] * ((double)g_k[kv_at(b, kvh, j) + (size_t)c] - mean[c]);
                }
                best = fmax(best, dot);
                best_c = fmax(best_c, dot_c);
            }
            over[n_over] = bound_c[row] - lambda * best_c;
            over_raw[n_over] = bound_r[row] - lambda * best;
            CHECK(over[n_over] >= 0.0 && over_raw[n_over] >= 0.0,
                  "[%s] head %d row %d: the bound is under the true max (overshoot %g, raw %g)",
                  label, h, i, over[n_over], over_raw[n_over]);
            n_over++;
        }
    }
    if (!has_v)
        vmax = 1.0;
    const int n = B * SQ;
    double qmin = INFINITY, qmax = 0.0, bcmax = 0.0, brmax = 0.0, omax = 0.0, ormax = 0.0;
    for (int i = 0; i < n; i++) {
        qmin = fmin(qmin, qn[i]);
        qmax = fmax(qmax, qn[i]);
        bcmax = fmax(bcmax, bc[i]);
        brmax = fmax(brmax, br[i]);
    }
    for (int i = 0; i < n_over; i++) {
        omax = fmax(omax, over[i]);
        ormax = fmax(ormax, over_raw[i]);
    }
    CHECK(got->struct_size == sizeof *got, "[%s] head %d: struct_size %zu", label, h,
          got->struct_size);
    CHECK(near(got->q_norm_min, qmin) && near(got->q_norm_max, qmax) &&
              near(got->q_norm_median, upper_median(qn, (size_t)n)),
          "[%s] head %d: |q| %.17g/%.17g/%.17g, want %.17g/%.17g/%.17g", label, h, got->q_norm_min,
          got->q_norm_median, got->q_norm_max, qmin, qn[n / 2], qmax);
    CHECK(near(got->k_norm_max, kmax), "[%s] head %d: |k| max %.17g, want %.17g", label, h,
          got->k_norm_max, kmax);
    CHECK(near(got->k_radius_centered, radius), "[%s] head %d: radius %.17g, want %.17g", label, h,
          got->k_radius_centered, radius);
    CHECK(got->vmax == vmax, "[%s] head %d: vmax %.17g, want %.17g", label, h, got->vmax, vmax);
    CHECK(got->c == fxa_fixed_m_c(SKV, vmax) && got->gate == fxa_fixed_m_gate_strict(got->c) &&
              got->gate_centered == fxa_fixed_m_gate_centered(got->c, SKV),
          "[%s] head %d: C %d gates %d/%d", label, h, got->c, got->gate, got->gate_centered);
    /* Bounds and fallback: the bound pass's own values, exactly. */
    CHECK(got->bound_max == bcmax && got->bound_raw_max == brmax &&
              got->bound_median == upper_median(bc, (size_t)n) &&
              got->bound_raw_median == upper_median(br, (size_t)n),
          "[%s] head %d: bounds %g/%g raw %g/%g, want %g/%g raw %g/%g", label, h, got->bound_median,
          got->bound_max, got->bound_raw_median, got->bound_raw_max, bc[n / 2], bcmax, br[n / 2],
          brmax);
    CHECK(got->rows == n && got->fallback_rows_centered == n_fb_c &&
              got->fallback_rows_raw == n_fb_r &&
              got->fallback_share_centered == (double)n_fb_c / n &&
              got->fallback_share_raw == (double)n_fb_r / n,
          "[%s] head %d: fallback %lld/%lld of %lld (shares %g/%g), want %lld/%lld of %d", label, h,
          (long long)got->fallback_rows_centered, (long long)got->fallback_rows_raw,
          (long long)got->rows, got->fallback_share_centered, got->fallback_share_raw,
          (long long)n_fb_c, (long long)n_fb_r, n);
    CHECK(got->sampled_rows == n_over, "[%s] head %d: %lld sampled rows, want %d", label, h,
          (long long)got->sampled_rows, n_over);
    CHECK(near(got->overshoot_max, omax) && near(got->overshoot_raw_max, ormax) &&
              near(got->overshoot_median, upper_median(over, (size_t)n_over)) &&
              near(got->overshoot_raw_median, upper_median(over_raw, (size_t)n_over)),
          "[%s] head %d: overshoot %.17g/%.17g raw %.17g/%.17g, want %.17g/%.17g raw %.17g/%.17g",
          label, h, got->overshoot_median, got->overshoot_max, got->overshoot_raw_median,
          got->overshoot_raw_max, over[n_over / 2], omax, over_raw[n_over / 2], ormax);
    CHECK(got->overshoot_median >= 0.0 && got->overshoot_raw_median >= 0.0,
          "[%s] head %d: negative overshoot median", label, h);
}

/* The report through a check plan: plan (V when v is set), workspace,
 * one run of head_size-byte heads, destroy. */
static fxa_status check_sized(fxa_ctx *ctx, const fxa_attn_desc *d, const void *q, const void *k,
                              const void *v, int sample_rows, fxa_check_head *out, size_t head_size)
{
    fxa_check_desc cd;
    fxa_check_desc_init(&cd);
    cd.attn = d;
    cd.sample_rows = sample_rows;
    cd.has_v = v != NULL;
    fxa_check_plan *plan = NULL;
    size_t bytes = 0;
    fxa_status st = fxa_check_plan_create(ctx, &cd, &plan, &bytes);
    if (st != FXA_OK) {
        CHECK(plan == NULL, "a failed plan_create left a plan");
        return st;
    }
    void *ws = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    const fxa_attn_args a = {.struct_size = sizeof a, .q = q, .k = k, .v = v};
    st = fxa_check_run(plan, &a, ws, out, head_size);
    free(ws);
    fxa_check_plan_destroy(plan);
    return st;
}

static fxa_status check(fxa_ctx *ctx, const fxa_attn_desc *d, const void *q, const void *k,
                        const void *v, int sample_rows, fxa_check_head *out)
{
    return check_sized(ctx, d, q, k, v, sample_rows, out, sizeof(fxa_check_head));
}

static void test_against_fp64(void)
{
    static float bound_c[ROWS], bound_r[ROWS];
    static uint8_t fb_c[ROWS], fb_r[ROWS];
    bounds(1, g_v, bound_c, fb_c);
    bounds(0, g_v, bound_r, fb_r);
    int64_t partial = 0;
    for (size_t i = 0; i < ROWS; i++)
        partial += fb_c[i];
    CHECK(partial > 0 && partial < (int64_t)ROWS,
          "the inputs should make some rows fall back with centring, not all: %lld of %zu",
          (long long)partial, ROWS);
    fxa_attn_desc d;
    init_desc(&d, FXA_F32);
    const int samples[4] = {0, 1, 7, 1000};
    for (int t = 0; t < 4; t++) {
        fxa_check_head heads[HQ];
        char label[64];
        snprintf(label, sizeof label, "f32, sample_rows %d", samples[t]);
        CHECK(check(g_ctx, &d, g_q, g_k, g_v, samples[t], heads) == FXA_OK, "[%s] %s", label,
              fxa_ctx_last_error(g_ctx));
        CHECK(*fxa_ctx_last_error(g_ctx) == 0, "[%s] message after success: %s", label,
              fxa_ctx_last_error(g_ctx));
        for (int h = 0; h < HQ; h++)
            verify_head(label, h, &heads[h], samples[t], bound_c, fb_c, bound_r, fb_r, 1);
    }
    /* v NULL: V taken as zeros, vmax reported as 1. */
    static float zeros[NKV];
    bounds(1, zeros, bound_c, fb_c);
    bounds(0, zeros, bound_r, fb_r);
    fxa_check_head no_v[HQ], zero_v[HQ];
    CHECK(check(g_ctx, &d, g_q, g_k, NULL, 0, no_v) == FXA_OK, "v NULL: %s",
          fxa_ctx_last_error(g_ctx));
    for (int h = 0; h < HQ; h++)
        verify_head("v NULL", h, &no_v[h], 0, bound_c, fb_c, bound_r, fb_r, 0);
    CHECK(check(g_ctx, &d, g_q, g_k, zeros, 0, zero_v) == FXA_OK, "V zeros: %s",
          fxa_ctx_last_error(g_ctx));
    for (int h = 0; h < HQ; h++) {
        CHECK(zero_v[h].vmax == 0.0 && no_v[h].vmax == 1.0, "head %d: vmax %g (zeros) %g (NULL)", h,
              zero_v[h].vmax, no_v[h].vmax);
        zero_v[h].vmax = 1.0;
        CHECK(memcmp(&zero_v[h], &no_v[h], sizeof no_v[h]) == 0,
              "head %d: v NULL differs from V all zeros beyond vmax", h);
    }
}

/* Tensor [B, heads, seq, D] from BSHD src into BHSD order. */
static void to_bhsd(const float *src, float *dst, size_t heads, size_t seq)
{
    for (size_t b = 0; b < B; b++)
        for (size_t s = 0; s < seq; s++)
            for (size_t h = 0; h < heads; h++)
                memcpy(dst + ((b * heads + h) * seq + s) * D, src + ((b * seq + s) * heads + h) * D,
                       D * sizeof(float));
}

/* n values of src converted to dtype (f32: copied). */
static void *as_dtype(const float *src, size_t n, fxa_dtype dtype)
{
    void *out = malloc(n * (dtype == FXA_F32 ? 4 : 2));
    for (size_t i = 0; i < n; i++) {
        if (dtype == FXA_F32)
            ((float *)out)[i] = src[i];
        else if (dtype == FXA_BF16)
            ((uint16_t *)out)[i] = fxa_f32_to_bf16(src[i]);
        else
            ((uint16_t *)out)[i] = fxa_f32_to_f16(src[i]);
    }
    return out;
}

static void test_strides_threads(void)
{
    static float qt[NQ], kt[NKV], vt[NKV];
    to_bhsd(g_q, qt, HQ, SQ);
    to_bhsd(g_k, kt, HKV, SKV);
    to_bhsd(g_v, vt, HKV, SKV);
    const fxa_dtype types[3] = {FXA_F32, FXA_BF16, FXA_F16};
    for (int t = 0; t < 3; t++) {
        const char *name = t == 0 ? "f32" : (t == 1 ? "bf16" : "f16");
        void *q = as_dtype(g_q, NQ, types[t]), *k = as_dtype(g_k, NKV, types[t]);
        void *v = as_dtype(g_v, NKV, types[t]);
        void *q2 = as_dtype(qt, NQ, types[t]), *k2 = as_dtype(kt, NKV, types[t]);
        void *v2 = as_dtype(vt, NKV, types[t]);
        fxa_attn_desc d;
        init_desc(&d, types[t]);
        fxa_check_head ref[HQ], got[HQ];
        CHECK(check(g_ctx, &d, q, k, v, 0, ref) == FXA_OK, "[%s] contiguous: %s", name,
              fxa_ctx_last_error(g_ctx));
        /* The BHSD-ordered buffers as a strided BSHD-layout view. */
        fxa_attn_desc ds = d;
        ds.q_strides = (fxa_attn_strides){.batch = HQ * SQ * D, .token = D, .head = SQ * D};
        ds.k_strides = (fxa_attn_strides){.batch = HKV * SKV * D, .token = D, .head = SKV * D};
        ds.v_strides = ds.k_strides;
        memset(got, 0xa5, sizeof got);
        CHECK(check(g_ctx, &ds, q2, k2, v2, 0, got) == FXA_OK, "[%s] strided: %s", name,
              fxa_ctx_last_error(g_ctx));
        CHECK(memcmp(ref, got, sizeof got) == 0, "[%s] transposed view: report differs", name);
        fxa_attn_desc dl = d;
        dl.layout = FXA_LAYOUT_BHSD;
        memset(got, 0xa5, sizeof got);
        CHECK(check(g_ctx, &dl, q2, k2, v2, 0, got) == FXA_OK, "[%s] BHSD: %s", name,
              fxa_ctx_last_error(g_ctx));
        CHECK(memcmp(ref, got, sizeof got) == 0, "[%s] BHSD layout: report differs", name);
        /* No V, strided: the same as no V, contiguous. */
        CHECK(check(g_ctx, &d, q, k, NULL, 0, ref) == FXA_OK &&
                  check(g_ctx, &ds, q2, k2, NULL, 0, got) == FXA_OK &&
                  memcmp(ref, got, sizeof got) == 0,
              "[%s] v NULL: strided report differs from contiguous", name);
        CHECK(check(g_ctx, &d, q, k, v, 5, ref) == FXA_OK, "[%s] 2 threads: %s", name,
              fxa_ctx_last_error(g_ctx));
        fxa_ctx *others[2] = {g_ctx1, g_ctx3};
        for (int c = 0; c < 2; c++) {
            memset(got, 0xa5, sizeof got);
            CHECK(check(others[c], &ds, q2, k2, v2, 5, got) == FXA_OK, "[%s] %d threads: %s", name,
                  fxa_ctx_threads(others[c]), fxa_ctx_last_error(others[c]));
            CHECK(memcmp(ref, got, sizeof got) == 0, "[%s] %d threads: report differs", name,
                  fxa_ctx_threads(others[c]));
        }
        free(q);
        free(k);
        free(v);
        free(q2);
        free(k2);
        free(v2);
    }
}

/* fxa_attn_bounds of desc d (center on) on q, k, v: per-row bounds, flags
 * and stats. */
static void bounds_of(const fxa_attn_desc *d, const void *q, const void *k, const void *v,
                      float *bound, uint8_t *fb, fxa_attn_stats *st)
{
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_plan_create(g_ctx, d, &plan, &ws_bytes) == FXA_OK, "plan: %s",
          fxa_ctx_last_error(g_ctx));
    void *ws = ws_bytes ? aligned_alloc(64, (ws_bytes + 63) & ~(size_t)63) : NULL;
    const fxa_attn_args a = {
        .struct_size = sizeof a, .q = q, .k = k, .v = v, .row_bound = bound, .row_fallback = fb};
    st->struct_size = sizeof *st;
    CHECK(fxa_attn_bounds(plan, &a, ws, st) == FXA_OK, "bounds: %s", fxa_ctx_last_error(g_ctx));
    free(ws);
    fxa_attn_plan_destroy(plan);
}

/* bf16 inputs are read as they are (the row statistics' bf16 forms, and for
 * bf16 compute the query rows' bf16 bits): their bounds, flags, stats and
 * check report are those of their exact fp32 widening, bit for bit, with
 * fp32 and with bf16 compute. */
static void test_bf16_as_widened(void)
{
    uint16_t *q = as_dtype(g_q, NQ, FXA_BF16), *k = as_dtype(g_k, NKV, FXA_BF16);
    uint16_t *v = as_dtype(g_v, NKV, FXA_BF16);
    static float qw[NQ], kw[NKV], vw[NKV]; /* the widening (head HOT's q rounds to bf16) */
    for (size_t i = 0; i < NQ; i++)
        qw[i] = fxa_bf16_to_f32(q[i]);
    for (size_t i = 0; i < NKV; i++) {
        kw[i] = fxa_bf16_to_f32(k[i]);
        vw[i] = fxa_bf16_to_f32(v[i]);
    }
    static float bound_ref[ROWS], bound[ROWS];
    static uint8_t fb_ref[ROWS], fb[ROWS];
    fxa_attn_stats st_ref, st;
    fxa_attn_desc d;
    init_desc(&d, FXA_F32);
    bounds_of(&d, qw, kw, vw, bound_ref, fb_ref, &st_ref);
    CHECK(st_ref.fallback_rows > 0 && st_ref.fallback_rows < (int64_t)ROWS,
          "bf16 vs fp32: want some rows on each path, %lld of %zu fall back",
          (long long)st_ref.fallback_rows, ROWS);
    for (int compute = 0; compute < 2; compute++) {
        init_desc(&d, FXA_BF16);
        d.compute = compute ? FXA_COMPUTE_BF16 : FXA_COMPUTE_FP32;
        memset(bound, 0xa5, sizeof bound);
        memset(fb, 0xa5, sizeof fb);
        bounds_of(&d, q, k, v, bound, fb, &st);
        CHECK(memcmp(bound, bound_ref, sizeof bound) == 0 && memcmp(fb, fb_ref, sizeof fb) == 0,
              "bf16 inputs, %s compute: row bounds or flags differ from fp32's",
              compute ? "bf16" : "fp32");
        CHECK(st.fallback_rows == st_ref.fallback_rows && st.vmax == st_ref.vmax &&
                  st.max_bound == st_ref.max_bound && st.c_min == st_ref.c_min &&
                  st.gate_strict == st_ref.gate_strict && st.gate_centered == st_ref.gate_centered,
              "bf16 inputs, %s compute: stats differ from fp32's", compute ? "bf16" : "fp32");
    }
    fxa_check_head ref[HQ], got[HQ];
    init_desc(&d, FXA_F32);
    CHECK(check(g_ctx, &d, qw, kw, vw, 5, ref) == FXA_OK, "check f32: %s",
          fxa_ctx_last_error(g_ctx));
    init_desc(&d, FXA_BF16);
    memset(got, 0xa5, sizeof got);
    CHECK(check(g_ctx, &d, q, k, v, 5, got) == FXA_OK, "check bf16: %s", fxa_ctx_last_error(g_ctx));
    CHECK(memcmp(ref, got, sizeof got) == 0, "bf16 inputs: check report differs from fp32's");
    free(q);
    free(k);
    free(v);
}

/* heads_out must hold its canary after a refusal. */
static int untouched(const fxa_check_head *h)
{
    const unsigned char *p = (const unsigned char *)h;
    for (size_t i = 0; i < HQ * sizeof *h; i++)
        if (p[i] != 0x5a)
            return 0;
    return 1;
}

static void expect_refusal(const char *label, fxa_status got, fxa_status want,
                           const fxa_check_head *heads, const char *needle)
{
    CHECK(got == want, "[%s] status %d (%s), want %d", label, (int)got, fxa_status_str(got),
          (int)want);
    CHECK(*fxa_ctx_last_error(g_ctx) != 0, "[%s] no message", label);
    CHECK(!needle || strstr(fxa_ctx_last_error(g_ctx), needle) != NULL,
          "[%s] message \"%s\" lacks \"%s\"", label, fxa_ctx_last_error(g_ctx), needle);
    CHECK(untouched(heads), "[%s] heads_out written on failure", label);
}

/* Refusals of fxa_check_run on a good plan (heads: the canary). */
static void test_run_refusals(fxa_check_head *heads)
{
    fxa_attn_desc d;
    init_desc(&d, FXA_F32);
    fxa_check_desc cd;
    fxa_check_desc_init(&cd);
    cd.attn = &d;
    fxa_check_plan *with_v = NULL, *no_v = NULL;
    size_t bytes_v = 0, bytes = 0;
    CHECK(fxa_check_plan_create(g_ctx, &cd, &with_v, &bytes_v) == FXA_OK, "plan: %s",
          fxa_ctx_last_error(g_ctx));
    cd.has_v = 0;
    CHECK(fxa_check_plan_create(g_ctx, &cd, &no_v, &bytes) == FXA_OK, "plan without V: %s",
          fxa_ctx_last_error(g_ctx));
    bytes = bytes > bytes_v ? bytes : bytes_v;
    unsigned char *ws = aligned_alloc(64, (bytes + 64 + 63) & ~(size_t)63);
    fxa_attn_args a = {.struct_size = sizeof a, .q = g_q, .k = g_k, .v = NULL};
    expect_refusal("plan with V, v NULL", fxa_check_run(with_v, &a, ws, heads, sizeof *heads),
                   FXA_ERR_INVALID_ARG, heads, "v is NULL");
    a.v = g_v;
    expect_refusal("plan without V, v set", fxa_check_run(no_v, &a, ws, heads, sizeof *heads),
                   FXA_ERR_INVALID_ARG, heads, "has_v");
    expect_refusal("workspace NULL", fxa_check_run(with_v, &a, NULL, heads, sizeof *heads),
                   FXA_ERR_INVALID_ARG, heads, "workspace");
    expect_refusal("workspace misaligned", fxa_check_run(with_v, &a, ws + 8, heads, sizeof *heads),
                   FXA_ERR_INVALID_ARG, heads, "aligned");
    expect_refusal("args NULL", fxa_check_run(with_v, NULL, ws, heads, sizeof *heads),
                   FXA_ERR_INVALID_ARG, heads, "NULL");
    fxa_attn_args small = a;
    small.struct_size = 4;
    expect_refusal("args struct_size 4", fxa_check_run(with_v, &small, ws, heads, sizeof *heads),
                   FXA_ERR_INVALID_ARG, heads, "fxa_attn_args.struct_size");
    /* The workspace over Q (a copy, so that the check reads what it wrote). */
    float *q = aligned_alloc(64, (sizeof g_q + bytes_v + 63) & ~(size_t)63);
    memcpy(q, g_q, sizeof g_q);
    a.q = q;
    expect_refusal("workspace over Q", fxa_check_run(with_v, &a, q, heads, sizeof *heads),
                   FXA_ERR_INVALID_ARG, heads, "overlaps");
    fxa_check_head *over_q = (fxa_check_head *)(void *)q;
    CHECK(fxa_check_run(with_v, &a, ws, over_q, sizeof *heads) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "overlaps") != NULL &&
              memcmp(q, g_q, sizeof g_q) == 0,
          "heads_out over Q: %s", fxa_ctx_last_error(g_ctx));
    free(q);
    /* Plan refusals: a struct_size out of range, no attention descriptor,
     * has_v neither 0 nor 1. */
    fxa_check_plan *plan = (fxa_check_plan *)&cd;
    size_t got_bytes = 0;
    cd.has_v = 1;
    cd.struct_size = sizeof cd - 1;
    CHECK(fxa_check_plan_create(g_ctx, &cd, &plan, &got_bytes) == FXA_ERR_INVALID_ARG &&
              plan == NULL && strstr(fxa_ctx_last_error(g_ctx), "fxa_check_desc.struct_size"),
          "check desc struct_size - 1: %s", fxa_ctx_last_error(g_ctx));
    cd.struct_size = sizeof cd;
    cd.attn = NULL;
    CHECK(fxa_check_plan_create(g_ctx, &cd, &plan, &got_bytes) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "attn is NULL"),
          "check desc attn NULL: %s", fxa_ctx_last_error(g_ctx));
    cd.attn = &d;
    cd.has_v = 2;
    CHECK(fxa_check_plan_create(g_ctx, &cd, &plan, &got_bytes) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "has_v"),
          "check desc has_v 2: %s", fxa_ctx_last_error(g_ctx));
    free(ws);
    fxa_check_plan_destroy(with_v);
    fxa_check_plan_destroy(no_v);
}

/* One plan, runs on two inputs: each the report of its own fresh plan;
 * fxa_attn_check gives the same bits in one call. */
static void test_plan_reuse(void)
{
    fxa_attn_desc d;
    init_desc(&d, FXA_F32);
    fxa_check_desc cd;
    fxa_check_desc_init(&cd);
    cd.attn = &d;
    cd.sample_rows = 7;
    fxa_check_plan *plan = NULL;
    size_t bytes = 0;
    CHECK(fxa_check_plan_create(g_ctx, &cd, &plan, &bytes) == FXA_OK && plan && bytes > 0,
          "plan: %s", fxa_ctx_last_error(g_ctx));
    void *ws = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    float *q2 = malloc(sizeof g_q);
    for (size_t i = 0; i < NQ; i++)
        q2[i] = -0.5f * g_q[i];
    const void *qs[3] = {g_q, q2, g_q};
    for (int r = 0; r < 3; r++) {
        fxa_check_head got[HQ], want[HQ], once[HQ];
        const fxa_attn_args a = {.struct_size = sizeof a, .q = qs[r], .k = g_k, .v = g_v};
        memset(got, 0xa5, sizeof got);
        CHECK(fxa_check_run(plan, &a, ws, got, sizeof *got) == FXA_OK, "run %d: %s", r,
              fxa_ctx_last_error(g_ctx));
        CHECK(check(g_ctx, &d, qs[r], g_k, g_v, 7, want) == FXA_OK, "fresh plan %d: %s", r,
              fxa_ctx_last_error(g_ctx));
        CHECK(memcmp(got, want, sizeof got) == 0, "run %d of one plan differs from a fresh plan",
              r);
        CHECK(fxa_attn_check(g_ctx, &d, qs[r], g_k, g_v, 7, once, sizeof *once) == FXA_OK &&
                  memcmp(once, want, sizeof once) == 0,
              "fxa_attn_check %d differs from the plan: %s", r, fxa_ctx_last_error(g_ctx));
    }
    free(q2);
    free(ws);
    fxa_check_plan_destroy(plan);
}

static void test_refusals(void)
{
    fxa_attn_desc d;
    init_desc(&d, FXA_F32);
    fxa_check_head heads[HQ];
    memset(heads, 0x5a, sizeof heads);
    const size_t bad[3] = {0, sizeof(fxa_check_head) - 1, sizeof(fxa_check_head) + 1};
    for (int i = 0; i < 3; i++) {
        char label[64];
        snprintf(label, sizeof label, "head_struct_size %zu", bad[i]);
        expect_refusal(label, check_sized(g_ctx, &d, g_q, g_k, g_v, 0, heads, bad[i]),
                       FXA_ERR_INVALID_ARG, heads, "fxa_check_head.struct_size");
    }
    float *q = malloc(sizeof g_q), *k = malloc(sizeof g_k);
    memcpy(q, g_q, sizeof g_q);
    memcpy(k, g_k, sizeof g_k);
    q[q_at(1, 2, 9) + 3] = NAN;
    expect_refusal("NaN in Q", check(g_ctx, &d, q, g_k, g_v, 0, heads), FXA_ERR_INVALID_ARG, heads,
                   "non-finite");
    k[kv_at(0, 1, 4) + 5] = INFINITY;
    expect_refusal("Inf in K", check(g_ctx, &d, g_q, k, NULL, 0, heads), FXA_ERR_INVALID_ARG, heads,
                   "non-finite");
    free(q);
    free(k);
    expect_refusal("q NULL", check(g_ctx, &d, NULL, g_k, g_v, 0, heads), FXA_ERR_INVALID_ARG, heads,
                   "NULL");
    expect_refusal("k NULL", check(g_ctx, &d, g_q, NULL, g_v, 0, heads), FXA_ERR_INVALID_ARG, heads,
                   "NULL");
    expect_refusal("d NULL", check(g_ctx, NULL, g_q, g_k, g_v, 0, heads), FXA_ERR_INVALID_ARG,
                   heads, "NULL");
    CHECK(check(g_ctx, &d, g_q, g_k, g_v, 0, NULL) == FXA_ERR_INVALID_ARG, "heads_out NULL");
    CHECK(check(NULL, &d, g_q, g_k, g_v, 0, heads) == FXA_ERR_INVALID_ARG, "ctx NULL");
    expect_refusal("sample_rows -1", check(g_ctx, &d, g_q, g_k, g_v, -1, heads),
                   FXA_ERR_INVALID_ARG, heads, "sample_rows");
    fxa_attn_desc e = d;
    e.heads_kv = 3;
    expect_refusal("Hq not a multiple of Hkv", check(g_ctx, &e, g_q, g_k, g_v, 0, heads),
                   FXA_ERR_INVALID_ARG, heads, "multiple");
    e = d;
    e.head_dim = FXA_MAX_HEAD_DIM + 1;
    expect_refusal("head_dim too large, v NULL", check(g_ctx, &e, g_q, g_k, NULL, 0, heads),
                   FXA_ERR_INVALID_ARG, heads, "head_dim");
    e = d;
    e.struct_size = 3;
    expect_refusal("desc struct_size 3", check(g_ctx, &e, g_q, g_k, g_v, 0, heads),
                   FXA_ERR_INVALID_ARG, heads, "fxa_attn_desc.struct_size");
    test_run_refusals(heads);
    /* A good call after the refusals clears the message. */
    CHECK(check(g_ctx, &d, g_q, g_k, g_v, 0, heads) == FXA_OK && *fxa_ctx_last_error(g_ctx) == 0,
          "good call after refusals: %s", fxa_ctx_last_error(g_ctx));
}

int main(void)
{
    g_ctx = make_ctx(2);
    g_ctx1 = make_ctx(1);
    g_ctx3 = make_ctx(3);
    fxt_rng r;
    fxt_rng_seed(&r, 20240611);
    /* Values exact in bf16 and f16 (8 significant bits), keys off-centre
     * (so that centring shrinks the radius), head HOT's queries 4.5x larger
     * (its bounds straddle the gates). */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < SQ; i++)
            for (int h = 0; h < HQ; h++)
                for (int c = 0; c < D; c++) {
                    const float x = (float)((int)(fxt_rng_next(&r) >> 56) - 128) / 32.0f;
                    g_q[q_at(b, h, i) + (size_t)c] = h == HOT ? 4.5f * x : x;
                }
    for (size_t i = 0; i < NKV; i++) {
        g_k[i] = (float)((int)(fxt_rng_next(&r) >> 56) - 128) / 32.0f + 2.0f;
        g_v[i] = (float)((int)(fxt_rng_next(&r) >> 56) - 128) / 16.0f;
    }
    test_against_fp64();
    test_strides_threads();
    test_bf16_as_widened();
    test_plan_reuse();
    test_refusals();
    fxa_ctx_destroy(g_ctx);
    fxa_ctx_destroy(g_ctx1);
    fxa_ctx_destroy(g_ctx3);
    return test_summary("test_attn_check");
}
