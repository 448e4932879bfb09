/* `fxattn bench --backward`: the attention backward's speed beside the
 * forward's (bench_bwd.c), or with --causal causal beside unmasked
 * (bench_bwd_causal.c). */
#ifndef FXT_BENCH_BWD_H
#define FXT_BENCH_BWD_H

#include "bench_opts.h"

/* Returns the exit code (errors printed). */
int fxt_bench_bwd(const bench_opts *o);

/* `--backward --causal`: the backward unmasked and causal side by side
 * (bench_bwd_causal.c). Returns the exit code. */
int fxt_bench_bwd_causal(const bench_opts *o);

#endif
