"""fxattn.scaled_dot_product_attention against torch's SDPA, case by case.

The reference is torch's math backend in float64 on the same (rounded)
inputs. Tolerances (relative to max|v|): fp32 compute within 2^-16 (10x
the errors seen; torch's own fp32 SDPA is within 2^-18 here); bf16 compute
within 2^-7 (P rounded to bf16, docs/numerics.md) plus 2^-8 for the bf16
output's rounding; float16 outputs within 2^-16 + 2^-11 (fp32 rounded once
to float16). Output dtype, shape and memory format must be SDPA's.
"""

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fxattn

FP32 = 2.0**-16
BF16 = 2.0**-7 + 2.0**-8
F16 = 2.0**-16 + 2.0**-11


def reference(q, k, v, attn_mask=None, **kw):
    """torch's math SDPA in float64 on the same values."""
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.double()
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=attn_mask, **kw)


def qkv(lead=(2,), hq=4, hkv=4, sq=33, skv=47, e=32, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, hq, sq, e, generator=g)
    k = torch.randn(*lead, hkv, skv, e, generator=g)
    v = torch.randn(*lead, hkv, skv, e, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def check(out, q, k, v, tol, attn_mask=None, **kw):
    """out has SDPA's dtype, shape and strides and lies within tol max|v| of the fp64 reference."""
    ref = reference(q, k, v, attn_mask=attn_mask, **kw)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, **kw)
    assert out.dtype == sdpa.dtype and out.shape == sdpa.shape
    assert out.stride() == sdpa.stride()
    err = float((out.double() - ref).abs().max() / v.double().abs().max())
    assert err <= tol, err
    return err


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)])
def test_ranks_3_4_5(lead):
    q, k, v = qkv(lead=lead)
    check(fxattn.scaled_dot_product_attention(q, k, v), q, k, v, FP32)


def test_rank_2():
    q, k, v = (t[0, 0] for t in qkv())
    check(fxattn.scaled_dot_product_attention(q, k, v), q, k, v, FP32)


def test_transposed_view_keeps_sdpa_memory_format():
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in qkv())
    out = fxattn.scaled_dot_product_attention(q, k, v)
    check(out, q, k, v, FP32)
    assert out.transpose(1, 2).is_contiguous()


def test_bool_masks_full_and_broadcast():
    q, k, v = qkv()
    g = torch.Generator().manual_seed(1)
    full = torch.rand(2, 4, 33, 47, generator=g) > 0.4
    check(fxattn.scaled_dot_product_attention(q, k, v, attn_mask=full), q, k, v, FP32, attn_mask=full)
    square = torch.rand(33, 47, generator=g) > 0.4
    check(fxattn.scaled_dot_product_attention(q, k, v, attn_mask=square), q, k, v, FP32, attn_mask=square)


def test_key_padding_and_fully_masked_rows_give_sdpa_zeros():
    q, k, v = qkv()
    pad = torch.ones(2, 1, 1, 47, dtype=torch.bool)
    pad[1, ..., 20:] = False
    check(fxattn.scaled_dot_product_attention(q, k, v, attn_mask=pad), q, k, v, FP32, attn_mask=pad)
    rows = torch.ones(33, 47, dtype=torch.bool)
    rows[5] = False
    out = fxattn.scaled_dot_product_attention(q, k, v, attn_mask=rows)
    check(out, q, k, v, FP32, attn_mask=rows)
    assert torch.equal(out[:, :, 5], torch.zeros_like(out[:, :, 5]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_additive_masks_broadcast(dtype):
    q, k, v = qkv()
    g = torch.Generator().manual_seed(2)
    bias = (3 * torch.randn(1, 4, 1, 47, generator=g)).to(dtype)
    bias[0, 1, 0, :10] = float("-inf")
    check(fxattn.scaled_dot_product_attention(q, k, v, attn_mask=bias), q, k, v, FP32, attn_mask=bias.float())


@pytest.mark.parametrize("sq,skv", [(40, 40), (20, 70), (70, 20)])
def test_causal_any_lengths(sq, skv):
    q, k, v = qkv(sq=sq, skv=skv)
    check(fxattn.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, FP32, is_causal=True)


def test_gqa_and_single_kv_head():
    q, k, v = qkv(hq=6, hkv=2)
    out = fxattn.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    check(out, q, k, v, FP32, enable_gqa=True)
    with pytest.raises(fxattn.InvalidArgumentError, match="enable_gqa=True"):
        fxattn.scaled_dot_product_attention(q, k, v)
    q, k, v = qkv(hq=4, hkv=1)  # one key/value head broadcasts, as in SDPA
    check(fxattn.scaled_dot_product_attention(q, k, v), q, k, v, FP32)


def test_scale_forms_give_the_same_bits():
    q, k, v = qkv()
    a = fxattn.scaled_dot_product_attention(q, k, v, scale=0.3)
    check(a, q, k, v, FP32, scale=0.3)
    for s in (torch.tensor(0.3), np.float64(0.3), np.array(0.3)):
        assert torch.equal(fxattn.scaled_dot_product_attention(q, k, v, scale=s), a)


def test_bf16_computes_as_chosen_unless_asked():
    """bf16 inputs: compute="bf16" and "fp32" each within their envelope and different;
    the default is the compute fxattn.compute_choice names for this machine, bit for bit."""
    q, k, v = qkv(dtype=torch.bfloat16)
    fast = fxattn.scaled_dot_product_attention(q, k, v, is_causal=True, compute="bf16")
    exact = fxattn.scaled_dot_product_attention(q, k, v, is_causal=True, compute="fp32")
    e_fast = check(fast, q, k, v, BF16, is_causal=True)
    e_exact = check(exact, q, k, v, 2.0**-8, is_causal=True)  # only the output's bf16 rounding
    assert not torch.equal(fast, exact) and e_exact <= e_fast
    default = fxattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    chosen = fxattn.compute_choice(torch.bfloat16, q.shape[-1]).compute
    assert torch.equal(default, fast if chosen == "bf16" else exact)


def test_float16_output():
    q, k, v = qkv(dtype=torch.float16)
    check(fxattn.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(33, 47, dtype=torch.bool)), q, k, v, F16)


def test_numpy_inputs():
    q, k, v = qkv()
    mask = torch.rand(33, 47) > 0.5
    out = fxattn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), attn_mask=mask.numpy())
    assert isinstance(out, np.ndarray) and out.dtype == np.float32
    ref = reference(q, k, v, attn_mask=mask).numpy()
    assert np.abs(out - ref).max() / np.abs(v.numpy()).max() <= FP32
    causal = fxattn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), is_causal=True)
    assert np.array_equal(causal, fxattn.scaled_dot_product_attention(q, k, v, is_causal=True).numpy())


def test_torch_compile_traces_masks_and_causal():
    q, k, v = qkv()
    mask = torch.rand(2, 1, 33, 47) > 0.3
    fn = torch.compile(
        lambda q, k, v, m: (
            fxattn.scaled_dot_product_attention(q, k, v, attn_mask=m) * 2 + fxattn.scaled_dot_product_attention(q, k, v, is_causal=True)
        ),
        fullgraph=True,
    )
    want = fxattn.scaled_dot_product_attention(q, k, v, attn_mask=mask) * 2 + fxattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(fn(q, k, v, mask), want)


def test_operator_opcheck_with_mask_and_causal():
    q, k, v = qkv()
    mask = (torch.rand(2, 1, 1, 47) > 0.3).expand(2, 4, 33, 47)
    args = (q, k, v, 0.0, "bhsd", "auto", True, "fp32", True, "", 0)
    torch.library.opcheck(torch.ops.fxattn.attention.default, args + (mask, False))
    torch.library.opcheck(torch.ops.fxattn.attention.default, args + (None, True))


def test_errors():
    q, k, v = qkv()
    sdpa = fxattn.scaled_dot_product_attention
    with pytest.raises(fxattn.InvalidArgumentError, match="dropout probability"):
        sdpa(q, k, v, dropout_p=1.5)
    with pytest.raises(fxattn.InvalidArgumentError, match="Explicit attn_mask should not be set when is_causal=True"):
        sdpa(q, k, v, attn_mask=torch.ones(33, 47, dtype=torch.bool), is_causal=True)
    with pytest.raises(fxattn.InvalidArgumentError, match="does not broadcast"):
        sdpa(q, k, v, attn_mask=torch.ones(33, 46, dtype=torch.bool))
    with pytest.raises(fxattn.InvalidArgumentError, match="bool or floating point"):
        sdpa(q, k, v, attn_mask=torch.ones(33, 47, dtype=torch.int32))
    bad = torch.zeros(33, 47)
    bad[3, 4] = float("nan")
    with pytest.raises(fxattn.InvalidArgumentError, match="query 3, key 4"):
        sdpa(q, k, v, attn_mask=bad)
    with pytest.raises(fxattn.UnsupportedError, match="head dim"):
        sdpa(q, k, torch.randn(2, 4, 47, 16))
    with pytest.raises(fxattn.InvalidArgumentError, match="scale"):
        sdpa(q, k, v, scale=float("inf"))
    with pytest.raises(fxattn.InvalidArgumentError, match="same kind"):
        sdpa(q, k, v, attn_mask=np.ones((33, 47), bool))
    with pytest.raises(fxattn.UnsupportedError, match="expand query first"):
        sdpa(q[:1], k, v)


@pytest.mark.parametrize(
    "shapes_dtypes",
    [
        (((8,), torch.float32),) * 3,  # 1-D
        (((), torch.float32),) * 3,  # 0-d
        (((2, 4, 8), torch.float32), ((2, 4, 8), torch.float64), ((2, 4, 8), torch.float32)),
        (((2, 4, 8), torch.float32), ((2, 4, 8), torch.bfloat16), ((2, 4, 8), torch.bfloat16)),
    ],
)
def test_malformed_inputs_raise_torchs_error(shapes_dtypes):
    """The same builtin type (RuntimeError) and the words torch's own message
    starts with, for the checks torch makes first: ranks and dtypes."""
    args = [torch.zeros(s, dtype=dt) for s, dt in shapes_dtypes]
    with pytest.raises(RuntimeError) as theirs:
        F.scaled_dot_product_attention(*args)
    with pytest.raises(RuntimeError) as ours:
        fxattn.scaled_dot_product_attention(*args)
    assert isinstance(ours.value, fxattn.InvalidArgumentError)
    words = str(theirs.value).split(", but got")[0].replace("  ", " ")
    assert str(ours.value).startswith(words)


# Malformed shapes torch's SDPA refuses: (query, key, value shapes, kwargs,
# words). words TORCH: fxattn's message starts with torch's whole message
# (its broadcasting and GQA checks say what is wrong). Otherwise torch's
# message is its matmul's, on the flattened operands (bmm: "Expected size
# for first two dimensions of batch2 tensor to be: [6, 8] but got: [6,
# 16]."; mm: "mat1 and mat2 shapes cannot be multiplied (4x8 and 16x5)"),
# and words is fxattn's phrase naming the arguments, filled in with the two
# sizes torch's message reports as not matching.
TORCH = None
GQA = {"enable_gqa": True}
MALFORMED = {
    "1d_query": ((8,), (2, 8), (2, 8), {}, TORCH),
    "1d_value": ((3, 4, 8), (3, 5, 8), (8,), {}, TORCH),
    "batch": ((2, 3, 4, 8), (3, 3, 5, 8), (3, 3, 5, 8), {}, TORCH),
    "batch_5d": ((2, 2, 3, 4, 8), (2, 3, 3, 5, 8), (2, 3, 3, 5, 8), {}, TORCH),
    "batch_value": ((2, 3, 4, 8), (2, 3, 5, 8), (3, 3, 5, 8), {}, TORCH),
    "heads": ((2, 4, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {}, TORCH),
    "heads_causal": ((2, 4, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {"is_causal": True}, TORCH),
    "heads_value": ((2, 4, 4, 8), (2, 4, 5, 8), (2, 2, 5, 8), {}, TORCH),
    "heads_3d_key": ((2, 3, 4, 8), (4, 5, 8), (4, 5, 8), {}, TORCH),
    "heads_3d_query": ((3, 4, 8), (2, 4, 5, 8), (2, 4, 5, 8), {}, TORCH),
    "gqa_heads": ((2, 4, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), GQA, TORCH),
    "gqa_value_heads": ((2, 4, 4, 8), (2, 2, 5, 8), (2, 3, 5, 8), GQA, TORCH),
    "gqa_3d": ((4, 4, 8), (3, 5, 8), (3, 5, 8), GQA, TORCH),
    "gqa_batch": ((2, 4, 4, 8), (3, 2, 5, 8), (3, 2, 5, 8), GQA, TORCH),
    "head_dim": ((2, 3, 4, 8), (2, 3, 5, 16), (2, 3, 5, 8), {}, "query has head dim {} but key has {}"),
    "head_dim_3d": ((3, 4, 8), (3, 5, 16), (3, 5, 8), {}, "query has head dim {} but key has {}"),
    "head_dim_2d": ((4, 8), (5, 16), (5, 8), {}, "query has head dim {} but key has {}"),
    "head_dim_2d_key": ((2, 3, 4, 8), (5, 16), (5, 8), {}, "query has head dim {} but key has {}"),
    "head_dim_gqa": ((2, 4, 4, 8), (2, 2, 5, 16), (2, 2, 5, 8), GQA, "query has head dim {} but key has {}"),
    "head_dim_key_and_value": ((2, 3, 4, 8), (2, 3, 5, 16), (2, 3, 5, 16), {}, "query has head dim {} but key has {}"),
    "head_dim_with_mask": (
        (2, 3, 4, 8),
        (2, 3, 5, 16),
        (2, 3, 5, 8),
        {"attn_mask": torch.ones(4, 5, dtype=torch.bool)},
        "query has head dim {} but key has {}",
    ),
    "tokens_value": ((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 6, 8), {}, "key has {} tokens (dim -2) but value has {}"),
    "tokens_value_2d": ((4, 8), (5, 8), (6, 8), {}, "key has {} tokens (dim -2) but value has {}"),
}


def _sizes(message: str):
    """The two sizes torch's matmul message reports as not matching."""
    m = re.search(r"to be: \[\d+, (\d+)\] but got: \[\d+, (\d+)\]", message) or re.search(r"\(\d+x(\d+) and (\d+)x\d+\)", message)
    assert m, message
    return m.groups()


@pytest.mark.parametrize("case", sorted(MALFORMED))
@pytest.mark.parametrize("kind", ["torch", "numpy"])
def test_malformed_shapes_raise_torchs_error(case, kind):
    """Each malformed call raises in torch's SDPA (its math backend, which
    checks every shape: its CPU flash kernel takes a value with more tokens
    than the key) and in fxattn an exception of torch's type
    (InvalidArgumentError, a RuntimeError), with torch's words where they say
    what is wrong, else fxattn's naming the arguments and torch's sizes."""
    qs, ks, vs, kw, words = MALFORMED[case]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g) for s in (qs, ks, vs))
    with sdpa_kernel(SDPBackend.MATH), pytest.raises(Exception) as theirs:
        F.scaled_dot_product_attention(q, k, v, **kw)
    if kind == "numpy":
        q, k, v = (t.numpy() for t in (q, k, v))
        kw = {n: a.numpy() if torch.is_tensor(a) else a for n, a in kw.items()}
    with pytest.raises(Exception) as ours:
        fxattn.scaled_dot_product_attention(q, k, v, **kw)
    assert type(theirs.value) is RuntimeError
    assert isinstance(ours.value, type(theirs.value)) and isinstance(ours.value, fxattn.InvalidArgumentError)
    theirs_text, ours_text = str(theirs.value).replace("  ", " "), str(ours.value)
    if words is TORCH:
        assert ours_text.startswith(theirs_text), (ours_text, theirs_text)
    else:
        assert words.format(*_sizes(theirs_text)) in ours_text, (ours_text, theirs_text)


# Shapes torch's SDPA takes and fxattn does not: (query, key, value shapes,
# kwargs, words of fxattn's UnsupportedError).
UNSUPPORTED = {
    "query_batch_broadcast": ((1, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {}, "query has batch and head dims [1, 3]"),
    "query_heads_broadcast": ((2, 1, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {}, "query has batch and head dims [2, 1]"),
    "query_fewer_dims": ((3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 8), {}, "query has batch and head dims [3]"),
    "value_one_head": ((2, 4, 4, 8), (2, 4, 5, 8), (2, 1, 5, 8), {}, "key has 4 heads and value 1"),
    "gqa_key_value_heads": ((2, 4, 4, 8), (2, 2, 5, 8), (2, 1, 5, 8), GQA, "key has 2 heads and value 1"),
    "value_head_dim": ((2, 3, 4, 8), (2, 3, 5, 8), (2, 3, 5, 16), {}, "value has head dim 16, query 8"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_shapes_torch_takes_and_fxattn_does_not(case):
    """UnsupportedError (a NotImplementedError and a RuntimeError) naming the
    arguments, where torch's SDPA broadcasts what fxattn does not."""
    qs, ks, vs, kw, words = UNSUPPORTED[case]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, generator=g) for s in (qs, ks, vs))
    assert F.scaled_dot_product_attention(q, k, v, **kw).ndim >= q.ndim
    with pytest.raises(fxattn.UnsupportedError) as ours:
        fxattn.scaled_dot_product_attention(q, k, v, **kw)
    assert isinstance(ours.value, RuntimeError) and isinstance(ours.value, NotImplementedError)
    assert words in str(ours.value)


@pytest.mark.parametrize(
    "shapes",
    [
        ((2, 3, 4, 8), (3, 5, 8), (3, 5, 8), {}),
        ((2, 3, 4, 8), (2, 3, 5, 8), (3, 5, 8), {}),
        ((2, 3, 4, 8), (5, 8), (5, 8), {"is_causal": True}),
        ((2, 3, 4, 8), (1, 3, 5, 8), (2, 3, 5, 8), {}),
        ((2, 4, 4, 8), (2, 5, 8), (2, 5, 8), GQA),
        ((2, 2, 4, 4, 8), (2, 1, 5, 8), (2, 1, 1, 5, 8), {}),
    ],
    ids=["kv_3d", "v_3d", "kv_2d_causal", "k_batch_1", "kv_3d_gqa", "5d"],
)
def test_key_and_value_broadcast_as_torch(shapes):
    """Key and value of fewer dims than query (leading 1s) and batch dims
    that each broadcast to query's, as torch's SDPA broadcasts them: its
    float64 output and gradients to fp64 rounding, for torch tensors and
    numpy arrays."""
    qs, ks, vs, kw = shapes
    g = torch.Generator().manual_seed(1)
    theirs = [torch.randn(s, generator=g, dtype=torch.float64, requires_grad=True) for s in (qs, ks, vs)]
    ours = [t.detach().clone().requires_grad_() for t in theirs]
    want = reference(*theirs, **kw)
    got = fxattn.scaled_dot_product_attention(*ours, **kw)
    assert got.shape == want.shape and (got - want).abs().max().item() < 1e-12
    dout = torch.randn(want.shape, generator=g, dtype=torch.float64)
    want.backward(dout)
    got.backward(dout)
    for a, b in zip(ours, theirs):
        assert a.grad.shape == b.grad.shape and (a.grad - b.grad).abs().max().item() < 1e-12
    out = fxattn.scaled_dot_product_attention(*(t.detach().numpy() for t in theirs), **kw)
    assert np.abs(out - want.detach().numpy()).max() < 1e-12


def test_mask_with_is_causal_raises_torchs_words():
    q, k, v = qkv()
    mask = torch.ones(33, 47, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True") as theirs:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
        fxattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    assert theirs.type is RuntimeError
