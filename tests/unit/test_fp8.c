/*
 * test_fp8: FP8 E4M3 (src/proj/fp8.c, include/fxattn_proj.h).
 *
 *  - Decoding: all 256 codes against sign * ldexp(8 + m, e - 10) (normals),
 *    sign * ldexp(m, -9) (subnormals), NaN with the code's sign for S.1111.111; the zeros
 *    keep their sign. Every value is exact in bf16 (round trip through fxa_f32_to_bf16),
 *    and every product of two decoded codes is exact in fp32.
 *  - Round trips: encode(decode(c)) == c for the 254 finite codes, 0x7f for both NaNs.
 *  - Encoding against a brute-force reference: the nearest of all 254 finite codes in
 *    exact double arithmetic (ties: the code with x's sign, then the even code), with
 *    the saturation rule for |x| > 2^16 and Inf (the nearest finite code is +-448; the
 *    double distances are exact only below) and NaN -> 0x7f. Checked on every exact
 *    midpoint of adjacent same-sign codes (and the floats either side of it), on named
 *    values (448.0001, 463.99, 464, 465, 1e30, FLT_MAX, Inf, 2^-9, 2^-10, 0.75 * 2^-9,
 *    -0.0, NaNs), on every 4099th of the 2^32 float bit patterns, every 127th float in
 *    [2^-11, 2^10] of either sign, 1e6 random bit patterns and 1e6 random values
 *    log-uniform over E4M3's range.
 *  - fxa_e4m3_quantize_rows / fxa_e4m3_dequantize_rows: the packed layout (n codes, then
 *    the scale's 4 little-endian bytes, per row), scale = absmax / 448 (1 for an all-zero
 *    row, FLT_MIN below 448 * FLT_MIN), codes = encode(x / scale), the absmax element
 *    at +-448, the error bounds (2^-4 |x| in E4M3's normal range, 2^-10 scale below),
 *    zero and -0 rows, fp32-subnormal and FLT_MAX rows; errors (NULL, sizes, NaN/Inf
 *    input, NaN codes, bad scales) leave the outputs untouched.
 *  - fxa_e4m3_quantize_weights: [out][in] codes with one scale per output channel (the
 *    same bytes as quantize_rows on the same matrix), channels of very different
 *    magnitudes, error bounds, errors.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_proj.h"
#include "testutil.h"

/* ------------------------------------------------------------------------ */
/* Independent reference                                                     */
/* ------------------------------------------------------------------------ */

static double ref_tab[256]; /* value of every code; NaN for 0x7f and 0xff */

/* Value of a code from its fields. */
static double ref_value(unsigned c)
{
    const unsigned s = c >> 7, e = (c >> 3) & 15u, m = c & 7u;
    if (e == 15u && m == 7u)
        return NAN;
    const double v = e == 0 ? ldexp((double)m, -9) : ldexp((double)(8u + m), (int)e - 10);
    return s ? -v : v;
}

static int is_nan_code(unsigned c)
{
    return (c & 0x7fu) == 0x7fu;
}

/* Tie-break rank among codes equally near x: x's sign first, then the even code. */
static int tie_rank(unsigned c, int neg)
{
    return (((c >> 7) != (unsigned)neg) ? 2 : 0) + (int)(c & 1u);
}

/* Brute force: the nearest of the 254 finite codes. Distances in double are exact for
 * |x| <= 2^16 (at most 50 significant bits between 2^16 and x's last bit, >= 2^-33 for
 * |x| >= 2^-10; below that zero is nearest by a margin); beyond, and for Inf, the
 * nearest finite code is +-448, the saturation rule. NaN -> 0x7f. */
static uint8_t ref_encode(float x)
{
    if (isnan(x))
        return 0x7fu;
    const int neg = signbit(x) != 0;
    if (fabsf(x) > 0x1p16f)
        return neg ? 0xfeu : 0x7eu;
    unsigned best = 0;
    double bestd = INFINITY;
    for (unsigned c = 0; c < 256u; c++) {
        if (is_nan_code(c))
            continue;
        const double d = fabs(ref_tab[c] - (double)x);
        if (d < bestd || (d == bestd && tie_rank(c, neg) < tie_rank(best, neg))) {
            best = c;
            bestd = d;
        }
    }
    return (uint8_t)best;
}

typedef struct tally {
    long long n, bad;
} tally;

static void check_enc(tally *t, float x)
{
    const uint8_t got = fxa_f32_to_e4m3(x), want = ref_encode(x);
    t->n++;
    if (got != want && t->bad++ < 5)
        fprintf(stderr, "  fxa_f32_to_e4m3(%a = %.9g) = 0x%02x, want 0x%02x\n", (double)x,
                (double)x, got, want);
}

static int same_bits(float a, float b)
{
    return test_f32_bits(a) == test_f32_bits(b);
}

/* ------------------------------------------------------------------------ */
/* Scalar conversions                                                        */
/* ------------------------------------------------------------------------ */

static void test_reference_itself(void)
{
    CHECK(ref_tab[0x38] == 1.0 && ref_tab[0x7e] == 448.0 && ref_tab[0x01] == 0x1p-9 &&
              ref_tab[0x08] == 0x1p-6 && ref_tab[0x07] == 7 * 0x1p-9 && ref_tab[0x77] == 240.0 &&
              ref_tab[0xfe] == -448.0 && isnan(ref_tab[0x7f]) && isnan(ref_tab[0xff]) &&
              ref_tab[0x80] == 0.0 && signbit(ref_tab[0x80]),
          "reference table");
    CHECK(ref_encode(1.0625f) == 0x38u, "ref: 1 + 1/16 ties to 1 (even)");
    CHECK(ref_encode(1.1875f) == 0x3au, "ref: 1.1875 ties to 1.25 (even)");
    CHECK(ref_encode(0x1p-10f) == 0x00u && ref_encode(-0x1p-10f) == 0x80u, "ref: +-2^-10 -> +-0");
    CHECK(ref_encode(0x1.8p-10f) == 0x01u, "ref: 0.75 * 2^-9 -> 2^-9");
    CHECK(ref_encode(464.0f) == 0x7eu && ref_encode(-1000.0f) == 0xfeu, "ref: saturation");
    CHECK(ref_encode(-0.0f) == 0x80u && ref_encode(0.0f) == 0x00u, "ref: zeros");
}

static void test_decode(void)
{
    int bad = 0, bad_bf16 = 0, nans = 0;
    for (unsigned c = 0; c < 256u; c++) {
        const float got = fxa_e4m3_to_f32((uint8_t)c);
        int ok;
        if (is_nan_code(c)) {
            nans++;
            ok = isnan(got) && (signbit(got) != 0) == ((c & 0x80u) != 0) &&
                 (test_f32_bits(got) & 0x00400000u); /* quiet */
        } else {
            const double want = ref_tab[c];
            ok = (double)got == want && (signbit(got) != 0) == (signbit(want) != 0);
            /* exact in bf16 */
            const float back = fxa_bf16_to_f32(fxa_f32_to_bf16(got));
            if (!same_bits(back, got) && bad_bf16++ < 5)
                fprintf(stderr, "  e4m3 0x%02x = %a is not exact in bf16\n", c, (double)got);
        }
        if (!ok && bad++ < 5)
            fprintf(stderr, "  fxa_e4m3_to_f32(0x%02x) = %a, want %a\n", c, (double)got,
                    ref_tab[c]);
    }
    CHECK(bad == 0, "%d codes decode wrongly", bad);
    CHECK(bad_bf16 == 0, "%d decoded codes are not exact in bf16", bad_bf16);
    CHECK(nans == 2, "%d NaN codes", nans);
    CHECK(same_bits(fxa_e4m3_to_f32(0x80u), -0.0f) && same_bits(fxa_e4m3_to_f32(0x00u), 0.0f),
          "signed zeros");
    CHECK(fxa_e4m3_to_f32(0x7eu) == FXA_E4M3_MAX && fxa_e4m3_to_f32(0xfeu) == -FXA_E4M3_MAX,
          "+-448");

    /* Products of two decoded codes are exact in fp32. */
    long long inexact = 0;
    for (unsigned a = 0; a < 256u; a++)
        for (unsigned b = 0; b < 256u; b++) {
            if (is_nan_code(a) || is_nan_code(b))
                continue;
            const float p = fxa_e4m3_to_f32((uint8_t)a) * fxa_e4m3_to_f32((uint8_t)b);
            inexact += (double)p != ref_tab[a] * ref_tab[b];
        }
    CHECK(inexact == 0, "%lld products of two codes are inexact in fp32", inexact);
}

static void test_round_trip(void)
{
    int bad = 0;
    for (unsigned c = 0; c < 256u; c++) {
        const uint8_t back = fxa_f32_to_e4m3(fxa_e4m3_to_f32((uint8_t)c));
        const unsigned want = is_nan_code(c) ? 0x7fu : c;
        if (back != want && bad++ < 5)
            fprintf(stderr, "  round trip 0x%02x -> 0x%02x, want 0x%02x\n", c, back, want);
    }
    CHECK(bad == 0, "%d codes do not round-trip", bad);
}

/* Exact midpoints of adjacent finite codes of the same sign round to the even code; the
 * floats just above and below them to the upper and lower code. */
static void test_halfway(void)
{
    long long bad = 0, inexact = 0, n = 0;
    for (unsigned c = 0; c < 0x7eu; c++) {
        const double mid = 0.5 * (ref_tab[c] + ref_tab[c + 1]);
        const float x = (float)mid;
        if ((double)x != mid) {
            inexact++;
            continue;
        }
        const unsigned even = (c & 1u) ? c + 1 : c;
        const float up = nextafterf(x, INFINITY), down = nextafterf(x, 0.0f);
        for (unsigned s = 0; s < 2; s++) {
            const unsigned sg = s ? 0x80u : 0u;
            const float sx = s ? -x : x, sup = s ? -up : up, sdown = s ? -down : down;
            const uint8_t g0 = fxa_f32_to_e4m3(sx), g1 = fxa_f32_to_e4m3(sup),
                          g2 = fxa_f32_to_e4m3(sdown);
            n += 3;
            if ((g0 != (sg | even) || g1 != (sg | (c + 1)) || g2 != (sg | c)) && bad++ < 5)
                fprintf(stderr,
                        "  halfway 0x%02x|0x%02x at %a: got 0x%02x (0x%02x above, 0x%02x below)\n",
                        sg | c, sg | (c + 1), (double)sx, g0, g1, g2);
            if ((ref_encode(sx) != (sg | even) || ref_encode(sup) != (sg | (c + 1)) ||
                 ref_encode(sdown) != (sg | c)) &&
                bad++ < 5)
                fprintf(stderr, "  reference wrong near %a\n", (double)sx);
        }
    }
    CHECK(inexact == 0, "%lld midpoints not representable in fp32", inexact);
    CHECK(n == 6LL * 0x7e, "%lld halfway checks", n);
    CHECK(bad == 0, "%lld midpoints round wrongly", bad);
}

static void test_named_values(void)
{
    const float big[] = {448.0f, 448.0001f, 463.99f,  464.0f, 465.0f,  479.99f,
                         480.0f, 1000.0f,   65536.0f, 1e30f,  FLT_MAX, INFINITY};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        CHECK(fxa_f32_to_e4m3(big[i]) == 0x7eu, "%.9g saturates to 448", (double)big[i]);
        CHECK(fxa_f32_to_e4m3(-big[i]) == 0xfeu, "-%.9g saturates to -448", (double)big[i]);
    }
    CHECK(fxa_f32_to_e4m3(nextafterf(448.0f, 0.0f)) == 0x7eu, "just below 448 -> 448");
    CHECK(fxa_f32_to_e4m3(432.0f) == 0x7eu, "432 ties 416|448 to 448 (even)");
    CHECK(fxa_f32_to_e4m3(nextafterf(432.0f, 0.0f)) == 0x7du, "just below 432 -> 416");
    CHECK(fxa_f32_to_e4m3(248.0f) == 0x78u, "248 ties 240|256 to 256 (even)");
    CHECK(fxa_f32_to_e4m3(1.0f) == 0x38u && fxa_f32_to_e4m3(-1.0f) == 0xb8u, "+-1");
    CHECK(fxa_f32_to_e4m3(1.0625f) == 0x38u, "1 + 1/16 ties to 1");
    CHECK(fxa_f32_to_e4m3(1.1875f) == 0x3au, "1.1875 ties to 1.25");
    CHECK(fxa_f32_to_e4m3(0.0f) == 0x00u, "+0");
    CHECK(fxa_f32_to_e4m3(-0.0f) == 0x80u, "-0 keeps its sign");
    CHECK(fxa_f32_to_e4m3(0x1p-9f) == 0x01u && fxa_f32_to_e4m3(-0x1p-9f) == 0x81u,
          "2^-9: smallest subnormal");
    CHECK(fxa_f32_to_e4m3(0x1p-10f) == 0x00u && fxa_f32_to_e4m3(-0x1p-10f) == 0x80u,
          "2^-10 ties to 0 (even), sign kept");
    CHECK(fxa_f32_to_e4m3(nextafterf(0x1p-10f, 1.0f)) == 0x01u, "just above 2^-10 -> 2^-9");
    CHECK(fxa_f32_to_e4m3(0.75f * 0x1p-9f) == 0x01u && fxa_f32_to_e4m3(-0.75f * 0x1p-9f) == 0x81u,
          "0.75 * 2^-9 -> 2^-9");
    CHECK(fxa_f32_to_e4m3(1.5f * 0x1p-9f) == 0x02u, "1.5 * 2^-9 ties to 2 * 2^-9");
    CHECK(fxa_f32_to_e4m3(2.5f * 0x1p-9f) == 0x02u, "2.5 * 2^-9 ties to 2 * 2^-9");
    CHECK(fxa_f32_to_e4m3(7.5f * 0x1p-9f) == 0x08u, "2^-6 - 2^-10 ties up to 2^-6");
    CHECK(fxa_f32_to_e4m3(0x1p-6f) == 0x08u, "2^-6: smallest normal");
    CHECK(fxa_f32_to_e4m3(1e-30f) == 0x00u && fxa_f32_to_e4m3(-1e-30f) == 0x80u, "underflow");
    CHECK(fxa_f32_to_e4m3(FLT_TRUE_MIN) == 0x00u && fxa_f32_to_e4m3(-FLT_TRUE_MIN) == 0x80u,
          "fp32 subnormals -> +-0");
    const float nan_ = nanf("");
    CHECK(fxa_f32_to_e4m3(nan_) == 0x7fu && fxa_f32_to_e4m3(-nan_) == 0x7fu, "NaN -> 0x7f");
    CHECK(fxa_f32_to_e4m3(test_bits_f32(0x7f800001u)) == 0x7fu &&
              fxa_f32_to_e4m3(test_bits_f32(0xff800001u)) == 0x7fu &&
              fxa_f32_to_e4m3(test_bits_f32(0xffffffffu)) == 0x7fu,
          "sNaN / payload NaNs -> 0x7f");
}

static void test_sweeps(void)
{
    const double t0 = test_now_seconds();
    tally t = {0, 0};
    for (uint64_t i = 0; i < (1ull << 32); i += 4099u)
        check_enc(&t, test_bits_f32((uint32_t)i));
    for (uint32_t b = test_f32_bits(0x1p-11f); b <= test_f32_bits(0x1p10f); b += 127u) {
        check_enc(&t, test_bits_f32(b));
        check_enc(&t, test_bits_f32(b | 0x80000000u));
    }
    fxt_rng r;
    fxt_rng_seed(&r, 20250131u);
    for (int i = 0; i < 1000000; i++)
        check_enc(&t, test_bits_f32((uint32_t)(fxt_rng_next(&r) >> 32)));
    for (int i = 0; i < 1000000; i++) {
        const int k = (int)(fxt_rng_next(&r) % 24u) - 13; /* [2^-13, 2^11) */
        const double v = ldexp(1.0 + fxt_rng_uniform(&r), k);
        check_enc(&t, (float)((fxt_rng_next(&r) & 1u) ? -v : v));
    }
    printf("encode vs brute force: %lld values (%.2f s)\n", t.n, test_now_seconds() - t0);
    CHECK(t.bad == 0, "%lld of %lld encodings differ from the brute-force reference", t.bad, t.n);
}

/* ------------------------------------------------------------------------ */
/* Row-scaled activations and weights                                        */
/* ------------------------------------------------------------------------ */

/* Expected scale of a row: absmax (in double) / 448 as an fp32 division, 1 for an
 * all-zero row, FLT_MIN where that is below FLT_MIN. */
static float want_scale(const float *x, int64_t n)
{
    double amax = 0.0;
    for (int64_t j = 0; j < n; j++)
        amax = fmax(amax, fabs((double)x[j]));
    if (amax == 0.0)
        return 1.0f;
    const float s = (float)amax / 448.0f;
    return s < FLT_MIN ? FLT_MIN : s;
}

/* Row kinds of the generated matrices. */
static void fill_row(fxt_rng *r, int kind, float *x, int64_t n)
{
    const int e = (int)(fxt_rng_next(r) % 41u) - 20;
    for (int64_t j = 0; j < n; j++) {
        double v;
        switch (kind) {
        case 0: /* gaussian at a random scale */ v = ldexp(fxt_rng_normal(r), e); break;
        case 1: /* zeros */ v = 0.0; break;
        case 2: /* 40 binades of dynamic range and some zeros: E4M3 subnormals and zeros */
            v = (fxt_rng_next(r) % 5u == 0)
                    ? 0.0
                    : ldexp(fxt_rng_normal(r), (int)(fxt_rng_next(r) % 40u) - 30);
            break;
        case 3: /* one negative spike */ v = j == n / 2 ? -3.75 : 0.0; break;
        case 4: /* near FLT_MAX */
            v = j == 0   ? (double)FLT_MAX
                : j == 1 ? -(double)FLT_MAX
                         : ldexp(fxt_rng_normal(r), 125);
            break;
        case 5: /* absmax below 448 * FLT_MIN: fp32 subnormals and tiny normals */
            v = ldexp(fxt_rng_normal(r), -125 - (int)(fxt_rng_next(r) % 26u));
            break;
        case 6: /* +-absmax only */ v = (fxt_rng_next(r) & 1u) ? 1.5 : -1.5; break;
        case 7: /* -0 only */ v = -0.0; break;
        default: /* the exact boundary 448 * FLT_MIN and a mix */
            v = j == 0 ? 448.0 * 0x1p-126 : ldexp(fxt_rng_normal(r), -130);
            break;
        }
        x[j] = (float)v;
    }
}
#define N_KINDS 9

typedef struct qstats {
    long long bad_code, bad_bound, bad_deq, checked;
    double worst_rel, worst_abs; /* relative to the bounds */
} qstats;

/* Checks one quantised row: codes == encode(x / scale) (fp32 division), the absmax
 * element at +-448 when the scale is not clamped, the dequantised values deq (when not
 * NULL) == decode * scale and within the error bounds. */
static void check_row(qstats *q, const float *x, int64_t n, const uint8_t *codes, float scale,
                      const float *deq)
{
    double amax = 0.0;
    for (int64_t j = 0; j < n; j++)
        amax = fmax(amax, fabs((double)x[j]));
    for (int64_t j = 0; j < n; j++) {
        q->checked++;
        const uint8_t want = ref_encode(x[j] / scale);
        int ok = codes[j] == want;
        if (amax > 0.0 && fabs((double)x[j]) == amax && scale > FLT_MIN)
            ok = ok && (codes[j] & 0x7fu) == 0x7eu && (codes[j] >> 7) == (signbit(x[j]) != 0);
        if (!ok && q->bad_code++ < 5)
            fprintf(stderr, "  x = %a, scale %a: code 0x%02x, want 0x%02x\n", (double)x[j],
                    (double)scale, codes[j], want);
        const float y = fxa_e4m3_to_f32(codes[j]) * scale;
        if (deq && !same_bits(deq[j], y) && q->bad_deq++ < 5)
            fprintf(stderr, "  dequantised %a, want %a\n", (double)deq[j], (double)y);
        const double err = fabs((double)y - (double)x[j]);
        int in_bound;
        if (fabs((double)x[j]) >= 0x1p-6 * (double)scale) {
            const double rel = err / fabs((double)x[j]) / 0x1p-4;
            q->worst_rel = fmax(q->worst_rel, rel);
            in_bound = rel <= 1.0;
        } else {
            const double ab = err / ((double)scale * 0x1p-10);
            q->worst_abs = fmax(q->worst_abs, ab);
            in_bound = ab <= 1.0 + 0x1p-16; /* fp32 roundings of x / scale and of the product */
        }
        if (!in_bound && q->bad_bound++ < 5)
            fprintf(stderr, "  x = %a, scale %a: %a is out of bounds\n", (double)x[j],
                    (double)scale, (double)y);
    }
}

/* Prints q's worst errors under `what` and checks that every code was encode(x / scale) and
 * every value within the error bounds. */
static void check_qstats(const char *what, const qstats *q)
{
    printf("%s: %lld values, worst error %.3f of the relative bound, %.3f of the absolute "
           "bound\n",
           what, q->checked, q->worst_rel, q->worst_abs);
    CHECK(q->bad_code == 0, "%s: %lld codes differ from encode(x / scale)", what, q->bad_code);
    CHECK(q->bad_bound == 0, "%s: %lld values out of the error bounds", what, q->bad_bound);
}

static float read_scale_le(const uint8_t *p)
{
    return test_bits_f32((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                         (uint32_t)p[3] << 24);
}

static int all_bytes(const void *p, size_t n, uint8_t v)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != v)
            return 0;
    return 1;
}

static void test_quantize_rows(void)
{
    const int64_t rows = 45, n = 67, stride = n + 4;
    float *x = malloc((size_t)(rows * n) * sizeof(float));
    float *y = malloc((size_t)(rows * n) * sizeof(float));
    uint8_t *packed = malloc((size_t)(rows * stride) + 1);
    if (!x || !y || !packed) {
        CHECK(0, "out of memory");
        return;
    }
    fxt_rng r;
    fxt_rng_seed(&r, 4242u);
    for (int64_t i = 0; i < rows; i++)
        fill_row(&r, (int)(i % N_KINDS), x + i * n, n);
    packed[rows * stride] = 0x5a; /* guard byte */
    CHECK(fxa_e4m3_quantize_rows(x, rows, n, packed) == FXA_OK, "quantize_rows");
    CHECK(packed[rows * stride] == 0x5a, "quantize_rows writes rows * (n + 4) bytes");
    CHECK(fxa_e4m3_dequantize_rows(packed, rows, n, y) == FXA_OK, "dequantize_rows");

    const uint32_t one = 1u;
    uint8_t lo;
    memcpy(&lo, &one, 1);
    qstats q;
    memset(&q, 0, sizeof q);
    int bad_scale = 0, bad_special = 0, all_finite = 1;
    for (int64_t i = 0; i < rows; i++) {
        const uint8_t *pr = packed + i * stride;
        const float s = read_scale_le(pr + n);
        float s_mem;
        memcpy(&s_mem, pr + n, sizeof s_mem);
        if (!same_bits(s, want_scale(x + i * n, n)) || (lo && !same_bits(s, s_mem))) {
            if (bad_scale++ < 5)
                fprintf(stderr, "  row %lld: scale %a, want %a\n", (long long)i, (double)s,
                        (double)want_scale(x + i * n, n));
        }
        check_row(&q, x + i * n, n, pr, s, y + i * n);
        for (int64_t j = 0; j < n; j++)
            all_finite = all_finite && isfinite(y[i * n + j]);
        const int kind = (int)(i % N_KINDS);
        if (kind == 1)
            bad_special += !(s == 1.0f && all_bytes(pr, (size_t)n, 0x00u));
        if (kind == 7)
            bad_special += !(s == 1.0f && all_bytes(pr, (size_t)n, 0x80u));
        if (kind == 3)
            bad_special += !(pr[n / 2] == 0xfeu && s == 3.75f / 448.0f);
        if (kind == 5)
            bad_special += s != FLT_MIN;
        if (kind == 8)
            bad_special += !(s == FLT_MIN && pr[0] == 0x7eu);
    }
    check_qstats("quantize_rows", &q);
    CHECK(bad_scale == 0, "%d row scales wrong (or not little-endian)", bad_scale);
    CHECK(q.bad_deq == 0, "%lld dequantised values differ from decode * scale", q.bad_deq);
    CHECK(bad_special == 0, "%d zero / -0 / spike / tiny rows wrong", bad_special);
    CHECK(all_finite, "dequantised FLT_MAX rows stay finite");

    /* n = 1: every row is its own absmax. */
    {
        const float x1[4] = {2.0f, -1e-20f, 0.0f, 1e30f};
        uint8_t p1[20];
        CHECK(fxa_e4m3_quantize_rows(x1, 4, 1, p1) == FXA_OK && p1[0] == 0x7eu && p1[5] == 0xfeu &&
                  p1[10] == 0x00u && read_scale_le(p1 + 11) == 1.0f && p1[15] == 0x7eu &&
                  read_scale_le(p1 + 1) == 2.0f / 448.0f,
              "n = 1 rows");
    }
    /* A true fp32 division: 5.46875 / 7 is exactly 0.78125, the midpoint of 0.75 (0x34)
     * and 0.8125 (0x35), and ties to 0x34; 5.46875 * (1 / 7.0f) lands above it. */
    {
        const float xt[2] = {3136.0f, 5.46875f};
        uint8_t pt[6];
        CHECK(fxa_e4m3_quantize_rows(xt, 1, 2, pt) == FXA_OK && read_scale_le(pt + 2) == 7.0f &&
                  pt[0] == 0x7eu && pt[1] == 0x34u,
              "codes come from x / scale (a true division), ties to even");
    }

    /* Errors: nothing written. */
    const size_t bytes = (size_t)(rows * stride);
    const float bad_vals[3] = {nanf(""), INFINITY, -INFINITY};
    for (int k = 0; k < 3; k++) {
        const int64_t at = (k == 0) ? rows * n - 1 : (k == 1) ? 0 : 5 * n + 3;
        const float keep = x[at];
        x[at] = bad_vals[k];
        memset(packed, 0xa5, bytes);
        CHECK(fxa_e4m3_quantize_rows(x, rows, n, packed) == FXA_ERR_INVALID_ARG &&
                  all_bytes(packed, bytes, 0xa5u),
              "non-finite input %d: error, output untouched", k);
        x[at] = keep;
    }
    memset(packed, 0xa5, bytes);
    CHECK(fxa_e4m3_quantize_rows(NULL, rows, n, packed) == FXA_ERR_INVALID_ARG, "NULL x");
    CHECK(fxa_e4m3_quantize_rows(x, rows, n, NULL) == FXA_ERR_INVALID_ARG, "NULL packed");
    CHECK(fxa_e4m3_quantize_rows(x, -1, n, packed) == FXA_ERR_INVALID_ARG, "rows < 0");
    CHECK(fxa_e4m3_quantize_rows(x, rows, 0, packed) == FXA_ERR_INVALID_ARG, "n = 0");
    CHECK(fxa_e4m3_quantize_rows(x, rows, -5, packed) == FXA_ERR_INVALID_ARG, "n < 0");
    CHECK(fxa_e4m3_quantize_rows(x, INT64_MAX, n, packed) == FXA_ERR_INVALID_ARG, "huge rows");
    CHECK(fxa_e4m3_quantize_rows(x, 2, INT64_MAX, packed) == FXA_ERR_INVALID_ARG, "huge n");
    CHECK(fxa_e4m3_quantize_rows(x, 0, n, packed) == FXA_OK, "rows = 0 is a no-op");
    CHECK(all_bytes(packed, bytes, 0xa5u), "failed calls write nothing");

    /* Dequantize errors: a NaN code or a bad scale anywhere; nothing written. */
    CHECK(fxa_e4m3_quantize_rows(x, rows, n, packed) == FXA_OK, "quantize again");
    const size_t ybytes = (size_t)(rows * n) * sizeof(float);
    const uint8_t nan_codes[2] = {0x7fu, 0xffu};
    for (int k = 0; k < 2; k++) {
        uint8_t *p = packed + 7 * stride + 11;
        const uint8_t keep = *p;
        *p = nan_codes[k];
        memset(y, 0xa5, ybytes);
        CHECK(fxa_e4m3_dequantize_rows(packed, rows, n, y) == FXA_ERR_INVALID_ARG &&
                  all_bytes(y, ybytes, 0xa5u),
              "NaN code 0x%02x: error, output untouched", nan_codes[k]);
        *p = keep;
    }
    const float bad_scales[5] = {nanf(""), INFINITY, -INFINITY, -1.0f, -0.0f};
    for (int k = 0; k < 5; k++) {
        uint8_t *p = packed + (rows - 1) * stride + n;
        uint8_t keep[4];
        memcpy(keep, p, 4);
        const uint32_t b = test_f32_bits(bad_scales[k]);
        for (int i = 0; i < 4; i++)
            p[i] = (uint8_t)(b >> (8 * i));
        memset(y, 0xa5, ybytes);
        CHECK(fxa_e4m3_dequantize_rows(packed, rows, n, y) == FXA_ERR_INVALID_ARG &&
                  all_bytes(y, ybytes, 0xa5u),
              "scale %g: error, output untouched", (double)bad_scales[k]);
        memcpy(p, keep, 4);
    }
    CHECK(fxa_e4m3_dequantize_rows(NULL, rows, n, y) == FXA_ERR_INVALID_ARG, "NULL packed");
    CHECK(fxa_e4m3_dequantize_rows(packed, rows, n, NULL) == FXA_ERR_INVALID_ARG, "NULL x");
    CHECK(fxa_e4m3_dequantize_rows(packed, -1, n, y) == FXA_ERR_INVALID_ARG, "rows < 0");
    CHECK(fxa_e4m3_dequantize_rows(packed, rows, 0, y) == FXA_ERR_INVALID_ARG, "n = 0");
    CHECK(fxa_e4m3_dequantize_rows(packed, 0, n, y) == FXA_OK && all_bytes(y, ybytes, 0xa5u),
          "rows = 0 is a no-op");
    {
        uint8_t pz[6] = {0x38u, 0xb8u, 0, 0, 0, 0}; /* scale +0 is allowed */
        float yz[2] = {1.0f, 1.0f};
        CHECK(fxa_e4m3_dequantize_rows(pz, 1, 2, yz) == FXA_OK && yz[0] == 0.0f && yz[1] == 0.0f,
              "scale 0 dequantises to zeros");
    }
    free(x);
    free(y);
    free(packed);
}

static void test_quantize_weights(void)
{
    const int64_t out = 27, in = 53;
    const size_t count = (size_t)(out * in);
    float *w = malloc(count * sizeof(float));
    uint8_t *codes = malloc(count);
    uint8_t *packed = malloc((size_t)(out * (in + 4)));
    float scales[27];
    if (!w || !codes || !packed) {
        CHECK(0, "out of memory");
        return;
    }
    fxt_rng r;
    fxt_rng_seed(&r, 977u);
    for (int64_t o = 0; o < out; o++) {
        fill_row(&r, (int)(o % N_KINDS), w + o * in, in);
        if (o % N_KINDS == 0) /* channels of very different magnitudes */
            for (int64_t i = 0; i < in; i++)
                w[o * in + i] = ldexpf(w[o * in + i], (int)o - 13);
    }
    CHECK(fxa_e4m3_quantize_weights(w, out, in, codes, scales) == FXA_OK, "quantize_weights");
    qstats q;
    memset(&q, 0, sizeof q);
    int bad_scale = 0;
    for (int64_t o = 0; o < out; o++) {
        bad_scale += !same_bits(scales[o], want_scale(w + o * in, in));
        check_row(&q, w + o * in, in, codes + o * in, scales[o], NULL);
    }
    check_qstats("quantize_weights", &q);
    CHECK(bad_scale == 0, "%d output-channel scales wrong", bad_scale);
    /* The same numbers as quantize_rows over the [out][in] matrix. */
    int same = fxa_e4m3_quantize_rows(w, out, in, packed) == FXA_OK;
    for (int64_t o = 0; o < out; o++)
        same = same && memcmp(packed + o * (in + 4), codes + o * in, (size_t)in) == 0 &&
               same_bits(read_scale_le(packed + o * (in + 4) + in), scales[o]);
    CHECK(same, "weights quantise like rows of quantize_rows");
    /* A 2 x 3 matrix by hand: one scale per output channel (row), not per input. */
    {
        const float w2[6] = {1.0f, -2.0f, 0.5f,    /* out 0: absmax 2 */
                             0.0f, 0.0f,  896.0f}; /* out 1: absmax 896 */
        uint8_t c2[6];
        float s2[2];
        CHECK(fxa_e4m3_quantize_weights(w2, 2, 3, c2, s2) == FXA_OK && s2[0] == 2.0f / 448.0f &&
                  s2[1] == 2.0f && c2[0] == fxa_f32_to_e4m3(224.0f) && c2[1] == 0xfeu &&
                  c2[2] == fxa_f32_to_e4m3(112.0f) && c2[3] == 0 && c2[4] == 0 && c2[5] == 0x7eu,
              "2 x 3 weights: [out][in] codes, per-output scales");
        const float wt[2] = {3136.0f, 5.46875f};
        CHECK(fxa_e4m3_quantize_weights(wt, 1, 2, c2, s2) == FXA_OK && s2[0] == 7.0f &&
                  c2[0] == 0x7eu && c2[1] == 0x34u,
              "weight codes come from w / scale (a true division)");
    }
    /* Errors: nothing written. */
    w[count / 2] = nanf("");
    memset(codes, 0xa5, count);
    memset(scales, 0xa5, sizeof scales);
    CHECK(fxa_e4m3_quantize_weights(w, out, in, codes, scales) == FXA_ERR_INVALID_ARG &&
              all_bytes(codes, count, 0xa5u) && all_bytes(scales, sizeof scales, 0xa5u),
          "NaN weight: error, outputs untouched");
    w[count / 2] = -INFINITY;
    CHECK(fxa_e4m3_quantize_weights(w, out, in, codes, scales) == FXA_ERR_INVALID_ARG, "-Inf");
    w[count / 2] = 1.0f;
    CHECK(fxa_e4m3_quantize_weights(NULL, out, in, codes, scales) == FXA_ERR_INVALID_ARG, "NULL w");
    CHECK(fxa_e4m3_quantize_weights(w, out, in, NULL, scales) == FXA_ERR_INVALID_ARG, "NULL codes");
    CHECK(fxa_e4m3_quantize_weights(w, out, in, codes, NULL) == FXA_ERR_INVALID_ARG, "NULL scales");
    CHECK(fxa_e4m3_quantize_weights(w, -1, in, codes, scales) == FXA_ERR_INVALID_ARG, "out < 0");
    CHECK(fxa_e4m3_quantize_weights(w, out, 0, codes, scales) == FXA_ERR_INVALID_ARG, "in = 0");
    CHECK(fxa_e4m3_quantize_weights(w, INT64_MAX / 2, 3, codes, scales) == FXA_ERR_INVALID_ARG,
          "huge shape");
    CHECK(fxa_e4m3_quantize_weights(w, 0, in, codes, scales) == FXA_OK, "out = 0 is a no-op");
    CHECK(all_bytes(codes, count, 0xa5u) && all_bytes(scales, sizeof scales, 0xa5u),
          "failed calls write nothing");
    free(w);
    free(codes);
    free(packed);
}

int main(void)
{
    for (unsigned c = 0; c < 256u; c++)
        ref_tab[c] = ref_value(c);
    test_reference_itself();
    test_decode();
    test_round_trip();
    test_halfway();
    test_named_values();
    test_sweeps();
    test_quantize_rows();
    test_quantize_weights();
    return test_summary("test_fp8");
}
