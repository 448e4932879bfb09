/* The options of a distributed run that `attn` and `bench` share (--ulysses, --ring,
 * --prefetch, --timeout, --grid), and whether a run is distributed. */
#ifndef FXT_CP_OPTS_H
#define FXT_CP_OPTS_H

#include <stdint.h>

typedef struct fxt_cp_opts {
    int64_t ulysses; /* 0: not given */
    int64_t ring;
    int64_t prefetch;
    double timeout;   /* --timeout seconds under mpirun; 0: not given (fxa_mpi_default_timeout) */
    const char *grid; /* --grid auto: the planner's U x R (plan.h); NULL: not given */
} fxt_cp_opts;

/* The option table rows of the group in o (an fxt_cp_opts), for a command's table. */
#define FXT_CP_OPTS_ROWS(o)                                                                        \
    {"--ulysses", NULL, FXT_OPT_INT, &(o).ulysses, 1, 1 << 20},                                    \
        {"--ring", NULL, FXT_OPT_INT, &(o).ring, 1, 1 << 20},                                      \
        {"--prefetch", NULL, FXT_OPT_INT, &(o).prefetch, 1, 1 << 20},                              \
        {"--timeout", NULL, FXT_OPT_DOUBLE, &(o).timeout, 0, 0},                                   \
    {                                                                                              \
        "--grid", NULL, FXT_OPT_STRING, &(o).grid, 0, 0                                            \
    }

/* 1 when the run is distributed: a group option given, or the process started by mpirun (its
 * environment says so). */
int fxt_cp_opts_distributed(const fxt_cp_opts *o);

#endif
