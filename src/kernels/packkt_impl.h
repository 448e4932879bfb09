/*
 * The K^T packing loop of the SIMD sets (fxa_pack_kt_fn in kernels.h), written once: keys go in
 * groups of PACK_W, dimensions in blocks of PACK_W; each block is PACK_W row loads (a key past n
 * loads nothing: zeros), the PACK_W x PACK_W transpose in registers, and one PACK_W-key store
 * per dimension into its panel row (a panel holds a multiple of 16 keys, so a group never
 * straddles two). The key tail masks its stores; the dimension tail masks its loads and stores
 * only the dimensions that exist. Moved as fp32 lanes: loads, shuffles and stores keep every
 * bit.
 *
 * A packing file defines, before including this header, under its own ISA flags:
 *   PACKKT_NAME                  the name of the fxa_pack_kt_fn this header defines;
 *   PACK_W, pack_vec, pack_mask  the lanes, the vector and the lane-mask types;
 *   first_lanes(count)           the mask of lanes [0, count);
 *   load_dims(x, dims, mask)     dims floats from x (dims <= PACK_W), the rest zero;
 *   zero_vec()                   a vector of zeros;
 *   transpose(in, out)           out[c][r] = in[r][c] for PACK_W vectors;
 *   store_keys(x, keys, mask, v) the first keys lanes of v to x.
 */
#ifndef FXA_PACKKT_IMPL_H
#define FXA_PACKKT_IMPL_H

#include <stddef.h>

#include "kernels.h"

/* Loops over PACK_W vectors, unrolled whole so that the blocks live in registers. */
#define PACK_UNROLL _Pragma("GCC unroll 16")

void PACKKT_NAME(const void *const *rows, size_t n, size_t d, size_t panel, void *kt_out)
{
    float *kt = kt_out;
    for (size_t j0 = 0; j0 < n; j0 += PACK_W) {
        const size_t keys = n - j0 < PACK_W ? n - j0 : PACK_W;
        const pack_mask key_mask = first_lanes(keys);
        float *group = kt + fxa_kt_offset(panel, d, 0, j0);
        for (size_t c0 = 0; c0 < d; c0 += PACK_W) {
            const size_t dims = d - c0 < PACK_W ? d - c0 : PACK_W;
            const pack_mask dim_mask = first_lanes(dims);
            pack_vec in[PACK_W], out[PACK_W];
            PACK_UNROLL
            for (size_t r = 0; r < PACK_W; r++)
                in[r] = r < keys ? load_dims((const float *)rows[j0 + r] + c0, dims, dim_mask)
                                 : zero_vec();
            transpose(in, out);
            PACK_UNROLL
            for (size_t c = 0; c < PACK_W; c++)
                if (c < dims)
                    store_keys(group + (c0 + c) * panel, keys, key_mask, out[c]);
        }
    }
}

#endif
