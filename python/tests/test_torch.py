"""fxattn.attention on torch tensors: against fp64 and
torch.nn.functional.scaled_dot_product_attention, dtypes, strided views,
the custom operator under torch.compile, errors.

Tolerances as in test_attention.py: fp32 results within 2^-16 max|v| of
fp64 (10x the errors seen); SDPA's own fp32 result is within the same of
fp64, so the two agree within twice that. A bf16 / fp16 output is the fp32
result rounded once: half an ulp, 2^-9 / 2^-12 relative, checked with
2^-8 / 2^-11.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_attention import FP32_TOL, reference

import fxattn
from fxattn._common import arrays as _arrays

SDPA = F.scaled_dot_product_attention


def tensors(b=1, sq=64, skv=96, hq=4, hkv=2, d=32, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=g)
    k = torch.randn(b, hkv, skv, d, generator=g)
    v = torch.randn(b, hkv, skv, d, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def err(a, b, v):
    return float((a.double() - b.double()).abs().max() / v.double().abs().max())


def test_fp32_bhsd_matches_sdpa_and_fp64():
    q, k, v = tensors()
    out = fxattn.attention(q, k, v, layout="bhsd")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float32 and out.shape == q.shape
    ref = torch.from_numpy(reference(q.numpy(), k.numpy(), v.numpy(), layout="bhsd"))
    assert err(out, ref, v) < FP32_TOL
    assert err(out, SDPA(q, k, v, enable_gqa=True), v) < 2 * FP32_TOL


def test_transposed_view_is_not_copied():
    # diffusers' layout: [B, S, H, D] tensors; SDPA wants [B, H, S, D] views.
    q, k, v = (t.transpose(1, 2).contiguous() for t in tensors(seed=1))  # BSHD memory
    qv, kv, vv = (t.transpose(1, 2) for t in (q, k, v))  # BHSD views
    assert not qv.is_contiguous()
    op = _arrays.operand(qv, "q")
    assert op.ptr == qv.data_ptr() and op.strides == (0,) + tuple(qv.stride())[1:]  # batch 1
    via_view = fxattn.attention(qv, kv, vv, layout="bhsd")
    dense = fxattn.attention(q, k, v, layout="bshd")
    assert torch.equal(via_view.transpose(1, 2), dense)  # same bits: strides never change results
    assert err(via_view, SDPA(qv, kv, vv, enable_gqa=True), vv) < 2 * FP32_TOL


@pytest.mark.parametrize("dtype,rel", [(torch.bfloat16, 2.0**-8), (torch.float16, 2.0**-11)])
def test_half_types_return_input_dtype(dtype, rel):
    q, k, v = tensors(seed=2, dtype=dtype)
    out = fxattn.attention(q, k, v, layout="bhsd", compute="fp32")
    assert out.dtype == dtype
    ref = torch.from_numpy(reference(q.float().numpy(), k.float().numpy(), v.float().numpy(), layout="bhsd"))
    bound = rel * ref.abs() + FP32_TOL * v.float().abs().max()
    assert bool(((out.double() - ref).abs() <= bound).all())
    out32 = fxattn.attention(q, k, v, layout="bhsd", out_dtype=torch.float32, compute="fp32")
    assert out32.dtype == torch.float32 and err(out32, ref, v.float()) < FP32_TOL
    assert torch.equal(out, out32.to(dtype))  # rounded once, to nearest even
    # SDPA in the same dtype is within its own rounding of the same result.
    assert err(out.float(), SDPA(q, k, v, enable_gqa=True).float(), v.float()) < 4 * rel


def test_bf16_from_fp32_out_dtype():
    q, k, v = tensors(seed=3)
    out = fxattn.attention(q, k, v, layout="bhsd", out_dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, fxattn.attention(q, k, v, layout="bhsd").to(torch.bfloat16))


def test_lse_shape_and_values():
    q, k, v = tensors(seed=4, hq=2, hkv=2)
    out, lse = fxattn.attention(q, k, v, layout="bhsd", return_lse=True)
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 64)
    scale = q.shape[-1] ** -0.5
    ref_lse = torch.logsumexp(scale * q.double() @ k.double().transpose(-1, -2), dim=-1)
    assert float((lse.double() - ref_lse).abs().max()) < FP32_TOL * max(1.0, float(ref_lse.abs().max()))


def test_torch_compile_fullgraph_same_result():
    q, k, v = tensors(seed=5)

    def block(q, k, v):
        # Elementwise ops around the call, exact in fp32 under any fusion.
        return fxattn.attention(q * 0.5, k, v, layout="bhsd") * 2.0 + 1.0

    compiled = torch.compile(block, fullgraph=True)  # fails on any graph break
    assert torch.equal(compiled(q, k, v), block(q, k, v))


def test_custom_operator_is_registered_with_fake():
    q, k, v = tensors(seed=6)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fq, fk, fv = (torch.empty(t.shape) for t in (q, k, v))
        out, lse, parts = torch.ops.fxattn.attention(fq, fk, fv, 0.0, "bhsd", "auto", True, "fp32", True, "", 0)
    assert out.shape == q.shape and lse.shape == (1, 4, 64) and parts.shape == (1, 4, 64, 3)
    torch.library.opcheck(torch.ops.fxattn.attention.default, (q, k, v, 0.0, "bhsd", "auto", True, "fp32", True, "", 0))


def test_torch_errors_are_value_errors_with_message():
    q, k, v = tensors(seed=7)
    with pytest.raises(ValueError, match="non-finite"):
        fxattn.attention(q.clone().fill_(float("inf")), k, v, layout="bhsd")
    with pytest.raises(ValueError, match="float64"):
        fxattn.attention(q.double(), k, v, layout="bhsd")
    with pytest.raises(ValueError, match="heads"):
        fxattn.attention(q[:, :3], k, v, layout="bhsd")


def test_numpy_and_torch_give_the_same_bits():
    q, k, v = tensors(seed=8)
    t = fxattn.attention(q, k, v, layout="bhsd")
    n = fxattn.attention(q.numpy(), k.numpy(), v.numpy(), layout="bhsd")
    assert np.array_equal(t.numpy(), n)
