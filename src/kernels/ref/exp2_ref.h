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

static inline float fxa_exp2_shifted_ref(float z, float m)
{
    const double e = (double)z - (double)m;
    /* Clamp so that n = round(e) stays in [-127, 128]. */
    const double ec = e < -127.0 ? -127.0 : (e > 127.99 ? 127.99 : e);
    /* Round to nearest: adding 1.5 * 2^52 drops the fraction bits. */
    const double shifter = 6755399441055744.0;
    const double nd = (ec + shifter) - shifter;
    const float f = (float)(ec - nd);
    const int32_t n = (int32_t)nd;
    const float c1 = 0.693147180559945f;
    const float c2 = 0.240226506959101f;
    const float c3 = 0.0555041086648216f;
    const float c4 = 0.00961812910762848f;
    const float c5 = 0.00133335581464284f;
    const float c6 = 0.000154035303933816f;
    const float c7 = 0.0000152527338040598f;
    float poly = c7;
    poly = poly * f + c6;
    poly = poly * f + c5;
    poly = poly * f + c4;
    poly = poly * f + c3;
    poly = poly * f + c2;
    poly = poly * f + c1;
    poly = poly * f + 1.0f;
    /* 2^n = 2^(n/2) * 2^(n - n/2): both factors stay normal for n in
     * [-127, 128], so no exponent field over- or underflows. */
    const int32_t n1 = n / 2;
    const int32_t n2 = n - n1;
    const uint32_t bits1 = (uint32_t)(n1 + 127) << 23;
    const uint32_t bits2 = (uint32_t)(n2 + 127) << 23;
    float s1;
    float s2;
    memcpy(&s1, &bits1, sizeof s1);
    memcpy(&s2, &bits2, sizeof s2);
    const float r = poly * s1 * s2;
    return e < -126.0 ? 0.0f : r;
}

#endif
