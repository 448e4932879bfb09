"""Run under mpirun -np P: the gradients of fxattn.mpi.attention on every
grid of P ranks against one process's fxattn.attention backward on the full
tensors (the same seeded data on every rank) and against an fp64 torch
reference. Prints 'OK rank R cases N'; a failure aborts the job (MPI_Abort).

The loss is sum(out * W) (+ sum(lse * Wl) with return_lse, so that lse's
gradient enters). Tolerances (eps = 2^-24):
- pure Ulysses (R = 1) with whole kv heads per rank: 0, bit for bit one
  process's forward and backward operators with P rebuilt from the lse
  (the forward and the backward run the single-process kernels on whole
  sequences of a rank's heads; the library guarantees both; the
  distributed backward takes no lse parts).
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


def lse_only(q, k, v, w, wl, layout, compute="fp32"):
    """One process's gradients with P rebuilt from the lse alone, as
    fxa_mpi_attn_bwd_run rebuilds it (it takes no lse parts): the forward
    and the backward operators on the full tensors, w (wl) the gradient of
    out (lse)."""
    opts = (0.0, layout, "auto", True, compute)
    out, lse, _ = torch.ops.fxattn.attention(q, k, v, *opts, True, "", 1)
    g = torch.ops.fxattn.attention_backward(w.to(out.dtype), q, k, v, out, lse, *opts, 1, wl)
    return list(g)


def run_case(u, r, case):
    global cases
    b, hq, hkv, sq, skv, d, layout, rl = case
    g = torch.Generator().manual_seed(1000 + cases)
    shape = (lambda h, s: (b, s, h, d)) if layout == "bshd" else (lambda h, s: (b, h, s, d))
    q = torch.randn(shape(hq, sq), generator=g)
    k = torch.randn(shape(hkv, skv), generator=g)
    v = torch.randn(shape(hkv, skv), generator=g)
    w = torch.randn(shape(hq, sq), generator=g)
    wl = torch.randn((b, hq, sq), generator=g) if rl else None
    scale = d**-0.5

    def one(q_, k_, v_):
        res = fxattn.attention(q_, k_, v_, layout=layout, return_lse=True if rl else False, threads=1)
        return res if rl else (res, None)

    ref = grads(one, (q, k, v), w, wl)
    shards = [cut(q, sq, layout), cut(k, skv, layout), cut(v, skv, layout)]

    def dist(q_, k_, v_):
        res = fm.attention(q_, k_, v_, comm, ulysses=u, ring=r, layout=layout, return_lse=rl, threads=1)
        return res if rl else (res, None)

    wl_r = None if wl is None else wl.narrow(2, *fm.shard(sq, grid_rank, P))
    got = grads(dist, shards, cut(w, sq, layout), wl_r)
    exact = r == 1 and hkv >= u
    same = lse_only(q, k, v, w, wl, layout) if exact else ref
    for name, x, full, n, s in zip("qkv", got, ref, (sq, skv, skv), same):
        want = cut(s if exact else full, n, layout)
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
    for name, x, t64, t32, n in zip("qkv", got, r64, r32, (sq, skv, skv)):
        t64, t32 = cut(t64, n, layout), cut(t32, n, layout)
        err = (x.double() - t64).abs().max().item() if x.numel() else 0.0
        allow = 4 * (t32.double() - t64).abs().max().item() + 2**-20 * t64.abs().max().item() if x.numel() else 0.0
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

    got = grads(dist, [cut(t, n, "bshd") for t, n in ((q, sq), (k, skv), (v, skv))], cut(w, sq, "bshd").float(),
                None)
    fn64 = lambda a, bb, c: manual(a, bb, c, d**-0.5, "bshd", torch.float64)  # noqa: E731
    r64 = grads(fn64, (q, k, v), w.double(), None, torch.float64)
    if r == 1 and hkv % u == 0:
        same = lse_only(q, k, v, w, None, "bshd", compute)
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
