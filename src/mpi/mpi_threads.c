/* The default thread count of a rank: its share of the CPUs it may use. */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "mpi_internal.h"

/* CPU c of this rank's affinity mask is shared by n_c ranks of the node
 * (their masks hold it too); the rank's share is the sum of 1 / n_c over
 * its CPUs, rounded down: unbound ranks on N CPUs get N / ranks each, ranks
 * bound to their own cores get those cores. A cgroup quota below the mask
 * (fxa_available_cpus() smaller than the mask) is split evenly. */
int fxa_mpi_default_threads(MPI_Comm comm)
{
    MPI_Comm node;
    int local = 1;
    int me = 0;
    const int avail = fxa_available_cpus();
    /* Every collective polled against the default deadline: a peer that
     * never arrives leaves this rank the even split of its CPUs (and the
     * caller's next collective reports the peer). */
    char why[96];
    if (fxa_mpi_check_comm(comm, why, sizeof why) != FXA_OK)
        return avail; /* no peers to share the CPUs with */
    fxa_mpi m;
    memset(&m, 0, sizeof m);
    MPI_Comm_rank(comm, &m.rank);
    m.timeout = fxa_mpi_default_timeout();
    m.timeout = m.timeout > 0.0 ? m.timeout : 60.0;
    if (fxa_mpi_arrive(&m, comm, "the ranks counting their CPUs") != FXA_OK ||
        MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return avail;
    MPI_Comm_size(node, &local);
    MPI_Comm_rank(node, &me);
    cpu_set_t mine;
    CPU_ZERO(&mine);
    /* A machine with more CPUs than a cpu_set_t holds: an even split. */
    const int have_mask = sched_getaffinity(0, sizeof mine, &mine) == 0;
    int all_have = 0;
    if (fxa_mpi_allreduce(&m, &have_mask, &all_have, 1, MPI_INT, MPI_MIN, node,
                          "the ranks' CPU masks") != FXA_OK)
        return avail / local > 1 ? avail / local : 1; /* a peer stopped: the even split */
    cpu_set_t *masks = all_have ? malloc((size_t)local * sizeof *masks) : NULL;
    int ok = masks != NULL;
    int all_ok = 0;
    int share = avail / local;
    if (fxa_mpi_allreduce(&m, &ok, &all_ok, 1, MPI_INT, MPI_MIN, node, "the ranks' CPU masks") ==
            FXA_OK &&
        all_ok &&
        fxa_mpi_allgather(&m, &mine, (int)sizeof mine, masks, MPI_BYTE, node,
                          "the ranks' CPU masks") == FXA_OK) {
        double s = 0;
        for (size_t c = 0; c < CPU_SETSIZE; c++) {
            if (!CPU_ISSET(c, &mine))
                continue;
            int n = 0;
            for (int r = 0; r < local; r++)
                n += CPU_ISSET(c, &masks[r]) != 0;
            s += 1.0 / n;
        }
        share = (int)floor(s + 1e-9);
        if (avail < CPU_COUNT(&mine) && avail / local < share)
            share = avail / local;
    }
    free(masks);
    if (!m.broken)
        MPI_Comm_free(&node);
    return share < 1 ? 1 : share;
}
