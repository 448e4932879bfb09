/* Options of `fxattn bench`, shared by the single-process and the
 * distributed (MPI) benchmark. */
#ifndef FXT_BENCH_OPTS_H
#define FXT_BENCH_OPTS_H

#include <stdint.h>

#include "cp_opts.h"
#include "fxattn.h"

typedef struct bench_opts {
    int64_t seq;
    int64_t seq_kv; /* keys per row: seq, or fewer (cross-attention, one process) */
    int64_t heads;
    int64_t dim;
    fxa_dtype dtype;
    fxa_compute compute;
    int64_t threads; /* 0: all cores (per rank: the cores of the node over its ranks) */
    int64_t repeats;
    int json;
    fxt_cp_opts cp;
} bench_opts;

/* The distributed benchmark (bench_mpi.c): initialises and finalises MPI. */
int fxt_bench_mpi(const bench_opts *o);

#endif
