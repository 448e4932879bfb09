/* Threads per rank (mpi_threads.h). */
#include "mpi_threads.h"

#include <mpi.h>
#include <unistd.h>

int fxt_mpi_threads_per_rank(int64_t threads)
{
    MPI_Comm node;
    int local = 1;
    /* Collective whatever `threads` is, so that ranks stay in step. */
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
        MPI_SUCCESS) {
        MPI_Comm_size(node, &local);
        MPI_Comm_free(&node);
    }
    if (threads > 0)
        return (int)threads;
    const long t = sysconf(_SC_NPROCESSORS_ONLN) / (local > 0 ? local : 1);
    return t > 0 ? (int)t : 1;
}
