/*
 * The planner of `fxattn plan` and `--grid auto` (docs/cluster.md): the
 * cost model (grid_cost.h) filled from options and measurements, printed
 * as a table or JSON. The measurements under mpirun are in plan_mpi.c.
 */
#ifndef FXT_PLAN_H
#define FXT_PLAN_H

#include <stdint.h>

#include "cmd_opts.h"
#include "fxattn.h"
#include "grid_cost.h"

/* Where the model's inputs came from, for the printout. */
typedef struct fxt_plan_source {
    const char *compute; /* "given", "measured on this node", "measured per rank" */
    const char *inter;   /* "given", "assumed", "measured" */
    const char *intra;
} fxt_plan_source;

/* Defaults of the links that are neither given nor measured. */
#define FXT_PLAN_LINK_GBPS 10.0
#define FXT_PLAN_LATENCY_US 20.0
#define FXT_PLAN_INTRA_GBPS 100.0
#define FXT_PLAN_INTRA_LATENCY_US 1.0
/* The head groups libfxattn_mpi pipelines pure Ulysses by (DEFAULT_GROUPS
 * in src/mpi/ulysses.c); --ulysses-groups overrides (1: blocking). */
#define FXT_PLAN_ULYSSES_GROUPS 4

/* Fill m's shape, links and overlap from o (ranks, hosts and the compute
 * rate left to the caller); src->inter and src->intra say "given" or
 * "assumed". Returns 0 or an exit code (the error printed). */
int fxt_plan_model_from_opts(const plan_opts *o, fxt_cost_model *m, fxt_plan_source *src);

/* Ranks that measure together: agree(arg, code) is a collective barrier
 * that also agrees on failures (every rank returns the same code: 0 when
 * all passed 0). */
typedef struct fxt_plan_sync {
    int (*agree)(void *arg, int code);
    void *arg;
} fxt_plan_sync;

/* The FLOP/s of fxa_attn_run on `threads` threads (0: all cores) on the
 * Wan-like data of `bench`: the first ceil(S / P) queries against every key
 * (all-gather + local's work; S capped at 8192), as many heads as make
 * about 1 GFLOP, the median of 5 runs after a warm-up. With `sync` (ranks
 * that measure together), every rank takes the same path: sync agrees
 * before the warm-up, before the timed runs and after them. Returns 0 or
 * an exit code (the error printed, or agreed through sync). */
int fxt_plan_measure_flops(const fxt_cost_model *m, fxa_dtype dtype, int threads,
                           const fxt_plan_sync *sync, double *flops);

/* The same at the shape of one ring step of every grid of m->ranks (ceil(S/R)
 * queries against as many keys, capped at 8192), into m->step_ring and
 * m->step_flops (the rates of this process; callers scale them as they
 * scale rank_flops). Returns 0 or an exit code (the error printed). */
int fxt_plan_measure_steps(fxt_cost_model *m, fxa_dtype dtype, int threads,
                           const fxt_plan_sync *sync);

/* Print every grid of m, the all-gather alternative and the best grid
 * (text, or with json a JSON array: one object per grid, the last one
 * naming the best). Returns the best grid's U. */
int fxt_plan_print(const fxt_cost_model *m, const fxt_plan_source *src, int json);

/* `fxattn plan --measure` under mpirun (plan_mpi.c; an error without MPI):
 * initialises and finalises MPI. */
int fxt_plan_mpi(const plan_opts *o);

#endif
