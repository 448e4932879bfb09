/* `--inputs-on rank0` (clusters without a shared file system): rank 0
 * reads the input files and sends every rank its shard. */
#ifndef FXT_INPUTS_MPI_H
#define FXT_INPUTS_MPI_H

#include "inputs.h"
#include "mpi_cli.h"

/* Collective over MPI_COMM_WORLD. World rank 0 reads the whole q, k and v
 * (fxt_inputs_load: the same checks), the other ranks open no file; every
 * world rank r then receives the shard of grid rank grid_of[r] and ends
 * with `in` as fxt_inputs_load_shard(..., P, grid_of[r], canonical, in) would fill it
 * (in->d the global problem). A failure (a missing or bad file on rank 0,
 * out of memory anywhere) is agreed on: every rank returns the same exit
 * code, rank 0 prints the message once. Returns 0 or that code. */
int fxt_inputs_scatter(fxt_world *w, const int *grid_of, const char *q_path, const char *k_path,
                       const char *v_path, fxa_layout layout, const char *dtype_opt, int canonical,
                       fxt_inputs *in);

#endif
