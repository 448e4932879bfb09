"""Finite additive masks of any size, and the backward where a row's lse is
large, against torch's SDPA math backend in float64 on the same inputs.

The envelope, per output (the forward's out, dq, dk, dv): fxattn's largest
error against the fp64 reference is at most 10x the largest error of torch's
own math SDPA in the same dtype (fp32, or bf16 for bf16 inputs, measured on
the same inputs), plus a floor of a few units of the dtype's rounding
(eps * max|reference|) for outputs that torch happens to get exactly (a
one-hot row's P). The math backend differentiates the softmax itself, so its
gradients are those of the function the forward computes; torch's default
CPU backward rebuilds P from a rounded lse (as fxattn's did) and is not the
reference here.

test_property_* draw their cases from a seeded generator (masks: bool,
additive with finfo.min, -1e30, +1e6 and mixed magnitudes, padded rows and
keys; scales; value magnitudes; fp32 and bf16; small shapes): a case that
fails prints its seed.
"""

import math
import random

import pytest

torch = pytest.importorskip("torch")

import fxattn  # noqa: E402
from fxattn.attn import torch_op  # noqa: E402,F401  (registers the operators)

F = torch.nn.functional
FMIN = torch.finfo(torch.float32).min
EPS = {torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8}


def _run(fn, q, k, v, dout, mask, scale, dtype):
    leaves = [t.to(dtype).detach().requires_grad_() for t in (q, k, v)]
    m = mask if mask is None or mask.dtype == torch.bool else mask.to(torch.float64 if dtype == torch.float64 else torch.float32)
    out = fn(*leaves, attn_mask=m, scale=scale)
    out.backward(dout.to(out.dtype))
    return [out.detach().double()] + [t.grad.double() for t in leaves]


def _units(q, k, v, dout, scale):
    """The size of one rounding of each output's terms: out sums P v (|v|),
    dQ sums scale dS k over keys (P sums to 1), dK and dV sum over up to Sq
    queries (dS ~ |dO| |v|): torch may get an output exactly (a one-hot
    row's dS is 0 in it) where another order of rounding gives a few of
    these."""
    n = [t.norm(dim=-1).max().item() for t in (q, k, v, dout)]
    s = (scale or q.shape[-1] ** -0.5) * n[3] * n[2]
    sq = q.shape[2]
    return n[2], s * n[1], sq * s * n[0], sq * n[3]


def _check(q, k, v, dout, mask=None, scale=None, dtype=torch.float32, what=""):
    """fxattn's out, dq, dk, dv within 10x torch math SDPA's own error in
    dtype (plus a floor) of fp64 math SDPA's; returns the errors."""
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref = _run(F.scaled_dot_product_attention, q, k, v, dout, mask, scale, torch.float64)
        env = _run(F.scaled_dot_product_attention, q, k, v, dout, mask, scale, dtype)
    got = _run(fxattn.scaled_dot_product_attention, q, k, v, dout, mask, scale, dtype)
    errs = []
    for name, g, r, t, unit in zip(("out", "dq", "dk", "dv"), got, ref, env, _units(q, k, v, dout, scale)):
        assert torch.isfinite(g).all(), f"{what}: {name} is not finite"
        err = (g - r).abs().max().item()
        allow = 10 * (t - r).abs().max().item() + 8 * EPS[dtype] * unit
        assert err <= allow, f"{what}: {name} error {err:.3g} > {allow:.3g} (torch {dtype}: {(t - r).abs().max().item():.3g})"
        errs.append(err)
    return errs


def _qkvd(b, h, sq, skv, d, seed, mag=1.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, sq, d, generator=g) * mag
    k = torch.randn(b, h, skv, d, generator=g) * mag
    v = torch.randn(b, h, skv, d, generator=g)
    dout = torch.randn(b, h, sq, d, generator=g)
    return q, k, v, dout


def _row_mask(s, value, rows=(3,)):
    m = torch.zeros(s, s)
    for r in rows:
        m[r] = value
    return m


@pytest.mark.parametrize("value", [FMIN, -3e38, -2.4e38])
def test_mask_values_past_fp32_base2_range_are_finite(value):
    """Every key of row 3 at a value whose base-2 form (value log2 e) is past
    fp32: the row is the softmax over those keys (uniform: the scores are
    absorbed, as in fp32 and fp64 SDPA), not a row of zeros."""
    q, k, v, dout = _qkvd(1, 2, 8, 8, 16, seed=1)
    out = fxattn.scaled_dot_product_attention(q, k, v, attn_mask=_row_mask(8, value))
    torch.testing.assert_close(out[0, :, 3], v[0].mean(1), rtol=1e-6, atol=1e-6)
    _check(q, k, v, dout, _row_mask(8, value), what=f"row at {value}")


def test_mask_values_below_the_range_keep_their_order():
    """Keys at finfo.min and at -3e38 in one row: only the -3e38 keys count
    (the others are 2.6e37 lower), as in SDPA."""
    q, k, v, dout = _qkvd(1, 1, 8, 8, 16, seed=2)
    m = torch.full((8, 8), FMIN)
    m[:, 1] = -3e38
    m[:, 6] = -3e38
    out = fxattn.scaled_dot_product_attention(q, k, v, attn_mask=m)
    torch.testing.assert_close(out[0, 0], ((v[0, 0, 1] + v[0, 0, 6]) / 2).expand(8, 16), rtol=1e-6, atol=1e-6)
    _check(q, k, v, dout, m, what="finfo.min and -3e38")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "case",
    ["padded finfo.min", "padded -1e30", "key padding finfo.min", "one-hot 1e3", "one-hot 1e6", "scale 1e4", "scale 1e6", "mixed"],
)
def test_backward_exact_where_the_lse_is_large(case, dtype):
    """Rows whose lse is large (padded rows at any finite mask value, a key
    raised by 1e3 or 1e6, a saturated softmax, rows of mixed magnitudes): the
    backward rebuilds the forward's P from its lse parts, not from the fp32
    lse rounded at the lse's magnitude."""
    s = 8
    q, k, v, dout = _qkvd(2, 2, s, s, 16, seed=3)
    mask, scale = None, None
    if case.startswith("padded"):
        mask = _row_mask(s, FMIN if "finfo" in case else -1e30, rows=(2, 5))
    elif case == "key padding finfo.min":
        mask = torch.zeros(2, 1, 1, s)
        mask[0, ..., 5:] = FMIN
        mask[1] = FMIN  # a sample with every key padded
        mask = mask.expand(2, 2, s, s)
    elif case.startswith("one-hot"):
        mask = torch.zeros(s, s)
        mask[:, 4] = float(case.split()[1])
    elif case.startswith("scale"):
        scale = float(case.split()[1])
    else:
        mask = torch.randn(s, s) * torch.tensor([1e-3, 1.0, 1e3, 1e6, -1e6, 0.0, 30.0, -1e30])[:, None]
    _check(q, k, v, dout, mask, scale, dtype, what=case)


def test_backward_refuses_an_lse_that_is_not_the_forwards():
    """A finite lse far below the forward's makes a recomputed P exceed 1:
    the backward raises with the library's message instead of returning NaN
    or wrong gradients."""
    q, k, v, dout = _qkvd(1, 2, 16, 16, 16, seed=4, mag=4.0)
    out, lse, _ = torch.ops.fxattn.attention(q, k, v, 0.0, "bhsd", "auto", True, "fp32", True, "", 0)
    args = (0.0, "bhsd", "auto", True, "fp32", 0)
    torch.ops.fxattn.attention_backward(dout, q, k, v, out, lse, *args)  # the forward's: accepted
    with pytest.raises(fxattn.InvalidArgumentError, match="lse is not the forward's"):
        torch.ops.fxattn.attention_backward(dout, q, k, v, out, lse - 200.0, *args)
    with pytest.raises(fxattn.InvalidArgumentError, match="lse is not the forward's"):
        torch.ops.fxattn.attention_backward(dout, q, k, v, out, torch.zeros_like(lse) - 1e4, *args)


# ---- the property-based test: a seeded generator of cases -------------------

_MASK_VALUES = [0.0, -1.0, 30.0, 1e3, -1e3, 1e6, -1e6, -1e30, FMIN, -3e38]


def _random_mask(rng, b, h, sq, skv):
    kind = rng.choice(["none", "bool", "additive", "padded rows", "key padding", "one-hot", "mixed"])
    if kind == "none":
        return None, kind
    if kind == "bool":
        m = torch.tensor([[rng.random() < 0.7 for _ in range(skv)] for _ in range(sq)])
        return m, kind
    if kind == "additive":
        vals = [rng.choice(_MASK_VALUES) for _ in range(sq * skv)]
        return torch.tensor(vals, dtype=torch.float32).reshape(sq, skv), kind
    big = rng.choice([FMIN, -1e30, -1e6, -3e38, -2.4e38])
    if kind == "padded rows":
        m = torch.zeros(sq, skv)
        for r in rng.sample(range(sq), max(1, sq // 3)):
            m[r] = big
        return m, f"{kind} {big:g}"
    if kind == "key padding":
        m = torch.zeros(b, 1, 1, skv)
        for i in range(b):
            m[i, ..., rng.randrange(1, skv + 1) :] = big
        if rng.random() < 0.5:
            m[0] = big  # a sample with every key padded
        return m.expand(b, h, sq, skv), f"{kind} {big:g}"
    if kind == "one-hot":
        m = torch.zeros(sq, skv)
        m[:, rng.randrange(skv)] = rng.choice([1e3, 1e6, 3e4])
        return m, kind
    # rows of random values of one magnitude each; past 1e30 negative only
    # (values above 2^120 are refused) and within fp32
    mags = torch.tensor([abs(rng.choice(_MASK_VALUES[1:])) for _ in range(sq)])[:, None]
    m = torch.randn(sq, skv, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))).double() * mags
    m = torch.where(mags > 1e30, -m.abs().clamp(max=-FMIN), m)
    return m.float(), kind


def _property_case(seed):
    rng = random.Random(seed)
    b, h = rng.choice([1, 2]), rng.choice([1, 2])
    sq, skv, d = rng.randrange(1, 12), rng.randrange(1, 12), rng.choice([4, 8, 16])
    mag = rng.choice([1.0, 1.0, 4.0, 0.01])
    scale = rng.choice([None, None, 1.0, 30.0, 1e4, 1e6 / d])
    dtype = rng.choice([torch.float32, torch.bfloat16])
    q, k, v, dout = _qkvd(b, h, sq, skv, d, seed, mag)
    mask, kind = _random_mask(rng, b, h, sq, skv)
    what = f"seed {seed}: {b}x{h}x{sq}x{skv}x{d} |x|~{mag} scale {scale} {dtype} mask {kind}"
    return (q, k, v, dout, mask, scale, dtype), what


@pytest.mark.parametrize("block", range(4))
def test_property_forward_and_gradients_match_fp64_sdpa(block):
    """40 seeded cases per block (160 in all, a few seconds)."""
    for seed in range(block * 40, block * 40 + 40):
        args, what = _property_case(seed)
        _check(*args, what=what)


def test_property_generator_covers_the_cases():
    """The generator draws every mask kind, both dtypes and the large scales."""
    seen = set()
    for seed in range(160):
        (q, k, v, dout, mask, scale, dtype), what = _property_case(seed)
        seen.add(what.split(" mask ")[1].split()[0])
        seen.add(str(dtype))
        seen.add("big scale" if scale is not None and scale >= 1e4 / 16 else "")
    assert {"none", "bool", "additive", "padded", "key", "one-hot", "mixed", "big scale"} <= seen
    assert {str(torch.float32), str(torch.bfloat16)} <= seen
    assert math.isfinite(FMIN)
