"""Run under mpirun -np P: fxattn.mpi.attention(reproducible=True) on every
U x R grid of P ranks returns, byte for byte, this rank's rows of
fxattn.attention(reproducible=True) on one process over the whole tensors
(the same seeded data on every rank): numpy and torch, both layouts, GQA,
bf16 compute, S not a multiple of 256 (short last group) and S below 256 P
(ranks without tokens); its shards are fxattn.mpi.shard(...,
reproducible=True)'s, and other shards are refused; a call recording
autograd raises UnsupportedError. Prints 'OK rank R cases N'; an assertion
failure aborts the job (MPI_Abort) so no rank hangs."""

import sys
import traceback

import numpy as np
import torch
from mpi4py import MPI

import fxattn
import fxattn.mpi as fm

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
grid_rank = fm.rank(comm)
cases = 0


def cut(x, start, n, layout):
    return x[:, start : start + n] if layout == "bshd" else x[:, :, start : start + n]


def case(kind, layout, s, hq, hkv, dtype="float32", compute="auto", seed=0):
    global cases
    g = np.random.default_rng(seed)

    def make(h, spread):
        shape = (1, s, h, 32) if layout == "bshd" else (1, h, s, 32)
        x = (spread * g.standard_normal(shape)).astype(np.float32)
        return torch.from_numpy(x).to(getattr(torch, dtype)) if kind == "torch" else x

    q, k, v = make(hq, 2.0), make(hkv, 2.0), make(hkv, 1.0)
    kw = dict(layout=layout, compute=compute, threads=1, reproducible=True, return_lse=True)
    one, one_lse = fxattn.attention(q, k, v, **kw)
    start, n = fm.shard(s, grid_rank, P, reproducible=True)
    for u in [u for u in range(1, P + 1) if P % u == 0]:
        sl = [cut(t, start, n, layout) for t in (q, k, v)]
        out, lse = fm.attention(*sl, comm, ulysses=u, ring=P // u, **kw)
        want, want_lse = cut(one, start, n, layout), one_lse[:, :, start : start + n]
        same = lambda a, b: np.array_equal(*(np.asarray(t.float() if kind == "torch" else t) for t in (a, b)))  # noqa: E731
        assert same(out, want) and same(lse, want_lse), f"{kind} {layout} S {s} {dtype}: grid {u}x{P // u} differs"
        cases += 1


def main():
    case("numpy", "bshd", 700, 4, 2, seed=1)  # GQA; groups 256, 256, 188
    case("torch", "bhsd", 600, 4, 4, seed=2)
    case("torch", "bshd", 520, 4, 2, dtype="bfloat16", compute="bf16", seed=3)
    case("numpy", "bshd", 300, 2, 2, seed=4)  # two groups: with P 4, two ranks hold no token
    # Shards other than the canonical split are refused on every rank.
    x = np.ones((1, 700, 2, 8), np.float32)
    start, n = fm.shard(700, grid_rank, P)
    try:
        fm.attention(*(x[:, start : start + n] for _ in range(3)), comm, layout="bshd", reproducible=True)
        raise AssertionError("even shards were taken with reproducible=True")
    except fxattn.InvalidArgumentError as e:
        assert "reproducible=True" in str(e), e
    t = torch.ones((1, 256 if grid_rank == 0 else 0, 2, 8), requires_grad=True)
    try:
        fm.attention(t, t, t, comm, layout="bshd", reproducible=True)
        raise AssertionError("autograd was taken with reproducible=True")
    except fxattn.UnsupportedError as e:
        assert "not reproducible across grids yet" in str(e), e
    fm.release(comm)
    print(f"OK rank {rank} cases {cases}", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        comm.Abort(1)
