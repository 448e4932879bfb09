"""fxattn.attention and fxattn.scaled_dot_product_attention under autograd:
gradients against torch's SDPA math backward in float64.

The envelope: per gradient, fxattn's largest error against the fp64
reference is at most 4x the largest error of torch's own fp32 math backward
(SDPA in float32 on the same inputs, measured in the same test) plus
2^-20 max|reference| (a floor for gradients that fp32 gets almost exactly).
fp32 attention through an fp32 backward is what both compute; the factor
allows for their different orders of summation.
"""

import pytest

torch = pytest.importorskip("torch")

from torch.nn.attention import bias as attn_bias  # noqa: E402
from wan_configs import T2V as WAN_T2V  # noqa: E402

import fxattn  # noqa: E402
from fxattn.attn import torch_op  # noqa: E402,F401  (registers the operators)

F = torch.nn.functional


def _inputs(b, hq, hkv, sq, skv, d, hot=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=g) * hot
    k = torch.randn(b, hkv, skv, d, generator=g)
    v = torch.randn(b, hkv, skv, d, generator=g)
    dout = torch.randn(b, hq, sq, d, generator=g)
    return q, k, v, dout


def _grads(fn, q, k, v, dout, dtype):
    leaves = [t.to(dtype).detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(dout.to(out.dtype))
    return out, [t.grad for t in leaves]


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])


def _check_envelope(fx_grads, q, k, v, dout):
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        _, ref = _grads(_sdpa, q, k, v, dout, torch.float64)
        _, f32 = _grads(_sdpa, q, k, v, dout, torch.float32)
    for name, got, r, t32 in zip("qkv", fx_grads, ref, f32):
        assert got.shape == r.shape and got.dtype == torch.float32
        err = (got.double() - r).abs().max().item()
        allow = 4 * (t32.double() - r).abs().max().item() + 2**-20 * r.abs().max().item()
        assert err <= allow, f"d{name}: error {err:.3g} > envelope {allow:.3g}"


@pytest.mark.parametrize(
    "b,hq,hkv,sq,skv,d,hot",
    [
        (2, 4, 4, 70, 70, 32, 1.0),  # random
        (1, 4, 4, 64, 96, 64, 16.0),  # hot rows: P peaked
        (2, 8, 2, 33, 150, 40, 1.0),  # GQA, Sq != Skv
        (1, 4, 1, 90, 50, 16, 1.0),  # MQA, Sq > Skv
    ],
)
def test_gradients_match_fp64_sdpa(b, hq, hkv, sq, skv, d, hot):
    q, k, v, dout = _inputs(b, hq, hkv, sq, skv, d, hot)
    _, got = _grads(lambda *t: fxattn.attention(*t, layout="bhsd"), q, k, v, dout, torch.float32)
    _check_envelope(got, q, k, v, dout)


def test_bshd_layout_and_transposed_views():
    q, k, v, dout = _inputs(2, 4, 2, 48, 72, 32)
    # bshd tensors of their own
    _, got = _grads(
        lambda *t: fxattn.attention(*(x.transpose(1, 2).contiguous() for x in t), layout="bshd").transpose(1, 2),
        q,
        k,
        v,
        dout,
        torch.float32,
    )
    _check_envelope(got, q, k, v, dout)

    # transposed views: bhsd leaves read as bshd without a copy, and the reverse
    def views(*t):
        return fxattn.attention(*(x.transpose(1, 2) for x in t), layout="bshd").transpose(1, 2)

    _, got_views = _grads(views, q, k, v, dout, torch.float32)
    for a, b in zip(got, got_views):
        assert torch.equal(a, b)  # the same values whatever the strides
    _, got_sdpa = _grads(lambda *t: fxattn.scaled_dot_product_attention(*t, enable_gqa=True), q, k, v, dout, torch.float32)
    for a, b in zip(got, got_sdpa):
        assert torch.equal(a, b)


def test_bf16_gradients_in_bf16():
    q, k, v, dout = _inputs(1, 4, 2, 64, 64, 32)
    out, got = _grads(lambda *t: fxattn.attention(*t, layout="bhsd"), q, k, v, dout, torch.bfloat16)
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in got)
    # fp64 reference on the bf16 values; the output's bf16 rounding (2^-8 relative) dominates
    qb, kb, vb = (t.bfloat16().float() for t in (q, k, v))
    _, ref = _grads(_sdpa, qb, kb, vb, dout.bfloat16().float(), torch.float64)
    for g, r in zip(got, ref):
        err = (g.double() - r).abs().max().item()
        assert err <= 2**-6 * r.abs().max().item(), err


def test_bf16_compute_backward():
    """bf16 inputs through fxattn.scaled_dot_product_attention(compute="bf16")
    run bf16 compute in the forward and the backward: the gradients are
    those of fxattn.attention(compute="bf16"), bit for bit, not fp32
    compute's, and within bf16 compute's envelope of the fp64 reference
    (docs/numerics.md: P, dS and dO rounded to bf16, ~2^-8 of each product;
    2^-5 max|reference| here). The default (compute None, "auto") gives the
    bits of the compute fxattn.compute_choice names for this machine."""
    q, k, v, dout = _inputs(1, 4, 2, 75, 131, 40)
    sdpa = lambda *t: fxattn.scaled_dot_product_attention(*t, enable_gqa=True, compute="bf16")  # noqa: E731
    out, got = _grads(sdpa, q, k, v, dout, torch.bfloat16)
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in got)
    _, same = _grads(lambda *t: fxattn.attention(*t, layout="bhsd", compute="bf16"), q, k, v, dout, torch.bfloat16)
    _, fp32 = _grads(lambda *t: fxattn.attention(*t, layout="bhsd", compute="fp32"), q, k, v, dout, torch.bfloat16)
    assert all(torch.equal(a, b) for a, b in zip(got, same))
    assert any(not torch.equal(a, b) for a, b in zip(got, fp32))
    default = lambda *t: fxattn.scaled_dot_product_attention(*t, enable_gqa=True)  # noqa: E731
    _, auto = _grads(default, q, k, v, dout, torch.bfloat16)
    chosen = same if fxattn.compute_choice(torch.bfloat16, 40).compute == "bf16" else fp32
    assert all(torch.equal(a, b) for a, b in zip(auto, chosen))
    qb, kb, vb = (t.bfloat16().float() for t in (q, k, v))
    _, ref = _grads(_sdpa, qb, kb, vb, dout.bfloat16().float(), torch.float64)
    for g, r in zip(got, ref):
        err = (g.double() - r).abs().max().item()
        assert err <= 2**-5 * r.abs().max().item(), err


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gradient_rounding_is_torchs(dtype):
    """bf16 and fp16 gradients: the library rounds its fp32 gradients as it
    stores them, to the bits of torch's conversion of the same fp32
    gradients (those of the same inputs, asked for in fp32)."""
    from fxattn._common import arrays
    from fxattn.attn.inputs import Inputs, lse_shape
    from fxattn.attn.options import Options
    from fxattn.attn.run import run, run_backward

    q, k, v, dout = (t.to(dtype) for t in _inputs(1, 4, 2, 70, 90, 32, hot=3.0))
    opts = Options.parse(None, "bhsd", center=False, compute="fp32")
    x = Inputs.of(q, k, v, "bhsd")
    out = torch.empty(q.shape, dtype=torch.float32)
    lse = torch.empty(lse_shape("bhsd", q.shape), dtype=torch.float32)
    run(x, opts, arrays.torch_dtype_code(torch, out.dtype), out.data_ptr(), lse.data_ptr())
    dout32 = dout.float()

    def grads(grad_dtype):
        g = [torch.empty(t.shape, dtype=grad_dtype) for t in (q, k, v)]
        code = arrays.torch_dtype_code(torch, torch.float32)
        ptrs = [t.data_ptr() for t in g]
        grad_code = arrays.torch_dtype_code(torch, grad_dtype)
        run_backward(x, opts, code, out.data_ptr(), dout32.data_ptr(), lse.data_ptr(), None, ptrs, grad_code)
        return g

    wide, narrow = grads(torch.float32), grads(dtype)
    for w, n in zip(wide, narrow):
        assert n.dtype == dtype and torch.isfinite(w).all()
        assert torch.equal(n.view(torch.int16), w.to(dtype).view(torch.int16))


def test_lse_gradient():
    q, k, v, dout = _inputs(1, 4, 2, 40, 56, 16)
    g = torch.randn(1, 4, 40, generator=torch.Generator().manual_seed(1))

    def loss(fn, dtype):
        leaves = [t.to(dtype).detach().requires_grad_() for t in (q, k, v)]
        out, lse = fn(*leaves)
        ((out * dout.to(dtype)).sum() + (lse * g.to(dtype)).sum()).backward()
        return [t.grad for t in leaves]

    got = loss(lambda *t: fxattn.attention(*t, layout="bhsd", return_lse=True), torch.float32)

    def ref(q, k, v):
        s = q @ k.repeat_interleave(2, 1).transpose(-1, -2) / 4.0
        return torch.softmax(s, -1) @ v.repeat_interleave(2, 1), torch.logsumexp(s, -1)

    want = loss(ref, torch.float64)
    f32 = loss(ref, torch.float32)
    for a, w, t in zip(got, want, f32):
        assert (a.double() - w).abs().max() <= 4 * (t.double() - w).abs().max() + 2**-20 * w.abs().max()


def _sdpa_masked(q, k, v, **kw):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1], **kw)


def _masks(b, hq, sq, skv, seed=3):
    """Bool, additive (with -inf) and key-padding masks, broadcast in SDPA's ways."""
    g = torch.Generator().manual_seed(seed)
    full = torch.rand(b, hq, sq, skv, generator=g) > 0.3
    full[..., 0] = True  # every row keeps a key (test_fully_masked_rows_have_zero_gradients has dead ones)
    bias = 3.0 * torch.randn(sq, skv, generator=g)
    bias[torch.rand(sq, skv, generator=g) < 0.2] = float("-inf")
    bias[:, 1] = 0.5
    pad = torch.ones(b, 1, 1, skv, dtype=torch.bool)
    pad[0, ..., skv // 2 :] = False
    return {"bool": full, "additive": bias, "key padding": pad}


@pytest.mark.parametrize("kind", ["bool", "additive", "key padding"])
@pytest.mark.parametrize("b,hq,hkv,sq,skv,d", [(2, 4, 2, 70, 150, 32), (1, 2, 2, 90, 40, 16)])
def test_mask_gradients_match_fp64_sdpa(kind, b, hq, hkv, sq, skv, d):
    q, k, v, dout = _inputs(b, hq, hkv, sq, skv, d)
    mask = _masks(b, hq, sq, skv)[kind]
    _, got = _grads(lambda *t: fxattn.scaled_dot_product_attention(*t, attn_mask=mask, enable_gqa=True), q, k, v, dout, torch.float32)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        m64 = mask if mask.dtype == torch.bool else mask.double()
        _, ref = _grads(lambda *t: _sdpa_masked(*t, attn_mask=m64), q, k, v, dout, torch.float64)
        _, f32 = _grads(lambda *t: _sdpa_masked(*t, attn_mask=mask), q, k, v, dout, torch.float32)
    for name, g, r, t32 in zip("qkv", got, ref, f32):
        err = (g.double() - r).abs().max().item()
        allow = 4 * (t32.double() - r).abs().max().item() + 2**-20 * r.abs().max().item()
        assert err <= allow, f"{kind} d{name}: error {err:.3g} > envelope {allow:.3g}"


@pytest.mark.parametrize("sq,skv", [(96, 96), (40, 130), (130, 40)])
def test_causal_gradients_match_fp64_sdpa(sq, skv):
    q, k, v, dout = _inputs(1, 4, 2, sq, skv, 24)
    _, got = _grads(lambda *t: fxattn.scaled_dot_product_attention(*t, is_causal=True, enable_gqa=True), q, k, v, dout, torch.float32)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        _, ref = _grads(lambda *t: _sdpa_masked(*t, is_causal=True), q, k, v, dout, torch.float64)
        _, f32 = _grads(lambda *t: _sdpa_masked(*t, is_causal=True), q, k, v, dout, torch.float32)
    for name, g, r, t32 in zip("qkv", got, ref, f32):
        err = (g.double() - r).abs().max().item()
        allow = 4 * (t32.double() - r).abs().max().item() + 2**-20 * r.abs().max().item()
        assert err <= allow, f"causal {sq}x{skv} d{name}: error {err:.3g} > envelope {allow:.3g}"
    if skv > sq:  # keys no query sees get exact zeros
        assert torch.count_nonzero(got[1][:, :, sq:]) == 0 and torch.count_nonzero(got[2][:, :, sq:]) == 0


@pytest.mark.parametrize("variant", ["upper_left", "lower_right"])
@pytest.mark.parametrize("sq,skv", [(96, 96), (40, 130), (130, 40)])
def test_causal_bias_masks_match_fp64_sdpa(variant, sq, skv):
    """torch.nn.attention.bias's CausalBias masks (whose storage holds no
    values) run as torch's SDPA runs them: output and gradients within the
    envelope of the fp64 SDPA given the same bias (lower-right with Sq > Skv
    has rows with no key: 0 and zero gradients, as SDPA gives)."""
    bias = getattr(attn_bias, f"causal_{variant}")(sq, skv)
    q, k, v, dout = _inputs(1, 4, 2, sq, skv, 24)
    out, got = _grads(lambda *t: fxattn.scaled_dot_product_attention(*t, attn_mask=bias, enable_gqa=True), q, k, v, dout, torch.float32)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        ref_out, ref = _grads(lambda *t: _sdpa_masked(*t, attn_mask=bias), q, k, v, dout, torch.float64)
        out32, f32 = _grads(lambda *t: _sdpa_masked(*t, attn_mask=bias), q, k, v, dout, torch.float32)
    for name, g, r, t32 in zip(("out", "dq", "dk", "dv"), [out] + got, [ref_out] + ref, [out32] + f32):
        err = (g.double() - r).abs().max().item()
        allow = 4 * (t32.double() - r).abs().max().item() + 2**-20 * r.abs().max().item()
        assert err <= allow, f"{variant} {sq}x{skv} {name}: error {err:.3g} > envelope {allow:.3g}"


def test_tensor_subclass_masks_are_refused():
    """A mask of another tensor subclass is refused before its memory is
    read, by the function and by the operator."""

    class Wrapped(torch.Tensor):
        pass

    q, k, v, _ = _inputs(1, 2, 2, 8, 8, 16)
    mask = torch.zeros(8, 8).as_subclass(Wrapped)
    with pytest.raises(fxattn.InvalidArgumentError, match="tensor subclass"):
        fxattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with pytest.raises(fxattn.InvalidArgumentError, match="tensor subclass"):
        torch.ops.fxattn.attention(q, k, v, 0.0, "bhsd", "auto", True, "fp32", False, "", 1, mask[None, None])
    with pytest.raises(fxattn.InvalidArgumentError, match="3 queries and 8 keys"):
        fxattn.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias.causal_lower_right(3, 8))


@pytest.mark.parametrize("shape", [(1, 3, 8, 12), (1, 1, 8, 5), (3, 1, 1, 1), (1, 1, 1, 24)])
def test_operator_refuses_masks_that_do_not_broadcast(shape):
    """torch.ops.fxattn.attention takes a 4-D mask that broadcasts to
    [B, Hq, Sq, Skv] (each axis 1 or the full extent) and refuses another
    before reading it, in eager and fake (traced) calls."""
    q, k, v, _ = _inputs(2, 2, 2, 8, 12, 16)
    mask = torch.zeros(shape)
    with pytest.raises(fxattn.InvalidArgumentError, match=r"does not broadcast to \[B, Hq, Sq, Skv\] = \[2, 2, 8, 12\]"):
        torch.ops.fxattn.attention(q, k, v, 0.0, "bhsd", "auto", True, "fp32", False, "", 1, mask)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = [mode.from_tensor(t) for t in (q, k, v, mask)]
        with pytest.raises(fxattn.InvalidArgumentError, match="does not broadcast"):
            torch.ops.fxattn.attention(*fake[:3], 0.0, "bhsd", "auto", True, "fp32", False, "", 1, fake[3])


@pytest.mark.parametrize("view", ["one element", "key row of a bigger tensor", "full"])
def test_operator_reads_broadcast_mask_axes_with_stride_zero(view):
    """Size-1 mask axes broadcast (read with stride 0 whatever their
    stride): a [1, 1, 1, 1] mask of one element, a [1, 1, 1, Skv] key mask
    sliced from a bigger tensor (other rows past each axis) and a full mask
    give SDPA's result."""
    q, k, v, _ = _inputs(2, 2, 2, 8, 12, 16)
    big = 4 * torch.randn(3, 5, 8, 12, generator=torch.Generator().manual_seed(5))
    mask = {"one element": big[:1, :1, :1, :1].clone(), "key row of a bigger tensor": big[:1, :1, :1], "full": big[:2, :2]}[view]
    out, _, _ = torch.ops.fxattn.attention(q, k, v, 0.0, "bhsd", "auto", True, "fp32", False, "", 1, mask)
    ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask.double())
    assert (out.double() - ref).abs().max().item() <= 2**-16 * v.abs().max().item()


def test_double_backward_is_refused_clearly():
    """fxattn has no second-order gradients: a backward through gradients
    taken with create_graph=True (a gradient penalty) raises an error
    naming fxattn; first-order gradients under create_graph are right."""
    q, k, v, dout = _inputs(1, 2, 2, 16, 16, 8)
    q.requires_grad_()
    out = fxattn.scaled_dot_product_attention(q, k, v)
    (dq,) = torch.autograd.grad(out, q, dout, create_graph=True)
    _, ref = _grads(F.scaled_dot_product_attention, q.detach(), k, v, dout, torch.float64)
    assert (dq.double() - ref[0]).abs().max().item() <= 2**-16 * ref[0].abs().max().item()
    with pytest.raises(fxattn.UnsupportedError, match="fxattn has no second-order gradients"):
        dq.square().sum().backward()


@pytest.mark.parametrize("kind", ["causal", "bool"])
def test_bf16_compute_masked_backward(kind):
    """bf16 inputs with is_causal or a bool mask (dead rows included) run
    bf16 compute in the backward too: the gradients differ from
    compute="fp32"'s and are within bf16 compute's envelope of the fp64
    reference on the bf16 values (2^-5 max|reference|, as unmasked); keys
    no query sees and dead rows get exact zeros."""
    q, k, v, dout = _inputs(1, 4, 2, 75, 300, 40)
    if kind == "causal":
        kw = {"is_causal": True}
    else:
        mask = _masks(1, 4, 75, 300)["bool"]
        mask[:, :, [5, 60]] = False
        kw = {"attn_mask": mask}

    def sdpa(compute):
        return lambda *t: fxattn.scaled_dot_product_attention(*t, enable_gqa=True, compute=compute, **kw)

    _, got = _grads(sdpa("bf16"), q, k, v, dout, torch.bfloat16)
    _, fp32 = _grads(sdpa("fp32"), q, k, v, dout, torch.bfloat16)
    assert any(not torch.equal(a, b) for a, b in zip(got, fp32))
    qb, kb, vb = (t.bfloat16().float() for t in (q, k, v))
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        _, ref = _grads(lambda *t: _sdpa_masked(*t, **kw), qb, kb, vb, dout.bfloat16().float(), torch.float64)
    for name, g, r in zip("qkv", got, ref):
        err = (g.double() - r).abs().max().item()
        assert err <= 2**-5 * r.abs().max().item(), f"{kind} d{name}: error {err:.3g}"
    if kind == "causal":  # keys 75.. no query sees
        assert torch.count_nonzero(got[1][:, :, 75:]) == 0 and torch.count_nonzero(got[2][:, :, 75:]) == 0
    else:
        assert torch.count_nonzero(got[0][:, :, [5, 60]]) == 0


def test_fully_masked_rows_have_zero_gradients():
    """Rows with every key masked: fxattn's forward gives them 0 (a constant),
    so their dq is exactly 0 and they add nothing to dk, dv; torch's math
    SDPA (2.15) gives 0 and zero gradients there too."""
    q, k, v, dout = _inputs(1, 2, 2, 30, 50, 16)
    mask = torch.rand(1, 2, 30, 50, generator=torch.Generator().manual_seed(4)) > 0.4
    mask[..., 0] = True
    dead = torch.zeros(30, dtype=torch.bool)
    dead[[3, 17, 29]] = True
    mask[:, :, dead] = False
    _, got = _grads(lambda *t: fxattn.scaled_dot_product_attention(*t, attn_mask=mask), q, k, v, dout, torch.float32)
    assert torch.count_nonzero(got[0][:, :, dead]) == 0
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        _, ref = _grads(lambda *t: _sdpa_masked(*t, attn_mask=mask), q, k, v, dout, torch.float64)
        _, f32 = _grads(lambda *t: _sdpa_masked(*t, attn_mask=mask), q, k, v, dout, torch.float32)
    for name, g, r, t32 in zip("qkv", got, ref, f32):
        err = (g.double() - r).abs().max().item()
        allow = 4 * (t32.double() - r).abs().max().item() + 2**-20 * r.abs().max().item()
        assert err <= allow, f"d{name}: error {err:.3g} > envelope {allow:.3g}"


def test_gradcheck_on_the_fp64_reference():
    """torch.autograd.gradcheck (finite differences) on the fp64 reference
    this file compares with, for a bool mask, an additive mask and causal;
    then fxattn's fp32 gradients on the same tiny case against it."""
    q, k, v, dout = _inputs(1, 2, 1, 5, 7, 4)
    masks = _masks(1, 2, 5, 7)
    for kw in ({"attn_mask": masks["bool"]}, {"attn_mask": masks["additive"].double()}, {"is_causal": True}):
        leaves = [t.double().requires_grad_() for t in (q, k, v)]
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            assert torch.autograd.gradcheck(lambda *t, kw=kw: _sdpa_masked(*t, **kw), leaves)
            _, ref = _grads(lambda *t, kw=kw: _sdpa_masked(*t, **kw), q, k, v, dout, torch.float64)
        kw32 = {key: (m.float() if key == "attn_mask" and m.dtype != torch.bool else m) for key, m in kw.items()}
        _, got = _grads(
            lambda *t, kw32=kw32: fxattn.scaled_dot_product_attention(*t, enable_gqa=True, **kw32), q, k, v, dout, torch.float32
        )
        for g, r in zip(got, ref):  # fp32 on 7 keys of dim 4: a few ulps of fp32
            assert (g.double() - r).abs().max().item() <= 1e-5 * (1 + r.abs().max().item())


def test_mask_requiring_grad_is_refused():
    q, k, v, _ = _inputs(1, 2, 2, 16, 16, 8)
    q.requires_grad_()
    bias = torch.zeros(16, 16, requires_grad=True)
    with pytest.raises(fxattn.UnsupportedError, match="attn_mask requires grad"):
        fxattn.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    out = fxattn.scaled_dot_product_attention(q, k, v, attn_mask=bias.detach())
    out.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_masked_operator_opcheck():
    q, k, v, dout = _inputs(1, 4, 2, 24, 40, 16)
    mask = _masks(1, 4, 24, 40)["bool"]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    base = (0.0, "bhsd", "auto", True, "fp32")
    torch.library.opcheck(torch.ops.fxattn.attention.default, (*leaves, *base, True, "", 0, mask, False))
    torch.library.opcheck(torch.ops.fxattn.attention.default, (*leaves, *base, True, "", 0, None, True))
    out, lse, parts = torch.ops.fxattn.attention(q, k, v, *base, True, "", 0, mask, False)
    torch.library.opcheck(torch.ops.fxattn.attention_backward.default, (dout, q, k, v, out, lse, *base, 0, None, mask, False))
    torch.library.opcheck(torch.ops.fxattn.attention_backward.default, (dout, q, k, v, out, lse, *base, 0, None, mask, False, parts))
    # an empty lse is computed again with the mask (and its parts): the same gradients
    empty = torch.empty(0)
    a = torch.ops.fxattn.attention_backward(dout, q, k, v, out, lse, *base, 0, None, mask, False, parts)
    b = torch.ops.fxattn.attention_backward(dout, q, k, v, out, empty, *base, 0, None, mask, False)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_lse_recomputed_for_direct_operator_calls():
    q, k, v, dout = _inputs(1, 2, 2, 40, 24, 16)
    args = (0.0, "bhsd", "auto", True, "fp32", False, "", 0)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, parts = torch.ops.fxattn.attention(*leaves, *args)  # return_lse False: lse [0]
    assert lse.shape == (0,) and parts.shape == (0,)
    out.backward(dout)
    _, want = _grads(lambda *t: fxattn.attention(*t, layout="bhsd"), q, k, v, dout, torch.float32)
    for leaf, w in zip(leaves, want):
        assert torch.equal(leaf.grad, w)


def test_opcheck():
    q, k, v, dout = _inputs(1, 4, 2, 24, 40, 16)
    for layout, (a, b, c) in (("bhsd", (q, k, v)), ("bshd", tuple(t.transpose(1, 2) for t in (q, k, v)))):
        leaves = [t.clone().requires_grad_() for t in (a, b, c)]
        torch.library.opcheck(torch.ops.fxattn.attention.default, (*leaves, 0.0, layout, "auto", True, "fp32", True, "", 0))
        torch.library.opcheck(torch.ops.fxattn.attention.default, (*leaves, 0.0, layout, "auto", True, "fp32", False, "", 0))
    out, lse, parts = torch.ops.fxattn.attention(q, k, v, 0.0, "bhsd", "auto", True, "fp32", True, "", 0)
    torch.library.opcheck(torch.ops.fxattn.attention_backward.default, (dout, q, k, v, out, lse, 0.0, "bhsd", "auto", True, "fp32", 0))
    torch.library.opcheck(
        torch.ops.fxattn.attention_backward.default,
        (dout, q, k, v, out, lse, 0.0, "bhsd", "auto", True, "fp32", 0, None, None, False, parts),
    )


def test_torch_compile_forward_and_backward():
    torch._dynamo.reset()
    q, k, v, dout = _inputs(1, 4, 2, 32, 48, 16)

    def f(q, k, v):
        return (fxattn.attention(q, k, v, layout="bhsd") * 2.0).sin()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    _, want = _grads(f, q, k, v, dout, torch.float32)
    _, got = _grads(compiled, q, k, v, dout, torch.float32)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_torch_compile_masked_and_causal_backward():
    torch._dynamo.reset()
    q, k, v, dout = _inputs(1, 2, 2, 40, 56, 16)
    mask = _masks(1, 2, 40, 56)["additive"]

    def f(q, k, v):
        causal = fxattn.scaled_dot_product_attention(q, k, v, is_causal=True)
        return causal + fxattn.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    _, want = _grads(f, q, k, v, dout, torch.float32)
    _, got = _grads(compiled, q, k, v, dout, torch.float32)
    for a, b in zip(got, want):
        assert torch.equal(a, b)  # the same operators on the same inputs


def _train(attention: str, steps: int = 3):
    """Losses and final weights of `steps` Adam steps of a tiny random Wan
    transformer (no downloads) with attention by diffusers' default
    ("torch"), fxattn's processor ("processor") or fxattn's backend
    ("backend")."""
    diffusers = pytest.importorskip("diffusers")
    from diffusers.models.attention_dispatch import attention_backend

    import fxattn.diffusers as fd

    torch.manual_seed(0)
    m = diffusers.WanTransformer3DModel(**WAN_T2V).train()
    if attention == "processor":
        m.set_attn_processor(fd.WanAttnProcessor(threads=2))
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x, ctx, target = (torch.randn(*shape, generator=g) for shape in ((2, 4, 3, 8, 10), (2, 7, 16), (2, 4, 3, 8, 10)))
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        if attention == "backend":
            with attention_backend("fxattn"):
                y = m(x, torch.tensor([500, 300]), ctx, return_dict=False)[0]
        else:
            y = m(x, torch.tensor([500, 300]), ctx, return_dict=False)[0]
        loss = F.mse_loss(y, target)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in m.named_parameters()}


def test_tiny_wan_trains_as_with_torch_attention(monkeypatch):
    """A few training steps give diffusers' default attention's losses and
    weights within the fp32 envelope: 2^-16 relative for the losses and
    of each parameter's scale for the weights (measured: equal losses,
    weights within 5e-7; Adam's sign-like update, lr 1e-3, amplifies
    gradient differences where a gradient is tiny)."""
    calls = []
    run_backward = torch_op.run_backward
    monkeypatch.setattr(torch_op, "run_backward", lambda *a: calls.append(1) or run_backward(*a))
    ref_losses, ref_w = _train("torch")
    assert not calls
    for attention in ("processor", "backend"):
        losses, w = _train(attention)
        assert len(calls) == 3 * 2 * 2, attention  # steps x layers x (self + cross attention)
        calls.clear()
        for a, b in zip(losses, ref_losses):
            assert abs(a - b) <= 2**-16 * abs(b), (attention, losses, ref_losses)
        for n, p in w.items():
            scale = max(ref_w[n].abs().max().item(), 1e-3)
            assert (p - ref_w[n]).abs().max().item() <= 2**-16 * scale, (attention, n)


@pytest.mark.parametrize("sq,skv", [(40, 130), (130, 40)])
def test_causal_lower_right_runs_in_the_library_as_its_mask(sq, skv):
    """causal_lower_right reaches the library as its alignment (no Sq x Skv
    mask made): the bits of the bool mask tril(ones(Sq, Skv), Skv - Sq),
    output and gradients; the operator takes causal_lower_right only with
    is_causal."""
    q, k, v, dout = _inputs(1, 4, 2, sq, skv, 24, seed=4)
    mask = torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq)
    run = fxattn.scaled_dot_product_attention
    out_b, got_b = _grads(
        lambda *t: run(*t, attn_mask=attn_bias.causal_lower_right(sq, skv), enable_gqa=True), q, k, v, dout, torch.float32
    )
    out_m, got_m = _grads(lambda *t: run(*t, attn_mask=mask, enable_gqa=True), q, k, v, dout, torch.float32)
    assert torch.equal(out_b, out_m) and all(torch.equal(a, b) for a, b in zip(got_b, got_m))
    kq, kk, kv = q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    out, _, _ = torch.ops.fxattn.attention(
        kq, kk, kv, 0.0, "bhsd", "auto", True, "fp32", False, "", 1, is_causal=True, causal_lower_right=True
    )
    assert torch.equal(out, run(kq, kk, kv, attn_mask=mask))
    with pytest.raises(fxattn.InvalidArgumentError, match="causal_lower_right=True needs is_causal=True"):
        torch.ops.fxattn.attention(kq, kk, kv, 0.0, "bhsd", "auto", True, "fp32", False, "", 1, causal_lower_right=True)
