"""Run under mpirun -np P (P >= 2): the last rank stops taking part (it
sleeps, as a stopped or hung peer would) while the others call
fxattn.mpi.attention(timeout=T) and then parallelize's token gather with
the same deadline. Each calling rank must raise fxattn.PeerTimeoutError
within about T seconds of each call; it prints

    TIMEOUT <what> rank R after X s: <message>

and, when both calls timed out, the calling ranks meet on their own
communicator and rank 0 ends the job (MPI_Abort, as the package's docs
ask after a timeout). Anything else (a result, another exception) prints
WRONG and aborts at once.
"""

import sys
import time
import traceback

import numpy as np
import torch
from mpi4py import MPI

import fxattn
import fxattn.mpi as fm
from fxattn.integrations.diffusers import context_parallel as _cp_plan

T = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
absent = P - 1
# Set up collectively while every rank is there: one communicator per call
# (a timed-out request stays posted on its communicator), the grid ranks of
# the gather's communicator, and the calling ranks' own communicator.
comm_attn, comm_gather = comm.Dup(), comm.Dup()
fm.rank(comm_gather)
callers = comm.Split(0 if rank != absent else MPI.UNDEFINED, rank)


def timed(what, fn):
    t0 = time.monotonic()
    try:
        fn()
    except fxattn.PeerTimeoutError as e:
        print(f"TIMEOUT {what} rank {rank} after {time.monotonic() - t0:.2f} s: {e}", flush=True)
        return
    except BaseException:  # noqa: BLE001
        print(f"WRONG {what} rank {rank}: another exception", flush=True)
        traceback.print_exc()
        sys.stdout.flush()
        comm.Abort(2)
    print(f"WRONG {what} rank {rank}: returned without the absent peer", flush=True)
    comm.Abort(3)


def main():
    if rank == absent:
        time.sleep(600)  # never calls; the job ends from rank 0
        return
    x = np.random.default_rng(0).standard_normal((1, 2 * P, 2, 8)).astype(np.float32)
    start, n = fm.shard(2 * P, rank, P)  # one host: grid rank = rank
    shard = x[:, start : start + n]
    timed("attention", lambda: fm.attention(shard, shard, shard, comm_attn, layout="bshd", threads=1, timeout=T))
    tokens = torch.from_numpy(shard.reshape(1, n, -1).copy())
    timed("gather", lambda: _cp_plan._gather(comm_gather, tokens, 1, list(range(P)), T))
    callers.Barrier()
    if callers.Get_rank() == 0:
        print("ALL CALLERS TIMED OUT", flush=True)
        comm.Abort(0)


if __name__ == "__main__":
    main()
