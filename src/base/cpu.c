/* CPU feature detection (see cpu.h). */
#include "cpu.h"

#include <pthread.h>
#include <stdint.h>

#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
#include <sys/syscall.h>
#include <unistd.h>
#endif

static fxa_cpu g_cpu;
static pthread_once_t g_cpu_once = PTHREAD_ONCE_INIT;

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* Linux grants a process the AMX tile data (XFEATURE_XTILEDATA, 18) on
 * request; without it the first tile instruction faults. The request fails
 * (and AMX stays unused) on kernels before 5.16 or when a thread's signal
 * stack is too small for the tile state. */
static int request_amx(void)
{
#if defined(__linux__) && defined(SYS_arch_prctl)
    const long arch_req_xcomp_perm = 0x1023;
    const long xfeature_xtiledata = 18;
    return syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
#else
    return 0;
#endif
}

static uint64_t read_xcr0(void)
{
    uint32_t lo;
    uint32_t hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static void detect(void)
{
    unsigned a;
    unsigned b;
    unsigned c;
    unsigned d;
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    int os_ymm = 0;
    int os_zmm = 0;
    int os_tile = 0;
    if (max_leaf < 1 || !__get_cpuid(1, &a, &b, &c, &d))
        return;
    g_cpu.sse2 = (d >> 26) & 1;
    int fma = (c >> 12) & 1;
    int osxsave = (c >> 27) & 1;
    int avx = (c >> 28) & 1;
    int f16c = (c >> 29) & 1;
    if (osxsave) {
        uint64_t xcr0 = read_xcr0();
        os_ymm = (xcr0 & 0x6) == 0x6;             /* XMM and YMM state */
        os_zmm = os_ymm && (xcr0 & 0xe0) == 0xe0; /* opmask, ZMM_Hi256, Hi16_ZMM */
        os_tile = (xcr0 & 0x60000) == 0x60000;    /* XTILECFG, XTILEDATA */
    }
    if (max_leaf < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    unsigned leaf7_b = b;
    unsigned leaf7_d = d;
    unsigned leaf7_max_sub = a;
    g_cpu.fma = fma && avx && os_ymm;
    g_cpu.f16c = f16c && avx && os_ymm;
    g_cpu.avx2 = ((leaf7_b >> 5) & 1) && avx && os_ymm;
    g_cpu.avx512f = ((leaf7_b >> 16) & 1) && os_zmm;
    g_cpu.avx512bw = g_cpu.avx512f && ((leaf7_b >> 30) & 1);
    g_cpu.avx512vl = g_cpu.avx512f && ((leaf7_b >> 31) & 1);
    g_cpu.avx512dq = g_cpu.avx512f && ((leaf7_b >> 17) & 1);
    if (leaf7_max_sub >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        g_cpu.avx512bf16 = g_cpu.avx512f && ((a >> 5) & 1);
    }
    const int amx = ((leaf7_d >> 22) & 1) && ((leaf7_d >> 24) & 1); /* AMX-BF16, AMX-TILE */
    g_cpu.amx_bf16 = amx && os_tile && g_cpu.avx512bf16 && request_amx();
}
#else
static void detect(void)
{
}
#endif

const fxa_cpu *fxa_cpu_get(void)
{
    pthread_once(&g_cpu_once, detect);
    return &g_cpu;
}
