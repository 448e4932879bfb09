/* Waits with a deadline (see mpi_internal.h): a peer that stops making
 * progress (a cut link, a frozen or dead host) fails the call instead of
 * hanging it. MPI has no timeout of its own on a blocked operation, so
 * every wait of the library polls its requests. */
#include <string.h>
#include <time.h>

#include "mpi_internal.h"

/* Sleeps between polls: 10 us, doubling up to 160 us. MPI moves data only
 * while a rank is inside MPI: over TCP every rendezvous handshake and every
 * collective round waits for the peer's next poll, so the longest pause is
 * a latency added to each of them (with pauses up to 1.28 ms, the calls on 4
 * hosts at 200 Mbit took 1.2-1.5x longer and the fixed cost of a call was
 * 65 ms instead of 23). Polls every 160 us at most cost a waiting rank a few
 * percent of a core. */
static void pause_briefly(int *us)
{
    const struct timespec ts = {0, (long)*us * 1000L};
    nanosleep(&ts, NULL);
    if (*us < 160)
        *us *= 2;
}

/* fxa_mpi_wait, pausing between polls (sleep) or not. */
static fxa_status poll_requests(fxa_mpi *m, int n, MPI_Request *reqs, int peer, const char *what,
                                int sleep)
{
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    int idx[FXA_MPI_MAX_WAIT];
    double last = MPI_Wtime();
    int us = 10;
    for (;;) {
        /* Windows of at most FXA_MPI_MAX_WAIT requests (MPI_Testsome's
         * index array lives on the stack). */
        int pending = 0;
        int progressed = 0;
        for (int at = 0; at < n; at += FXA_MPI_MAX_WAIT) {
            const int len = n - at < FXA_MPI_MAX_WAIT ? n - at : FXA_MPI_MAX_WAIT;
            int done = 0;
            if (MPI_Testsome(len, reqs + at, &done, idx, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
                return fxa_mpi_fail(m, FXA_ERR_MPI, "MPI failed while waiting for %s", what);
            if (done == MPI_UNDEFINED)
                continue; /* every request of the window complete */
            pending = 1;
            progressed |= done > 0;
        }
        if (!pending)
            return FXA_OK;
        const double now = MPI_Wtime();
        if (progressed) {
            last = now;
            us = 10;
            continue;
        }
        if (now - last > m->timeout) {
            m->broken = 1;
            if (peer >= 0)
                return fxa_mpi_fail(
                    m, FXA_ERR_TIMEOUT, "rank %d: no progress from rank %d for %g s (%s)",
                    fxa_mpi_name(m, m->rank), fxa_mpi_name(m, peer), m->timeout, what);
            return fxa_mpi_fail(m, FXA_ERR_TIMEOUT,
                                "rank %d: no progress from the other ranks for %g s (%s)",
                                fxa_mpi_name(m, m->rank), m->timeout, what);
        }
        if (sleep)
            pause_briefly(&us);
    }
}

fxa_status fxa_mpi_wait(fxa_mpi *m, int n, MPI_Request *reqs, int peer, const char *what)
{
    return poll_requests(m, n, reqs, peer, what, 1);
}

fxa_status fxa_mpi_spin(fxa_mpi *m, int n, MPI_Request *reqs, int peer, const char *what)
{
    return poll_requests(m, n, reqs, peer, what, 0);
}

fxa_status fxa_mpi_allreduce(fxa_mpi *m, const void *in, void *out, int n, MPI_Datatype t,
                             MPI_Op op, MPI_Comm comm, const char *what)
{
    MPI_Request r;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    if (MPI_Iallreduce(in, out, n, t, op, comm, &r) != MPI_SUCCESS)
        return fxa_mpi_fail(m, FXA_ERR_MPI, "MPI_Iallreduce failed (%s)", what);
    return fxa_mpi_wait(m, 1, &r, -1, what);
}

fxa_status fxa_mpi_bcast(fxa_mpi *m, void *buf, int n, MPI_Datatype t, int root, MPI_Comm comm,
                         const char *what)
{
    MPI_Request r;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    if (MPI_Ibcast(buf, n, t, root, comm, &r) != MPI_SUCCESS)
        return fxa_mpi_fail(m, FXA_ERR_MPI, "MPI_Ibcast failed (%s)", what);
    return fxa_mpi_wait(m, 1, &r, root, what);
}

fxa_status fxa_mpi_allgather(fxa_mpi *m, const void *in, int n, void *out, MPI_Datatype t,
                             MPI_Comm comm, const char *what)
{
    MPI_Request r;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    if (MPI_Iallgather(in, n, t, out, n, t, comm, &r) != MPI_SUCCESS)
        return fxa_mpi_fail(m, FXA_ERR_MPI, "MPI_Iallgather failed (%s)", what);
    return fxa_mpi_wait(m, 1, &r, -1, what);
}

fxa_status fxa_mpi_arrive(fxa_mpi *m, MPI_Comm comm, const char *what)
{
    MPI_Request r;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    if (MPI_Ibarrier(comm, &r) != MPI_SUCCESS)
        return fxa_mpi_fail(m, FXA_ERR_MPI, "MPI_Ibarrier failed (%s)", what);
    return fxa_mpi_wait(m, 1, &r, -1, what);
}

fxa_status fxa_mpi_dup(fxa_mpi *m, MPI_Comm comm)
{
    MPI_Request r;
    MPI_Comm dup = MPI_COMM_NULL;
    m->comm = MPI_COMM_NULL;
    if (MPI_Comm_idup(comm, &dup, &r) != MPI_SUCCESS)
        return fxa_mpi_fail(m, FXA_ERR_MPI, "MPI_Comm_dup failed");
    const fxa_status st = fxa_mpi_wait(m, 1, &r, -1, "the ranks creating the context");
    if (st == FXA_OK)
        m->comm = dup;
    return st;
}

fxa_status fxa_mpi_wait_all(int n, MPI_Request *reqs, double timeout_seconds, int spin)
{
    if (n < 0 || (n > 0 && !reqs) || !(timeout_seconds >= 0.0) || timeout_seconds > 1e9)
        return FXA_ERR_INVALID_ARG;
    fxa_mpi m;
    memset(&m, 0, sizeof m);
    m.timeout = timeout_seconds > 0.0 ? timeout_seconds : fxa_mpi_default_timeout();
    if (m.timeout == 0.0)
        return FXA_ERR_INVALID_ARG;
    return poll_requests(&m, n, reqs, -1, "requests", !spin);
}
