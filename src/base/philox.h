/*
 * Philox4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers:
 * as easy as 1, 2, 3", SC11): a counter-based generator, 4 32-bit words
 * out of a 128-bit counter and a 64-bit key, with the paper's round
 * multipliers and Weyl key increments.
 */
#ifndef FXA_PHILOX_H
#define FXA_PHILOX_H

#include <stdint.h>

#define FXA_PHILOX_M0 0xD2511F53u
#define FXA_PHILOX_M1 0xCD9E8D57u
#define FXA_PHILOX_W0 0x9E3779B9u
#define FXA_PHILOX_W1 0xBB67AE85u

/* out = Philox4x32-10(ctr, key). */
static inline void fxa_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        const uint64_t p0 = (uint64_t)FXA_PHILOX_M0 * c0;
        const uint64_t p1 = (uint64_t)FXA_PHILOX_M1 * c2;
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        const uint32_t n1 = (uint32_t)p1;
        const uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        const uint32_t n3 = (uint32_t)p0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += FXA_PHILOX_W0;
        k1 += FXA_PHILOX_W1;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

#endif
