/* Fixed-max constants and gates (docs/numerics.md); see bound.c. */
#ifndef FXA_BOUND_H
#define FXA_BOUND_H

#include <stdint.h>

#include "fxattn.h"

/* ceil(log2 n) for n >= 1. */
int fxa_ceil_log2_i64(int64_t n);
/* ceil(log2 max(x, 1)) for finite x >= 0. */
int fxa_ceil_log2_vmax(double x);

#endif
