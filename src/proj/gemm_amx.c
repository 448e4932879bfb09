/* bf16 GEMM on AMX tiles (contract in gemm_amx.h). Built with -mamx-tile
 * -mamx-bf16 where the compiler has them (src/proj/CMakeLists.txt); without
 * them fxa_gemm_amx_fits says no and nothing here runs.
 *
 * Blocking: an item is a block of N_BLOCK columns of y. Its w rows are
 * packed (pack_kt: word c of row j to panel j / 16, row c, column j % 16)
 * so that each 16 x 16-pair B tile is 1 KB contiguous; the block (k x 128
 * bf16: 1.25 MB at k = 5120) stays in L2 while every 32-row strip of x
 * streams past it (S 4096 x 5120 x 15360 on 2 threads, a standalone
 * harness: 128-column blocks 1.8-2.1 TFLOP/s, 256 1.5, 64 1.8-2.1; blocks
 * of k of 1280-2560 with 256 columns 2.0-2.1). The micro-kernel holds 2 x 2
 * accumulator tiles (32 rows x 32 columns) over the whole of k, A tiles
 * read from x in place. The last 1-31 rows run as a block of 16 and one of
 * 1-15 rows (own tile shapes). */
#include "gemm_amx.h"

#include <string.h>

#include "../base/alloc.h"

#define N_BLOCK 128 /* columns of y per item */
#define PANEL 16    /* columns per packed panel: one B tile wide */

size_t fxa_gemm_amx_scratch_bytes(int64_t k, int n_threads)
{
    return (size_t)n_threads * fxa_align_up((size_t)k * N_BLOCK * sizeof(uint16_t));
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include "../base/amx_tiles.h"

int fxa_gemm_amx_usable(const fxa_ctx *ctx)
{
    return strcmp(fxa_ctx_isa(ctx), "amx") == 0;
}

int fxa_gemm_amx_fits(const fxa_ctx *ctx, int64_t k, int64_t n, const void *w)
{
    return fxa_gemm_amx_usable(ctx) && k % 32 == 0 && n % 32 == 0 && (uintptr_t)w % 4 == 0;
}

typedef struct gemm_job {
    const fxa_ctx *ctx;
    const uint16_t *x;
    int64_t m, k;
    const uint16_t *w;
    int64_t n;
    float *y;
    int64_t ldy;
    unsigned char *scratch;
    size_t scratch_per_thread;
} gemm_job;

/* y rows [i0, i0 + 16 (1 + rows2)) x columns [j0, j0 + 32) over all of k;
 * wp is the item's packed block and jp the column's offset in it. */
static inline __attribute__((always_inline)) void
block(const gemm_job *g, const uint16_t *wp, int64_t i0, int64_t j0, int64_t jp, const int rows2)
{
    const int64_t pairs = g->k / 2;
    const size_t x_stride = (size_t)g->k * sizeof(uint16_t);
    const size_t y_stride = (size_t)g->ldy * sizeof(float);
    const uint16_t *x0 = g->x + i0 * g->k;
    const uint16_t *x1 = x0 + 16 * g->k;
    const uint16_t *b0 = wp + 2 * (jp / PANEL) * PANEL * pairs;
    const uint16_t *b1 = b0 + 2 * PANEL * pairs;
    _tile_zero(C00);
    _tile_zero(C01);
    if (rows2) {
        _tile_zero(C10);
        _tile_zero(C11);
    }
    for (int64_t c = 0; c < pairs; c += 16) {
        _tile_loadd(A0, x0 + 2 * c, x_stride);
        if (rows2)
            _tile_loadd(A1, x1 + 2 * c, x_stride);
        _tile_loadd(B0, b0 + 2 * PANEL * c, 64);
        _tile_loadd(B1, b1 + 2 * PANEL * c, 64);
        _tile_dpbf16ps(C00, A0, B0);
        _tile_dpbf16ps(C01, A0, B1);
        if (rows2) {
            _tile_dpbf16ps(C10, A1, B0);
            _tile_dpbf16ps(C11, A1, B1);
        }
    }
    float *y0 = g->y + i0 * g->ldy + j0;
    _tile_stored(C00, y0, y_stride);
    _tile_stored(C01, y0 + 16, y_stride);
    if (rows2) {
        _tile_stored(C10, y0 + 16 * g->ldy, y_stride);
        _tile_stored(C11, y0 + 16 * g->ldy + 16, y_stride);
    }
}

static void item(void *arg, int64_t it, int thread_id)
{
    const gemm_job *g = arg;
    const int64_t j_begin = it * N_BLOCK;
    const int64_t cols = g->n - j_begin < N_BLOCK ? g->n - j_begin : N_BLOCK;
    uint16_t *wp = (uint16_t *)(g->scratch + (size_t)thread_id * g->scratch_per_thread);
    const void *rows[PANEL];
    for (int64_t j = 0; j < cols; j += PANEL) {
        for (int r = 0; r < PANEL; r++)
            rows[r] = g->w + (j_begin + j + r) * g->k;
        fxa_ctx_pack_kt(g->ctx, rows, PANEL, (size_t)(g->k / 2), PANEL,
                        (uint32_t *)wp + (size_t)j * (size_t)(g->k / 2));
    }
    fxa_amx_configure(16);
    int64_t i0 = 0;
    for (; i0 + 32 <= g->m; i0 += 32)
        for (int64_t j = 0; j < cols; j += 32)
            block(g, wp, i0, j_begin + j, j, 1);
    if (i0 + 16 <= g->m) {
        for (int64_t j = 0; j < cols; j += 32)
            block(g, wp, i0, j_begin + j, j, 0);
        i0 += 16;
    }
    if (i0 < g->m) {
        fxa_amx_configure((size_t)(g->m - i0));
        for (int64_t j = 0; j < cols; j += 32)
            block(g, wp, i0, j_begin + j, j, 0);
    }
    _tile_release();
}

void fxa_gemm_amx_run(fxa_ctx *ctx, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                      int64_t n, float *y, int64_t ldy, void *scratch)
{
    const gemm_job g = {ctx, x, m,   k,       w,
                        n,   y, ldy, scratch, fxa_align_up((size_t)k * N_BLOCK * sizeof(uint16_t))};
    fxa_pool_run(fxa_ctx_pool(ctx), item, (void *)&g, (n + N_BLOCK - 1) / N_BLOCK);
}

#else

int fxa_gemm_amx_usable(const fxa_ctx *ctx)
{
    (void)ctx;
    return 0;
}

int fxa_gemm_amx_fits(const fxa_ctx *ctx, int64_t k, int64_t n, const void *w)
{
    (void)ctx;
    (void)k;
    (void)n;
    (void)w;
    return 0;
}

void fxa_gemm_amx_run(fxa_ctx *ctx, const uint16_t *x, int64_t m, int64_t k, const uint16_t *w,
                      int64_t n, float *y, int64_t ldy, void *scratch)
{
    (void)ctx;
    (void)x;
    (void)m;
    (void)k;
    (void)w;
    (void)n;
    (void)y;
    (void)ldy;
    (void)scratch;
}

#endif
