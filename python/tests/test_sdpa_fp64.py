"""float64 q, k, v: computed in fp64 by the library (FXA_F64, FXA_COMPUTE_FP64),
forward and backward, for torch tensors and numpy arrays, against torch's
math SDPA in float64 on the same inputs; and torch.autograd.gradcheck on
fxattn itself.

Tolerances: fxattn's fp64 path and torch's math SDPA in float64 are both
double-precision evaluations of the same sums (scores, exponentials, the
weighted sum of v and its normalisation; for the gradients P, dP, dS and
their products), only in other orders and with other shifts (fixed-max
bound against the row maximum). Each is within a few hundred units of
2^-53 (1.1e-16) of the exact result at these sizes (D <= 16, Skv <= 12), so
1e-12 (forward) and 1e-10 (gradients, one more product and sum) leave a
margin of about 10^3-10^4, while one fp32 rounding anywhere (6e-8: an input,
a mask value, the lse) fails them by four orders of magnitude.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention import bias as attn_bias

import fxattn

FWD = dict(rtol=1e-12, atol=1e-12)
GRAD = dict(rtol=1e-10, atol=1e-10)
F64 = torch.float64
F64_MIN = torch.finfo(F64).min


def qkv(b=2, hq=4, hkv=4, sq=9, skv=12, e=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, e, generator=g, dtype=F64)
    k = torch.randn(b, hkv, skv, e, generator=g, dtype=F64)
    v = torch.randn(b, hkv, skv, e, generator=g, dtype=F64)
    dout = torch.randn(b, hq, sq, e, generator=g, dtype=F64)
    return q, k, v, dout


def reference(q, k, v, **kw):
    """torch's math SDPA in float64 (a causal bias as the bool mask it stands for)."""
    mask = kw.pop("attn_mask", None)
    if isinstance(mask, attn_bias.CausalBias):
        sq, skv = mask.seq_len_q, mask.seq_len_kv
        lower_right = mask.variant == attn_bias.CausalVariant.LOWER_RIGHT
        mask = torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq if lower_right else 0)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


def additive_mask(sq, skv, seed=5, min_row=None):
    """A float64 mask of values that float32 cannot hold (rounding them
    moves the output by ~1e-8), a key masked with -inf in every row, a row
    of -inf (every key masked: 0, in fxattn as in torch's math SDPA) and,
    with min_row, that row at float64's most negative value (its softmax is
    uniform: the scores are absorbed)."""
    g = torch.Generator().manual_seed(seed)
    m = torch.randn(sq, skv, generator=g, dtype=F64) * 3.0
    m[:, 2] = -torch.inf
    m[sq - 2] = -torch.inf
    if min_row is not None:
        m[min_row] = F64_MIN
    return m


def bool_mask(sq, skv, seed=6):
    """A random bool mask with one fully masked row (0 in fxattn and torch)."""
    m = torch.rand(sq, skv, generator=torch.Generator().manual_seed(seed)) > 0.4
    m[:, 0] = True
    m[4] = False
    return m


# Each case: (shape keywords of qkv, call keywords of scaled_dot_product_attention).
CASES = {
    "plain": ({}, {}),
    "bool": ({}, {"attn_mask": bool_mask(9, 12)}),
    "additive": ({}, {"attn_mask": additive_mask(9, 12)}),
    "additive_float32": ({}, {"attn_mask": additive_mask(9, 12).float()}),
    "additive_min_row": ({}, {"attn_mask": additive_mask(9, 12, min_row=3)}),
    "broadcast_mask": ({}, {"attn_mask": additive_mask(9, 12)[None, None].expand(2, 1, 9, 12)}),
    "causal": ({}, {"is_causal": True}),
    "causal_upper_left": ({}, {"attn_mask": attn_bias.causal_upper_left(9, 12)}),
    "causal_lower_right": ({}, {"attn_mask": attn_bias.causal_lower_right(9, 12)}),
    "gqa": ({"hkv": 2}, {"enable_gqa": True}),
    "gqa_causal": ({"hkv": 1}, {"enable_gqa": True, "is_causal": True}),
    "negative_scale": ({}, {"scale": -0.7}),
    "zero_scale": ({}, {"scale": 0.0}),
    "large_scale": ({}, {"scale": 3.0}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_fp64_sdpa(case):
    shape, kw = CASES[case]
    q, k, v, _ = qkv(**shape)
    out = fxattn.scaled_dot_product_attention(q, k, v, **kw)
    ref = reference(q, k, v, **kw)
    assert out.dtype == F64 and out.shape == ref.shape and out.stride() == ref.stride()
    torch.testing.assert_close(out, ref, **FWD)


def test_mask_rows_at_float64_min_and_fully_masked():
    """The row at finfo(float64).min is the mean of v (every score absorbed),
    the row of -inf and the all-False bool row are 0."""
    q, k, v, _ = qkv(b=1, hq=2, hkv=2)
    out = fxattn.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask(9, 12, min_row=3))
    torch.testing.assert_close(out[0, :, 3], v[0].mean(1), **FWD)
    assert not out[0, :, 7].any()
    out = fxattn.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask(9, 12))
    assert not out[0, :, 4].any()


def test_additive_float64_mask_is_not_rounded_to_float32():
    """A mask difference below float32's resolution at the mask's magnitude
    changes the output as in torch: the float64 mask is read in double."""
    q, k, v, _ = qkv(b=1, hq=1, hkv=1)
    m = torch.full((9, 12), 1000.0, dtype=F64)
    m[:, 1] += 1e-6  # 1000 + 1e-6 is 1000 in float32
    out = fxattn.scaled_dot_product_attention(q, k, v, attn_mask=m)
    torch.testing.assert_close(out, reference(q, k, v, attn_mask=m), **FWD)
    assert not torch.equal(out, fxattn.scaled_dot_product_attention(q, k, v, attn_mask=m.float()))


def test_non_contiguous_inputs():
    """A transposed [B, S, H, E] view (output in that memory format, as SDPA's)
    and every second head of a tensor, read with their strides."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, s, 4, 16, generator=g, dtype=F64).transpose(1, 2) for s in (9, 12, 12))
    out = fxattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert out.stride() == F.scaled_dot_product_attention(q, k, v, is_causal=True).stride()  # the default kernel's layout
    torch.testing.assert_close(out, reference(q, k, v, is_causal=True), **FWD)
    q, k, v = (torch.randn(2, 8, s, 16, generator=g, dtype=F64)[:, ::2] for s in (9, 12, 12))
    torch.testing.assert_close(fxattn.scaled_dot_product_attention(q, k, v), reference(q, k, v), **FWD)


def test_numpy_float64():
    q, k, v, _ = qkv(hkv=2)
    qn, kn, vn = (t.numpy() for t in (q, k, v))
    m = additive_mask(9, 12)
    for kw, tkw in (
        ({}, {}),
        ({"attn_mask": m.numpy()}, {"attn_mask": m}),
        ({"attn_mask": bool_mask(9, 12).numpy()}, {"attn_mask": bool_mask(9, 12)}),
    ):
        out = fxattn.scaled_dot_product_attention(qn, kn, vn, enable_gqa=True, **kw)
        assert isinstance(out, np.ndarray) and out.dtype == np.float64
        np.testing.assert_allclose(out, reference(q, k, v, enable_gqa=True, **tkw).numpy(), **FWD)
    big_endian = [t.astype(">f8") for t in (qn, kn, vn)]
    assert np.array_equal(
        fxattn.scaled_dot_product_attention(*big_endian, enable_gqa=True), fxattn.scaled_dot_product_attention(qn, kn, vn, enable_gqa=True)
    )


@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_attention_float64_and_its_lse(kind):
    """fxattn.attention: a float64 output and a float64 lse, the natural-log
    log-sum-exp of the scaled scores."""
    q, k, v, _ = qkv(hkv=2)
    args = (q, k, v) if kind == "torch" else tuple(t.numpy() for t in (q, k, v))
    out, lse = fxattn.attention(*args, layout="bhsd", scale=0.3, return_lse=True)
    assert out.dtype == lse.dtype == (F64 if kind == "torch" else np.float64)
    kk = k.repeat_interleave(2, 1)
    want_lse = torch.logsumexp(0.3 * q @ kk.transpose(-1, -2), -1)
    torch.testing.assert_close(torch.as_tensor(lse), want_lse, **FWD)
    torch.testing.assert_close(torch.as_tensor(out), reference(q, k, v, scale=0.3, enable_gqa=True), **FWD)


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradients_match_fp64_sdpa(case):
    """Gradients within 1e-10 of torch's math backward in float64, the row
    at finfo(float64).min included (its P is the forward's, uniform)."""
    shape, kw = CASES[case]
    q, k, v, dout = qkv(**shape)
    got, want = [], []
    for fn, grads in ((fxattn.scaled_dot_product_attention, got), (reference, want)):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*leaves, **kw).backward(dout)
        grads += [t.grad for t in leaves]
    for name, g, w in zip("qkv", got, want):
        assert g.dtype == F64
        torch.testing.assert_close(g, w, **GRAD, msg=lambda m, name=name: f"{case}: d{name}: {m}")


def _small(hq=2, hkv=2, sq=5, skv=5, e=4, seed=11):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, s, e, generator=g, dtype=F64, requires_grad=True) for h, s in ((hq, sq), (hkv, skv), (hkv, skv)))


GRADCHECK = {
    "plain": ({}, {}),
    "causal": ({}, {"is_causal": True}),
    "causal_lower_right": ({"sq": 4, "skv": 6}, {"attn_mask": attn_bias.causal_lower_right(4, 6)}),
    "bool": ({}, {"attn_mask": bool_mask(5, 5, seed=2)}),
    "additive": ({}, {"attn_mask": additive_mask(5, 5, seed=3)}),
    "gqa": ({"hq": 4, "hkv": 2}, {"enable_gqa": True}),
    "negative_scale": ({}, {"scale": -1.3}),
}


@pytest.mark.parametrize("case", sorted(GRADCHECK))
def test_gradcheck(case):
    shape, kw = GRADCHECK[case]
    inputs = _small(**shape)
    assert torch.autograd.gradcheck(lambda q, k, v: fxattn.scaled_dot_product_attention(q, k, v, **kw), inputs)


def test_gradcheck_non_contiguous_and_with_the_lse():
    """Transposed leaves (the BSHD path), and fxattn.attention's (out, lse),
    whose backward takes the lse's gradient too."""
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(1, 5, 2, 4, generator=g, dtype=F64).requires_grad_() for _ in range(3))
    assert torch.autograd.gradcheck(lambda q, k, v: fxattn.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))), (q, k, v))
    assert torch.autograd.gradcheck(lambda q, k, v: fxattn.attention(q, k, v, layout="bshd", return_lse=True), (q, k, v))


def test_operator_checks_with_float64():
    """The custom operator's fake implementation gives the float64 outputs
    (lse float64, no lse parts) and its autograd registration holds."""
    q, k, v = (t.detach() for t in _small())
    args = (q, k, v, 0.0, "bhsd", "auto", True, "auto", True, "", 1)
    out, lse, parts = torch.ops.fxattn.attention(*args)
    assert out.dtype == lse.dtype == F64 and lse.shape == (1, 2, 5) and parts.numel() == 0
    torch.library.opcheck(torch.ops.fxattn.attention.default, args)
    # without the lse (return_lse False) the backward computes it again: the same gradients
    grads = []
    for call in (
        lambda *t: torch.ops.fxattn.attention(*t, *args[3:8], False, "", 1)[0],
        lambda *t: fxattn.scaled_dot_product_attention(*t, threads=1),
    ):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        call(*leaves).sum().backward()
        grads.append([t.grad for t in leaves])
    assert all(torch.equal(a, b) for a, b in zip(*grads))


def test_threads_give_the_same_bits():
    q, k, v, dout = qkv(hkv=2)
    m = additive_mask(9, 12)
    results = []
    for threads in (1, 2):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = fxattn.scaled_dot_product_attention(*leaves, attn_mask=m, enable_gqa=True, threads=threads)
        out.backward(dout)
        results.append([out.detach()] + [t.grad for t in leaves])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_float64_refusals():
    q, k, v, _ = qkv()
    with pytest.raises(fxattn.InvalidArgumentError, match="fp64"):
        fxattn.scaled_dot_product_attention(q, k, v, compute="fp32")
    with pytest.raises(fxattn.InvalidArgumentError, match="fp64 compute is for float64"):
        fxattn.scaled_dot_product_attention(q.float(), k.float(), v.float(), compute="fp64")
    with pytest.raises(fxattn.InvalidArgumentError, match="float64 output"):
        fxattn.attention(q, k, v, layout="bhsd", out_dtype=torch.float32)
    with pytest.raises(fxattn.InvalidArgumentError, match="needs float64 inputs"):
        fxattn.attention(
            q.numpy().astype(np.float32), k.numpy().astype(np.float32), v.numpy().astype(np.float32), layout="bhsd", out_dtype="float64"
        )
    with pytest.raises(fxattn.InvalidArgumentError, match="must match"):
        fxattn.attention(q, k.float(), v, layout="bhsd")
    m = torch.zeros(2, 4, 9, 12, dtype=F64)
    with pytest.raises(fxattn.InvalidArgumentError, match="float64 mask"):
        torch.ops.fxattn.attention(q.float(), k.float(), v.float(), 0.0, "bhsd", "auto", True, "auto", False, "", 1, attn_mask=m)
    with pytest.raises(fxattn.UnsupportedError, match="float64"):
        fxattn.check(q.numpy(), k.numpy(), v.numpy(), layout="bhsd")
    assert fxattn.compute_choice("float64", 16).compute == "fp64"
    assert fxattn.compute_choice(torch.float64, 16).compute == "fp64"


def test_float64_mask_with_float32_inputs_is_rounded_to_float32():
    """float32 inputs take a float64 mask rounded to float32: the same bits
    as the float32 mask."""
    q, k, v, _ = qkv()
    q, k, v = (t.float() for t in (q, k, v))
    m = additive_mask(9, 12)
    assert torch.equal(
        fxattn.scaled_dot_product_attention(q, k, v, attn_mask=m), fxattn.scaled_dot_product_attention(q, k, v, attn_mask=m.float())
    )


def test_compile_traces_float64_forward_and_backward():
    """torch.compile(fullgraph=True) traces the float64 call (the operators'
    fake implementations give float64 outputs) with the eager bits."""
    q, k, v = _small()
    compiled = torch.compile(lambda q, k, v: fxattn.scaled_dot_product_attention(q, k, v, is_causal=True), fullgraph=True)
    results = []
    for fn in (compiled, lambda q, k, v: fxattn.scaled_dot_product_attention(q, k, v, is_causal=True)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = fn(*leaves)
        out.sum().backward()
        results.append([out.detach()] + [t.grad for t in leaves])
    for a, b in zip(*results):
        assert a.dtype == F64 and torch.equal(a, b)


def test_nonfinite_float64_gives_torchs_result():
    """NaN or Inf in float64 inputs: torch's own result, as for float32
    (test_sdpa_nonfinite.py), for torch tensors and numpy arrays."""
    q, k, v, _ = qkv()
    k[0, 1, 3, 2] = torch.inf
    want = F.scaled_dot_product_attention(q, k, v)
    got = fxattn.scaled_dot_product_attention(q, k, v)
    assert got.dtype == F64 and torch.equal(got.isnan(), want.isnan())
    torch.testing.assert_close(got.nan_to_num(0.0), want.nan_to_num(0.0), rtol=0, atol=0)
    got = fxattn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy())
    assert got.dtype == np.float64 and np.array_equal(np.isnan(got), want.isnan().numpy())
    with pytest.raises(fxattn.InvalidArgumentError, match="non-finite"):
        fxattn.scaled_dot_product_attention(q, k, v, nonfinite="raise")
