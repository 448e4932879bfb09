/* Fixed-max constants and gates (docs/numerics.md); see bound.c. */
#ifndef FXA_BOUND_H
#define FXA_BOUND_H

#include <stdint.h>

#include "fxattn.h"

/* ceil(log2 n) for n >= 1. */
int fxa_ceil_log2_i64(int64_t n);
/* ceil(log2 max(x, 1)) for finite x >= 0. */
int fxa_ceil_log2_vmax(double x);

/* Rows with an additive mask whose largest bias passes this (base 2) run
 * online softmax: fixed shifts stay small integers, exact in fp32. */
#define FXA_BIAS_FIXED_LIMIT 65536.0

/* The masked gate (bound.c): the largest ceil(U) of a fixed row with an
 * additive mask, for C = c and n_keys keys. */
int fxa_fixed_m_gate_masked(int c, int64_t n_keys);

#endif
