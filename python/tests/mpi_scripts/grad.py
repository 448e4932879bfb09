"""Run under mpirun -np P: the gradients of fxattn.mpi.attention on every
grid of P ranks against one process's fxattn.attention backward on the full
tensors (the same seeded data on every rank) and against an fp64 torch
reference. Prints 'OK rank R cases N'; a failure aborts the job (MPI_Abort).

The loss is sum(out * W) (+ sum(lse * Wl) with return_lse, so that lse's
gradient enters). Tolerances (eps = 2^-24):
- pure Ulysses (R = 1) with whole kv heads per rank: 0, bit for bit one
  process's fxattn.attention (the forward and the backward run the
  single-process kernels on whole sequences of a rank's heads, the
  backward on the forward's lse parts as one process's does; the library
  guarantees both).
- ring, 2-D, and replicated kv heads (heads_kv < U): 1e-5 max |gradient of
  the tensor|. The ring changes the order of the forward's sums over the
  key blocks (out and lse within 4 n eps of one process, n = Skv <= 40:
  < 1e-5 relative) and the backward sums R parts of dQ, dK, dV; replicas
  add at most U parts of a kv head's dK, dV: each part rounds once at eps
  of a magnitude within a few times the largest gradient, as
  test_mpi_bwd's bound.
- vs fp64: test_autograd's envelope, 4x the error of the same formula
  evaluated by torch in fp32 plus 2^-20 max |reference|.
- bf16 inputs (GQA, every grid): gradients in bf16 within test_autograd's
  envelope for bf16 inputs, 2^-6 max |fp64 gradient|, of the fp64
  reference on the same bf16 values (W rounded to bf16 as out's gradient
  is): the backward takes D = dO . O on the output as returned, rounded to
  bf16 (2^-9 relative per element; measured up to ~2^-8 of max |dq|), the
  fp32 arithmetic adds ~1e-6 relative and the gradients' own rounding to
  bf16 2^-9. With compute="bf16"
  (P, dS and dO rounded to bf16, ~2^-8 of each product): within
  test_autograd's bf16-compute envelope, 2^-5 max |fp64 gradient|. In both
  computes, bit for bit fxattn.attention's gradients in the same compute on
  pure Ulysses grids with whole kv heads (the backward takes the output as
  rounded to bf16, as fxattn.attention's does).
- saturated softmax (scale 1e4 and 1e6: scores up to ~1e7, every row runs
  online softmax, lse of that magnitude): the same tolerances, and against
  fp64 the envelope gains test_large_masks_grads' floor, 8 eps times the
  size of one rounding of each gradient's terms (dQ: scale |dO| |v| |k|,
  dK: Sq scale |dO| |v| |q|, dV: Sq |dO|, with |dO| |v| + |g_lse| where
  lse's gradient enters): torch gets a one-hot row's dS exactly 0, any
  other order of rounding a few of those units. The backward rebuilds P
  from the forward's lse parts, never from the lse rounded at its
  magnitude (that puts P's largest weight off by up to |lse| 2^-24: 2e-3
  of dv at scale 1e4, 100x this floor).
"""

import sys
import traceback

import torch
from mpi4py import MPI

import fxattn
import fxattn.mpi as fm

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
grid_rank = fm.rank(comm)
cases = 0

# (batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, layout, return_lse)
CASES = [
    (1, 4, 4, 13, 11, 16, "bshd", False),
    (2, 4, 2, 9, 14, 8, "bhsd", False),  # GQA (replicated at U = 4)
    (1, 4, 1, 10, 7, 8, "bshd", True),  # MQA (replicated at U > 1), lse's gradient
    (1, 4, 4, 17, 15, 8, "bhsd", True),
    (1, 4, 2, 1, 3, 8, "bshd", True),  # empty shards: one query token, three keys
]
# (case, scale): saturated softmax
SATURATED = [
    ((1, 4, 2, 12, 10, 8, "bhsd", False), 1e4),
    ((1, 4, 4, 11, 13, 8, "bshd", True), 1e6),
]


def grids(p):
    return [(u, p // u) for u in range(1, p + 1) if p % u == 0]


def seq_axis(layout):
    return 1 if layout == "bshd" else 2


def cut(x, n, layout):
    start, length = fm.shard(n, grid_rank, P)
    return x.narrow(seq_axis(layout), start, length)


def manual(q, k, v, scale, layout, dtype):
    """out, lse of attention in dtype by torch (GQA by repeat), fxattn's layouts."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    if layout == "bshd":
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = scale * q @ k.transpose(-1, -2)
    lse = torch.logsumexp(s, -1)
    out = torch.softmax(s, -1) @ v
    return (out.transpose(1, 2) if layout == "bshd" else out), lse


def grads(fn, tensors, w, wl, dtype=None):
    leaves = [t.detach().clone().to(dtype or t.dtype).requires_grad_() for t in tensors]
    out, lse = fn(*leaves)
    loss = (out.to(w.dtype if dtype is None else dtype) * w.to(dtype or w.dtype)).sum()
    if wl is not None:
        loss = loss + (lse.to(dtype or lse.dtype) * wl.to(dtype or wl.dtype)).sum()
    loss.backward()
    return [t.grad for t in leaves]


def units(q, k, v, w, wl, scale, sq):
    """8 eps times one rounding of dQ's, dK's and dV's terms (the docstring)."""
    nq, nk, nv, nw = (t.norm(dim=-1).max().item() for t in (q, k, v, w))
    s = scale * (nw * nv + (0.0 if wl is None else wl.abs().max().item()))
    return tuple(8 * 2.0**-24 * x for x in (s * nk, sq * s * nq, sq * nw))


def run_case(u, r, case, scale=None):
    global cases
    b, hq, hkv, sq, skv, d, layout, rl = case
    g = torch.Generator().manual_seed(1000 + cases)
    shape = (lambda h, s: (b, s, h, d)) if layout == "bshd" else (lambda h, s: (b, h, s, d))
    q = torch.randn(shape(hq, sq), generator=g)
    k = torch.randn(shape(hkv, skv), generator=g)
    v = torch.randn(shape(hkv, skv), generator=g)
    w = torch.randn(shape(hq, sq), generator=g)
    wl = torch.randn((b, hq, sq), generator=g) if rl else None
    given = scale
    scale = scale or d**-0.5

    def one(q_, k_, v_):
        res = fxattn.attention(q_, k_, v_, scale=given, layout=layout, return_lse=rl, threads=1)
        return res if rl else (res, None)

    ref = grads(one, (q, k, v), w, wl)
    shards = [cut(q, sq, layout), cut(k, skv, layout), cut(v, skv, layout)]

    def dist(q_, k_, v_):
        res = fm.attention(q_, k_, v_, comm, ulysses=u, ring=r, scale=given, layout=layout, return_lse=rl, threads=1)
        return res if rl else (res, None)

    wl_r = None if wl is None else wl.narrow(2, *fm.shard(sq, grid_rank, P))
    got = grads(dist, shards, cut(w, sq, layout), wl_r)
    exact = r == 1 and hkv >= u
    for name, x, full, n in zip("qkv", got, ref, (sq, skv, skv)):
        want = cut(full, n, layout)
        assert x.dtype == torch.float32 and x.shape == want.shape, (name, x.dtype, x.shape, want.shape)
        if exact:
            assert torch.equal(x, want), f"grid {u}x{r} case {case}: d{name} not bit for bit one process's"
        else:
            err = (x - want).abs().max().item() if x.numel() else 0.0
            tol = 1e-5 * full.abs().max().item()
            assert err <= tol, f"grid {u}x{r} case {case}: d{name} err {err:.3g} > {tol:.3g}"
    # fp64 envelope (the whole problem: this rank's shard of it)
    fn64 = lambda a, bb, c: manual(a, bb, c, scale, layout, torch.float64)  # noqa: E731
    fn32 = lambda a, bb, c: manual(a, bb, c, scale, layout, torch.float32)  # noqa: E731
    r64 = grads(fn64, (q, k, v), w.double(), None if wl is None else wl.double())
    r32 = grads(fn32, (q, k, v), w, wl)
    floors = units(q, k, v, w, wl, scale, sq) if given else (0.0, 0.0, 0.0)
    for name, x, t64, t32, n, floor in zip("qkv", got, r64, r32, (sq, skv, skv), floors):
        t64, t32 = cut(t64, n, layout), cut(t32, n, layout)
        err = (x.double() - t64).abs().max().item() if x.numel() else 0.0
        allow = 0.0
        if x.numel():
            allow = 4 * (t32.double() - t64).abs().max().item() + 2**-20 * t64.abs().max().item() + floor
        assert err <= allow, f"grid {u}x{r} case {case}: d{name} vs fp64 {err:.3g} > envelope {allow:.3g}"
    cases += 1


def run_bf16(u, r, compute):
    global cases
    b, hq, hkv, sq, skv, d = 1, 4, 2, 12, 10, 8
    g = torch.Generator().manual_seed(2000 + cases)
    q = torch.randn(b, sq, hq, d, generator=g).bfloat16()
    k = torch.randn(b, skv, hkv, d, generator=g).bfloat16()
    v = torch.randn(b, skv, hkv, d, generator=g).bfloat16()
    w = torch.randn(b, sq, hq, d, generator=g).bfloat16()

    def dist(q_, k_, v_):
        return fm.attention(q_, k_, v_, comm, ulysses=u, ring=r, layout="bshd", threads=1, compute=compute), None

    got = grads(dist, [cut(t, n, "bshd") for t, n in ((q, sq), (k, skv), (v, skv))], cut(w, sq, "bshd").float(), None)
    fn64 = lambda a, bb, c: manual(a, bb, c, d**-0.5, "bshd", torch.float64)  # noqa: E731
    r64 = grads(fn64, (q, k, v), w.double(), None, torch.float64)
    if r == 1 and hkv % u == 0:
        one = lambda a, bb, c: (fxattn.attention(a, bb, c, layout="bshd", threads=1, compute=compute), None)  # noqa: E731
        same = grads(one, (q, k, v), w.float(), None)
        for name, x, t, n in zip("qkv", got, same, (sq, skv, skv)):
            assert torch.equal(x, cut(t, n, "bshd")), f"grid {u}x{r} bf16 inputs, {compute} compute: d{name} not one process's bytes"
    for name, x, t64, n in zip("qkv", got, r64, (sq, skv, skv)):
        want = cut(t64, n, "bshd")
        assert x.dtype == torch.bfloat16 and x.shape == want.shape, (name, x.dtype, x.shape)
        err = (x.double() - want).abs().max().item() if x.numel() else 0.0
        tol = (2**-6 if compute == "fp32" else 2**-5) * t64.abs().max().item()
        assert err <= tol, f"grid {u}x{r} bf16 inputs, {compute} compute: d{name} vs fp64 {err:.3g} > {tol:.3g}"
    cases += 1


def main():
    for u, r in grids(P):
        for case in CASES:
            run_case(u, r, case)
        for case, scale in SATURATED:
            run_case(u, r, case, scale)
        run_bf16(u, r, "fp32")
        run_bf16(u, r, "bf16")
    # requires_grad on one rank only: the same error on every rank, no hang
    q = torch.randn(1, 4, 4, 8)
    x = [cut(q, 4, "bshd").clone() for _ in range(3)]
    if rank == 0:
        x[0].requires_grad_()
    try:
        fm.attention(*x, comm, ulysses=P, layout="bshd", threads=1)
        raise AssertionError("grad on one rank did not raise")
    except fxattn.InvalidArgumentError as e:
        assert "ranks disagree on requires_grad" in str(e), str(e)
        print(f"error [grad on one rank] {e}", flush=True)
    # double backward (a gradient penalty): first-order gradients under create_graph, then a clear error
    x = [cut(q, 4, "bshd").clone().requires_grad_() for _ in range(3)]
    out = fm.attention(*x, comm, ulysses=P, layout="bshd", threads=1)
    (dq,) = torch.autograd.grad(out.square().sum(), x[0], create_graph=True)
    try:
        dq.square().sum().backward()
        raise AssertionError("double backward did not raise")
    except fxattn.UnsupportedError as e:
        assert "fxattn has no second-order gradients" in str(e), str(e)
        print(f"error [double backward] rank {rank} {e}", flush=True)
    print(f"OK rank {rank} cases {cases}", flush=True)


try:
    main()
except BaseException:
    traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    comm.Abort(1)
fm.release()
