/*
 * Portable exp2 for the reference kernels: 2^(z - m) for an integer-valued
 * shift m, with results below 2^-126 flushed to zero. Branch-free so that
 * compilers vectorise it.
 *
 * Why a shifted form: fixed-max shifts are integers of size ~C (about 110),
 * and rounding z - m to fp32 would cost about 7 bits of the exponent's
 * fraction. Here e = z - m is formed in double, which is exact (z has 24
 * significant bits, m is an integer below 2^31), so the only error in the
 * argument is the error already in z.
 *
 * e = n + f with n = round(e), |f| <= 1/2 (f exact in fp32); 2^f by the
 * degree-7 Taylor polynomial of e^(f ln 2) (truncation < 0.3466^8/8! < 5e-9
 * relative) in fp32 Horner form, times 2^n built from exponent bits. e < -126
 * gives exactly 0, e in [-126, -125.5) a value near 2^-126 (possibly
 * subnormal); e > 127.99 saturates at 2^127.99 (callers keep e <= C + 1).
 * Measured error (tests/unit/test_exp2.c, against double exp2 over
 * e in [-126, 127.99]): at most 1.151 ULP, at e = -0.4983; the test asserts
 * <= 2 ULP. Not strictly monotone: steps of one ULP down occur where
 * neighbouring arguments are closer than a quarter ULP of the result.
 */
#ifndef FXA_EXP2_REF_H
#define FXA_EXP2_REF_H

#include <stdint.h>
#include <string.h>

/* Coefficients of 2^f, f^1 to f^7 (the constant term is 1): the degree-7
 * Taylor polynomial here and in the SIMD twins (vexp2_avx2.h,
 * vexp2_avx512.h), which must use these very values. */
#define FXA_EXP2_C1 0.693147180559945f
#define FXA_EXP2_C2 0.240226506959101f
#define FXA_EXP2_C3 0.0555041086648216f
#define FXA_EXP2_C4 0.00961812910762848f
#define FXA_EXP2_C5 0.00133335581464284f
#define FXA_EXP2_C6 0.000154035303933816f
#define FXA_EXP2_C7 0.0000152527338040598f
/* The same, highest power first (the order of every Horner loop here and in the twins). */
#define FXA_EXP2_COEFFS                                                                            \
    FXA_EXP2_C7, FXA_EXP2_C6, FXA_EXP2_C5, FXA_EXP2_C4, FXA_EXP2_C3, FXA_EXP2_C2, FXA_EXP2_C1, 1.0f
#define FXA_EXP2_DEGREE 7
/* The SIMD twins' Horner loops, unrolled whole (constant coefficients, one FMA a step). */
#define FXA_EXP2_UNROLL _Pragma("GCC unroll 8")

/* The reduction both polynomials share: e = z - m exactly (double), n =
 * round(e) and f = e - n (exact in fp32), e clamped so that n stays in
 * [-127, 128]. */
typedef struct fxa_exp2_parts {
    double e; /* unclamped, for the flush test */
    float f;
    int32_t n;
} fxa_exp2_parts;

static inline fxa_exp2_parts fxa_exp2_reduce(float z, float m)
{
    fxa_exp2_parts r;
    r.e = (double)z - (double)m;
    const double ec = r.e < -127.0 ? -127.0 : (r.e > 127.99 ? 127.99 : r.e);
    /* Round to nearest: adding 1.5 * 2^52 drops the fraction bits. */
    const double shifter = 6755399441055744.0;
    const double nd = (ec + shifter) - shifter;
    r.f = (float)(ec - nd);
    r.n = (int32_t)nd;
    return r;
}

/* poly * 2^n, and 0 where e < -126. 2^n = 2^(n/2) * 2^(n - n/2): both
 * factors stay normal for n in [-127, 128], so no exponent field over- or
 * underflows. */
static inline float fxa_exp2_scale(float poly, fxa_exp2_parts r)
{
    const int32_t n1 = r.n / 2;
    const int32_t n2 = r.n - n1;
    const uint32_t bits1 = (uint32_t)(n1 + 127) << 23;
    const uint32_t bits2 = (uint32_t)(n2 + 127) << 23;
    float s1;
    float s2;
    memcpy(&s1, &bits1, sizeof s1);
    memcpy(&s2, &bits2, sizeof s2);
    const float v = poly * s1 * s2;
    return r.e < -126.0 ? 0.0f : v;
}

/* The polynomial of coefficients c[0..degree] (highest power first) at f, in fp32 Horner form
 * (each step a product, then a sum). */
static inline float fxa_exp2_horner(const float *c, int degree, float f)
{
    float poly = c[0];
    for (int k = 1; k <= degree; k++)
        poly = poly * f + c[k];
    return poly;
}

static inline float fxa_exp2_shifted_ref(float z, float m)
{
    static const float c[] = {FXA_EXP2_COEFFS};
    const fxa_exp2_parts r = fxa_exp2_reduce(z, m);
    return fxa_exp2_scale(fxa_exp2_horner(c, FXA_EXP2_DEGREE, r.f), r);
}

/*
 * The exp2 of bf16 compute, whose P is rounded to bf16 (8 significant bits)
 * right after: the same reduction and scaling with the degree-4 minimax
 * polynomial of 2^f on [-1/2, 1/2] in relative error (Remez; 2.6e-6, 2^-18.5,
 * in fp32 Horner form, three multiply-adds fewer than the degree-7 one).
 * Its error is 1/700 of bf16's unit roundoff 2^-8; the bf16 error budget
 * (tests/numerics/test_attn_bf16.c, docs/numerics.md) carries it as
 * FXA_EXP2_BF16_REL_ERR. tests/unit/test_exp2.c checks the bound.
 */
#define FXA_EXP2_BF16_REL_ERR 0x1p-18
/* Its coefficients, f^0 to f^4 (the AVX-512 twin uses these too). */
#define FXA_EXP2_BF16_C0 0.999999285f
#define FXA_EXP2_BF16_C1 0.693121791f
#define FXA_EXP2_BF16_C2 0.240247443f
#define FXA_EXP2_BF16_C3 0.0559178591f
#define FXA_EXP2_BF16_C4 0.00957010221f
#define FXA_EXP2_BF16_COEFFS                                                                       \
    FXA_EXP2_BF16_C4, FXA_EXP2_BF16_C3, FXA_EXP2_BF16_C2, FXA_EXP2_BF16_C1, FXA_EXP2_BF16_C0
#define FXA_EXP2_BF16_DEGREE 4

static inline float fxa_exp2_shifted_bf16_ref(float z, float m)
{
    static const float c[] = {FXA_EXP2_BF16_COEFFS};
    const fxa_exp2_parts r = fxa_exp2_reduce(z, m);
    return fxa_exp2_scale(fxa_exp2_horner(c, FXA_EXP2_BF16_DEGREE, r.f), r);
}

#endif
