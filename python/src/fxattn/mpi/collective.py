"""The package's own collectives over an mpi4py communicator: each is
non-blocking and polled against a deadline (wait), so that a dead, stopped
or absent peer fails every waiting rank with PeerTimeoutError; and the
agreement by which every rank raises the lowest failing rank's error."""

from __future__ import annotations

import pickle
import time

import numpy as np

from .. import _capi
from .._capi.mpi import MPI, PLACE_HOSTS, PLACE_RANKS, mpi
from .._common import validate

bad = validate.bad


_PLACEMENTS = {"hosts": PLACE_HOSTS, "ranks": PLACE_RANKS}


def placement_code(placement) -> int:
    if not isinstance(placement, str) or placement not in _PLACEMENTS:
        raise bad(f"placement must be 'hosts' or 'ranks', not {placement!r}")
    return _PLACEMENTS[placement]


def timeout_seconds(timeout) -> float:
    """A timeout= argument: None ($FXA_MPI_TIMEOUT or 60, as the library
    takes it) or a positive number of seconds up to 1e9."""
    if timeout is None:
        t = float(mpi.fxa_mpi_default_timeout())
        if t <= 0:
            raise bad("FXA_MPI_TIMEOUT is not a positive number of seconds")
        return t
    t = validate.positive_real("timeout", timeout)
    if t > 1e9:
        raise bad(f"timeout must be a positive number of seconds up to 1e9, not {timeout!r}")
    return t


def wait(comm, request, timeout: float, what: str) -> None:
    """Complete the non-blocking MPI request, polling it until timeout
    seconds have passed; then raise PeerTimeoutError (the request stays
    posted: end the job). Every collective of the package goes through
    this, so a dead, stopped or absent peer fails every waiting rank."""
    deadline = time.monotonic() + timeout
    pause = 1e-5
    while not request.Test():
        if time.monotonic() > deadline:
            raise _capi.PeerTimeoutError(
                f"rank {comm.Get_rank()}: {what}: not every rank of the communicator took part within "
                f"{timeout:g} s (a peer is dead, stopped or did not make the same call); end the job",
                _capi.TIMEOUT,
            )
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


def allgather_int(comm, value: int, timeout: float, what: str) -> list:
    """Every rank's int value, by rank (an MPI_Iallgather under the deadline)."""
    mine = np.array([value], np.int64)
    every = np.empty(comm.Get_size(), np.int64)
    wait(comm, comm.Iallgather([mine, MPI.INT64_T], [every, MPI.INT64_T]), timeout, what)
    return [int(x) for x in every]


def allgather_object(comm, obj, timeout: float, what: str) -> list:
    """Every rank's picklable obj, by rank (two MPI_Iallgather(v) calls
    under the deadline)."""
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = allgather_int(comm, data.size, timeout, what)
    displs = [sum(sizes[:r]) for r in range(len(sizes))]
    recv = np.empty(sum(sizes), np.uint8)
    wait(comm, comm.Iallgatherv([data, MPI.BYTE], [recv, (sizes, displs), MPI.BYTE]), timeout, what)
    return [pickle.loads(recv[d : d + n].tobytes()) for d, n in zip(displs, sizes)]


def agree_local(comm, local_error, timeout: float, what: str) -> None:
    """Every rank raises the lowest failing rank's local error (one
    allgather under the deadline)."""
    for r, err in enumerate(allgather_object(comm, local_error, timeout, what)):
        if err is not None:
            cls, status, message = err
            raise cls(f"rank {r}: {message}", status)


def local_error(e: Exception):
    if isinstance(e, _capi.FxattnError):
        return (type(e), e.status, str(e))
    return (_capi.InvalidArgumentError, _capi.INVALID_ARG, f"{type(e).__name__}: {e}")
