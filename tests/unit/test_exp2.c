/*
 * test_exp2: accuracy and edge behaviour of fxa_exp2_shifted_ref(z, m) = 2^(z - m)
 * (src/kernels/ref/exp2_ref.h).
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
 *     (z = -2^-k, m = -128).
 * The ULP of a reference value r is 2^(floor(log2 r) - 23) (2^-149 below 2^-126; no result
 * for e >= -126 is subnormal). The maximum is printed with its argument, for e <= 127.99
 * (below exp2_ref.h's upper clamp) and for the whole range, and each is asserted <= 2 ULP.
 *
 * Edges: e < -126 gives +0.0f exactly (also z = -inf); e = 0 gives 1.0f (also for large m);
 * integer e in [-126, 127] gives exactly 2^e; results are finite below e = 128; large shifts
 * (m near 1e9, 2^23, 2^30) give exact powers of two; and the result is non-decreasing in z
 * for fixed m over a dense sweep of [-130, 128) (every 8th float, every float near each
 * half-integer and in (-1/2, -1/4)), with any decrease also bounded by 1 ULP.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kernels/ref/exp2_ref.h"
#include "testutil.h"

#define MAX_ULP 2.0

static uint32_t fbits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static float bitsf(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static double now_s(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ULP of the fp32 grid at the (positive) double value r. */
static double ulp_at(double r)
{
    if (r < 0x1p-126)
        return 0x1p-149;
    int k;
    (void)frexp(r, &k); /* r = fr * 2^k, fr in [0.5, 1): floor(log2 r) = k - 1 */
    return ldexp(1.0, k - 1 - 23);
}

/* Running maximum of the ULP error over one region of e. */
typedef struct errstat {
    double max_ulp;
    float z, m;   /* argument of the maximum */
    double e;
    float got;
    double ref;
    long long n;  /* points measured */
    long long nonfinite;
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

static void measure_core(errstat *s, float z, float m);

static void measure(errstat *s, float z, float m)
{
    if ((double)z - (double)m <= CORE_HI)
        measure_core(&g_core, z, m);
    measure_core(s, z, m);
}

static void measure_core(errstat *s, float z, float m)
{
    const double e = (double)z - (double)m;
    const float got = fxa_exp2_shifted_ref(z, m);
    const double ref = exp2(e);
    s->n++;
    if (!isfinite(got)) {
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

static void merge(errstat *into, const errstat *s)
{
    if (s->max_ulp > into->max_ulp) {
        long long n = into->n, nf = into->nonfinite;
        *into = *s;
        into->n = n, into->nonfinite = nf;
    }
    into->n += s->n;
    into->nonfinite += s->nonfinite;
}

static void print_stat(const char *label, const errstat *s)
{
    printf("  %-34s %11lld pts  max error %.6f ULP at e = %.17g (z = %.9g, m = %.9g): "
           "got %a, exp2 = %a\n",
           label, s->n, s->max_ulp, s->e, (double)s->z, (double)s->m, (double)s->got, s->ref);
}

/* Every stride-th float z (bit patterns, both signs, magnitudes from min_abs up) with
 * (double)z in [lo, hi), m = 0. */
static void sweep_floats(errstat *s, double lo, double hi, uint32_t stride, float min_abs)
{
    const uint32_t b0 = fbits(min_abs);
    /* Positive z: magnitudes ascending. */
    for (uint32_t b = b0; b < 0x7f800000u; b += stride) {
        const float z = bitsf(b);
        if ((double)z >= hi)
            break;
        if ((double)z >= lo)
            measure(s, z, 0.0f);
    }
    /* Negative z: magnitudes ascending. */
    for (uint32_t b = 0x80000000u | b0; b < 0xff800000u; b += stride) {
        const float z = bitsf(b);
        if ((double)z < lo)
            break;
        if ((double)z < hi)
            measure(s, z, 0.0f);
    }
}

static void test_accuracy(void)
{
    errstat all, s;
    errstat_init(&all);
    errstat_init(&g_core);
    printf("accuracy of fxa_exp2_shifted_ref against double exp2 (e = z - m):\n");

    double t0 = now_s();
    errstat_init(&s);
    sweep_floats(&s, -126.0, 128.0, 64, 0.0f);
    print_stat("every 64th float z in [-126,128)", &s);
    CHECK(s.n > 30000000, "float sweep covered only %lld points", s.n);
    merge(&all, &s);

    errstat_init(&s);
    sweep_floats(&s, -1.0, 1.0000001, 16, 0x1p-26f);
    print_stat("every 16th float in [-1,1]", &s);
    merge(&all, &s);

    /* f = e - round(e) takes every float value in [-1/2, 1/2], and the error in ULPs
     * depends on f only (2^n scales the result and its ULP alike), so every float in
     * 1/8 <= |z| <= 1/2, where the polynomial's error peaks, is measured. */
    errstat_init(&s);
    sweep_floats(&s, -0.5, 0.5000001, 1, 0.125f);
    print_stat("every float in 1/8 <= |z| <= 1/2", &s);
    merge(&all, &s);

    /* Windows of consecutive floats around every half-integer (n switches) and
     * every integer in [-126, 128). */
    errstat_init(&s);
    for (int k2 = -252; k2 < 256; k2++) {
        const float c = (float)k2 * 0.5f;
        float z = c;
        for (int i = 0; i < 2048; i++)
            z = nextafterf(z, -INFINITY);
        for (int i = 0; i < 4096; i++, z = nextafterf(z, INFINITY))
            if ((double)z >= -126.0 && (double)z < 128.0)
                measure(&s, z, 0.0f);
    }
    print_stat("windows at integers, half-integers", &s);
    merge(&all, &s);

    /* Random (z, m) with integer shifts. */
    errstat_init(&s);
    trng r;
    trng_seed(&r, 20240611u);
    long long zero_bad = 0;
    for (int i = 0; i < 4000000; i++) {
        const int mi = (int)(trng_next(&r) % 601u) - 300;
        const double e0 = -126.0 + 254.0 * trng_uniform(&r);
        const float m = (float)mi;
        const float z = (float)((double)mi + e0);
        const double e = (double)z - (double)m;
        if (e < -126.0) {
            const float got = fxa_exp2_shifted_ref(z, m);
            zero_bad += fbits(got) != 0u;
            continue;
        }
        if (e >= 128.0)
            continue;
        measure(&s, z, m);
    }
    print_stat("random (z, m), m in [-300,300]", &s);
    CHECK(zero_bad == 0, "%lld random arguments with e < -126 did not give +0.0f", zero_bad);
    merge(&all, &s);

    /* Random e near the ends of the range, where clamps and 2^n splitting act. */
    errstat_init(&s);
    for (int i = 0; i < 1000000; i++) {
        const int mi = (int)(trng_next(&r) % 601u) - 300;
        const double u = trng_uniform(&r);
        const double e0 = (i & 1) ? 128.0 - 1.0 * u : -126.0 + 1.0 * u;
        const float m = (float)mi;
        const float z = (float)((double)mi + e0);
        const double e = (double)z - (double)m;
        if (e < -126.0 || e >= 128.0)
            continue;
        measure(&s, z, m);
    }
    print_stat("random e in [-126,-125), [127,128)", &s);
    merge(&all, &s);

    /* The last float steps below e = 128: z just below 128 with m = 0, and tiny
     * negative z with m = -128 (e = 128 - |z|, closer to 128 than any float). */
    errstat_init(&s);
    {
        float z = 128.0f;
        for (int i = 0; i < 100000; i++) {
            z = nextafterf(z, 0.0f);
            measure(&s, z, 0.0f);
        }
        for (int k = 1; k <= 60; k++)
            measure(&s, -ldexpf(1.0f, -k), -128.0f);
    }
    print_stat("e just below 128", &s);
    merge(&all, &s);

    const double t1 = now_s();
    print_stat("e in [-126, 127.99]", &g_core);
    print_stat("ALL e in [-126, 128)", &all);
    printf("  (%.2f s)\n", t1 - t0);
    CHECK(all.nonfinite == 0, "%lld arguments with e in [-126, 128) gave a non-finite result "
                              "(e.g. e = %.17g)", all.nonfinite, all.e);
    CHECK(g_core.max_ulp <= MAX_ULP,
          "e <= 127.99: max error %.6f ULP > %.1f at e = %.17g (z = %a, m = %a): got %a, "
          "exp2 = %a", g_core.max_ulp, MAX_ULP, g_core.e, (double)g_core.z, (double)g_core.m,
          (double)g_core.got, g_core.ref);
    /* Above 127.99 the contract is saturation (callers keep e <= C + 1 <= 128 - 1),
     * so only finiteness is asserted there (above). */
}

static void test_underflow(void)
{
    const float zs[] = {-126.0001f, nextafterf(-126.0f, -INFINITY), -127.0f, -127.5f, -128.0f,
                        -150.0f, -1000.0f, -1e30f, -FLT_MAX, -INFINITY};
    for (size_t i = 0; i < sizeof zs / sizeof zs[0]; i++) {
        const float got = fxa_exp2_shifted_ref(zs[i], 0.0f);
        CHECK(fbits(got) == 0u, "exp2(%a - 0) = %a, want +0.0f", (double)zs[i], (double)got);
    }
    /* The same via the shift. */
    const float ms[] = {1.0f, 100.0f, 300.0f, 0x1p30f, 1e9f};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        const float got = fxa_exp2_shifted_ref(0.0f, ms[i]);
        CHECK(fbits(got) == (ms[i] > 126.0f ? 0u : fbits(ldexpf(1.0f, -(int)ms[i]))),
              "exp2(0 - %a) = %a", (double)ms[i], (double)got);
        const float got2 = fxa_exp2_shifted_ref(-INFINITY, ms[i]);
        CHECK(fbits(got2) == 0u, "exp2(-inf - %a) = %a, want +0.0f", (double)ms[i],
              (double)got2);
    }
    CHECK(fbits(fxa_exp2_shifted_ref(-27.0001f, 99.0f)) == 0u, "e = -126.0001 via m = 99");
    CHECK(fbits(fxa_exp2_shifted_ref(-INFINITY, -300.0f)) == 0u, "-inf with m = -300");
    /* e = -126 exactly is not flushed. */
    CHECK(fbits(fxa_exp2_shifted_ref(-126.0f, 0.0f)) == 0x00800000u, "e = -126 gives 2^-126");
}

static void test_exact_points(void)
{
    /* e = 0: exactly 1. */
    const float ms[] = {0.0f,     1.0f,      -1.0f,     127.0f,     -300.0f,  300.0f,
                        0x1p23f,  0x1p24f,   0x1p30f,   -0x1p30f,   1e9f,     -1e9f,
                        2147483520.0f /* largest float below 2^31 */};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        const float got = fxa_exp2_shifted_ref(ms[i], ms[i]);
        CHECK(got == 1.0f, "exp2(%a - %a) = %a, want 1", (double)ms[i], (double)ms[i],
              (double)got);
    }
    /* Integer e in [-126, 127]: exactly 2^e, with and without a shift. */
    int bad = 0;
    for (int e = -126; e <= 127; e++) {
        const float want = ldexpf(1.0f, e);
        const float shifts[] = {0.0f, 5.0f, -7.0f, 100.0f, -250.0f};
        for (size_t j = 0; j < sizeof shifts / sizeof shifts[0]; j++) {
            const float m = shifts[j];
            const float z = (float)e + m;
            const float got = fxa_exp2_shifted_ref(z, m);
            if (fbits(got) != fbits(want)) {
                if (bad++ < 5)
                    fprintf(stderr, "  exp2(%g - %g) = %a, want %a\n", (double)z, (double)m,
                            (double)got, (double)want);
            }
        }
    }
    CHECK(bad == 0, "%d integer arguments did not give exactly 2^e", bad);

    /* Large magnitudes with the shift. 1e9f is an integer-valued float but its
     * neighbours are 64 apart, so e = 3 needs z, m below 2^24. */
    CHECK(fxa_exp2_shifted_ref(8388611.0f, 8388608.0f) == 8.0f, "z = 2^23 + 3, m = 2^23: 8");
    CHECK(fxa_exp2_shifted_ref(16777222.0f, 16777216.0f) == 64.0f, "z = 2^24 + 6, m = 2^24: 64");
    CHECK(fxa_exp2_shifted_ref(1e9f, 1e9f - 64.0f) == 0x1p64f, "z = 1e9, m = 1e9 - 64: 2^64");
    CHECK(fxa_exp2_shifted_ref(1e9f, 1e9f + 64.0f) == 0x1p-64f, "z = 1e9, m = 1e9 + 64: 2^-64");
    CHECK(fxa_exp2_shifted_ref(1e9f + 64.0f, 1e9f) == 0x1p64f, "z = 1e9 + 64, m = 1e9: 2^64");
    CHECK(fbits(fxa_exp2_shifted_ref(1e9f - 64.0f, 1e9f + 64.0f)) == 0u,
          "z = 1e9 - 64, m = 1e9 + 64: e = -128 flushes to 0");
    CHECK(fxa_exp2_shifted_ref(8388735.0f, 8388608.0f) == 0x1p127f, "z = 2^23 + 127, m = 2^23");
    CHECK(fxa_exp2_shifted_ref(-1e9f, -1e9f + 64.0f) == 0x1p-64f, "z = -1e9, m = -1e9 + 64");
    CHECK(fxa_exp2_shifted_ref(0x1p30f, 0x1p30f - 128.0f) < INFINITY, "e = 128 at 2^30 finite");
    /* Fractional e with a large shift: z = 2^23 - 0.5, m = 2^23 - 8 -> e = 7.5. */
    {
        const float got = fxa_exp2_shifted_ref(8388607.5f, 8388600.0f);
        const double ref = exp2(7.5);
        CHECK(fabs((double)got - ref) <= MAX_ULP * ulp_at(ref), "e = 7.5 at m = 2^23 - 8: %a",
              (double)got);
    }
}

/* Monotonicity over ascending z for a fixed m: counts decreases and the largest one in
 * ULPs of the larger value. */
typedef struct mono {
    float m;
    float prev_z, prev;
    long long n, decreases;
    double max_drop_ulp;
    float worst_z;
} mono;

static void mono_start(mono *s, float z)
{
    s->prev_z = z;
    s->prev = fxa_exp2_shifted_ref(z, s->m);
}

static void mono_step(mono *s, float z)
{
    const float r = fxa_exp2_shifted_ref(z, s->m);
    s->n++;
    if (!(r >= s->prev)) {
        const double drop = ((double)s->prev - (double)r) / ulp_at((double)s->prev);
        if (s->decreases++ < 3)
            fprintf(stderr, "  not monotone (m = %g): exp2(%a) = %a < exp2(%a) = %a\n",
                    (double)s->m, (double)z, (double)r, (double)s->prev_z, (double)s->prev);
        if (!(drop <= s->max_drop_ulp)) {
            s->max_drop_ulp = drop;
            s->worst_z = z;
        }
    }
    s->prev = r;
    s->prev_z = z;
}

static void test_monotone(void)
{
    const double t0 = now_s();
    mono s;
    memset(&s, 0, sizeof s);
    /* m = 0: every 8th float from -130 up to -0, then +0 up to 128. */
    s.m = 0.0f;
    mono_start(&s, -130.0f);
    for (uint32_t b = fbits(-130.0f); b > 0x80000000u; b -= 8u)
        mono_step(&s, bitsf(b));
    for (uint32_t b = 0; b < fbits(128.0f); b += 8u)
        mono_step(&s, bitsf(b));
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
    for (uint32_t b = fbits(-0.5f) - 1u; b > fbits(-0.25f); b--)
        mono_step(&s, bitsf(b));
    /* m = 77: every 64th float, e in [-130, 128). */
    s.m = 77.0f;
    mono_start(&s, -53.0f);
    for (uint32_t b = fbits(-53.0f); b > 0x80000000u; b -= 64u)
        mono_step(&s, bitsf(b));
    for (uint32_t b = 0; b < fbits(205.0f); b += 64u)
        mono_step(&s, bitsf(b));

    printf("monotonicity: %lld consecutive pairs, %lld decreases, largest %.3f ULP at z = %a "
           "(%.2f s)\n",
           s.n, s.decreases, s.max_drop_ulp, (double)s.worst_z, now_s() - t0);
    CHECK(s.n > 250000000, "monotone sweep covered only %lld points", s.n);
    /* No decrease beyond one ULP (a bound that the <= 1.14-ULP polynomial meets). */
    CHECK(s.max_drop_ulp <= 1.0, "exp2 decreases by %.3f ULP at z = %a", s.max_drop_ulp,
          (double)s.worst_z);
    /* Not asserted: strict monotonicity. Where neighbouring arguments are closer
     * than a quarter ULP of the result, fp32 Horner rounding can step down by one
     * ULP (exp2_ref.h states this). */
}

int main(void)
{
    test_accuracy();
    test_underflow();
    test_exact_points();
    test_monotone();
    return test_summary("test_exp2");
}
