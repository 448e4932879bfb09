/*
 * fxattn_diag.h (libfxattn): the fixed-max constants, for diagnostics tools
 * and tests (`fxattn check` reports them per head). Attention itself needs
 * none of this: fxa_attn_run derives them. docs/numerics.md derives them.
 */
#ifndef FXATTN_DIAG_H
#define FXATTN_DIAG_H

#include <stdint.h>

#include "fxattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* C(N) = 127 - ceil(log2 N) - ceil(log2 max(Vmax,1)). n_keys >= 1. */
FXA_API int fxa_fixed_m_c(int64_t n_keys, double vmax);
/* Strict gate floor(W/2), W = C + 125: sound for any row. */
FXA_API int fxa_fixed_m_gate_strict(int c);
/* Looser gate for rows with virtually centred keys (derivation in bound.c). */
FXA_API int fxa_fixed_m_gate_centered(int c, int64_t n_keys);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_DIAG_H */
