/* Threads per rank for the distributed subcommands. */
#ifndef FXT_MPI_THREADS_H
#define FXT_MPI_THREADS_H

#include <stdint.h>

/* `threads` when > 0, else the cores of this node shared by its ranks
 * (at least 1). Collective over MPI_COMM_WORLD. */
int fxt_mpi_threads_per_rank(int64_t threads);

#endif
