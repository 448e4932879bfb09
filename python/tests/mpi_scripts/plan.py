"""Run under mpirun -np 2: fxattn.mpi.plan and grid="auto".

- plan with everything given (nothing measured) picks the fastest of its
  grids, and its grids are the library's cost model (fxa_grid_cost) for
  those figures; every rank gets the same plan.
- plan with everything measured: this job's one host has a link inside it
  (measured), none between hosts (the assumed figures stay), a positive
  compute rate; the pick is a grid of 2 ranks, the fastest of its grids.
- attention(grid="auto") runs the grid that plan picks for the call's
  shape: its output equals attention(ulysses=U, ring=R) bit for bit.
- bad arguments raise the same InvalidArgumentError on every rank.
Prints 'OK rank R plan' on success; a failure aborts the job.
"""

import sys
import traceback

import numpy as np
from mpi4py import MPI

import fxattn
import fxattn.mpi as fm
from fxattn.mpi import handles

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()


def same_everywhere(what, x):
    xs = comm.allgather(x)
    assert all(y == xs[0] for y in xs), f"{what} differs across ranks: {xs}"


def given():
    inter = fm.Link(20e-6, 1.25e9)
    intra = fm.Link(1e-5, 1e9)
    p = fm.plan(comm, 1024, 2, 64, rank_gflops=5, inter=inter, intra=intra, measure_call=False, hosts=1)
    assert p.measured == frozenset(), p.measured
    assert (p.ranks, p.hosts, p.inter, p.intra) == (P, 1, inter, intra), p
    assert p.rank_flops == 5e9 and p.call_seconds == 0, p
    assert [(u, r) for u, r, *_ in p.grids] == [(u, P // u) for u in range(1, P + 1) if P % u == 0]
    fastest = min(p.grids, key=lambda g: g[2])
    assert (p.ulysses, p.ring, p.seconds) == fastest[:3], (p, fastest)
    if P == 2:  # docs/cluster.md's case worked by hand: ring 1 x 2
        assert abs(p.grids[0][2] - (0.0536870912 + 1e-5)) <= 1e-9, p.grids
    same_everywhere("the given plan", p)


def measured():
    p = fm.plan(comm, 512, 2, 64, threads=1)
    assert {"intra", "intra_cpu", "compute", "call"} <= p.measured, p.measured
    assert "inter" not in p.measured and p.inter == fm.Link(20e-6, 10e9 / 8), p.inter
    assert p.hosts == 1 and p.ranks == P and not p.uneven_hosts, p
    assert p.rank_flops > 0 and p.intra.bytes_per_second > 0, p
    assert p.ulysses * p.ring == P and p.seconds == min(g[2] for g in p.grids), p
    same_everywhere("the measured plan", p)


def auto():
    s, h, d = 96, 2, 32
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, s, h, d), dtype=np.float32) for _ in range(3))
    g = fm.rank(comm)
    start, n = fm.shard(s, g, P)
    qs, ks, vs = (x[:, start : start + n] for x in (q, k, v))
    out = fm.attention(qs, ks, vs, comm, layout="bshd", grid="auto", threads=1)
    picks = handles.auto_picks
    assert len(picks) == 1, picks
    ((u, r),) = picks.values()
    assert u * r == P, (u, r)
    want = fm.attention(qs, ks, vs, comm, layout="bshd", ulysses=u, ring=r, threads=1)
    assert np.array_equal(out, want), "grid='auto' differs from its grid"
    again = fm.attention(qs, ks, vs, comm, layout="bshd", grid="auto", threads=1)
    assert np.array_equal(again, out) and len(handles.auto_picks) == 1


def expect_bad(what, fn, needle):
    msg = None
    try:
        fn()
    except fxattn.InvalidArgumentError as e:
        msg = str(e)
    msgs = comm.allgather(msg)
    assert all(m is not None and m == msgs[0] for m in msgs), f"{what}: {msgs}"
    assert needle in msgs[0], f"{what}: {needle!r} not in {msgs[0]!r}"


def errors():
    x = np.zeros((1, 48, 2, 32), np.float32)
    expect_bad("grid 1x2", lambda: fm.attention(x, x, x, comm, layout="bshd", grid="1x2"), "grid must be None or 'auto'")
    expect_bad("grid with ring", lambda: fm.attention(x, x, x, comm, layout="bshd", grid="auto", ring=P), "give one or the other")
    expect_bad("seq 0", lambda: fm.plan(comm, 0, 2, 32), "seq")
    expect_bad("bad link", lambda: fm.plan(comm, 64, 2, 32, inter=(1, 2)), "fxattn.mpi.Link")
    expect_bad("3 hosts", lambda: fm.plan(comm, 64, 2, 32, rank_gflops=1, hosts=3, ranks=2, measure_call=False), "divide")


try:
    given()
    measured()
    auto()
    errors()
    print(f"OK rank {rank} plan", flush=True)
except Exception:  # noqa: BLE001
    traceback.print_exc()
    sys.stdout.flush()
    comm.Abort(1)
