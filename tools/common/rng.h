/* The tools' and tests' pseudo-random numbers (one generator for all of
 * them): xoshiro256** (Blackman and Vigna, 2018) seeded through
 * splitmix64, the same sequence on every platform. */
#ifndef FXT_RNG_H
#define FXT_RNG_H

#include <stdint.h>

typedef struct fxt_rng {
    uint64_t s[4];
} fxt_rng;

void fxt_rng_seed(fxt_rng *r, uint64_t seed);
uint64_t fxt_rng_next(fxt_rng *r);

/* Uniform in [0, 1): 53 bits (double), 24 bits (float). */
double fxt_rng_uniform(fxt_rng *r);
float fxt_rng_uniform24(fxt_rng *r);

/* N(0, 1) by Box-Muller in double. */
double fxt_rng_normal(fxt_rng *r);

/* Approximately N(0, 1), cheaply: the Irwin-Hall sum of the four 16-bit
 * pieces of one draw (mean 131070, sd 65536 / sqrt(3)), as a float. */
float fxt_rng_gauss4(fxt_rng *r);

#endif
