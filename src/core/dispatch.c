/*
 * The dispatch table. Entries are ordered from the most portable to the
 * fastest; the automatic choice is the last entry the CPU supports and the
 * build provides. The portable reference set is the first entry and always
 * valid. Faster sets (AVX2, AVX-512) register here when they are built.
 */
#include "dispatch.h"

#include <stdio.h>
#include <string.h>

#include "cpu.h"

typedef struct isa_entry {
    const char *name;
    const fxa_kernels *kernels; /* NULL: not built yet */
    int (*cpu_has)(const fxa_cpu *c);
    const fxa_kernels *kernels_bf16; /* the set to use when the CPU has AVX512-BF16 */
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

static const isa_entry g_table[] = {
    {"ref", &fxa_kernels_ref, has_any, NULL},
#if defined(FXA_HAVE_X86_KERNELS)
    {"avx2", &fxa_kernels_avx2, has_avx2, NULL},
    {"avx512", &fxa_kernels_avx512, has_avx512, &fxa_kernels_avx512_bf16},
#else
    {"avx2", NULL, has_avx2, NULL},
    {"avx512", NULL, has_avx512, NULL},
#endif
};

#define N_ENTRIES (sizeof g_table / sizeof g_table[0])

static const fxa_kernels *entry_kernels(const isa_entry *e, const fxa_cpu *cpu)
{
    return e->kernels_bf16 && cpu->avx512bf16 ? e->kernels_bf16 : e->kernels;
}

fxa_status fxa_kernels_select(const char *isa_env, const fxa_kernels **out, char *msg,
                              size_t msg_len)
{
    const fxa_cpu *cpu = fxa_cpu_get();
    if (!isa_env || !*isa_env) {
        *out = &fxa_kernels_ref;
        for (size_t i = 0; i < N_ENTRIES; i++) {
            if (g_table[i].kernels && g_table[i].cpu_has(cpu))
                *out = entry_kernels(&g_table[i], cpu);
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
        if (!g_table[i].kernels) {
            snprintf(msg, msg_len, "FXA_ISA=%s: this build has no %s kernels", isa_env,
                     g_table[i].name);
            return FXA_ERR_UNSUPPORTED;
        }
        *out = entry_kernels(&g_table[i], cpu);
        return FXA_OK;
    }
    snprintf(msg, msg_len, "FXA_ISA=%s: unknown ISA (choose ref, avx2 or avx512)", isa_env);
    return FXA_ERR_INVALID_ARG;
}
