/*
 * K^T packing (fxa_pack_kt_fn in src/kernels/kernels.h): the reference puts
 * every 32-bit word rows[j][c] where the panel layout says and writes
 * nothing else, and every kernel set's pack_kt gives the reference's bits
 * for its own panel width, with the memory around the packed region (pads
 * of the last panel, guards on both sides) untouched. Words are random
 * bits, NaN and Inf patterns included: bf16 compute packs pairs of bf16
 * values through the same kernels.
 */
#include <stdlib.h>

#include "kernels/kernels.h"
#include "simd_sets.h"
#include "testutil.h"

static const size_t g_keys[] = {1, 5, 15, 16, 17, 63, 64, 65, 200, 256};
static const size_t g_dims[] = {1, 3, 16, 17, 64, 100, 128};
#define N_KEYS (sizeof g_keys / sizeof g_keys[0])
#define N_DIMS (sizeof g_dims / sizeof g_dims[0])
#define MAX_KEYS 256
#define MAX_D 128
#define GUARD 64                  /* words on each side of the packed region */
#define ROW_STRIDE (MAX_D + 3)    /* rows apart as in a strided input, unaligned */
#define SENTINEL_BITS 0x7fc0deadu /* a NaN pattern no row holds */

/* Random bits (any pattern but the sentinel's). */
static void fill_rows(fxt_rng *r, uint32_t *src, const void **rows, size_t n, size_t d)
{
    for (size_t j = 0; j < n; j++) {
        uint32_t *row = src + j * ROW_STRIDE + j % 3;
        for (size_t c = 0; c < d; c++) {
            uint32_t bits = (uint32_t)(fxt_rng_next(r) >> 32);
            row[c] = bits == SENTINEL_BITS ? bits ^ 1u : bits;
        }
        rows[j] = row;
    }
}

static size_t packed_len(size_t n, size_t d, size_t panel)
{
    return (n + panel - 1) / panel * panel * d;
}

/* A buffer is GUARD floats, the packed region, GUARD floats, all sentinels
 * before packing. */
static void fill_sentinels(uint32_t *buf, size_t len)
{
    for (size_t i = 0; i < len; i++)
        buf[i] = SENTINEL_BITS;
}

/* The reference against the layout read backwards: position `at` of the region
 * is key j = at / (panel d) * panel + at % panel, dimension c = at % (panel d) / panel,
 * holding rows[j][c] when j < n and untouched otherwise, as are the guards. */
static void check_ref(const void *const *rows, size_t n, size_t d, size_t panel, uint32_t *buf)
{
    const size_t len = packed_len(n, d, panel);
    fill_sentinels(buf, len + 2 * GUARD);
    fxa_f32_packkt__ref(rows, n, d, panel, buf + GUARD);
    long long wrong = 0;
    for (size_t i = 0; i < len + 2 * GUARD; i++) {
        uint32_t want = SENTINEL_BITS;
        if (i >= GUARD && i < GUARD + len) {
            const size_t at = i - GUARD;
            const size_t j = at / (panel * d) * panel + at % panel;
            const size_t c = at % (panel * d) / panel;
            if (j < n)
                want = ((const uint32_t *)rows[j])[c];
        }
        wrong += buf[i] != want;
    }
    CHECK(wrong == 0, "ref: n = %zu, d = %zu, panel = %zu: %lld words wrong", n, d, panel, wrong);
}

/* One kernel set's pack_kt against the reference, every word of the buffer. */
static void compare_to_ref(const char *name, const fxa_kernels *k)
{
    static uint32_t src[MAX_KEYS * ROW_STRIDE + 2];
    const void *rows[MAX_KEYS];
    const size_t panel = k->kt_panel;
    const size_t buf_len = packed_len(MAX_KEYS, MAX_D, panel) + 2 * GUARD;
    uint32_t *want = malloc(buf_len * sizeof *want);
    uint32_t *got = malloc(buf_len * sizeof *got);
    CHECK(want && got, "out of memory");
    if (!want || !got)
        return;
    fxt_rng r;
    fxt_rng_seed(&r, 11);
    int differing = 0;
    for (size_t a = 0; a < N_KEYS; a++)
        for (size_t b = 0; b < N_DIMS; b++) {
            const size_t n = g_keys[a], d = g_dims[b];
            const size_t len = packed_len(n, d, panel) + 2 * GUARD;
            fill_rows(&r, src, rows, n, d);
            check_ref(rows, n, d, panel, want);
            fill_sentinels(got, len);
            k->pack_kt(rows, n, d, panel, got + GUARD);
            const int same = memcmp(got, want, len * sizeof *got) == 0;
            differing += !same;
            CHECK(same, "%s: n = %zu, d = %zu, panel = %zu differs from the reference", name, n, d,
                  panel);
        }
    printf("%s (panel %zu): %zu shapes, %d differ from the reference\n", name, panel,
           N_KEYS * N_DIMS, differing);
    free(want);
    free(got);
}

/* A SIMD set: its own packing, with the reference's bits. */
static void compare_simd_set(const char *name, const fxa_kernels *k)
{
    CHECK(k->pack_kt != fxa_f32_packkt__ref, "%s: the set uses the reference packing", name);
    compare_to_ref(name, k);
}

int main(void)
{
    fxa_kernels ref;
    fxa_kernels_init_ref(&ref);
    compare_to_ref("ref", &ref);
    for_each_simd_set(compare_simd_set);
    return test_summary("test_pack_kt");
}
