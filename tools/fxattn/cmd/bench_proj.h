/* `fxattn bench --proj`: the QKV projection's speed (bench_proj.c). */
#ifndef FXT_BENCH_PROJ_H
#define FXT_BENCH_PROJ_H

#include "cmd_opts.h"

/* Returns the exit code (errors printed). */
int fxt_bench_proj(const bench_args *a);

#endif
