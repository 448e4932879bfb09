/* The synthetic generator of the Wan layer's weights and input (wan_synth.h,
 * fxattn_wan.h: fxa_wan_synth). */
#include <stdint.h>

#include "fxattn_wan.h"
#include "wan_synth.h"

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float fxa_wan_synth(uint64_t seed, uint64_t stream, uint64_t i)
{
    /* Counter-based, so that any slice (a rank's shard) is cheap to make:
     * the Irwin-Hall sum of four 16-bit pieces of one hash, variance 1. */
    const uint64_t h = mix64(mix64(seed * 0x9e3779b97f4a7c15ull + stream) + i);
    const int64_t s =
        (int64_t)((h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48));
    return (float)(s - 131070) * (1.0f / 37837.23f);
}

void fxa_wan_synth_fill(float *dst, int64_t first, int64_t n, uint64_t seed, uint64_t stream,
                        double mean, double sd)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)(mean + sd * (double)fxa_wan_synth(seed, stream, (uint64_t)(first + i)));
}
