/*
 * The planner of `fxattn plan` and `--grid auto` (docs/cluster.md): the
 * library's cost model (fxattn_grid.h) filled from options and
 * measurements, printed as a table or JSON. Under mpirun the measurements
 * are libfxattn_mpi's fxa_mpi_grid_plan (plan_mpi.c).
 */
#ifndef FXT_PLAN_H
#define FXT_PLAN_H

#include <stdint.h>

#include "cmd_opts.h"
#include "fxattn_grid.h"

/* Where the model's inputs came from, for the printout. */
typedef struct fxt_plan_source {
    const char *compute; /* "given", "measured on this node", "measured per rank" */
    const char *inter;   /* "given", "assumed", "measured" */
    const char *intra;
} fxt_plan_source;

/* --ulysses-groups' default: the head groups libfxattn_mpi pipelines pure
 * Ulysses by (fxa_grid_model_init's ulysses_groups). */
#define FXT_PLAN_ULYSSES_GROUPS 4

/* Fill m's shape, links and overlap from o (ranks and hosts as given, 0
 * when not; the compute rate left to the caller) and m->measure with what
 * o leaves to measure; src->inter and src->intra say "given" or "assumed".
 * Returns 0 or an exit code (the error printed). */
int fxt_plan_model_from_opts(const plan_opts *o, fxa_grid_model *m, fxt_plan_source *src);

/* Print every grid of m, the all-gather alternative and the best grid
 * (text, or with json a JSON array: one object per grid, the last one
 * naming the best). Returns 0 or an exit code (the model's error printed,
 * with the prefix `what`). */
int fxt_plan_print(const fxa_grid_model *m, const fxt_plan_source *src, int json, const char *what);

/* `fxattn plan --measure` under mpirun (plan_mpi.c; an error without MPI):
 * initialises and finalises MPI. */
int fxt_plan_mpi(const plan_opts *o);

#endif
