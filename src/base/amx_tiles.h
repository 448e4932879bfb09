/*
 * The tile layout the AMX code shares (the attention tile,
 * kernels/x86_avx512/bf16_tile_16x32_amx.c, and the projection GEMM,
 * proj/gemm_amx.c; header-only, in core so that both libraries may use it):
 * eight tiles, 64 bytes wide, as 2 x 2 fp32 accumulators (C00..C11, 16 x
 * 16 each), two A operands (16 rows x 16 bf16 pairs) and two B operands (16
 * pairs x 16 columns). Include only from files compiled with -mamx-tile.
 */
#ifndef FXA_AMX_TILES_H
#define FXA_AMX_TILES_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

/* Tile registers (macros: the tile intrinsics paste their number into the
 * instruction text). */
#define C00 0
#define C01 1
#define C10 2
#define C11 3
#define A0 4
#define A1 5
#define B0 6
#define B1 7

/* The LDTILECFG operand (palette 1). */
typedef struct fxa_amx_config {
    uint8_t palette;
    uint8_t start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} fxa_amx_config;

/* The accumulators and A tiles `rows` tall (16, or the last block of 1-15
 * rows), the B tiles 16. Loading a configuration zeroes every tile. */
static inline void fxa_amx_configure(size_t rows)
{
    fxa_amx_config c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int i = 0; i < 8; i++) {
        c.colsb[i] = 64;
        c.rows[i] = (uint8_t)(i < B0 ? rows : 16);
    }
    _tile_loadconfig(&c);
}

#endif
