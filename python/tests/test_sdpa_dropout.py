"""fxattn.scaled_dot_product_attention with dropout_p > 0: "philox" keep
decisions (seeded from torch's or numpy's RNG) against an fp64 reference
built from fxa_dropout_kept, forward and gradients; "torch" decisions
against torch's math SDPA under the same seed; statistics and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fxattn
from fxattn._capi import core

sdpa = fxattn.scaled_dot_product_attention
SEED_BOUND = 1 << 62


def qkv(b=2, hq=4, hkv=4, sq=9, skv=13, e=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, e, generator=g).to(dtype)
    k = torch.randn(b, hkv, skv, e, generator=g).to(dtype)
    v = torch.randn(b, hkv, skv, e, generator=g).to(dtype)
    return q, k, v


def philox_draw(seed: int):
    """The seed and offset a "philox" call draws after torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return torch.randint(0, SEED_BOUND, (2,), dtype=torch.int64).tolist()


def philox_keep(seed: int, offset: int, p: float, shape) -> torch.Tensor:
    """fxa_dropout_kept of every weight of [B, Hq, Sq, Skv], float64."""
    n = math.prod(shape)
    kept = [core.fxa_dropout_kept(seed, offset, p, e) for e in range(n)]
    return torch.tensor(kept, dtype=torch.float64).reshape(shape)


def reference(q, k, v, keep, p, attn_mask=None, is_causal=False, grad=None):
    """torch's dropout attention in float64 with the given keep decisions:
    (out, (dq, dk, dv) or None)."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    rep = q.shape[-3] // k.shape[-3]
    kk, vv = k.repeat_interleave(rep, -3), v.repeat_interleave(rep, -3)
    s = (q @ kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), -math.inf)
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, -math.inf) if attn_mask.dtype == torch.bool else s + attn_mask.double()
    out = (torch.softmax(s, -1) * keep / (1 - p)) @ vv
    if grad is None:
        return out.detach(), None
    out.backward(grad.double())
    return out.detach(), (q.grad, k.grad, v.grad)


CASES = {
    "plain": {},
    "bool_mask": {"attn_mask": torch.rand(9, 13, generator=torch.Generator().manual_seed(1)) > 0.3},
    "additive_mask": {"attn_mask": torch.randn(2, 1, 9, 13, generator=torch.Generator().manual_seed(2))},
    "causal": {"is_causal": True},
    "gqa": {"hkv": 2, "enable_gqa": True},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_philox_matches_fp64_reference(case):
    """Output and gradients equal the fp64 reference built from
    fxa_dropout_kept of the seed and offset drawn from torch's generator."""
    kw = dict(CASES[case])
    hkv = kw.pop("hkv", 4)
    p = 0.3
    q, k, v = qkv(hkv=hkv)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    seed, offset = philox_draw(11)
    torch.manual_seed(11)
    out = sdpa(q, k, v, dropout_p=p, **kw)
    keep = philox_keep(seed, offset, p, (2, 4, 9, 13))
    assert 0 < keep.mean() < 1
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    want, grads = reference(q, k, v, keep, p, kw.get("attn_mask"), kw.get("is_causal", False), g)
    assert (out.double() - want).abs().max() <= 2e-5 * v.abs().max() / (1 - p)
    got = torch.autograd.grad(out, (q, k, v), g)
    for name, a, b in zip("qkv", got, grads):
        assert (a.double() - b).abs().max() <= 1e-4 * b.abs().max(), name


def test_philox_transposed_views_and_lse_gradient():
    """A [B, S, H, E] view runs as BSHD with the same decisions (they index
    the [B, Hq, Sq, Skv] weights); fxattn.attention's lse gradient path
    takes dropout through the operator too."""
    p = 0.2
    q, k, v = qkv()
    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v))
    seed, offset = philox_draw(4)
    torch.manual_seed(4)
    out = sdpa(qt, kt, vt, dropout_p=p)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5))
    want, grads = reference(q, k, v, philox_keep(seed, offset, p, (2, 4, 9, 13)), p, grad=g)
    assert (out.double() - want).abs().max() <= 2e-5 * v.abs().max() / (1 - p)
    for a, b in zip(torch.autograd.grad(out, (qt, kt, vt), g), grads):
        assert (a.double() - b).abs().max() <= 1e-4 * b.abs().max()
    # the backward operator with a nonzero lse gradient, against the reference's
    so = torch.tensor([seed, offset], dtype=torch.int64)
    x = [t.detach().requires_grad_() for t in (q, k, v)]
    out2, lse, _ = torch.ops.fxattn.attention(*x, 0.0, "bhsd", "auto", True, "fp32", True, "", 0, dropout_p=p, dropout_seed_offset=so)
    assert torch.equal(out2, out.detach())
    g_lse = torch.randn(lse.shape, generator=torch.Generator().manual_seed(6))
    got = torch.autograd.grad((out2, lse), x, (g, g_lse))
    r = [t.detach().double().requires_grad_() for t in (q, k, v)]
    s = r[0] @ r[1].transpose(-1, -2) / 4.0
    keep = philox_keep(seed, offset, p, (2, 4, 9, 13))
    ((torch.softmax(s, -1) * keep / (1 - p)) @ r[2] * g.double()).sum().add((torch.logsumexp(s, -1) * g_lse.double()).sum()).backward()
    for a, b in zip(got, (t.grad for t in r)):
        assert (a.double() - b).abs().max() <= 1e-4 * b.abs().max()


def test_philox_seed_reproduces():
    """torch.manual_seed reproduces a call bit for bit, gradients included;
    another seed changes the output; dropout_p=0 draws nothing and is the
    call without dropout."""
    q, k, v = qkv()

    def run(seed):
        x = [t.clone().requires_grad_() for t in (q, k, v)]
        torch.manual_seed(seed)
        out = sdpa(*x, dropout_p=0.4)
        return out, torch.autograd.grad(out.square().sum(), x)

    (a, ga), (b, gb), (c, _) = run(7), run(7), run(8)
    assert torch.equal(a, b) and all(torch.equal(x, y) for x, y in zip(ga, gb))
    assert not torch.equal(a, c)
    torch.manual_seed(9)
    before = torch.random.get_rng_state()
    assert torch.equal(sdpa(q, k, v, dropout_p=0.0), sdpa(q, k, v))
    assert torch.equal(torch.random.get_rng_state(), before)


def test_dropped_share_is_p():
    """q = k = 0 makes every weight 1/Skv; v = the identity shows each
    weight in the output: dropped ones are 0, kept ones 1/(Skv (1 - p));
    the dropped share is p within 5 sigma."""
    p, n = 0.35, 64
    q = torch.zeros(1, 2, n, n)
    v = torch.eye(n).expand(1, 2, n, n)
    torch.manual_seed(0)
    out = sdpa(q, q, v, dropout_p=p)
    dropped = out == 0
    assert torch.allclose(out[~dropped], torch.tensor(1 / (n * (1 - p))), rtol=1e-6)
    share = dropped.double().mean().item()
    assert abs(share - p) <= 5 * math.sqrt(p * (1 - p) / dropped.numel()), share


@pytest.mark.parametrize("dtype, tol", [(torch.bfloat16, 2**-6), (torch.float16, 2e-3)])
def test_half_inputs(dtype, tol):
    """bfloat16 and float16 inputs run forward and backward, near the fp64
    reference of their (rounded) values."""
    p = 0.25
    q, k, v = (t.requires_grad_() for t in qkv(dtype=dtype))
    seed, offset = philox_draw(2)
    torch.manual_seed(2)
    out = sdpa(q, k, v, dropout_p=p)
    assert out.dtype == dtype
    want, _ = reference(q, k, v, philox_keep(seed, offset, p, (2, 4, 9, 13)), p)
    assert (out.double() - want).abs().max() <= tol * v.abs().max().double() / (1 - p)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(g.dtype == dtype and torch.isfinite(g).all() for g in grads)


def test_errors():
    """float64 inputs with dropout raise UnsupportedError; dropout_p
    outside [0, 1) raises InvalidArgumentError, a RuntimeError as torch's
    SDPA raises; dropout_rng takes "philox" or "torch"."""
    q, k, v = qkv(dtype=torch.float64)
    with pytest.raises(fxattn.UnsupportedError, match="float64"):
        sdpa(q, k, v, dropout_p=0.1)
    q, k, v = qkv()
    for p in (1.5, -0.1, 1.0, float("nan")):
        with pytest.raises(RuntimeError, match="dropout probability"):
            sdpa(q, k, v, dropout_p=p)
        with pytest.raises(fxattn.InvalidArgumentError):
            sdpa(q, k, v, dropout_p=p)
    with pytest.raises(RuntimeError):
        F.scaled_dot_product_attention(q, k, v, dropout_p=1.5)
    with pytest.raises(fxattn.InvalidArgumentError, match="dropout_rng"):
        sdpa(q, k, v, dropout_p=0.1, dropout_rng="numpy")
    with pytest.raises(fxattn.InvalidArgumentError, match="dropout_seed_offset"):
        torch.ops.fxattn.attention(q, k, v, 0.0, "bhsd", "auto", True, "fp32", False, "", 0, dropout_p=0.1)


TORCH_CASES = {
    "plain": {},
    "bool_mask": {"attn_mask": torch.rand(2, 1, 9, 13, generator=torch.Generator().manual_seed(1)) > 0.3},
    "causal": {"is_causal": True},
    "gqa": {"enable_gqa": True},
}


@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_torch_rng_matches_math_sdpa(case):
    """dropout_rng="torch": output and gradients equal torch's math SDPA
    (which torch's default CPU SDPA is, with dropout) under the same
    torch.manual_seed, to fp32 rounding."""
    kw = TORCH_CASES[case]
    p = 0.3
    q, k, v = qkv(hkv=2 if kw.get("enable_gqa") else 4)
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    theirs = [t.clone().requires_grad_() for t in (q, k, v)]
    torch.manual_seed(21)
    out = sdpa(*mine, dropout_p=p, dropout_rng="torch", **kw)
    with sdpa_kernel(SDPBackend.MATH):
        torch.manual_seed(21)
        want = F.scaled_dot_product_attention(*theirs, dropout_p=p, **kw)
    torch.manual_seed(21)
    assert torch.equal(F.scaled_dot_product_attention(q, k, v, dropout_p=p, **kw), want.detach())
    assert (out - want).abs().max() <= 2e-5 * v.abs().max() / (1 - p)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    for a, b in zip(torch.autograd.grad(out, mine, g), torch.autograd.grad(want, theirs, g)):
        assert (a - b).abs().max() <= 1e-4 * b.abs().max()


def test_numpy_inputs():
    """numpy arrays run with dropout: np.random.seed reproduces a call, the
    seed and offset drawn from numpy's global RandomState; "torch"
    decisions equal the torch path's."""
    q, k, v = (t.numpy() for t in qkv())
    p = 0.3
    np.random.seed(5)
    seed, offset = (int(n) for n in np.random.randint(0, SEED_BOUND, size=2, dtype=np.int64))
    np.random.seed(5)
    a = sdpa(q, k, v, dropout_p=p)
    np.random.seed(5)
    b = sdpa(q, k, v, dropout_p=p)
    assert isinstance(a, np.ndarray) and a.dtype == np.float32 and np.array_equal(a, b)
    want, _ = reference(*(torch.from_numpy(t) for t in (q, k, v)), philox_keep(seed, offset, p, (2, 4, 9, 13)), p)
    assert np.abs(a - want.numpy()).max() <= 2e-5 * np.abs(v).max() / (1 - p)
    torch.manual_seed(6)
    c = sdpa(q, k, v, dropout_p=p, dropout_rng="torch")
    torch.manual_seed(6)
    d = sdpa(*(torch.from_numpy(t) for t in (q, k, v)), dropout_p=p, dropout_rng="torch")
    assert np.array_equal(c, d.numpy())


def test_compile_fullgraph():
    """torch.compile(fullgraph=True) traces a call with dropout: the seed
    draw and the keep decisions are graph ops, forward and backward run."""
    torch._dynamo.reset()
    q, k, v = (t.requires_grad_() for t in qkv())

    @torch.compile(fullgraph=True, backend="aot_eager")
    def fn(q, k, v):
        return sdpa(q, k, v, dropout_p=0.3), sdpa(q, k, v, dropout_p=0.3, dropout_rng="torch")

    a, b = fn(q, k, v)
    assert a.shape == b.shape == q.shape and not torch.equal(a, b)
    torch.autograd.grad((a.sum(), b.sum()), (q, k, v))
    torch.manual_seed(1)
    c, _ = fn(q, k, v)
    torch.manual_seed(1)
    d, _ = fn(q, k, v)
    assert torch.equal(c, d)


def test_operator_opcheck_with_dropout():
    """torch.library.opcheck of the operator with dropout (seed and offset,
    or keep decisions): schema, fake implementation and autograd agree."""
    q, k, v = (t.requires_grad_() for t in qkv())
    args = (q, k, v, 0.0, "bhsd", "auto", True, "fp32", True, "", 0, None, False, False, 0.3)
    so = torch.tensor([12, 34], dtype=torch.int64)
    torch.library.opcheck(torch.ops.fxattn.attention.default, args + (so, None))
    keep = (torch.rand(2, 4, 9, 13, generator=torch.Generator().manual_seed(0)) > 0.3).to(torch.uint8)
    torch.library.opcheck(torch.ops.fxattn.attention.default, args + (None, keep))
