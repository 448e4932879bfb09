/*
 * test_convert: fp32 <-> bf16 / fp16 conversions (src/core/convert.c).
 *
 *  - Decoding: every f16 code matches sign * 2^(e-15) * (1 + m/1024) (normals),
 *    sign * m * 2^-24 (subnormals), +-inf (e = 31, m = 0), NaN with its sign otherwise;
 *    every bf16 code likewise with its own formula (8-bit exponent, 7-bit mantissa).
 *  - Round trips: 16-bit -> f32 -> 16-bit is the identity on all 65536 codes of each
 *    format except NaNs, which stay NaN (quiet) with their sign.
 *  - Encoding, round to nearest even, against an independent reference in double that
 *    binary-searches a table of the decoded codes for the two neighbours of |x| and picks
 *    the nearer (the even code on a tie; 2^16 resp. 2^128 act as the value of the Inf
 *    code, which gives IEEE overflow), on: every 251st of the 2^32 float bit patterns,
 *    every exact halfway point between consecutive codes of either format (and the float
 *    just above and below it), every 7th float in [2^-26, 2^-13] (f16 subnormals and the
 *    boundary to normals), and named values
 *    (65504, 65519.99, 65520, FLT_MAX, -0.0, +-Inf, NaN).
 *  - fxa_convert_f32: overflow of a finite input is FXA_ERR_INVALID_ARG, Inf/NaN and
 *    ordinary values are FXA_OK with the scalar functions' outputs, FXA_F32 copies bit for
 *    bit, an unknown dtype or a NULL buffer is FXA_ERR_INVALID_ARG.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
#include "testutil.h"

/* ------------------------------------------------------------------------ */
/* Independent reference                                                     */
/* ------------------------------------------------------------------------ */

/* A 16-bit format: exponent and mantissa widths. */
typedef struct fmt {
    const char *name;
    int ebits, mbits;
    uint16_t inf; /* code of +Inf */
    double *tab;  /* tab[c] = value of positive code c for c <= inf (tab[inf] = 2^emax+1) */
    uint16_t (*enc)(float);
    float (*dec)(uint16_t);
} fmt;

static double tab_f16[0x7c01];
static double tab_bf16[0x7f81];
static fmt F16 = {"f16", 5, 10, 0x7c00u, tab_f16, fxa_f32_to_f16, fxa_f16_to_f32};
static fmt BF16 = {"bf16", 8, 7, 0x7f80u, tab_bf16, fxa_f32_to_bf16, fxa_bf16_to_f32};

/* Value of a positive finite code (or of the Inf code, read as a normal number: 2^(emax+1))
 * from the textbook formula. */
static double formula(const fmt *f, uint32_t c)
{
    const int bias = (1 << (f->ebits - 1)) - 1;
    const uint32_t e = (c >> f->mbits) & ((1u << f->ebits) - 1u);
    const uint32_t m = c & ((1u << f->mbits) - 1u);
    if (e == 0)
        return ldexp((double)m, 1 - bias - f->mbits);
    return ldexp(1.0 + (double)m / (double)(1u << f->mbits), (int)e - bias);
}

static void build_tab(fmt *f)
{
    for (uint32_t c = 0; c <= f->inf; c++)
        f->tab[c] = formula(f, c);
}

static int is_nan_code(const fmt *f, uint16_t c)
{
    return (c & 0x7fffu) > f->inf;
}

/* Round |x| (a non-NaN float) to the nearest code, ties to even. */
static uint16_t ref_encode(const fmt *f, float x)
{
    const uint16_t sign = signbit(x) ? 0x8000u : 0u;
    const double a = fabs((double)x);
    if (a >= f->tab[f->inf]) /* includes Inf */
        return (uint16_t)(sign | f->inf);
    /* Largest c < inf with tab[c] <= a. */
    uint32_t lo = 0, hi = f->inf; /* tab[lo] <= a < tab[hi] */
    while (hi - lo > 1) {
        const uint32_t mid = (lo + hi) / 2;
        if (f->tab[mid] <= a)
            lo = mid;
        else
            hi = mid;
    }
    uint32_t c;
    const double twice = 2.0 * a, sum = f->tab[lo] + f->tab[hi]; /* both exact */
    if (twice < sum)
        c = lo;
    else if (twice > sum)
        c = hi;
    else
        c = (lo & 1u) ? hi : lo;
    return (uint16_t)(sign | c);
}

/* Checks one encoding; returns 1 if it is right. NaN must give a quiet NaN, sign kept. */
static int enc_ok(const fmt *f, float x, uint16_t got, uint16_t *want)
{
    if (isnan(x)) {
        const uint16_t quiet = (uint16_t)(1u << (f->mbits - 1));
        *want = (uint16_t)((signbit(x) ? 0x8000u : 0u) | f->inf | quiet);
        return is_nan_code(f, got) && (got & quiet) && ((got & 0x8000u) != 0) == (signbit(x) != 0);
    }
    *want = ref_encode(f, x);
    return got == *want;
}

typedef struct tally {
    long long n, bad;
} tally;

static void check_enc(const fmt *f, tally *t, float x)
{
    uint16_t want;
    const uint16_t got = f->enc(x);
    t->n++;
    if (!enc_ok(f, x, got, &want) && t->bad++ < 5)
        fprintf(stderr, "  fxa_f32_to_%s(%a = %.9g) = 0x%04x, want 0x%04x\n", f->name, (double)x,
                (double)x, got, want);
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                     */
/* ------------------------------------------------------------------------ */

static void test_reference_itself(void)
{
    /* Hand-checked points, so that the reference cannot be wrong in the same way. */
    CHECK(tab_f16[0x3c00] == 1.0 && tab_f16[0x7bff] == 65504.0 && tab_f16[0x0001] == 0x1p-24 &&
              tab_f16[0x0400] == 0x1p-14 && tab_f16[0x7c00] == 65536.0,
          "f16 table");
    CHECK(tab_bf16[0x3f80] == 1.0 && tab_bf16[0x7f7f] == 0x1.fep127 &&
              tab_bf16[0x0001] == 0x1p-133 && tab_bf16[0x0080] == 0x1p-126 &&
              tab_bf16[0x7f80] == 0x1p128,
          "bf16 table");
    CHECK(ref_encode(&F16, 1.0f + 0x1p-11f) == 0x3c00u, "ref: 1 + 2^-11 ties to 1 (even)");
    CHECK(ref_encode(&F16, 1.0f + 3 * 0x1p-11f) == 0x3c02u, "ref: 1 + 3*2^-11 ties up");
    CHECK(ref_encode(&F16, 65520.0f) == 0x7c00u, "ref: 65520 -> Inf");
    CHECK(ref_encode(&F16, -65519.0f) == 0xfbffu, "ref: -65519 -> -65504");
    CHECK(ref_encode(&BF16, 1.0f + 0x1p-8f) == 0x3f80u, "ref: bf16 1 + 2^-8 ties to 1");
    CHECK(ref_encode(&BF16, FLT_MAX) == 0x7f80u, "ref: bf16 FLT_MAX -> Inf");
}

static void test_decode(void)
{
    int bad16 = 0, badbf = 0;
    for (uint32_t c = 0; c < 0x10000u; c++) {
        const uint16_t h = (uint16_t)c;
        const double sgn = (c & 0x8000u) ? -1.0 : 1.0;
        /* f16: the formula written out directly from the IEEE definition. */
        {
            const uint32_t e = (c >> 10) & 31u, m = c & 1023u;
            const float got = fxa_f16_to_f32(h);
            int ok;
            if (e == 31 && m != 0)
                ok = isnan(got) && (signbit(got) != 0) == (sgn < 0);
            else {
                double v;
                if (e == 31)
                    v = sgn * INFINITY;
                else if (e == 0)
                    v = sgn * (double)m * 0x1p-24;
                else
                    v = sgn * ldexp(1.0 + (double)m / 1024.0, (int)e - 15);
                if (v == 0.0)
                    v = copysign(0.0, sgn);
                ok = test_f32_bits(got) == test_f32_bits((float)v) && (double)(float)v == v;
            }
            if (!ok && bad16++ < 5)
                fprintf(stderr, "  fxa_f16_to_f32(0x%04x) = %a\n", c, (double)got);
        }
        /* bf16: sign * 2^(e-127) * (1 + m/128), sign * m * 2^-133, +-inf, NaN. */
        {
            const uint32_t e = (c >> 7) & 255u, m = c & 127u;
            const float got = fxa_bf16_to_f32(h);
            int ok;
            if (e == 255 && m != 0)
                ok = isnan(got) && (signbit(got) != 0) == (sgn < 0);
            else {
                double v;
                if (e == 255)
                    v = sgn * INFINITY;
                else if (e == 0)
                    v = sgn * (double)m * 0x1p-133;
                else
                    v = sgn * ldexp(1.0 + (double)m / 128.0, (int)e - 127);
                if (v == 0.0)
                    v = copysign(0.0, sgn);
                ok = test_f32_bits(got) == test_f32_bits((float)v);
            }
            if (!ok && badbf++ < 5)
                fprintf(stderr, "  fxa_bf16_to_f32(0x%04x) = %a\n", c, (double)got);
        }
    }
    CHECK(bad16 == 0, "%d f16 codes decode wrongly", bad16);
    CHECK(badbf == 0, "%d bf16 codes decode wrongly", badbf);
}

static void test_round_trip(const fmt *f)
{
    int bad = 0, nans = 0;
    for (uint32_t c = 0; c < 0x10000u; c++) {
        const uint16_t h = (uint16_t)c;
        const float x = f->dec(h);
        const uint16_t back = f->enc(x);
        int ok;
        if (is_nan_code(f, h)) {
            nans++;
            ok = isnan(x) && is_nan_code(f, back) && (back & 0x8000u) == (h & 0x8000u);
        } else
            ok = back == h;
        if (!ok && bad++ < 5)
            fprintf(stderr, "  %s round trip: 0x%04x -> %a -> 0x%04x\n", f->name, c, (double)x,
                    back);
    }
    CHECK(bad == 0, "%s: %d codes do not round-trip", f->name, bad);
    CHECK(nans == 2 * ((1 << f->mbits) - 1), "%s: %d NaN codes", f->name, nans);
}

static void test_all_patterns(void)
{
    const double t0 = test_now_seconds();
    tally t16 = {0, 0}, tbf = {0, 0};
    for (uint64_t i = 0; i < (1ull << 32); i += 251u) {
        const float x = test_bits_f32((uint32_t)i);
        check_enc(&F16, &t16, x);
        check_enc(&BF16, &tbf, x);
    }
    /* The f16 subnormal range: every 7th float in [2^-26, 2^-13], both signs, and every
     * 4099th below 2^-26 (all of which round to zero). */
    for (uint32_t b = test_f32_bits(0x1p-26f); b <= test_f32_bits(0x1p-13f); b += 7u) {
        check_enc(&F16, &t16, test_bits_f32(b));
        check_enc(&F16, &t16, test_bits_f32(b | 0x80000000u));
    }
    for (uint32_t b = 0; b < test_f32_bits(0x1p-26f); b += 4099u) {
        check_enc(&F16, &t16, test_bits_f32(b));
        check_enc(&F16, &t16, test_bits_f32(b | 0x80000000u));
    }
    printf("encode vs reference: %lld f16 and %lld bf16 values (%.2f s)\n", t16.n, tbf.n,
           test_now_seconds() - t0);
    CHECK(t16.bad == 0, "f16: %lld of %lld encodings differ from the reference", t16.bad, t16.n);
    CHECK(tbf.bad == 0, "bf16: %lld of %lld encodings differ from the reference", tbf.bad, tbf.n);
}

/* Every exact halfway point between consecutive codes (including max finite / Inf) must
 * round to the even code; the floats just above and below to the upper and lower code. */
static void test_halfway(const fmt *f)
{
    long long bad = 0, inexact = 0, n = 0;
    for (uint32_t c = 0; c < f->inf; c++) {
        const double mid = 0.5 * (f->tab[c] + f->tab[c + 1]);
        const float x = (float)mid;
        if ((double)x != mid) {
            inexact++;
            continue;
        }
        const uint16_t even = (uint16_t)((c & 1u) ? c + 1 : c);
        const float up = nextafterf(x, INFINITY), down = nextafterf(x, 0.0f);
        for (int s = 0; s < 2; s++) {
            const uint16_t sg = s ? 0x8000u : 0u;
            const float sx = s ? -x : x, sup = s ? -up : up, sdown = s ? -down : down;
            const uint16_t g0 = f->enc(sx), g1 = f->enc(sup), g2 = f->enc(sdown);
            n += 3;
            if (g0 != (sg | even) || g1 != (sg | (c + 1)) || g2 != (sg | c)) {
                if (bad++ < 5)
                    fprintf(stderr,
                            "  %s halfway 0x%04x|0x%04x at %a: got 0x%04x (0x%04x above, 0x%04x "
                            "below), want 0x%04x (0x%04x, 0x%04x)\n",
                            f->name, c, c + 1, (double)sx, g0, g1, g2, sg | even, sg | (c + 1),
                            sg | c);
            }
            /* The reference agrees (a check of the reference itself). */
            if (ref_encode(f, sx) != (sg | even) && bad++ < 5)
                fprintf(stderr, "  reference wrong at %a\n", (double)sx);
        }
    }
    CHECK(inexact == 0, "%s: %lld halfway points not representable in fp32", f->name, inexact);
    CHECK(n == 6LL * f->inf, "%s: %lld halfway checks", f->name, n);
    CHECK(bad == 0, "%s: %lld halfway points round wrongly", f->name, bad);
}

static void test_named_values(void)
{
    const float nan_ = nanf("");
    /* f16 */
    CHECK(fxa_f32_to_f16(65504.0f) == 0x7bffu, "65504 -> 0x7bff");
    CHECK(fxa_f32_to_f16(65519.99f) == 0x7bffu, "65519.99 -> 65504");
    CHECK(fxa_f32_to_f16(nextafterf(65520.0f, 0.0f)) == 0x7bffu, "below 65520 -> 65504");
    CHECK(fxa_f32_to_f16(65520.0f) == 0x7c00u, "65520 -> Inf");
    CHECK(fxa_f32_to_f16(-65520.0f) == 0xfc00u, "-65520 -> -Inf");
    CHECK(fxa_f32_to_f16(70000.0f) == 0x7c00u, "70000 -> Inf");
    CHECK(fxa_f32_to_f16(FLT_MAX) == 0x7c00u, "FLT_MAX -> Inf");
    CHECK(fxa_f32_to_f16(0.0f) == 0x0000u, "+0");
    CHECK(fxa_f32_to_f16(-0.0f) == 0x8000u, "-0 keeps its sign");
    CHECK(fxa_f32_to_f16(INFINITY) == 0x7c00u && fxa_f32_to_f16(-INFINITY) == 0xfc00u, "+-Inf");
    CHECK(is_nan_code(&F16, fxa_f32_to_f16(nan_)) && !(fxa_f32_to_f16(nan_) & 0x8000u), "NaN");
    CHECK(is_nan_code(&F16, fxa_f32_to_f16(-nan_)) && (fxa_f32_to_f16(-nan_) & 0x8000u),
          "-NaN keeps its sign");
    CHECK(is_nan_code(&F16, fxa_f32_to_f16(test_bits_f32(0x7f800001u))), "f16: sNaN, low payload");
    CHECK(fxa_f32_to_f16(0x1p-24f) == 0x0001u, "2^-24 -> smallest subnormal");
    CHECK(fxa_f32_to_f16(0x1p-25f) == 0x0000u, "2^-25 ties to 0");
    CHECK(fxa_f32_to_f16(nextafterf(0x1p-25f, 1.0f)) == 0x0001u, "above 2^-25 -> 0x0001");
    CHECK(fxa_f32_to_f16(0x1.8p-24f) == 0x0002u, "1.5 * 2^-24 ties to 0x0002");
    CHECK(fxa_f32_to_f16(0x1p-14f - 0x1p-25f) == 0x0400u, "2^-14 - 2^-25 ties up to 2^-14");
    CHECK(fxa_f32_to_f16(1e-30f) == 0x0000u && fxa_f32_to_f16(-1e-30f) == 0x8000u, "underflow");
    CHECK(fxa_f32_to_f16(0x1p-149f) == 0x0000u, "smallest float subnormal -> 0");
    /* bf16 */
    CHECK(fxa_f32_to_bf16(FLT_MAX) == 0x7f80u, "FLT_MAX -> bf16 Inf (above the halfway point)");
    CHECK(fxa_f32_to_bf16(3.4e38f) == 0x7f80u, "3.4e38 -> bf16 Inf");
    CHECK(fxa_f32_to_bf16(0x1.fep127f) == 0x7f7fu, "bf16 max finite stays");
    CHECK(fxa_f32_to_bf16(0x1.ffp127f) == 0x7f80u, "bf16 max/Inf halfway ties to Inf (even)");
    CHECK(fxa_f32_to_bf16(nextafterf(0x1.ffp127f, 0.0f)) == 0x7f7fu, "below that -> max");
    CHECK(fxa_f32_to_bf16(-0.0f) == 0x8000u, "bf16 -0");
    CHECK(fxa_f32_to_bf16(INFINITY) == 0x7f80u && fxa_f32_to_bf16(-INFINITY) == 0xff80u,
          "bf16 +-Inf");
    CHECK(is_nan_code(&BF16, fxa_f32_to_bf16(nan_)), "bf16 NaN");
    CHECK(is_nan_code(&BF16, fxa_f32_to_bf16(test_bits_f32(0xff800001u))) &&
              (fxa_f32_to_bf16(test_bits_f32(0xff800001u)) & 0x8000u),
          "bf16: -sNaN with only a low payload bit stays a negative NaN (not -Inf)");
    CHECK(is_nan_code(&BF16, fxa_f32_to_bf16(test_bits_f32(0x7fffffffu))) &&
              !(fxa_f32_to_bf16(test_bits_f32(0x7fffffffu)) & 0x8000u),
          "bf16: NaN with all payload bits does not carry into the sign");
    CHECK(fxa_f32_to_bf16(0x1p-149f) == 0x0000u, "bf16: smallest float subnormal -> 0");
    CHECK(fxa_f32_to_bf16(0x1p-133f) == 0x0001u, "bf16: 2^-133 -> 0x0001");
}

static void test_convert_array(void)
{
    float src[64];
    uint16_t dst[64];
    const float nan_ = nanf("");

    /* Overflow of finite inputs. */
    src[0] = 1.0f, src[1] = 70000.0f, src[2] = 2.0f;
    CHECK(fxa_convert_f32(src, FXA_F16, dst, 3) == FXA_ERR_INVALID_ARG, "70000 to f16");
    src[1] = -70000.0f;
    CHECK(fxa_convert_f32(src, FXA_F16, dst, 3) == FXA_ERR_INVALID_ARG, "-70000 to f16");
    src[1] = 65520.0f;
    CHECK(fxa_convert_f32(src, FXA_F16, dst, 3) == FXA_ERR_INVALID_ARG, "65520 to f16");
    src[1] = 65519.99f;
    CHECK(fxa_convert_f32(src, FXA_F16, dst, 3) == FXA_OK && dst[1] == 0x7bffu,
          "65519.99 to f16 is 65504, no error");
    src[1] = 3.4e38f;
    CHECK(fxa_convert_f32(src, FXA_BF16, dst, 3) == FXA_ERR_INVALID_ARG, "3.4e38 to bf16");
    src[1] = -FLT_MAX;
    CHECK(fxa_convert_f32(src, FXA_BF16, dst, 3) == FXA_ERR_INVALID_ARG, "-FLT_MAX to bf16");
    src[1] = 0x1.fep127f;
    CHECK(fxa_convert_f32(src, FXA_BF16, dst, 3) == FXA_OK && dst[1] == 0x7f7fu,
          "bf16 max finite, no error");
    src[1] = 70000.0f;
    CHECK(fxa_convert_f32(src, FXA_BF16, dst, 3) == FXA_OK, "70000 to bf16 is fine");

    /* Inf and NaN are carried through. */
    const float special[4] = {INFINITY, -INFINITY, nan_, -nan_};
    CHECK(fxa_convert_f32(special, FXA_F16, dst, 4) == FXA_OK && dst[0] == 0x7c00u &&
              dst[1] == 0xfc00u && is_nan_code(&F16, dst[2]) && is_nan_code(&F16, dst[3]) &&
              (dst[3] & 0x8000u),
          "Inf/NaN to f16");
    CHECK(fxa_convert_f32(special, FXA_BF16, dst, 4) == FXA_OK && dst[0] == 0x7f80u &&
              dst[1] == 0xff80u && is_nan_code(&BF16, dst[2]) && is_nan_code(&BF16, dst[3]) &&
              (dst[3] & 0x8000u),
          "Inf/NaN to bf16");

    /* Ordinary values: the scalar functions' outputs. */
    fxt_rng r;
    fxt_rng_seed(&r, 77u);
    int bad = 0;
    for (int rep = 0; rep < 200; rep++) {
        for (int i = 0; i < 64; i++)
            src[i] = (float)ldexp(fxt_rng_normal(&r), (int)(fxt_rng_next(&r) % 40u) - 30);
        src[rep % 64] = (rep & 1) ? -0.0f : 0x1p-20f; /* a zero and an f16 subnormal */
        for (int t = 0; t < 2; t++) {
            const fmt *f = t ? &BF16 : &F16;
            memset(dst, 0xaa, sizeof dst);
            const fxa_status s = fxa_convert_f32(src, t ? FXA_BF16 : FXA_F16, dst, 64);
            int ok = s == FXA_OK;
            for (int i = 0; i < 64; i++)
                ok = ok && dst[i] == f->enc(src[i]);
            if (!ok && bad++ < 3)
                fprintf(stderr, "  fxa_convert_f32 to %s: status %d or outputs differ\n", f->name,
                        (int)s);
        }
    }
    CHECK(bad == 0, "%d array conversions differ from the scalar functions", bad);

    /* FXA_F32 copies bit for bit (NaN payloads, -0, subnormals). */
    float fsrc[6] = {
        -0.0f, test_bits_f32(0x7fa00001u), test_bits_f32(0xffc12345u), 0x1p-149f, -INFINITY, 3.25f};
    float fdst[6];
    memset(fdst, 0, sizeof fdst);
    CHECK(fxa_convert_f32(fsrc, FXA_F32, fdst, 6) == FXA_OK && memcmp(fsrc, fdst, sizeof fsrc) == 0,
          "FXA_F32 copies exactly");

    /* Bad arguments. */
    src[0] = 1.0f;
    CHECK(fxa_convert_f32(src, (fxa_dtype)3, dst, 1) == FXA_ERR_INVALID_ARG, "dtype 3");
    CHECK(fxa_convert_f32(src, (fxa_dtype)99, dst, 1) == FXA_ERR_INVALID_ARG, "dtype 99");
    CHECK(fxa_convert_f32(NULL, FXA_F16, dst, 1) == FXA_ERR_INVALID_ARG, "NULL src");
    CHECK(fxa_convert_f32(src, FXA_BF16, NULL, 1) == FXA_ERR_INVALID_ARG, "NULL dst");
    CHECK(fxa_convert_f32(src, FXA_F16, NULL, 0) == FXA_OK, "n = 0 with NULL dst");
}

/* The kernel sets' fp16 widening (used while packing): the portable one and,
 * where the CPU has F16C, the F16C one agree with fxa_f16_to_f32 on every
 * code (NaNs only as NaNs: F16C quiets signalling NaNs). Lengths 1..67
 * exercise the 8-wide body and the scalar tail. */
static void test_widen_f16(void)
{
    static uint16_t codes[65536];
    static float ref[65536];
    static float got[65536];
    for (uint32_t i = 0; i < 65536; i++) {
        codes[i] = (uint16_t)i;
        ref[i] = fxa_f16_to_f32((uint16_t)i);
    }
    fxa_widen_f16_fn *fns[2] = {fxa_widen_f16_ref, NULL};
    const char *names[2] = {"portable", "F16C"};
#if defined(__x86_64__) || defined(__i386__)
    if (__builtin_cpu_supports("f16c"))
        fns[1] = fxa_widen_f16_f16c;
    else
        printf("F16C widening not run: this CPU lacks F16C\n");
#endif
    for (int f = 0; f < 2; f++) {
        if (!fns[f])
            continue;
        int bad = 0;
        for (size_t len = 1; len <= 67; len++) {
            for (size_t start = 0; start + len <= 65536; start += 4099) {
                fns[f](codes + start, got + start, len);
                for (size_t i = start; i < start + len; i++) {
                    const int same = isnan(ref[i]) ? isnan(got[i]) != 0
                                                   : memcmp(&ref[i], &got[i], sizeof(float)) == 0;
                    bad += !same;
                }
            }
        }
        fns[f](codes, got, 65536);
        for (uint32_t i = 0; i < 65536; i++) {
            const int same =
                isnan(ref[i]) ? isnan(got[i]) != 0 : memcmp(&ref[i], &got[i], sizeof(float)) == 0;
            bad += !same;
        }
        CHECK(bad == 0, "%s fp16 widening differs from fxa_f16_to_f32 in %d values", names[f], bad);
    }
}

int main(void)
{
    test_widen_f16();
    build_tab(&F16);
    build_tab(&BF16);
    test_reference_itself();
    test_decode();
    test_round_trip(&F16);
    test_round_trip(&BF16);
    test_halfway(&F16);
    test_halfway(&BF16);
    test_named_values();
    test_all_patterns();
    test_convert_array();
    return test_summary("test_convert");
}
