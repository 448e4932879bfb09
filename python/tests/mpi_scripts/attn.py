"""Run under mpirun -np P: fxattn.mpi.attention on every grid of P ranks
against one process's fxattn.attention on the full tensors (the same seeded
data on every rank) and an fp64 numpy reference, then the collective error
paths. Exits 0 and prints 'OK rank R cases N' on success; an assertion
failure aborts the job (MPI_Abort) so no rank hangs.

Tolerances (eps = 2^-24, fp32 unit roundoff):
- pure Ulysses (R = 1): 0, bit for bit (each rank runs the single-process
  kernels on whole sequences of its heads; the library guarantees it).
- ring and 2-D vs one process: the only difference is the order in which a
  row's sums over the R key blocks are added. For the denominator l (a sum
  of n = Skv positive terms) reordering changes it by at most 2 (n-1) eps l
  (both orders within (n-1) eps of the exact sum), for the numerator by at
  most 2 (n-1) eps l max|v|; so |d out| <= 4 n eps max|v| and
  |d lse| <= 2 n eps + eps |lse| (one rounding of the log).
- vs fp64: scores err by at most D eps scale max|q| max|k| (fp32 dot
  products, |q|, |k| the row norms) = e_s, which moves the softmax weights
  by a factor within exp(+-2 e_s), so |d out| <= 2 (2 e_s + 4 n eps) max|v|
  (with the summation term above) and |d lse| <= 2 e_s + 2 n eps + eps |lse|.
- bf16 outputs: the fp32 tolerance plus one bf16 rounding (2^-8 |ref|).
"""

import sys
import traceback

import numpy as np
import torch
from mpi4py import MPI

import fxattn
import fxattn.mpi as fm

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
grid_rank = fm.rank(comm)  # the rank to shard by (placed by hosts; FXA_MPI_TEST_HOSTS fakes hosts)
EPS = 2.0**-24
cases = 0


def grids(p):
    return [(u, p // u) for u in range(1, p + 1) if p % u == 0]


def ref64(q, k, v, scale, layout):
    """fp64 attention and lse, layouts as fxattn's; GQA by head repeat."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    if layout == "bshd":
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    g = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = scale * q @ k.transpose(0, 1, 3, 2)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    denom = p.sum(-1, keepdims=True)
    out = (p / denom) @ v
    lse = (m + np.log(denom))[..., 0]
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    return out, lse


def seq_axis(layout):
    return 1 if layout == "bshd" else 2


def cut(x, start, n, layout):
    ax = seq_axis(layout)
    idx = [slice(None)] * 4
    idx[ax] = slice(start, start + n)
    return x[tuple(idx)]


def f32(x):
    return x.float().numpy() if isinstance(x, torch.Tensor) else np.asarray(x, np.float32)


def check(name, got, want, tol):
    got, want = f32(got), f32(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    err = float(np.max(np.abs(got - want))) if got.size else 0.0
    assert err <= tol, f"{name}: max |diff| {err:.3g} > tol {tol:.3g}"


def case(kind, layout, sq, skv, hq, hkv, d, dtype="float32", compute="fp32", strided=False, seed=0):
    global cases
    rng = np.random.default_rng(seed)
    ax = seq_axis(layout)

    def make(s, h):
        shape = [1, 0, 0, d]
        shape[ax], shape[3 - ax] = s, h
        return (rng.standard_normal(shape) * 1.5).astype(np.float32)

    q, k, v = make(sq, hq), make(skv, hkv), make(skv, hkv)
    if dtype == "bfloat16":  # round once so every path sees the same values
        q, k, v = (torch.from_numpy(t).bfloat16().float().numpy() for t in (q, k, v))
    elif dtype == "float16":
        q, k, v = (t.astype(np.float16).astype(np.float32) for t in (q, k, v))
    scale = 1.0 / np.sqrt(d)
    r64, l64 = ref64(q, k, v, scale, layout)

    def conv(t):
        if kind == "numpy":
            return t if dtype == "float32" else t.astype(np.float16)
        return torch.from_numpy(t).to(getattr(torch, dtype))

    Q, K, V = conv(q), conv(k), conv(v)
    one, one_lse = fxattn.attention(Q, K, V, layout=layout, compute=compute, return_lse=True, threads=1)
    q0, nq = fm.shard(sq, grid_rank, P)
    k0, nk = fm.shard(skv, grid_rank, P)
    qs, ks, vs = cut(Q, q0, nq, layout), cut(K, k0, nk, layout), cut(V, k0, nk, layout)
    if strided:  # a non-contiguous view of the shard: copied inside
        qs = qs.transpose(1, 2).contiguous().transpose(1, 2)
        assert not qs.is_contiguous()
    vmax = float(np.abs(v).max())
    qn = float(np.linalg.norm(q, axis=-1).max())
    kn = float(np.linalg.norm(k, axis=-1).max())
    e_s = d * EPS * scale * qn * kn
    lmax = float(np.abs(l64).max())
    low = 0.0 if dtype == "float32" else 2.0**-8 * float(np.abs(r64).max())
    if dtype == "float16":
        low = 2.0**-11 * float(np.abs(r64).max())
    if compute == "bf16":  # bf16 products and P: compare to one process only
        e_s = None
    for u, r in grids(P):
        out, lse = fm.attention(qs, ks, vs, comm, ulysses=u, ring=r, layout=layout, compute=compute, return_lse=True, threads=1)
        label = f"{kind} {dtype} {layout} Sq={sq} Skv={skv} Hq={hq} Hkv={hkv} U={u} R={r} rank {rank}"
        assert type(out) is type(Q), f"{label}: output kind {type(out)}"
        assert out.dtype == Q.dtype, f"{label}: output dtype {out.dtype} != {Q.dtype}"
        assert tuple(lse.shape) == (1, hq, nq), f"{label}: lse shape {tuple(lse.shape)}"
        want, want_lse = cut(one, q0, nq, layout), one_lse[:, :, q0 : q0 + nq]
        if r == 1:
            check(label + " out vs one process (bitwise)", out, want, 0.0)
            check(label + " lse vs one process (bitwise)", lse, want_lse, 0.0)
        else:
            check(label + " out vs one process", out, want, 4 * skv * EPS * vmax + 2 * low)
            check(label + " lse vs one process", lse, want_lse, 2 * skv * EPS + EPS * lmax)
        if e_s is not None:
            tol = 2 * (2 * e_s + 4 * skv * EPS) * vmax + low
            check(label + " out vs fp64", out, cut(r64, q0, nq, layout), tol)
            check(label + " lse vs fp64", lse, l64[:, :, q0 : q0 + nq], 2 * e_s + 2 * skv * EPS + EPS * lmax)
        cases += 1


def expect_error(what, fn, cls, needle):
    """fn must raise cls on every rank with one and the same message."""
    msg = None
    try:
        fn()
    except cls as e:
        msg = str(e)
    except Exception as e:  # noqa: BLE001
        msg = f"WRONG {type(e).__name__}: {e}"
    msgs = comm.allgather(msg)
    assert all(m is not None for m in msgs), f"{what}: some rank did not raise: {msgs}"
    assert len(set(msgs)) == 1, f"{what}: messages differ across ranks: {msgs}"
    assert not msgs[0].startswith("WRONG"), f"{what}: {msgs[0]}"
    assert needle in msgs[0], f"{what}: {needle!r} not in {msgs[0]!r}"
    if rank == 0:
        print(f"error [{what}]: {msgs[0]}", flush=True)


def errors():
    rng = np.random.default_rng(1)
    s = 4 * P + 1
    x = rng.standard_normal((1, s, 2, 8)).astype(np.float32)
    q0, n = fm.shard(s, grid_rank, P)
    good = x[:, q0 : q0 + n]
    # rank P-1 drops two tokens: the sum and the split no longer agree
    bad = good[:, :-2] if rank == P - 1 else good
    expect_error(
        "wrong shard length",
        lambda: fm.attention(bad, bad, bad, comm, layout="bshd", threads=1),
        fxattn.InvalidArgumentError,
        "are not fxattn.mpi.shard's split",
    )
    # only the key/value shards are wrong
    expect_error(
        "wrong k/v shard length",
        lambda: fm.attention(good, bad, bad, comm, layout="bshd", threads=1),
        fxattn.InvalidArgumentError,
        "key/value shard lengths",
    )
    # a bad dtype on one rank only: its message, prefixed with its rank
    odd = good.astype(np.int32) if rank == P - 1 else good
    expect_error(
        "dtype on one rank",
        lambda: fm.attention(odd, odd, odd, comm, layout="bshd", threads=1),
        fxattn.InvalidArgumentError,
        f"rank {P - 1}: q has dtype int32",
    )
    # a NaN in one rank's shard: the library's agreed error
    nan = good.copy()
    if rank == P - 1:
        nan[0, 0, 0, 0] = np.nan
    expect_error("NaN on one rank", lambda: fm.attention(good, nan, good, comm, layout="bshd", threads=1), fxattn.InvalidArgumentError, "K")
    # a grid that does not match the communicator (from fxa_mpi_create)
    expect_error(
        "grid", lambda: fm.attention(good, good, good, comm, layout="bshd", ulysses=P, ring=2, threads=1), fxattn.InvalidArgumentError, ""
    )
    # an unknown placement on one rank
    where = "nowhere" if rank == P - 1 else "hosts"
    expect_error(
        "placement",
        lambda: fm.attention(good, good, good, comm, layout="bshd", threads=1, placement=where),
        fxattn.InvalidArgumentError,
        "placement must be 'hosts' or 'ranks'",
    )
    # float16 outputs that overflow on one rank only (grid rank P-1's queries
    # pick the one key whose value is 1e5; the others average it over s
    # keys, below 65504): the same error on every rank
    hot, spike = np.zeros((3, 1, s, 2, 8), np.float32), fm.shard(s, P - 1, P)
    hot[0, :, spike[0] : spike[0] + spike[1], :, 0] = 10  # q
    hot[1, :, 0, :, 0] = 10  # k
    hot[2, :, 0] = 1e5  # v
    hq, hk, hv = (t[:, q0 : q0 + n] for t in hot)
    expect_error(
        "float16 overflow on one rank",
        lambda: fm.attention(hq, hk, hv, comm, layout="bshd", threads=1, out_dtype="float16"),
        fxattn.InvalidArgumentError,
        "out_dtype float16: the output holds values up to",
    )
    # the handle still works after all that
    out = fm.attention(good, good, good, comm, layout="bshd", threads=1)
    check("after errors", out, cut(fxattn.attention(x, x, x, threads=1, layout="bshd"), q0, n, "bshd"), 4 * s * EPS * 4)


def disagree():
    """Options that differ on ranks 1 and 2 (each its own value), a dtype
    on one rank (named, not coded), float64 on one rank (which libfxattn_mpi
    does not run) and a torch/numpy mix on one rank: one message on every
    rank."""
    x = np.random.default_rng(2).standard_normal((1, 2 * P, 2, 8)).astype(np.float32)
    q0, n = fm.shard(2 * P, grid_rank, P)
    s = x[:, q0 : q0 + n]
    scale = {1: 0.5, 2: 0.25}.get(rank, None)
    expect_error(
        "options on two ranks",
        lambda: fm.attention(s, s, s, comm, layout="bshd", threads=1, scale=scale),
        fxattn.InvalidArgumentError,
        "ranks disagree on options: rank 0 has",
    )
    half = s.astype(np.float16) if rank == 2 else s
    expect_error(
        "a dtype on one rank",
        lambda: fm.attention(half, half, half, comm, layout="bshd", threads=1),
        fxattn.InvalidArgumentError,
        "ranks disagree on dtype: rank 0 has 'float32', rank 2 has 'float16'",
    )
    wide = s.astype(np.float64) if rank == 2 else s
    expect_error(
        "float64 on one rank",
        lambda: fm.attention(wide, wide, wide, comm, layout="bshd", threads=1),
        fxattn.UnsupportedError,
        "rank 2: fxattn.mpi.attention takes float32, bfloat16 or float16 inputs, not float64",
    )
    k = torch.from_numpy(s) if rank == 1 else s
    expect_error(
        "torch and numpy mixed",
        lambda: fm.attention(s, k, s, comm, layout="bshd", threads=1),
        fxattn.InvalidArgumentError,
        "rank 1: q, k and v must be all torch tensors or all numpy arrays",
    )
    # inputs that autograd records on one rank only: the backward is
    # collective, so every rank refuses
    t = torch.from_numpy(s.copy()).requires_grad_(rank == 1)
    expect_error(
        "inputs requiring grad on one rank",
        lambda: fm.attention(t, t, t, comm, layout="bshd", threads=1),
        fxattn.InvalidArgumentError,
        "ranks disagree on requires_grad: rank 0 has False, rank 1 has True",
    )
    with torch.no_grad():
        fm.attention(t, t, t, comm, layout="bshd", threads=1)
    fm.release(comm)
    print(f"OK rank {rank} cases 0", flush=True)


def check_placement():
    """fm.rank: comm's order with placement "ranks"; with "hosts", the order
    of FXA_MPI_TEST_HOSTS's labels (by world rank): hosts by their lowest
    rank, rank order within a host; comm's order when the variable is unset
    (one host)."""
    import os

    assert fm.rank(comm, "ranks") == rank, f"placement ranks: {fm.rank(comm, 'ranks')} on rank {rank}"
    labels = [int(x) for x in os.environ.get("FXA_MPI_TEST_HOSTS", ",".join(["0"] * P)).split(",")]
    first = {lab: labels.index(lab) for lab in labels}
    order = sorted(range(P), key=lambda r: (first[labels[r]], r))
    assert grid_rank == order.index(rank), f"rank {rank}: grid rank {grid_rank}, expected {order.index(rank)}"
    if rank == 0:
        print(f"placement by hosts {labels}: grid ranks {comm.allgather(grid_rank)}", flush=True)
    else:
        comm.allgather(grid_rank)


def main():
    check_placement()
    s = 3 * P + 1  # S % P != 0 for P = 2, 4
    case("numpy", "bshd", s, s, 4, 4, 16)
    case("numpy", "bhsd", s, 2 * P - 1, 4, 2, 16, seed=1)  # GQA, Skv != Sq
    case("torch", "bshd", s + 2, s + 2, 4, 1, 8, seed=2)  # MQA: K/V heads replicated over U
    case("torch", "bshd", s, s, 4, 4, 16, strided=True, seed=3)
    case("torch", "bshd", s, s, 4, 4, 16, dtype="bfloat16", seed=4)
    case("torch", "bhsd", s, s, 4, 4, 16, dtype="bfloat16", compute="bf16", seed=5)
    case("numpy", "bshd", s, s, 4, 4, 16, dtype="float16", seed=6)
    case("numpy", "bshd", P - 1, P - 1, 4, 4, 8, seed=7)  # one rank holds no token
    errors()
    # default threads (fxa_mpi_default_threads) and the handle cache
    x = np.random.default_rng(8).standard_normal((1, 2 * P, 2, 8)).astype(np.float32)
    q0, n = fm.shard(2 * P, grid_rank, P)
    a = fm.attention(x[:, q0 : q0 + n], x[:, q0 : q0 + n], x[:, q0 : q0 + n], comm, layout="bshd", ulysses=P)
    b = fm.attention(x[:, q0 : q0 + n], x[:, q0 : q0 + n], x[:, q0 : q0 + n], comm, layout="bshd", ulysses=P)
    assert fm.default_threads(comm) >= 1
    check("repeat", a, b, 0.0)
    check("default threads", a, cut(fxattn.attention(x, x, x, threads=1, layout="bshd"), q0, n, "bshd"), 0.0)
    fm.release(comm)
    print(f"OK rank {rank} cases {cases}", flush=True)


if __name__ == "__main__":
    try:
        disagree() if sys.argv[1:] == ["disagree"] else main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        comm.Abort(1)
