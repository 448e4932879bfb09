/*
 * Kernel contracts and the dispatch table.
 *
 * Drivers (src/attn) reach kernels only through fxa_kernels. A kernel set
 * starts from the portable reference set (kernels/ref, the executable spec)
 * and overrides entries; a faster kernel must match the reference within
 * fp32 reordering, and bit for bit across thread counts.
 */
#ifndef FXA_KERNELS_H
#define FXA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/*
 * One attention tile: n_q query rows of one head against n_kv keys.
 *
 * Scores are base-2 and virtually centred:
 *     z_ij = lambda * (q_i . k_j - qk_center_i)
 * (qk_center_i = q_i . kbar, or 0 without centring). Row i then updates its
 * unnormalised state (m_i, l_i, o_i); shifts m_i are always integers, so the
 * exponent argument z - m is formed exactly and rescales are powers of two:
 *   fixed row (online[i] == 0): m_i is the constant shift from the bound;
 *       p_ij = exp2(z_ij - m_i), l_i += sum_j p_ij, o_i += sum_j p_ij v_j.
 *   online row (online[i] == 1): m_i is the running shift (-INFINITY before
 *       the first tile); m' = max(m_i, ceil(max_j z_ij)), a = exp2(m_i - m'),
 *       l_i = a l_i + sum_j exp2(z_ij - m'), o_i = a o_i + sum_j exp2(z_ij - m') v_j.
 * exp2 flushes results below 2^-126 to zero (the gate's derivation assumes
 * exactly that). Accumulation is fp32, in increasing j within a tile.
 * Layout, row-major: q [n_q, ldq], kt = K transposed [d, ldkt] (n_kv used
 * columns: the driver packs it so that key columns are contiguous), v
 * [n_kv, ldv], o [n_q, ldo]. scores is scratch of n_q * n_kv floats. Every
 * score is the dot product summed in increasing c from 0.0f, every o element
 * sums in increasing j: a kernel may block and vectorise, but a row's result
 * must not depend on its position in the tile (tiles of any n_q give the
 * same bits). No aliasing.
 */
typedef struct fxa_attn_tile {
    size_t n_q;
    size_t n_kv;
    size_t d;
    float lambda;
    const float *q;
    size_t ldq;
    const float *kt;
    size_t ldkt;
    const float *v;
    size_t ldv;
    const float *qk_center;
    const uint8_t *online;
    float *m;
    float *l;
    float *o;
    size_t ldo;
    float *scores;
} fxa_attn_tile;

typedef void fxa_attn_tile_fn(const fxa_attn_tile *t);

typedef struct fxa_kernels {
    const char *isa_name;
    size_t kv_tile; /* keys per tile the driver hands to attn_tile */
    fxa_attn_tile_fn *attn_tile;
} fxa_kernels;

/* The portable reference set: always valid, first entry of the table. */
extern const fxa_kernels fxa_kernels_ref;

#endif
