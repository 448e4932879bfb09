"""fxattn.scaled_dot_product_attention against torch's SDPA, case by case.

The reference is torch's math backend in float64 on the same (rounded)
inputs. Tolerances (relative to max|v|): fp32 compute within 2^-16 (10x
the errors seen; torch's own fp32 SDPA is within 2^-18 here); bf16 compute
within 2^-7 (P rounded to bf16, docs/numerics.md) plus 2^-8 for the bf16
output's rounding; float16 outputs within 2^-16 + 2^-11 (fp32 rounded once
to float16). Output dtype, shape and memory format must be SDPA's.
"""

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
    with pytest.raises(fxattn.UnsupportedError, match="no dropout"):
        sdpa(q, k, v, dropout_p=0.1)
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
    with pytest.raises(fxattn.InvalidArgumentError, match="one rank"):
        sdpa(q, k[0], v[0])


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


def test_mask_with_is_causal_raises_torchs_words():
    q, k, v = qkv()
    mask = torch.ones(33, 47, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True") as theirs:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    with pytest.raises(RuntimeError, match="Explicit attn_mask should not be set when is_causal=True"):
        fxattn.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=True)
    assert theirs.type is RuntimeError
