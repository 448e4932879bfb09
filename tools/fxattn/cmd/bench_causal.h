/* `fxattn bench --causal`: causal attention's speed beside unmasked
 * attention's (bench_causal.c). */
#ifndef FXT_BENCH_CAUSAL_H
#define FXT_BENCH_CAUSAL_H

#include "bench_opts.h"

/* Returns the exit code (errors printed). */
int fxt_bench_causal(const bench_opts *o);

#endif
