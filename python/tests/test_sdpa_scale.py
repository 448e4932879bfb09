"""Any finite scale, as torch's scaled_dot_product_attention takes: negative,
tiny, large and zero, forward and backward, against torch's math SDPA in
float64 on the same inputs (test_sdpa.py's and test_autograd.py's
tolerances); and the identities that make a negative scale exact rather
than close: scale -s on q gives the bytes of scale s on -q, and their
gradients agree bit for bit (dq negated)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fxattn

FP32 = 2.0**-16  # of max|v| (test_sdpa.py)


def inputs(sq=33, skv=47, e=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(2, 3, s, e, generator=g) for s in (sq, skv, skv, sq))
    return q, k, v, dout


def sdpa64(q, k, v, **kw):
    mask = kw.pop("attn_mask", None)
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


def grads(fn, q, k, v, dout, dtype=torch.float32):
    leaves = [t.to(dtype).detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(dout.to(out.dtype))
    return out.detach(), [t.grad for t in leaves]


def masks(sq=33, skv=47):
    g = torch.Generator().manual_seed(5)
    additive = torch.randn(sq, skv, generator=g)
    additive[:, ::7] = -torch.inf
    return {
        "none": {},
        "bool": {"attn_mask": torch.rand(sq, skv, generator=g) > 0.3},
        "additive": {"attn_mask": additive},
        "causal": {"is_causal": True},
    }


@pytest.mark.parametrize("scale", [-0.7, -1e-3, 0.0, 1e-3, 2.5, -8.0])
@pytest.mark.parametrize("mask", ["none", "bool", "additive", "causal"])
def test_forward_and_gradients_match_fp64_sdpa(scale, mask):
    q, k, v, dout = inputs()
    kw = dict(masks()[mask], scale=scale)
    out, got = grads(lambda *t: fxattn.scaled_dot_product_attention(*t, **kw), q, k, v, dout)
    ref, want = grads(lambda *t: sdpa64(*t, **kw), q, k, v, dout, torch.float64)
    _, f32 = grads(lambda *t: sdpa64(*t, **kw), q, k, v, dout)
    assert float((out.double() - ref).abs().max() / v.abs().max()) <= FP32
    for name, g, r, t32 in zip("qkv", got, want, f32):
        err = (g.double() - r).abs().max().item()
        allow = 4 * (t32.double() - r).abs().max().item() + 2**-20 * r.abs().max().item()
        assert err <= allow, f"scale {scale}, {mask}: d{name} error {err:.3g} > {allow:.3g}"
    if scale == 0.0:  # every score is 0: q has no effect, nor k on the weights
        assert not got[0].any() and not got[1].any()


@pytest.mark.parametrize("mask", ["none", "additive", "causal"])
def test_negative_scale_is_positive_scale_on_negated_q_bit_for_bit(mask):
    q, k, v, dout = inputs(seed=3)
    kw = masks()[mask]
    out_n, (dq_n, dk_n, dv_n) = grads(lambda *t: fxattn.scaled_dot_product_attention(*t, scale=-0.3, **kw), q, k, v, dout)
    out_p, (dq_p, dk_p, dv_p) = grads(lambda *t: fxattn.scaled_dot_product_attention(*t, scale=0.3, **kw), -q, k, v, dout)
    assert torch.equal(out_n, out_p)
    # d/dq of f(-q) is minus the gradient at -q; dk and dv are the same sums
    assert torch.equal(dq_n, -dq_p) and torch.equal(dk_n, dk_p) and torch.equal(dv_n, dv_p)


def test_numpy_and_attention_take_any_scale():
    q, k, v, _ = inputs(seed=1)
    for scale in (-0.25, 0.0, 3.0):
        ref = sdpa64(q.double(), k.double(), v.double(), scale=scale).numpy()
        out = fxattn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), scale=scale)
        assert np.abs(out - ref).max() / np.abs(v.numpy()).max() <= FP32
        out, lse = fxattn.attention(q.numpy(), k.numpy(), v.numpy(), scale=scale, layout="bhsd", return_lse=True)
        assert np.abs(out - ref).max() / np.abs(v.numpy()).max() <= FP32
        s = scale * q.double() @ k.double().transpose(-1, -2)
        assert np.abs(lse - torch.logsumexp(s, -1).numpy()).max() <= 2.0**-18 * max(1.0, np.abs(lse).max())


def test_bad_scales_refused():
    q, k, v, _ = inputs()
    for bad in (float("inf"), -float("inf"), float("nan")):
        with pytest.raises(fxattn.InvalidArgumentError, match="scale must be a finite number"):
            fxattn.scaled_dot_product_attention(q, k, v, scale=bad)


def test_check_reports_negative_scales_and_refuses_zero():
    q, k, v, _ = inputs()
    qn, kn, vn = (t.numpy() for t in (q, k, v))
    neg = fxattn.check(-qn, kn, vn, scale=-0.2, layout="bhsd").to_dict()
    pos = fxattn.check(qn, kn, vn, scale=0.2, layout="bhsd").to_dict()
    assert neg["heads"] == pos["heads"]  # the bound needs |scale| and |q|: the same report
    with pytest.raises(fxattn.InvalidArgumentError, match="scale 0 is not taken here"):
        fxattn.check(qn, kn, vn, scale=0.0, layout="bhsd")
