/* `fxattn bench --backward`: the attention backward's speed beside the
 * forward's (bench_bwd.c). */
#ifndef FXT_BENCH_BWD_H
#define FXT_BENCH_BWD_H

#include "bench_opts.h"

/* Returns the exit code (errors printed). */
int fxt_bench_bwd(const bench_opts *o);

#endif
