/*
 * The dispatch table. Entries are ordered from the most portable to the
 * fastest; the automatic choice is the last entry the CPU supports and the
 * build provides. The portable reference set is the first entry and always
 * valid. Faster sets (AVX2, AVX-512, AMX) register here by their init function
 * (fxa_kernels_init_<isa>, kernels.h) when they are built.
 */
#include "dispatch.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "../base/cpu.h"
#include "kernels.h"

typedef struct isa_entry {
    const char *name;
    void (*init)(fxa_kernels *k, const fxa_cpu *cpu); /* NULL: not in this build */
    int (*cpu_has)(const fxa_cpu *c);
} isa_entry;

static int has_any(const fxa_cpu *c)
{
    (void)c;
    return 1;
}

static int has_avx2(const fxa_cpu *c)
{
    return c->avx2 && c->fma && c->f16c;
}

static int has_avx512(const fxa_cpu *c)
{
    return c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq && c->fma && c->f16c;
}

static int has_amx(const fxa_cpu *c)
{
    return has_avx512(c) && c->amx_bf16;
}

static void init_ref(fxa_kernels *k, const fxa_cpu *cpu)
{
    (void)cpu;
    fxa_kernels_init_ref(k);
}

#if defined(FXA_HAVE_X86_KERNELS)
static void init_avx2(fxa_kernels *k, const fxa_cpu *cpu)
{
    (void)cpu;
    fxa_kernels_init_avx2(k);
}
#endif

static const isa_entry g_table[] = {
    {"ref", init_ref, has_any},
#if defined(FXA_HAVE_X86_KERNELS)
    {"avx2", init_avx2, has_avx2},
    {"avx512", fxa_kernels_init_avx512, has_avx512},
#if defined(FXA_HAVE_AMX_KERNELS)
    {"amx", fxa_kernels_init_amx, has_amx},
#else
    {"amx", NULL, has_amx},
#endif
#else
    {"avx2", NULL, has_avx2},
    {"avx512", NULL, has_avx512},
    {"amx", NULL, has_amx},
#endif
};

#define N_ENTRIES (sizeof g_table / sizeof g_table[0])

/* Every set of this build, built once for this CPU (the init functions are
 * plain C, so building a set the CPU lacks is harmless). */
static fxa_kernels g_sets[N_ENTRIES];
static pthread_once_t g_sets_once = PTHREAD_ONCE_INIT;

static void build_sets(void)
{
    const fxa_cpu *cpu = fxa_cpu_get();
    for (size_t i = 0; i < N_ENTRIES; i++)
        if (g_table[i].init)
            g_table[i].init(&g_sets[i], cpu);
}

fxa_status fxa_kernels_select(const char *isa_env, const fxa_kernels **out, char *msg,
                              size_t msg_len)
{
    const fxa_cpu *cpu = fxa_cpu_get();
    pthread_once(&g_sets_once, build_sets);
    if (!isa_env || !*isa_env) {
        *out = &g_sets[0];
        for (size_t i = 0; i < N_ENTRIES; i++) {
            if (g_table[i].init && g_table[i].cpu_has(cpu))
                *out = &g_sets[i];
        }
        return FXA_OK;
    }
    for (size_t i = 0; i < N_ENTRIES; i++) {
        if (strcmp(isa_env, g_table[i].name) != 0)
            continue;
        if (!g_table[i].cpu_has(cpu)) {
            snprintf(msg, msg_len, "FXA_ISA=%s: this CPU (or its OS) lacks %s", isa_env,
                     g_table[i].name);
            return FXA_ERR_UNSUPPORTED;
        }
        if (!g_table[i].init) {
            snprintf(msg, msg_len, "FXA_ISA=%s: this build has no %s kernels", isa_env,
                     g_table[i].name);
            return FXA_ERR_UNSUPPORTED;
        }
        *out = &g_sets[i];
        return FXA_OK;
    }
    snprintf(msg, msg_len, "FXA_ISA=%s: unknown ISA (choose ref, avx2, avx512 or amx)", isa_env);
    return FXA_ERR_INVALID_ARG;
}

const char *fxa_kernels_isa(const fxa_kernels *k)
{
    return k->isa_name;
}

const char *fxa_kernels_info(const fxa_kernels *k)
{
    return k->description;
}

void fxa_kernels_pack_kt(const fxa_kernels *k, const void *const *rows, size_t n, size_t d,
                         size_t panel, void *kt)
{
    k->pack_kt(rows, n, d, panel, kt);
}
