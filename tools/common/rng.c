/* Pseudo-random numbers for the tools and tests (rng.h). */
#include "rng.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fxt_rng_seed(fxt_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t fxt_rng_next(fxt_rng *r)
{
    uint64_t *s = r->s;
    const uint64_t out = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double fxt_rng_uniform(fxt_rng *r)
{
    return (double)(fxt_rng_next(r) >> 11) * 0x1p-53;
}

float fxt_rng_uniform24(fxt_rng *r)
{
    return (float)(fxt_rng_next(r) >> 40) * 0x1p-24f;
}

double fxt_rng_normal(fxt_rng *r)
{
    double u1 = fxt_rng_uniform(r);
    const double u2 = fxt_rng_uniform(r);
    if (u1 < 1e-300)
        u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

float fxt_rng_gauss4(fxt_rng *r)
{
    const uint64_t x = fxt_rng_next(r);
    const int32_t s =
        (int32_t)((x & 0xffff) + ((x >> 16) & 0xffff) + ((x >> 32) & 0xffff) + (x >> 48));
    return (float)(s - 131070) * (float)(1.7320508075688772 / 65536.0);
}
