/* Options of `fxattn attn` (the attn_opts struct, cmd_opts.h) and the helpers
 * shared by the single-process and the distributed (MPI) paths. */
#ifndef FXT_ATTN_OPTS_H
#define FXT_ATTN_OPTS_H

#include <stdint.h>

#include "cmd_opts.h"
#include "fxattn.h"
#include "inputs.h"
#include "verify.h"

/* Apply mode, centring, compute, scale and scheduling to d. Returns 0 or an
 * exit code (the error printed). */
int fxt_attn_apply_options(const attn_opts *o, fxa_attn_desc *d);

/* Compare out/lse with the fp64 reference on 64 rows per head (whole
 * inputs). Returns 0 or an exit code. */
int fxt_attn_verify(const fxt_inputs *in, const float *out, const float *lse,
                    fxt_verify_result *vr);

/* Stage and commit -o (and --lse) all or nothing for the global problem
 * in->d. Returns 0 or an exit code (the error printed). */
int fxt_attn_write_outputs(const attn_opts *o, const fxt_inputs *in, const float *out,
                           const float *lse);

/* Distributed when --ulysses, --ring or --prefetch is given, or when the
 * process was started by mpirun. */
int fxt_attn_is_distributed(const attn_opts *o);
/* The memory check of `attn` (cmd_attn.c): on one process (1, 1, 1) or on
 * one of `ranks` MPI ranks, node_ranks of them on this node, the one that
 * gathers the output with gathers = 1. 0 or an exit code. */
int fxt_attn_check_memory(const attn_opts *o, int ranks, int node_ranks, int gathers);

/* `fxattn attn` on MPI (attn_mpi.c): initialises and finalises MPI. */
int fxt_attn_mpi(const attn_opts *o);

#endif
