/*
 * test_exp2: accuracy and edge behaviour of 2^(z - m) for integer-valued m, in two
 * implementations that run the same sweeps and checks:
 *   - fxa_exp2_shifted_ref(z, m) (src/kernels/ref/exp2_ref.h), the scalar reference;
 *   - fxa_vexp2_shifted_f32x16 (src/kernels/x86_avx512/vexp2_avx512.h), its AVX-512 twin,
 *     reached through exp2_avx512_probe.c (the only file built with AVX-512 flags) when
 *     the build has it (FXA_TEST_EXP2_AVX512, x86-64) and the CPU runs it (AVX-512F/BW/VL/DQ
 *     and FMA, as the library's dispatch requires); otherwise the test says that part was
 *     not run and passes or fails on the scalar checks alone.
 * The AVX-512 variant without the flush test (fxa_vexp2_shifted_noflush_f32x16, for rows
 * whose bound proves e >= -125) must match the flushing one bit for bit for e >= -126.
 * Each implementation is an "evaluate a batch" function; the sweeps queue their arguments
 * and evaluate them BATCH at a time, so that the vector path is not measured through a
 * call per point.
 *
 * Accuracy: the error in ULPs against exp2 evaluated in double on the exact argument
 * e = (double)z - (double)m (exact: z has 24 significant bits, m is an integer below 2^31;
 * glibc's double exp2 is accurate to ~1e-16 relative, far below an fp32 ULP), over
 *   - every 64th float z in [-126, 128) with m = 0,
 *   - every 16th float z in [-1, 1] with |z| >= 2^-26, every float with 1/8 <= |z| <= 1/2
 *     (the error depends only on f = e - round(e), and peaks near |f| = 1/2), and every
 *     float in a window around each integer and half-integer e (where n = round(e) switches),
 *   - random (z, m) pairs, integer m in [-300, 300], z = fl(m + e), e uniform in [-126, 128),
 *     and e near both ends of the range, including e closer to 128 than any float
 *     (z = -2^-k, m = -128), and random e below the range (in [-160, -126) and within
 *     2^-12 below -126).
 * The ULP of a reference value r is 2^(floor(log2 r) - 23) (2^-149 below 2^-126; no result
 * for e >= -126 is subnormal). The maximum is printed with its argument, for e <= 127.99
 * (below exp2_ref.h's upper clamp) and for the whole range; the former is asserted <= 2 ULP.
 * Every argument of these sweeps with e < -126 must give +0.0f.
 *
 * Edges: e < -126 gives +0.0f exactly (also z = -inf); e = 0 gives 1.0f (also for large m);
 * integer e in [-126, 127] gives exactly 2^e; results are finite below e = 128; large shifts
 * (m near 1e9, 2^23, 2^30) give exact powers of two; and the result is non-decreasing in z
 * for fixed m over a dense sweep of [-130, 128) (every 8th float, every float near each
 * half-integer and in (-1/2, -1/4)), with any decrease also bounded by 1 ULP.
 *
 * Where the AVX-512 version differs by design, and what is asserted for it instead:
 *   - It has no upper clamp: 2^n is applied by vscalefps, so for e within ~2^-24.5 of 128
 *     (and at e = 128) it returns +inf, as correct rounding of 2^e >= 2^128 (1 - 2^-25)
 *     does (apart from arguments right at that threshold), where the scalar saturates at
 *     2^127.99; callers keep e <= C <= 127, far from this. Asserted: no
 *     non-finite result for e <= 127.99, and +inf only where 2^e > FLT_MAX; such results
 *     are counted ("overflow") rather than measured in ULPs.
 *   - It flushes on the fp32 sum n + f (n = round(z) - m, f = z - round(z)) rather than on
 *     the exact e, so for e in (-126 - 2^-17, -126) it may return a value near 2^-126
 *     instead of 0 (fp32 spacing at 126 is 2^-17). Outside that window it must give +0.0f
 *     for e < -126 like the scalar; inside, results are counted and printed. A dense sweep of
 *     e around -126 for shifts that make z's grid coarser and finer than the window
 *     checks that scalar and vector agree on zero vs non-zero outside the window and
 *     prints how often they disagree inside it.
 *   - It is compared with the scalar on every argument with e in [-126, 127.99]: the
 *     largest distance in fp32 steps (ULPs) is printed and asserted <= 2.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/ref/exp2_ref.h"
#include "testutil.h"
#ifdef FXA_TEST_EXP2_AVX512
#include "exp2_avx512_probe.h"
#endif

#define MAX_ULP 2.0
#define MAX_AGREE_STEPS 2
/* e in (-126 - FLUSH_WINDOW, -126 + FLUSH_WINDOW): where the vector version may decide
 * zero vs non-zero differently from the scalar one. */
#define FLUSH_WINDOW 0x1p-17
#define BATCH 4096

/* ULP of the fp32 grid at the (positive, finite) double value r: 2^(floor(log2 r) - 23),
 * built from r's exponent field (frexp/ldexp cost a sixth of the run time). */
static double ulp_at(double r)
{
    if (r < 0x1p-126)
        return 0x1p-149;
    uint64_t b;
    memcpy(&b, &r, sizeof b);
    b = (b & 0x7ff0000000000000u) - ((uint64_t)23 << 52);
    double u;
    memcpy(&u, &b, sizeof u);
    return u;
}

/* ---- implementations under test ------------------------------------------------------ */

/* out[i] = 2^(z[i] - m[i]) for i < n. */
typedef void (*exp2_batch_fn)(const float *z, const float *m, float *out, size_t n);

typedef struct impl {
    const char *name;
    exp2_batch_fn eval;
    int vector; /* the AVX-512 version: compared with the scalar, flush window allowed */
} impl;

static void eval_scalar(const float *z, const float *m, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = fxa_exp2_shifted_ref(z[i], m[i]);
}

/* One argument (for the vector version: a masked 1-lane tail). */
static float eval1(const impl *im, float z, float m)
{
    float r;
    im->eval(&z, &m, &r, 1);
    return r;
}

/* ---- statistics ---------------------------------------------------------------------- */

/* Running maximum of the ULP error over one region of e. */
typedef struct errstat {
    double max_ulp;
    float z, m; /* argument of the maximum */
    double e;
    float got;
    double ref;
    long long n;         /* points measured */
    long long nonfinite; /* non-finite results (other than the overflows below) */
    long long overflow;  /* +inf where 2^e > FLT_MAX (vector version near e = 128) */
} errstat;

static void errstat_init(errstat *s)
{
    memset(s, 0, sizeof *s);
    s->max_ulp = -1.0;
}

/* Statistics over e <= CORE_HI only: the part of the range below the clamp at 127.99
 * in exp2_ref.h, printed separately so that the polynomial's own accuracy shows. */
#define CORE_HI 127.99
static errstat g_core;

/* Arguments with e < -126, where +0.0f is required (vector: outside the flush window). */
typedef struct zerostat {
    long long n, bad, window;
    float bad_z, bad_m, bad_got; /* first bad one */
    float win_max;               /* largest result inside the window */
} zerostat;
static zerostat g_zero;

/* Vector against scalar on e in [-126, CORE_HI]: distance in fp32 steps (both results are
 * non-negative floats, so the difference of their bit patterns counts the steps). */
typedef struct agreestat {
    long long n, differ, max_steps;
    float z, m, v, s;
    double e;
} agreestat;
static agreestat g_agree;

static void measure_one(errstat *s, float z, float m, double e, float got, double ref)
{
    s->n++;
    if (!isfinite(got)) {
        if (got == INFINITY && ref > (double)FLT_MAX) {
            s->overflow++;
            return;
        }
        s->nonfinite++;
        if (s->max_ulp < INFINITY) {
            s->max_ulp = INFINITY;
            s->z = z, s->m = m, s->e = e, s->got = got, s->ref = ref;
        }
        return;
    }
    const double err = fabs((double)got - ref) / ulp_at(ref);
    if (err > s->max_ulp) {
        s->max_ulp = err;
        s->z = z, s->m = m, s->e = e, s->got = got, s->ref = ref;
    }
}

static void check_zero(const impl *im, float z, float m, double e, float got)
{
    g_zero.n++;
    if (test_f32_bits(got) == 0u)
        return;
    if (im->vector && e > -126.0 - FLUSH_WINDOW) {
        g_zero.window++;
        if (!(got <= g_zero.win_max))
            g_zero.win_max = got;
        return;
    }
    if (g_zero.bad++ == 0)
        g_zero.bad_z = z, g_zero.bad_m = m, g_zero.bad_got = got;
}

static void agree_one(float z, float m, double e, float v, float s)
{
    g_agree.n++;
    if (test_f32_bits(v) == test_f32_bits(s))
        return;
    g_agree.differ++;
    const long long d = llabs((long long)test_f32_bits(v) - (long long)test_f32_bits(s));
    if (d > g_agree.max_steps) {
        g_agree.max_steps = d;
        g_agree.z = z, g_agree.m = m, g_agree.e = e, g_agree.v = v, g_agree.s = s;
    }
}

static void merge(errstat *into, const errstat *s)
{
    if (s->max_ulp > into->max_ulp) {
        long long n = into->n, nf = into->nonfinite, ov = into->overflow;
        *into = *s;
        into->n = n, into->nonfinite = nf, into->overflow = ov;
    }
    into->n += s->n;
    into->nonfinite += s->nonfinite;
    into->overflow += s->overflow;
}

static void print_stat(const char *label, const errstat *s)
{
    printf("  %-34s %11lld pts  max error %.6f ULP at e = %.17g (z = %.9g, m = %.9g): "
           "got %a, exp2 = %a",
           label, s->n, s->max_ulp, s->e, (double)s->z, (double)s->m, (double)s->got, s->ref);
    if (s->overflow)
        printf("; %lld gave +inf where 2^e > FLT_MAX", s->overflow);
    printf("\n");
}

/* ---- batched evaluation of the accuracy sweeps --------------------------------------- */

/* Arguments (z, m) gathered for one call of an implementation, with its results (got) and,
 * when asked, the scalar reference's (sc). */
typedef struct zm_buf {
    size_t n;
    float z[BATCH], m[BATCH], got[BATCH], sc[BATCH];
} zm_buf;

/* Appends (z, m); 1 when the buffer is then full. */
static int zm_add(zm_buf *a, float z, float m)
{
    a->z[a->n] = z;
    a->m[a->n] = m;
    return ++a->n == BATCH;
}

/* got = im's results on the gathered arguments; sc = the scalar's too when with_scalar. */
static void zm_eval(zm_buf *a, const impl *im, int with_scalar)
{
    im->eval(a->z, a->m, a->got, a->n);
    if (with_scalar)
        eval_scalar(a->z, a->m, a->sc, a->n);
}

typedef struct batch {
    const impl *im;
    errstat *s; /* statistics of the current sweep */
    zm_buf a;
} batch;
static batch g_b;

static void batch_flush(batch *b)
{
    zm_buf *a = &b->a;
    if (a->n == 0)
        return;
    zm_eval(a, b->im, b->im->vector);
    for (size_t i = 0; i < a->n; i++) {
        const float z = a->z[i], m = a->m[i], got = a->got[i];
        const double e = (double)z - (double)m;
        if (e < -126.0) {
            check_zero(b->im, z, m, e, got);
            continue;
        }
        if (e >= 128.0)
            continue;
        const double ref = exp2(e);
        if (e <= CORE_HI) {
            measure_one(&g_core, z, m, e, got, ref);
            if (b->im->vector)
                agree_one(z, m, e, got, a->sc[i]);
        }
        measure_one(b->s, z, m, e, got, ref);
    }
    a->n = 0;
}

static void batch_begin(batch *b, errstat *s)
{
    errstat_init(s);
    b->s = s;
    b->a.n = 0;
}

static void batch_end(batch *b)
{
    batch_flush(b);
    b->s = NULL;
}

static void push(batch *b, float z, float m)
{
    if (zm_add(&b->a, z, m))
        batch_flush(b);
}

/* Every stride-th float z (bit patterns, both signs, magnitudes from min_abs up) with
 * (double)z in [lo, hi), m = 0. */
static void sweep_floats(batch *b, double lo, double hi, uint32_t stride, float min_abs)
{
    const uint32_t b0 = test_f32_bits(min_abs);
    /* Positive z: magnitudes ascending. */
    for (uint32_t u = b0; u < 0x7f800000u; u += stride) {
        const float z = test_bits_f32(u);
        if ((double)z >= hi)
            break;
        if ((double)z >= lo)
            push(b, z, 0.0f);
    }
    /* Negative z: magnitudes ascending. */
    for (uint32_t u = 0x80000000u | b0; u < 0xff800000u; u += stride) {
        const float z = test_bits_f32(u);
        if ((double)z < lo)
            break;
        if ((double)z < hi)
            push(b, z, 0.0f);
    }
}

/* Pushes z = m + e0 (rounded to float) with m, for m a random integer in [-300, 300] and
 * e0 = lo + span * u, u uniform in [0, 1) drawn after m. */
static void push_random_shift(batch *b, fxt_rng *r, double lo, double span)
{
    const int mi = (int)(fxt_rng_next(r) % 601u) - 300;
    const double e0 = lo + span * fxt_rng_uniform(r);
    push(b, (float)((double)mi + e0), (float)mi);
}

static void test_accuracy(const impl *im)
{
    batch *b = &g_b;
    errstat all, s;
    errstat_init(&all);
    errstat_init(&g_core);
    memset(&g_zero, 0, sizeof g_zero);
    memset(&g_agree, 0, sizeof g_agree);
    b->im = im;
    printf("accuracy of %s against double exp2 (e = z - m):\n", im->name);

    double t0 = test_now_seconds();
    batch_begin(b, &s);
    sweep_floats(b, -126.0, 128.0, 64, 0.0f);
    batch_end(b);
    print_stat("every 64th float z in [-126,128)", &s);
    CHECK(s.n > 30000000, "%s: float sweep covered only %lld points", im->name, s.n);
    merge(&all, &s);

    batch_begin(b, &s);
    sweep_floats(b, -1.0, 1.0000001, 16, 0x1p-26f);
    batch_end(b);
    print_stat("every 16th float in [-1,1]", &s);
    merge(&all, &s);

    /* f = e - round(e) takes every float value in [-1/2, 1/2], and the error in ULPs
     * depends on f only (2^n scales the result and its ULP alike), so every float in
     * 1/8 <= |z| <= 1/2, where the polynomial's error peaks, is measured. */
    batch_begin(b, &s);
    sweep_floats(b, -0.5, 0.5000001, 1, 0.125f);
    batch_end(b);
    print_stat("every float in 1/8 <= |z| <= 1/2", &s);
    merge(&all, &s);

    /* Windows of consecutive floats around every half-integer (n switches) and
     * every integer in [-126, 128). */
    batch_begin(b, &s);
    for (int k2 = -252; k2 < 256; k2++) {
        const float c = (float)k2 * 0.5f;
        float z = c;
        for (int i = 0; i < 2048; i++)
            z = nextafterf(z, -INFINITY);
        for (int i = 0; i < 4096; i++, z = nextafterf(z, INFINITY))
            if ((double)z >= -126.0 && (double)z < 128.0)
                push(b, z, 0.0f);
    }
    batch_end(b);
    print_stat("windows at integers, half-integers", &s);
    merge(&all, &s);

    /* Random (z, m) with integer shifts; e < -126 must give +0.0f (checked in the
     * batch), e >= 128 is skipped. */
    batch_begin(b, &s);
    fxt_rng r;
    fxt_rng_seed(&r, 20240611u);
    for (int i = 0; i < 4000000; i++)
        push_random_shift(b, &r, -126.0, 254.0);
    batch_end(b);
    print_stat("random (z, m), m in [-300,300]", &s);
    merge(&all, &s);

    /* Random e near the ends of the range, where clamps and 2^n splitting act. */
    batch_begin(b, &s);
    for (int i = 0; i < 1000000; i++)
        push_random_shift(b, &r, (i & 1) ? 128.0 : -126.0, (i & 1) ? -1.0 : 1.0);
    batch_end(b);
    print_stat("random e in [-126,-125), [127,128)", &s);
    merge(&all, &s);

    /* Random e below the range, which must flush to +0.0f: uniform in [-160, -126) and
     * within 2^-12 below -126 (the few that round up to e >= -126 are measured). */
    batch_begin(b, &s);
    for (int i = 0; i < 1000000; i++)
        push_random_shift(b, &r, -126.0, (i & 1) ? -34.0 : -0x1p-12);
    batch_end(b);
    merge(&all, &s);

    /* The last float steps below e = 128: z just below 128 with m = 0, and tiny
     * negative z with m = -128 (e = 128 - |z|, closer to 128 than any float). */
    batch_begin(b, &s);
    {
        float z = 128.0f;
        for (int i = 0; i < 100000; i++) {
            z = nextafterf(z, 0.0f);
            push(b, z, 0.0f);
        }
        for (int k = 1; k <= 60; k++)
            push(b, -ldexpf(1.0f, -k), -128.0f);
    }
    batch_end(b);
    print_stat("e just below 128", &s);
    merge(&all, &s);

    const double t1 = test_now_seconds();
    print_stat("e in [-126, 127.99]", &g_core);
    print_stat("ALL e in [-126, 128)", &all);
    printf("  e < -126: %lld pts, %lld not +0.0f", g_zero.n, g_zero.bad);
    if (im->vector)
        printf(", %lld non-zero inside the flush window (-126 - 2^-17, -126) (largest %a)",
               g_zero.window, (double)g_zero.win_max);
    printf("\n");
    if (im->vector)
        printf("  agreement with the scalar on e in [-126, 127.99]: %lld pts, %lld differ, "
               "max %lld fp32 steps at e = %.17g (z = %.9g, m = %.9g): vector %a, scalar %a\n",
               g_agree.n, g_agree.differ, g_agree.max_steps, g_agree.e, (double)g_agree.z,
               (double)g_agree.m, (double)g_agree.v, (double)g_agree.s);
    printf("  (%.2f s)\n", t1 - t0);

    CHECK(g_core.nonfinite == 0 && g_core.overflow == 0,
          "%s: %lld arguments with e in [-126, 127.99] gave a non-finite result (e.g. e = %.17g)",
          im->name, g_core.nonfinite + g_core.overflow, g_core.e);
    if (im->vector)
        /* No clamp: +inf is allowed only where 2^e itself exceeds FLT_MAX. */
        CHECK(all.nonfinite == 0,
              "%s: %lld arguments with e in [-126, 128) gave a non-finite "
              "result other than overflow (e.g. e = %.17g)",
              im->name, all.nonfinite, all.e);
    else
        /* The scalar saturates: finite everywhere below 128. */
        CHECK(all.nonfinite == 0 && all.overflow == 0,
              "%s: %lld arguments with e in [-126, 128) gave a non-finite result (e.g. e = "
              "%.17g)",
              im->name, all.nonfinite + all.overflow, all.e);
    CHECK(g_core.max_ulp <= MAX_ULP,
          "%s: e <= 127.99: max error %.6f ULP > %.1f at e = %.17g (z = %a, m = %a): got %a, "
          "exp2 = %a",
          im->name, g_core.max_ulp, MAX_ULP, g_core.e, (double)g_core.z, (double)g_core.m,
          (double)g_core.got, g_core.ref);
    CHECK(g_zero.n > 900000, "%s: only %lld arguments with e < -126", im->name, g_zero.n);
    CHECK(g_zero.bad == 0,
          "%s: %lld arguments with e < -126 did not give +0.0f (e.g. z = %a, "
          "m = %a: %a)",
          im->name, g_zero.bad, (double)g_zero.bad_z, (double)g_zero.bad_m, (double)g_zero.bad_got);
    if (im->vector) {
        CHECK(g_agree.n == g_core.n, "%s: compared %lld of %lld points", im->name, g_agree.n,
              g_core.n);
        CHECK(g_agree.max_steps <= MAX_AGREE_STEPS,
              "%s: differs from the scalar by %lld fp32 steps at z = %a, m = %a: %a vs %a",
              im->name, g_agree.max_steps, (double)g_agree.z, (double)g_agree.m, (double)g_agree.v,
              (double)g_agree.s);
    }
    /* Above 127.99 the scalar's contract is saturation (callers keep e <= C + 1 <= 128 - 1),
     * so only finiteness is asserted there (above). */
}

/* ---- edges --------------------------------------------------------------------------- */

static void test_underflow(const impl *im)
{
    const float zs[] = {-126.0001f, nextafterf(-126.0f, -INFINITY),
                        -127.0f,    -127.5f,
                        -128.0f,    -150.0f,
                        -1000.0f,   -1e30f,
                        -FLT_MAX,   -INFINITY};
    for (size_t i = 0; i < sizeof zs / sizeof zs[0]; i++) {
        const float got = eval1(im, zs[i], 0.0f);
        CHECK(test_f32_bits(got) == 0u, "%s: exp2(%a - 0) = %a, want +0.0f", im->name,
              (double)zs[i], (double)got);
    }
    /* The same via the shift. */
    const float ms[] = {1.0f, 100.0f, 300.0f, 0x1p30f, 1e9f};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        const float got = eval1(im, 0.0f, ms[i]);
        CHECK(test_f32_bits(got) ==
                  (ms[i] > 126.0f ? 0u : test_f32_bits(ldexpf(1.0f, -(int)ms[i]))),
              "%s: exp2(0 - %a) = %a", im->name, (double)ms[i], (double)got);
        const float got2 = eval1(im, -INFINITY, ms[i]);
        CHECK(test_f32_bits(got2) == 0u, "%s: exp2(-inf - %a) = %a, want +0.0f", im->name,
              (double)ms[i], (double)got2);
    }
    CHECK(test_f32_bits(eval1(im, -27.0001f, 99.0f)) == 0u, "%s: e = -126.0001 via m = 99",
          im->name);
    CHECK(test_f32_bits(eval1(im, -INFINITY, -300.0f)) == 0u, "%s: -inf with m = -300", im->name);
    CHECK(test_f32_bits(eval1(im, -INFINITY, 0.0f)) == 0u, "%s: -inf with m = 0", im->name);
    /* e = -126 exactly is not flushed. */
    CHECK(test_f32_bits(eval1(im, -126.0f, 0.0f)) == 0x00800000u, "%s: e = -126 gives 2^-126",
          im->name);
    CHECK(test_f32_bits(eval1(im, 0.0f, 126.0f)) == 0x00800000u,
          "%s: e = -126 via m = 126 gives "
          "2^-126",
          im->name);
}

static void test_exact_points(const impl *im)
{
    /* e = 0: exactly 1. */
    const float ms[] = {
        0.0f,    1.0f,    -1.0f,    127.0f, -300.0f, 300.0f,       0x1p23f,
        0x1p24f, 0x1p30f, -0x1p30f, 1e9f,   -1e9f,   2147483520.0f /* largest float below 2^31 */};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        const float got = eval1(im, ms[i], ms[i]);
        CHECK(got == 1.0f, "%s: exp2(%a - %a) = %a, want 1", im->name, (double)ms[i], (double)ms[i],
              (double)got);
    }
    /* Integer e in [-126, 127]: exactly 2^e, with and without a shift (one batch of
     * 254 * 5 arguments: full vectors and a tail). */
    {
        enum { NE = 254, NS = 5 };
        static float z[NE * NS], m[NE * NS], got[NE * NS];
        const float shifts[NS] = {0.0f, 5.0f, -7.0f, 100.0f, -250.0f};
        size_t n = 0;
        for (int e = -126; e <= 127; e++)
            for (size_t j = 0; j < NS; j++, n++) {
                m[n] = shifts[j];
                z[n] = (float)e + shifts[j];
            }
        im->eval(z, m, got, n);
        int bad = 0;
        for (size_t i = 0; i < n; i++) {
            const float want = ldexpf(1.0f, (int)(z[i] - m[i]));
            if (test_f32_bits(got[i]) != test_f32_bits(want)) {
                if (bad++ < 5)
                    fprintf(stderr, "  %s: exp2(%g - %g) = %a, want %a\n", im->name, (double)z[i],
                            (double)m[i], (double)got[i], (double)want);
            }
        }
        CHECK(bad == 0, "%s: %d integer arguments did not give exactly 2^e", im->name, bad);
    }

    /* Large magnitudes with the shift. 1e9f is an integer-valued float but its
     * neighbours are 64 apart, so e = 3 needs z, m below 2^24. */
    CHECK(eval1(im, 8388611.0f, 8388608.0f) == 8.0f, "%s: z = 2^23 + 3, m = 2^23: 8", im->name);
    CHECK(eval1(im, 16777222.0f, 16777216.0f) == 64.0f, "%s: z = 2^24 + 6, m = 2^24: 64", im->name);
    CHECK(eval1(im, 1e9f, 1e9f - 64.0f) == 0x1p64f, "%s: z = 1e9, m = 1e9 - 64: 2^64", im->name);
    CHECK(eval1(im, 1e9f, 1e9f + 64.0f) == 0x1p-64f, "%s: z = 1e9, m = 1e9 + 64: 2^-64", im->name);
    CHECK(eval1(im, 1e9f + 64.0f, 1e9f) == 0x1p64f, "%s: z = 1e9 + 64, m = 1e9: 2^64", im->name);
    CHECK(test_f32_bits(eval1(im, 1e9f - 64.0f, 1e9f + 64.0f)) == 0u,
          "%s: z = 1e9 - 64, m = 1e9 + 64: e = -128 flushes to 0", im->name);
    CHECK(eval1(im, 8388735.0f, 8388608.0f) == 0x1p127f, "%s: z = 2^23 + 127, m = 2^23", im->name);
    CHECK(eval1(im, -1e9f, -1e9f + 64.0f) == 0x1p-64f, "%s: z = -1e9, m = -1e9 + 64", im->name);
    {
        /* e = 128: the scalar saturates (finite); the vector version has no clamp and may
         * return +inf, the correctly rounded fp32 value of 2^128, but nothing else
         * non-finite. */
        const float got = eval1(im, 0x1p30f, 0x1p30f - 128.0f);
        if (im->vector)
            printf("  %s: e = 128 (z = 2^30, m = 2^30 - 128) gives %a\n", im->name, (double)got);
        CHECK(got < INFINITY || (im->vector && got == INFINITY), "%s: e = 128 at 2^30 gives %a",
              im->name, (double)got);
    }
    /* Fractional e with a large shift: z = 2^23 - 0.5, m = 2^23 - 8 -> e = 7.5. */
    {
        const float got = eval1(im, 8388607.5f, 8388600.0f);
        const double ref = exp2(7.5);
        CHECK(fabs((double)got - ref) <= MAX_ULP * ulp_at(ref), "%s: e = 7.5 at m = 2^23 - 8: %a",
              im->name, (double)got);
    }
}

/* ---- monotonicity -------------------------------------------------------------------- */

/* Monotonicity over ascending z for a fixed m: counts decreases and the largest one in
 * ULPs of the larger value. Arguments are queued and evaluated BATCH at a time; a run of
 * ascending z starts with mono_start and continues with mono_step. */
typedef struct mono {
    const impl *im;
    float m;
    int have_prev;
    float prev_z, prev;
    long long n, decreases;
    double max_drop_ulp;
    float worst_z;
    size_t nb;
    float z[BATCH], mv[BATCH], r[BATCH];
    uint8_t start[BATCH];
} mono;

static void mono_flush(mono *s)
{
    if (s->nb == 0)
        return;
    s->im->eval(s->z, s->mv, s->r, s->nb);
    for (size_t i = 0; i < s->nb; i++) {
        const float z = s->z[i], r = s->r[i];
        if (!s->start[i]) {
            s->n++;
            if (!(r >= s->prev)) {
                const double drop = ((double)s->prev - (double)r) / ulp_at((double)s->prev);
                if (s->decreases++ < 3)
                    fprintf(stderr,
                            "  %s: not monotone (m = %g): exp2(%a) = %a < exp2(%a) = "
                            "%a\n",
                            s->im->name, (double)s->mv[i], (double)z, (double)r, (double)s->prev_z,
                            (double)s->prev);
                if (!(drop <= s->max_drop_ulp)) {
                    s->max_drop_ulp = drop;
                    s->worst_z = z;
                }
            }
        }
        s->prev = r;
        s->prev_z = z;
    }
    s->nb = 0;
}

static void mono_push(mono *s, float z, int start)
{
    s->z[s->nb] = z;
    s->mv[s->nb] = s->m;
    s->start[s->nb] = (uint8_t)start;
    if (++s->nb == BATCH)
        mono_flush(s);
}

static void mono_start(mono *s, float z)
{
    mono_push(s, z, 1);
}

static void mono_step(mono *s, float z)
{
    mono_push(s, z, 0);
}

/* One run from lo (negative) up: every stride-th float from lo through -0, then from +0 to
 * below hi. */
static void mono_sweep(mono *s, float lo, float hi, uint32_t stride)
{
    mono_start(s, lo);
    for (uint32_t b = test_f32_bits(lo); b > 0x80000000u; b -= stride)
        mono_step(s, test_bits_f32(b));
    for (uint32_t b = 0; b < test_f32_bits(hi); b += stride)
        mono_step(s, test_bits_f32(b));
}

static void test_monotone(const impl *im)
{
    const double t0 = test_now_seconds();
    static mono s;
    memset(&s, 0, sizeof s);
    s.im = im;
    /* m = 0: every 8th float from -130 up to -0, then +0 up to 128. */
    s.m = 0.0f;
    mono_sweep(&s, -130.0f, 128.0f, 8u);
    /* Every float in windows around each integer and half-integer in [-130, 128). */
    for (int k2 = -260; k2 < 256; k2++) {
        float z = (float)k2 * 0.5f;
        for (int i = 0; i < 4096; i++)
            z = nextafterf(z, -INFINITY);
        mono_start(&s, z);
        for (int i = 0; i < 8192; i++) {
            z = nextafterf(z, INFINITY);
            if (z >= 128.0f)
                break;
            mono_step(&s, z);
        }
    }
    /* Every float in (-0.5, -0.25) (f < 0 with n = 0, where consecutive z are closest
     * relative to the output's ULP). */
    mono_start(&s, -0.5f);
    for (uint32_t b = test_f32_bits(-0.5f) - 1u; b > test_f32_bits(-0.25f); b--)
        mono_step(&s, test_bits_f32(b));
    /* m = 77: every 64th float, e in [-130, 128). */
    s.m = 77.0f;
    mono_sweep(&s, -53.0f, 205.0f, 64u);
    mono_flush(&s);

    printf("monotonicity of %s: %lld consecutive pairs, %lld decreases, largest %.3f ULP at "
           "z = %a (%.2f s)\n",
           im->name, s.n, s.decreases, s.max_drop_ulp, (double)s.worst_z, test_now_seconds() - t0);
    CHECK(s.n > 250000000, "%s: monotone sweep covered only %lld points", im->name, s.n);
    /* No decrease beyond one ULP (a bound that the <= 1.15-ULP polynomial meets). */
    CHECK(s.max_drop_ulp <= 1.0, "%s: exp2 decreases by %.3f ULP at z = %a", im->name,
          s.max_drop_ulp, (double)s.worst_z);
    /* Not asserted: strict monotonicity. Where neighbouring arguments are closer
     * than a quarter ULP of the result, fp32 Horner rounding can step down by one
     * ULP (exp2_ref.h states this). */
}

/* ---- the vector version's flush boundary --------------------------------------------- */

#ifdef FXA_TEST_EXP2_AVX512
/* Integer key of a float, increasing with its value (-0 just below +0). */
static int64_t fkey(float x)
{
    const uint32_t b = test_f32_bits(x);
    return (b & 0x80000000u) ? -(int64_t)(b & 0x7fffffffu) - 1 : (int64_t)b;
}

static float keyf(int64_t k)
{
    return k < 0 ? test_bits_f32(0x80000000u | (uint32_t)(-(k + 1))) : test_bits_f32((uint32_t)k);
}

typedef struct wstat {
    const impl *im;
    long long n, in_window, dis_window, dis_outside, scalar_bad;
    double dis_lo, dis_hi; /* range of e where the two disagree */
    float dis_max;         /* largest vector result where the scalar gives 0 */
    zm_buf a;              /* got: the implementation's results, sc: the scalar's */
} wstat;

static void window_flush(wstat *w)
{
    zm_buf *a = &w->a;
    if (a->n == 0)
        return;
    zm_eval(a, w->im, 1);
    for (size_t i = 0; i < a->n; i++) {
        const double e = (double)a->z[i] - (double)a->m[i];
        const int sz = test_f32_bits(a->sc[i]) == 0u, vz = test_f32_bits(a->got[i]) == 0u;
        const int inwin = e > -126.0 - FLUSH_WINDOW && e < -126.0 + FLUSH_WINDOW;
        w->n++;
        w->in_window += inwin;
        if (sz != (e < -126.0) && w->scalar_bad++ < 3)
            fprintf(stderr, "  scalar: exp2(%a - %a) = %a\n", (double)a->z[i], (double)a->m[i],
                    (double)a->sc[i]);
        if (sz == vz)
            continue;
        if (!inwin) {
            if (w->dis_outside++ < 5)
                fprintf(stderr, "  %s: exp2(%a - %a) = %a but the scalar gives %a (e = %.17g)\n",
                        w->im->name, (double)a->z[i], (double)a->m[i], (double)a->got[i],
                        (double)a->sc[i], e);
            continue;
        }
        if (w->dis_window++ == 0)
            w->dis_lo = w->dis_hi = e;
        w->dis_lo = fmin(w->dis_lo, e);
        w->dis_hi = fmax(w->dis_hi, e);
        if (sz && !(a->got[i] <= w->dis_max))
            w->dis_max = a->got[i];
    }
    a->n = 0;
}

static void window_push(wstat *w, float z, float m)
{
    if (zm_add(&w->a, z, m))
        window_flush(w);
}

/* Floats z from fl(zc - half) to fl(zc + half), every one or evenly spaced in the
 * ordering of floats (so across zero each binade gets its share) for at most max_pts. */
static void window_range(wstat *w, float m, double zc, double half, int64_t max_pts)
{
    const int64_t k0 = fkey((float)(zc - half)), k1 = fkey((float)(zc + half));
    int64_t stride = (k1 - k0) / max_pts;
    if (stride < 1)
        stride = 1;
    for (int64_t k = k0; k <= k1; k += stride)
        window_push(w, keyf(k), m);
}

/* Every float within `steps` floats of fl(x). */
static void window_around(wstat *w, float m, double x, int64_t steps)
{
    const int64_t k = fkey((float)x);
    for (int64_t j = k - steps; j <= k + steps; j++)
        window_push(w, keyf(j), m);
}

static void test_flush_window(const impl *im)
{
    const double t0 = test_now_seconds();
    static wstat w;
    memset(&w, 0, sizeof w);
    w.im = im;
    /* m = e.g. 0, -100, 300: z's fp32 spacing near m - 126 is 2^-17 or coarser (|z| >= 64),
     * so no argument lands strictly inside the window; 62 < m < 190: finer, down to the
     * subnormals at m = 126 (z near 0). */
    const float ms[] = {-100.0f, 0.0f,   62.0f,  63.0f,  64.0f,  100.0f, 120.0f,
                        125.0f,  126.0f, 127.0f, 150.0f, 189.0f, 190.0f, 300.0f};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        const double zc = (double)ms[i] - 126.0; /* e = -126 */
        window_range(&w, ms[i], zc, 0x1p-8, (int64_t)1 << 17);
        window_around(&w, ms[i], zc - FLUSH_WINDOW, 4096);
        window_around(&w, ms[i], zc - 0.5 * FLUSH_WINDOW, 4096); /* n + f rounds to -126 */
        window_around(&w, ms[i], zc, 4096);
        window_around(&w, ms[i], zc + FLUSH_WINDOW, 4096);
    }
    window_flush(&w);
    printf("flush boundary of %s: %lld arguments with e in [-126 - 2^-8, -126 + 2^-8], "
           "%lld inside (-126 - 2^-17, -126 + 2^-17); zero vs non-zero differs from the "
           "scalar on %lld inside",
           im->name, w.n, w.in_window, w.dis_window);
    if (w.dis_window)
        printf(" (e in [%.17g, %.17g], vector up to %a)", w.dis_lo, w.dis_hi, (double)w.dis_max);
    printf(" and %lld outside (%.2f s)\n", w.dis_outside, test_now_seconds() - t0);
    CHECK(w.scalar_bad == 0, "scalar: %lld arguments near e = -126 flushed wrongly", w.scalar_bad);
    CHECK(w.dis_outside == 0,
          "%s: %lld arguments outside the flush window differ from the "
          "scalar in zero vs non-zero",
          im->name, w.dis_outside);
}

/* fxa_vexp2_shifted_noflush_f32x16 (FXA_ROW_FIXED rows, whose bound proves
 * e = z - m >= -125) must give the flushing version's bits wherever
 * e >= -126: random integer m in [-300, 300] and e in [-126, 128), plus every
 * float in a window just above -126; and it must really lack the flush
 * (non-zero results just below -126), or this comparison proves nothing. */
static void test_noflush_matches(void)
{
    enum { N = 1 << 20 };
    static float z[N], m[N], with[N], without[N];
    fxt_rng r;
    fxt_rng_seed(&r, 2024);
    size_t n = 0;
    while (n < N / 2) {
        m[n] = (float)((int)(fxt_rng_next(&r) % 601) - 300);
        z[n] = m[n] + (float)(-126.0 + 254.0 * fxt_rng_uniform(&r));
        n += (double)z[n] - (double)m[n] >= -126.0;
    }
    for (float e = -126.0f; n < N; e = nextafterf(e, INFINITY)) {
        m[n] = 0.0f;
        z[n++] = e;
    }
    fxa_test_vexp2_avx512(z, m, with, N);
    fxa_test_vexp2_noflush_avx512(z, m, without, N);
    long long differ = 0;
    for (size_t i = 0; i < N; i++)
        differ += test_f32_bits(with[i]) != test_f32_bits(without[i]);
    const float below[2] = {-126.5f, -130.0f};
    const float zero[2] = {0.0f, 0.0f};
    float below_with[2], below_without[2];
    fxa_test_vexp2_avx512(below, zero, below_with, 2);
    fxa_test_vexp2_noflush_avx512(below, zero, below_without, 2);
    printf("no-flush exp2: %d arguments with e >= -126, %lld differ from the flushing version; "
           "e = -126.5, -130: %g, %g (flushing: %g, %g)\n",
           N, differ, (double)below_without[0], (double)below_without[1], (double)below_with[0],
           (double)below_with[1]);
    CHECK(differ == 0, "the no-flush exp2 differs on %lld arguments with e >= -126", differ);
    CHECK(below_with[0] == 0.0f && below_with[1] == 0.0f && below_without[0] > 0.0f &&
              below_without[1] > 0.0f,
          "the no-flush exp2 should not flush below -126 (it is the variant without the test)");
}

/* The library's dispatch needs these for its AVX-512 kernels; the probe is compiled with
 * all of them, so all are required here too. */
static int cpu_has_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("fma");
}
#endif

/* ---- bf16 compute's degree-4 exp2 -------------------------------------------------- */

static void eval_bf16_scalar(const float *z, const float *m, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = fxa_exp2_shifted_bf16_ref(z[i], m[i]);
}

/* Relative error at most FXA_EXP2_BF16_REL_ERR (what the bf16 error budget assumes) for
 * every e = z - m in [-126, 8] on a grid of 2^-12 plus random (z, m) pairs with m in
 * [-300, 300], where results are normal; exactly +0.0f below -126 (like the fp32 exp2,
 * outside the vector flush window). Returns the largest relative error seen. */
static double check_bf16_exp2(const char *name, exp2_batch_fn eval, int flushes)
{
    static float z[BATCH], m[BATCH], out[BATCH];
    double worst = 0.0, worst_e = 0.0;
    long long bad = 0, not_zero = 0;
    fxt_rng r;
    fxt_rng_seed(&r, 77);
    const long long grid = (long long)(134.0 * 4096.0) + 1;
    const long long total = grid + 200000;
    for (long long i0 = 0; i0 < total; i0 += BATCH) {
        const size_t n = (size_t)(total - i0 < BATCH ? total - i0 : BATCH);
        for (size_t i = 0; i < n; i++) {
            const long long i1 = i0 + (long long)i;
            if (i1 < grid) {
                z[i] = (float)(-126.0 + (double)i1 / 4096.0);
                m[i] = 0.0f;
            } else {
                m[i] = (float)floor(fxt_rng_uniform(&r) * 600.0 - 300.0);
                z[i] = (float)((double)m[i] + fxt_rng_uniform(&r) * 146.0 - 138.0);
            }
        }
        eval(z, m, out, n);
        for (size_t i = 0; i < n; i++) {
            const double e = (double)z[i] - (double)m[i];
            if (e < -126.0 - FLUSH_WINDOW) {
                if (flushes && out[i] != 0.0f)
                    not_zero++;
                continue;
            }
            if (e < -126.0 + FLUSH_WINDOW || e > 8.0)
                continue;
            const double ref = exp2(e);
            const double rel = fabs((double)out[i] - ref) / ref;
            if (!(rel <= FXA_EXP2_BF16_REL_ERR))
                bad++;
            if (rel > worst || rel != rel) {
                worst = rel;
                worst_e = e;
            }
        }
    }
    printf("%s: max relative error %.3g (2^%.2f) at e = %.6g, bound 2^-18\n", name, worst,
           log2(worst), worst_e);
    CHECK(bad == 0, "%s: %lld arguments beyond the relative error bound %g", name, bad,
          FXA_EXP2_BF16_REL_ERR);
    CHECK(not_zero == 0, "%s: %lld arguments below -126 did not flush to +0.0f", name, not_zero);
    return worst;
}

static void run_all(const impl *im)
{
    test_accuracy(im);
    test_underflow(im);
    test_exact_points(im);
    test_monotone(im);
}

int main(void)
{
    const double t0 = test_now_seconds();
    const impl scalar = {"fxa_exp2_shifted_ref", eval_scalar, 0};
    run_all(&scalar);
    check_bf16_exp2("fxa_exp2_shifted_bf16_ref", eval_bf16_scalar, 1);
#ifdef FXA_TEST_EXP2_AVX512
    if (cpu_has_avx512()) {
        const impl avx512 = {"fxa_vexp2_shifted_f32x16", fxa_test_vexp2_avx512, 1};
        run_all(&avx512);
        test_flush_window(&avx512);
        test_noflush_matches();
        check_bf16_exp2("fxa_vexp2_shifted_bf16_f32x16", fxa_test_vexp2_bf16_avx512, 1);
        check_bf16_exp2("fxa_vexp2_shifted_bf16_noflush_f32x16", fxa_test_vexp2_bf16_noflush_avx512,
                        0);
    } else {
        printf("AVX-512 part not run: this CPU lacks AVX-512F/BW/VL/DQ or FMA "
               "(fxa_vexp2_shifted_f32x16 untested here)\n");
    }
#else
    printf("AVX-512 part not run: not built (FXA_TEST_EXP2_AVX512 is defined by the x86-64 "
           "build only)\n");
#endif
    printf("(total %.2f s)\n", test_now_seconds() - t0);
    return test_summary("test_exp2");
}
