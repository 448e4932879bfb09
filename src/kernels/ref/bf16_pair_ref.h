/*
 * One step of the reference kernels' bf16 dot products: s plus the products of two bf16 pairs
 * (a[0], a[1]) and (b[0], b[1]), odd element first, as vdpbf16ps adds them:
 * (s + a[1] b[1]) + a[0] b[0], each product exact in fp32.
 *
 * Each pair is read as one 32-bit word and split in registers, not as two element loads: a loop
 * over c summing element loads odd first is an in-order sum whose terms come out of memory
 * order, and the vectoriser of GCC 12 (at -O3) merges that load permutation into the in-order
 * reduction and sums wrong values (GCC PR 110381). A word per pair leaves no load order to
 * permute. The tests NAME_release (tests/CMakeLists.txt) run the numerics on the kernels built
 * with the Release flags.
 */
#ifndef FXA_BF16_PAIR_REF_H
#define FXA_BF16_PAIR_REF_H

#include <stdint.h>
#include <string.h>

#include "../../base/convert_inline.h"

/* Element e (0 or 1) of the pair word w as fp32; element 0 is the one first in memory. */
static inline float fxa_bf16_pair_elem(uint32_t w, int e)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    e = 1 - e;
#endif
    return fxa_bits_f32(e ? w & 0xffff0000u : w << 16);
}

/* (s + a[1] b[1]) + a[0] b[0] in fp32 for the bf16 pairs at a and b. */
static inline float fxa_bf16_pair_dot(float s, const uint16_t *a, const uint16_t *b)
{
    uint32_t x;
    uint32_t y;
    memcpy(&x, a, sizeof x);
    memcpy(&y, b, sizeof y);
    return (s + fxa_bf16_pair_elem(x, 1) * fxa_bf16_pair_elem(y, 1)) +
           fxa_bf16_pair_elem(x, 0) * fxa_bf16_pair_elem(y, 0);
}

#endif
