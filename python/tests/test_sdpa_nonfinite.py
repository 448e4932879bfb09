"""NaN and Inf in the drop-in, as torch: fxattn.scaled_dot_product_attention
gives torch's own result for inputs holding them (NaN and Inf exactly where
torch's scaled_dot_product_attention puts them, the finite elements equal
too), for torch tensors and numpy arrays, with masks, causal, torch's causal
biases and GQA, forward and backward; nonfinite="raise" refuses them naming
the element; fxattn.attention keeps refusing. Finite inputs never reach
torch's operator."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import bias as attn_bias

import fxattn


def inputs(seed=0, hkv=4):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, 4, 9, 16, generator=g), torch.randn(2, hkv, 11, 16, generator=g), torch.randn(2, hkv, 11, 16, generator=g)


def same(a, b):
    """Equal, NaN where NaN, Inf where Inf of the same sign."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.isnan(), b.isnan())
        and torch.equal(a.nan_to_num(0.0, 7.0, -7.0), b.nan_to_num(0.0, 7.0, -7.0))
    )


POISON = [
    ("q", (0, 1, 3, 5), float("nan")),
    ("k", (1, 2, 4, 0), float("inf")),
    ("v", (0, 0, 7, 2), float("nan")),
    ("v", (1, 3, 2, 9), -float("inf")),
]


@pytest.mark.parametrize("where", POISON)
@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"is_causal": True},
        {"attn_mask": torch.rand(9, 11, generator=torch.Generator().manual_seed(3)) > 0.3},
        {"attn_mask": attn_bias.causal_lower_right(9, 11)},
        {"scale": -0.5},
    ],
    ids=["plain", "causal", "bool", "lower_right", "scale"],
)
def test_torch_results_for_nonfinite_inputs(where, kw):
    name, at, value = where
    t = dict(zip("qkv", inputs()))
    t[name][at] = value
    leaves = [x.clone().requires_grad_() for x in (t["q"], t["k"], t["v"])]
    mine = [x.clone().requires_grad_() for x in (t["q"], t["k"], t["v"])]
    want = F.scaled_dot_product_attention(*leaves, **kw)
    got = fxattn.scaled_dot_product_attention(*mine, **kw)
    assert same(got, want)
    dout = torch.randn_like(want)
    want.backward(dout)
    got.backward(dout)
    for a, b in zip(mine, leaves):
        assert same(a.grad, b.grad)


def test_gqa_and_numpy_nonfinite_inputs():
    q, k, v = inputs(1, hkv=2)
    k[0, 1, 3, 3] = float("nan")
    assert same(fxattn.scaled_dot_product_attention(q, k, v, enable_gqa=True), F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
    got = fxattn.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), enable_gqa=True)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    assert same(torch.from_numpy(got), F.scaled_dot_product_attention(q, k, v, enable_gqa=True))


def test_bf16_nonfinite_inputs():
    q, k, v = (t.bfloat16() for t in inputs(2))
    v[1, 1, 1, 1] = float("inf")
    assert same(fxattn.scaled_dot_product_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))


def test_raise_and_the_other_entries_refuse():
    q, k, v = inputs()
    k[0, 0, 5, 1] = float("nan")
    with pytest.raises(fxattn.InvalidArgumentError, match="K has a non-finite value"):
        fxattn.scaled_dot_product_attention(q, k, v, nonfinite="raise")
    with pytest.raises(fxattn.InvalidArgumentError, match="K has a non-finite value"):
        fxattn.attention(q, k, v, layout="bhsd")
    with pytest.raises(fxattn.InvalidArgumentError, match="nonfinite"):
        fxattn.scaled_dot_product_attention(q, k, v, nonfinite="ignore")


def test_finite_inputs_never_reach_torchs_operator(monkeypatch):
    calls = []
    real = torch.ops.aten.scaled_dot_product_attention

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(torch.ops.aten, "scaled_dot_product_attention", counting)
    q, k, v = inputs()
    fxattn.scaled_dot_product_attention(q, k, v)
    assert not calls
    with pytest.raises(fxattn.InvalidArgumentError, match="does not broadcast"):
        fxattn.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(9, 10, dtype=torch.bool))
    assert not calls


def test_diffusers_backend_gives_the_native_result_for_nonfinite_inputs():
    """The "fxattn" backend, unmasked (its fxattn.attention path) and with
    return_lse: the native backend's output for a NaN in value."""
    from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn

    import fxattn.diffusers  # noqa: F401  (registers the backend)

    q, k, v = (t.transpose(1, 2).contiguous() for t in inputs(5))  # [B, S, H, D]
    v[0, 3, 1, 2] = float("nan")
    name = AttentionBackendName("fxattn")
    want = dispatch_attention_fn(q, k, v, backend=AttentionBackendName("native"))
    assert same(dispatch_attention_fn(q, k, v, backend=name), want)
    out, lse = dispatch_attention_fn(q, k, v, backend=name, attention_kwargs={"return_lse": True})
    s = q.double().transpose(1, 2) @ k.double().transpose(1, 2).transpose(-1, -2) * 16**-0.5
    assert same(out, want) and (lse - torch.logsumexp(s, -1).transpose(1, 2)).abs().max() < 1e-5
