/* A context, a plan and its workspace for one attention descriptor: the
 * setup every subcommand repeats. Errors print and return an exit code. */
#ifndef FXT_RUNNER_H
#define FXT_RUNNER_H

#include "fxattn.h"

typedef struct fxt_runner {
    fxa_ctx *ctx;
    fxa_attn_plan *plan;
    void *workspace;
} fxt_runner;

/* threads 0 = all cores. Returns 0 or an exit code. */
/* A context of `threads` threads (0: the default); an error printed and its
 * exit code returned when it cannot be created. */
int fxt_context(int64_t threads, fxa_ctx **ctx);

int fxt_runner_init(fxt_runner *r, int threads, const fxa_attn_desc *d);
/* Run (or only the bound pass when bounds_only); prints the library's
 * message on failure. Returns 0 or an exit code. */
int fxt_runner_run(fxt_runner *r, const fxa_attn_args *a, fxa_attn_stats *st, int bounds_only);
void fxt_runner_free(fxt_runner *r);

/* *compute FXA_COMPUTE_AUTO replaced by what the library chooses for dtype
 * and head_dim on this machine (fxa_ctx_compute_choice); other values are
 * left. 0, or a printed error's exit code. */
int fxt_resolve_compute(fxa_compute *compute, fxa_dtype dtype, int64_t head_dim);

#endif
