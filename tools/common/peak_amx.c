/*
 * peak_amx: the AMX tdpbf16ps throughput loop for peak.c. Built with per-file
 * flags, never -march=native:
 *   set_source_files_properties(peak_amx.c PROPERTIES COMPILE_OPTIONS
 *                               "-mamx-tile;-mamx-bf16")
 * peak.c calls the loop only after fxt_peak_amx_ready() said yes.
 */
#include "peak.h"

#if defined(__x86_64__)
#if !defined(__AMX_TILE__) || !defined(__AMX_BF16__)
#error "peak_amx.c needs -mamx-tile -mamx-bf16"
#endif

#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* CPUID AMX-BF16 and AMX-TILE, the OS's tile state in XCR0, and Linux's
 * permission for this process (ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA;
 * granting it twice is harmless). */
int fxt_peak_amx_ready(void)
{
    unsigned a, b, c, d;
    if (__get_cpuid_max(0, NULL) < 7 || !__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1))
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    if (!((d >> 22) & 1) || !((d >> 24) & 1))
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x60000u) != 0x60000u)
        return 0;
#if defined(__linux__) && defined(SYS_arch_prctl)
    return syscall(SYS_arch_prctl, 0x1023L, 18L) == 0;
#else
    return 0;
#endif
}

typedef struct tile_config {
    unsigned char palette, start_row, reserved[14];
    unsigned short colsb[16];
    unsigned char rows[16];
} tile_config;

/* Four 16 x 16 fp32 accumulators (tiles 0-3) += two 16 x 32 bf16 A tiles (4,
 * 5) times two 32 x 16 B tiles (6, 7), all values a and b: each element
 * grows by 32 a b per instruction, far from overflow for small b. */
static float amx_run(uint64_t iters, float a, float b)
{
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    unsigned short a16[16 * 32], b16[16 * 32];
    float out[16 * 16];
    unsigned ua, ub;
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    for (int i = 0; i < 16 * 32; i++) {
        a16[i] = (unsigned short)(ua >> 16);
        b16[i] = (unsigned short)(ub >> 16);
    }
    _tile_loadconfig(&cfg);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a16, 64);
    _tile_loadd(5, a16, 64);
    _tile_loadd(6, b16, 64);
    _tile_loadd(7, b16, 64);
    for (uint64_t i = 0; i < iters; i++) {
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    float sum = 0.0f;
    _tile_stored(0, out, 64);
    sum += out[0];
    _tile_stored(1, out, 64);
    sum += out[0];
    _tile_stored(2, out, 64);
    sum += out[0];
    _tile_stored(3, out, 64);
    sum += out[0];
    _tile_release();
    return sum;
}

/* Four tdpbf16ps of 16 x 16 x 32: 4 x 16 x 16 x 32 x 2 FLOP. */
const fxt_peak_loop fxt_peak_loop_amx_bf16 = {amx_run, 4 * 16 * 16 * 32 * 2.0,
                                              "amx tdpbf16ps 16x16x32"};

#endif
