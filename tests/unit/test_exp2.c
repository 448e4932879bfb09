/*
 * test_exp2: accuracy and edge behaviour of fxa_exp2_shifted_ref(z, m) = 2^(z - m)
 * (src/kernels/ref/exp2_ref.h).
 *
 * Accuracy: the error in ULPs against exp2 evaluated in double on the exact argument
 * e = (double)z - (double)m (exact: z has 24 significant bits, m is an integer below 2^31;
 * glibc's double exp2 is accurate to ~1e-16 relative, far below an fp32 ULP), over
 *   - every 64th float z in [-126, 128) with m = 0,
 *   - every 8th float z in [-1, 1] with |z| >= 2^-26 (m = 0) and every float in a window
 *     around each half-integer e (where n = round(e) switches),
 *   - random (z, m) pairs, integer m in [-300, 300], z = fl(m + e), e uniform in [-126, 128).
 * The ULP of a reference value r is 2^(floor(log2 r) - 23) (2^-149 below 2^-126).
 * The maximum is printed precisely, with its argument, and asserted <= 2 ULP.
 *
 * Edges: e < -126 gives +0.0f exactly; e = 0 gives 1.0f; integer e in [-126, 127] gives
 * exactly 2^e; monotone non-decreasing in z; large-magnitude arguments with the shift.
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

static void measure(errstat *s, float z, float m)
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

/* Every stride-th float z (bit patterns, both signs) with (double)z in [lo, hi), m = 0. */
static void sweep_floats(errstat *s, double lo, double hi, uint32_t stride, double min_abs)
{
    /* Positive z: magnitudes ascending. */
    for (uint32_t b = 0; b < 0x7f800000u; b += stride) {
        const float z = bitsf(b);
        if ((double)z >= hi)
            break;
        if ((double)z < lo || (double)z < min_abs)
            continue;
        measure(s, z, 0.0f);
    }
    /* Negative z. */
    for (uint32_t b = 0x80000000u; b < 0xff800000u; b += stride) {
        const float z = bitsf(b);
        if ((double)z < lo)
            break;
        if ((double)z >= hi || -(double)z < min_abs)
            continue;
        measure(s, z, 0.0f);
    }
}

static void test_accuracy(void)
{
    errstat all, s;
    errstat_init(&all);
    printf("accuracy of fxa_exp2_shifted_ref against double exp2 (e = z - m):\n");

    double t0 = now_s();
    errstat_init(&s);
    sweep_floats(&s, -126.0, 128.0, 64, 0.0);
    print_stat("every 64th float z in [-126,128)", &s);
    CHECK(s.n > 30000000, "float sweep covered only %lld points", s.n);
    merge(&all, &s);

    errstat_init(&s);
    sweep_floats(&s, -1.0, 1.0000001, 8, 0x1p-26);
    print_stat("every 8th float in [-1,1]", &s);
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
    print_stat("ALL", &all);
    printf("  (%.2f s)\n", t1 - t0);
    CHECK(all.nonfinite == 0, "%lld arguments with e in [-126, 128) gave a non-finite result "
                              "(e.g. e = %.17g)", all.nonfinite, all.e);
    CHECK(all.max_ulp <= MAX_ULP,
          "max error %.6f ULP > %.1f at e = %.17g (z = %a, m = %a): got %a, exp2 = %a",
          all.max_ulp, MAX_ULP, all.e, (double)all.z, (double)all.m, (double)all.got, all.ref);
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
    CHECK(fxa_exp2_shifted_ref(1e9f + 64.0f, 1e9f - 64.0f) == 0x1p127f, "e = 128 - 1 at 1e9");
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

static void test_monotone(void)
{
    /* Ascending over every 4th float in [-130, 128) (m = 0): from -130 up to -0, then
     * +0 up to 128. Also every float in windows around each half-integer. */
    const double t0 = now_s();
    long long bad = 0, n = 0;
    float prev_z = -130.0f;
    float prev = fxa_exp2_shifted_ref(prev_z, 0.0f);
#define MONO_STEP(zz)                                                                          \
    do {                                                                                       \
        const float z_ = (zz);                                                                 \
        const float r_ = fxa_exp2_shifted_ref(z_, 0.0f);                                       \
        n++;                                                                                   \
        if (!(r_ >= prev)) {                                                                   \
            if (bad++ < 5)                                                                     \
                fprintf(stderr, "  not monotone: exp2(%a) = %a < exp2(%a) = %a\n", (double)z_, \
                        (double)r_, (double)prev_z, (double)prev);                             \
        }                                                                                      \
        prev = r_;                                                                             \
        prev_z = z_;                                                                           \
    } while (0)
    for (uint32_t b = fbits(-130.0f); b > 0x80000000u; b -= 4u)
        MONO_STEP(bitsf(b));
    for (uint32_t b = 0; b < fbits(128.0f); b += 4u)
        MONO_STEP(bitsf(b));
    for (int k2 = -260; k2 < 256; k2++) {
        float z = (float)k2 * 0.5f;
        for (int i = 0; i < 4096; i++)
            z = nextafterf(z, -INFINITY);
        prev_z = z;
        prev = fxa_exp2_shifted_ref(z, 0.0f);
        for (int i = 0; i < 8192; i++) {
            z = nextafterf(z, INFINITY);
            if (z >= 128.0f)
                break;
            MONO_STEP(z);
        }
    }
    /* With a shift: m = 77, z ascending on a stride over e in [-130, 128). */
    prev_z = -53.0f;
    prev = fxa_exp2_shifted_ref(prev_z, 77.0f);
    for (uint32_t b = fbits(-53.0f); b > 0x80000000u; b -= 64u) {
        const float z = bitsf(b);
        const float rr = fxa_exp2_shifted_ref(z, 77.0f);
        n++;
        if (!(rr >= prev) && bad++ < 5)
            fprintf(stderr, "  not monotone (m = 77): exp2(%a) < exp2(%a)\n", (double)z,
                    (double)prev_z);
        prev = rr, prev_z = z;
    }
    for (uint32_t b = 0; b < fbits(205.0f); b += 64u) {
        const float z = bitsf(b);
        const float rr = fxa_exp2_shifted_ref(z, 77.0f);
        n++;
        if (!(rr >= prev) && bad++ < 5)
            fprintf(stderr, "  not monotone (m = 77): exp2(%a) < exp2(%a)\n", (double)z,
                    (double)prev_z);
        prev = rr, prev_z = z;
    }
#undef MONO_STEP
    printf("monotonicity: %lld points, %lld decreases (%.2f s)\n", n, bad, now_s() - t0);
    CHECK(n > 100000000, "monotone sweep covered only %lld points", n);
    CHECK(bad == 0, "%lld decreases of exp2 over ascending z", bad);
}

int main(void)
{
    test_accuracy();
    test_underflow();
    test_exact_points();
    test_monotone();
    return test_summary("test_exp2");
}
