"""fxattn.varlen_attention, packed variable-length sequences (flash-attn's
varlen convention), against torch's math SDPA in float64 on the same
tokens with a block-diagonal mask (causal: each block lower-right aligned,
flash-attn's causal): the output within 2^-16 max|v| and the gradients
within 4x the error of torch's own float32 run plus 2^-20 of their size
(test_sdpa_scale.py's tolerances); each sequence's bytes equal to
fxattn.attention on that sequence alone; rows without keys give 0 and
lse -inf; bad offsets raise with the argument named."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fxattn

FP32 = 2.0**-16  # of max|v|
LENS_Q = [37, 0, 5, 64, 1, 20]
LENS_K = [29, 3, 0, 64, 9, 41]


def offsets(lens):
    return torch.tensor([0] + list(np.cumsum(lens)), dtype=torch.int32)


def packed(hq=4, hkv=2, e=32, seed=0, lens_q=LENS_Q, lens_k=LENS_K):
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q, dout = (torch.randn(tq, hq, e, generator=g) for _ in range(2))
    k, v = (torch.randn(tk, hkv, e, generator=g) for _ in range(2))
    return q, k, v, dout, offsets(lens_q), offsets(lens_k)


def block_mask(cq, ck, causal):
    """[total_q, total_k] bool: query i of sequence s may attend key j of s
    (causal: j - start_k <= i - start_q + Skv - Sq)."""
    tq, tk = int(cq[-1]), int(ck[-1])
    mask = torch.zeros(tq, tk, dtype=torch.bool)
    for s in range(len(cq) - 1):
        a, b, c, e = int(cq[s]), int(cq[s + 1]), int(ck[s]), int(ck[s + 1])
        block = torch.ones(b - a, e - c, dtype=torch.bool)
        if causal:
            block = torch.ones(b - a, e - c).tril(diagonal=(e - c) - (b - a)).bool()
        mask[a:b, c:e] = block
    return mask


def reference(q, k, v, cq, ck, causal, dtype):
    """torch's math SDPA on the packed tokens with a block-diagonal mask
    ([H, T, D] views); rows with no key to attend give 0 (torch gives NaN)."""
    mask = block_mask(cq, ck, causal)
    group = q.shape[1] // k.shape[1]
    qh, kh, vh = (t.to(dtype).transpose(0, 1) for t in (q, k, v))
    kh, vh = (t.repeat_interleave(group, 0) for t in (kh, vh))
    with sdpa_kernel(SDPBackend.MATH):
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
    live = mask.any(1)
    return torch.where(live[None, :, None], out, torch.zeros((), dtype=dtype)).transpose(0, 1)


def grads(fn, q, k, v, dout, dtype=torch.float32):
    leaves = [t.to(dtype).detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(dout.to(out.dtype))
    return out.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_gradients_match_fp64_sdpa_on_a_block_diagonal_mask(causal):
    q, k, v, dout, cq, ck = packed()
    got_out, got = grads(lambda *t: fxattn.varlen_attention(*t, cq, ck, causal=causal), q, k, v, dout)
    ref_out, want = grads(lambda *t: reference(*t, cq, ck, causal, torch.float64), q, k, v, dout, torch.float64)
    _, f32 = grads(lambda *t: reference(*t, cq, ck, causal, torch.float32), q, k, v, dout)
    assert got_out.shape == q.shape and got_out.dtype == torch.float32
    assert float((got_out.double() - ref_out).abs().max() / v.abs().max()) <= FP32
    for name, g, r, t32 in zip("qkv", got, want, f32):
        err = (g.double() - r).abs().max().item()
        allow = 4 * (t32.double() - r).abs().max().item() + 2**-20 * r.abs().max().item()
        assert err <= allow, f"causal {causal}: d{name} error {err:.3g} > {allow:.3g}"


def test_each_sequence_gives_the_bytes_of_its_own_call():
    q, k, v, _, cq, ck = packed(seed=1)
    out, lse = fxattn.varlen_attention(q.numpy(), k.numpy(), v.numpy(), cq.numpy(), ck, return_lse=True)
    assert out.shape == tuple(q.shape) and lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == np.float32
    for s in range(len(LENS_Q)):
        a, b, c, e = int(cq[s]), int(cq[s + 1]), int(ck[s]), int(ck[s + 1])
        if a == b or c == e:
            continue
        one, one_lse = fxattn.attention(q[a:b][None].numpy(), k[c:e][None].numpy(), v[c:e][None].numpy(), layout="bshd", return_lse=True)
        assert np.array_equal(out[a:b], one[0]) and np.array_equal(lse[:, a:b], one_lse[0])


def test_rows_without_keys_give_zero_and_minus_infinity():
    q, k, v, dout, cq, ck = packed(seed=2)
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out, lse = fxattn.varlen_attention(*leaves, cq, ck, causal=True, return_lse=True)
    (out * dout).sum().backward()
    live = block_mask(cq, ck, True).any(1)
    assert not live.all()  # sequence 2 has no keys; sequence 0's first causal rows none
    assert not out[~live].any() and torch.isneginf(lse[:, ~live]).all()
    assert torch.isfinite(lse[:, live]).all()
    assert not leaves[0].grad[~live].any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_other_dtypes_follow_fxattn_attention(dtype):
    q, k, v, _, cq, ck = packed(seed=3)
    q, k, v = (t.to(dtype) for t in (q, k, v))
    out = fxattn.varlen_attention(q, k, v, cq, ck)
    assert out.dtype == dtype
    a, b, c, e = int(cq[3]), int(cq[4]), int(ck[3]), int(ck[4])
    one = fxattn.attention(q[a:b][None], k[c:e][None], v[c:e][None], layout="bshd")
    assert torch.equal(out[a:b], one[0])
    if dtype == torch.float64:
        ref = reference(q, k, v, cq, ck, False, torch.float64)
        assert float((out - ref).abs().max()) <= 1e-12


def test_gqa_grouping_and_scale():
    q, k, v, _, cq, ck = packed(hq=6, hkv=3, seed=4)
    out = fxattn.varlen_attention(q, k, v, cq, ck, scale=-0.4)
    mask = block_mask(cq, ck, False)
    qh, kh, vh = (t.double().transpose(0, 1) for t in (q, k, v))
    kh, vh = (t.repeat_interleave(2, 0) for t in (kh, vh))
    ref = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=-0.4)
    live = mask.any(1)
    assert float((out.double()[live] - ref.transpose(0, 1)[live]).abs().max() / v.abs().max()) <= FP32


@pytest.mark.parametrize(
    "cq, ck, words",
    [
        ([1, 5], [0, 5], "cu_seqlens_q must start at 0"),
        ([0, 6, 4, 5], [0, 1, 2, 5], "cu_seqlens_q decreases at sequence 1"),
        ([0, 4], [0, 5], "cu_seqlens_q ends at 4, but q holds 5 tokens"),
        ([0, 2, 5], [0, 5], "cu_seqlens_q holds 2 sequences but cu_seqlens_k 1"),
        ([0.0, 5.0], [0, 5], "cu_seqlens_q must hold integers"),
        ([[0, 5]], [0, 5], "cu_seqlens_q must be 1-D"),
        ([0, 5], [0, 6], "cu_seqlens_k ends at 6, but k holds 5 tokens"),
    ],
)
def test_bad_offsets_name_the_argument(cq, ck, words):
    q, k, v = (np.ones((5, 2, 8), np.float32) for _ in range(3))
    with pytest.raises(fxattn.InvalidArgumentError, match=words):
        fxattn.varlen_attention(q, k, v, np.array(cq), np.array(ck))


def test_bad_shapes_are_refused():
    q = np.ones((1, 5, 2, 8), np.float32)
    with pytest.raises(fxattn.InvalidArgumentError, match=r"q must be \[tokens, heads, head_dim\]"):
        fxattn.varlen_attention(q, q[0], q[0], [0, 5], [0, 5])
    k = np.ones((5, 2, 8), np.float32)
    with pytest.raises(fxattn.InvalidArgumentError, match="k holds 5 tokens but v 4"):
        fxattn.varlen_attention(k, k, k[:4], [0, 5], [0, 5])
