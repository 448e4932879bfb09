"""The "fxattn" attention backend of diffusers' dispatcher
(fxattn.integrations.diffusers.backend, registered by importing fxattn.diffusers), in
tiny random diffusers models built from configs (no downloads): Wan T2V
and I2V, Flux, LTX-Video and Qwen-Image, whose attention processors call
dispatch_attention_fn, and with masks (fxattn.scaled_dot_product_attention)
HunyuanVideo, LTX-Video and Qwen-Image with padded text. CogVideoX's processor calls torch's SDPA itself, so
no backend applies to it.

Tolerances, against the same model in fp64 on diffusers' native backend
(torch SDPA), per model, with s = max|y_fp64|:
fp64 (the model cast to fp64, fxattn computing in fp64): within 1e-12 s.
fp32: the native backend's fp32 error is fp32 rounding through 1-2 blocks,
about 2^-22 s here; fp32 must stay within 2^-18 s of it (asserted), and
fxattn within 2 x that error + 2^-22 s of fp64 and within 2^-18 s of the
native fp32 output (a 16x margin over the rounding seen; a 1% change of
the softmax scale moves y by about 2^-9 s, checked below).
bf16 (the model cast to bf16 whole): both backends round q, k, v, the
probabilities and the output to bf16 (2^-9 relative each), and the model
rounds every op around them, so fxattn's bf16 compute must be as close to
fp64 as the native backend's bf16 run (within 2x, as the rounding paths
differ) and within 2^-4 s (8 bf16 ulps of s) of it.
"""

import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from diffusers import (
    FluxTransformer2DModel,
    HunyuanVideoTransformer3DModel,
    LTXVideoTransformer3DModel,
    QwenImageTransformer2DModel,
    WanTransformer3DModel,
)
from diffusers.models import attention_dispatch as dispatch
from diffusers.models.attention_dispatch import AttentionBackendName, attention_backend, dispatch_attention_fn
from wan_configs import I2V, T2V

import fxattn
import fxattn.diffusers  # noqa: F401  (registers "fxattn")
import fxattn.integrations.diffusers.backend as backend

FP32_TOL = 2.0**-18
FP32_FLOOR = 2.0**-22
BF16_TOL = 2.0**-4


def _randn(g, *shape):
    return torch.randn(*shape, generator=g)


def wan_inputs(g, i2v):
    a = dict(hidden_states=_randn(g, 1, 4, 3, 8, 10), timestep=torch.tensor([500]), encoder_hidden_states=_randn(g, 1, 512, 16))
    if i2v:
        a["encoder_hidden_states_image"] = _randn(g, 1, 6, 8)
    return a


def qwen_inputs(g):
    a = dict(
        hidden_states=_randn(g, 1, 16, 16), encoder_hidden_states=_randn(g, 1, 7, 16), timestep=torch.tensor([1.0]), img_shapes=[(1, 4, 4)]
    )
    if "txt_seq_lens" in inspect.signature(QwenImageTransformer2DModel.forward).parameters:
        a["txt_seq_lens"] = [7]  # diffusers < 0.41 needs them
    return a


# name: (model class, config, inputs(generator))
MODELS = {
    "wan_t2v": (WanTransformer3DModel, T2V, lambda g: wan_inputs(g, False)),
    "wan_i2v": (WanTransformer3DModel, I2V, lambda g: wan_inputs(g, True)),
    "flux": (
        FluxTransformer2DModel,
        dict(
            patch_size=1,
            in_channels=4,
            num_layers=1,
            num_single_layers=1,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=32,
            axes_dims_rope=(4, 4, 8),
        ),
        lambda g: dict(
            hidden_states=_randn(g, 1, 16, 4),
            encoder_hidden_states=_randn(g, 1, 8, 32),
            pooled_projections=_randn(g, 1, 32),
            img_ids=_randn(g, 16, 3),
            txt_ids=torch.zeros(8, 3),
            timestep=torch.tensor([0.5]),
        ),
    ),
    "ltx_video": (
        LTXVideoTransformer3DModel,
        dict(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=8,
            cross_attention_dim=16,
            num_layers=1,
            caption_channels=16,
        ),
        lambda g: dict(
            hidden_states=_randn(g, 1, 2 * 4 * 4, 4),
            encoder_hidden_states=_randn(g, 1, 6, 16),
            timestep=torch.tensor([500]),
            encoder_attention_mask=None,
            num_frames=2,
            height=4,
            width=4,
        ),
    ),
    "qwen_image": (
        QwenImageTransformer2DModel,
        dict(
            patch_size=2,
            in_channels=16,
            out_channels=4,
            num_layers=2,
            attention_head_dim=16,
            num_attention_heads=3,
            joint_attention_dim=16,
            axes_dims_rope=(8, 4, 4),
        ),
        lambda g: qwen_inputs(g),
    ),
}


# Models whose attention gets a mask: padded text tokens (the last two of
# six or seven) as each pipeline passes them.
_TEXT_MASK = torch.tensor([[1, 1, 1, 1, 0, 0]])
MASKED_MODELS = {
    "hunyuan_video": (
        HunyuanVideoTransformer3DModel,
        dict(
            in_channels=4,
            out_channels=4,
            num_attention_heads=2,
            attention_head_dim=10,
            num_layers=1,
            num_single_layers=1,
            num_refiner_layers=1,
            patch_size=1,
            patch_size_t=1,
            guidance_embeds=True,
            text_embed_dim=16,
            pooled_projection_dim=8,
            rope_axes_dim=(2, 4, 4),
        ),
        lambda g: dict(
            hidden_states=_randn(g, 1, 4, 1, 4, 4),
            timestep=torch.tensor([500]),
            encoder_hidden_states=_randn(g, 1, 6, 16),
            pooled_projections=_randn(g, 1, 8),
            encoder_attention_mask=_TEXT_MASK,
            guidance=torch.tensor([3000.0]),
        ),
    ),
    "ltx_video_masked": (
        MODELS["ltx_video"][0],
        MODELS["ltx_video"][1],
        lambda g: dict(MODELS["ltx_video"][2](g), encoder_attention_mask=_TEXT_MASK),
    ),
    "qwen_image_masked": (
        MODELS["qwen_image"][0],
        MODELS["qwen_image"][1],
        lambda g: dict(MODELS["qwen_image"][2](g), encoder_hidden_states_mask=torch.tensor([[1, 1, 1, 1, 1, 0, 0]]).bool()),
    ),
}


def build(name):
    cls, config, inputs = {**MODELS, **MASKED_MODELS}[name]
    torch.manual_seed(0)
    return cls(**config).eval(), inputs(torch.Generator().manual_seed(1))


def cast(args, dtype):
    return {k: v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v for k, v in args.items()}


def forward(model, args, dtype, name=None):
    """model(args) in dtype with backend `name` set on the model (None: the
    model's processors keep their backend and the active one runs), as
    fp64."""
    model.to(dtype)
    if name is not None:
        model.set_attention_backend(name)
    try:
        with torch.no_grad():
            return model(**cast(args, dtype), return_dict=False)[0].double()
    finally:
        model.reset_attention_backend()
        dispatch._AttentionBackendRegistry._active_backend = AttentionBackendName.NATIVE


def _count_calls(monkeypatch, name):
    """Counts the backend's calls of fxattn.<name> (a one-element list)."""
    n = [0]
    run = getattr(fxattn, name)

    def counted(*a, **k):
        n[0] += 1
        return run(*a, **k)

    monkeypatch.setattr(backend, name, counted)
    return n


@pytest.fixture
def calls(monkeypatch):
    """Counts the calls of fxattn.attention (the backend's unmasked call)."""
    return _count_calls(monkeypatch, "attention")


@pytest.fixture
def masked_calls(monkeypatch):
    """Counts the calls of fxattn.scaled_dot_product_attention (the
    backend's masked call)."""
    return _count_calls(monkeypatch, "scaled_dot_product_attention")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_fp32_bf16(name, calls):
    check_model(name, calls)


@pytest.mark.parametrize("name", sorted(MASKED_MODELS))
def test_masked_model_fp32_bf16(name, masked_calls):
    check_model(name, masked_calls)


def check_model(name, calls):
    """The model's output with fxattn against the native backend and fp64
    (the tolerances of the module's docstring); calls counts the backend's
    calls."""
    model, args = build(name)
    ref = forward(model, args, torch.float64, "native")
    s = ref.abs().max().item()
    native = forward(model, args, torch.float32, "native")
    assert calls[0] == 0
    fx = forward(model, args, torch.float32, "fxattn")
    fp32_calls = calls[0]
    assert fp32_calls > 0
    e_native, e_fx = (native - ref).abs().max().item(), (fx - ref).abs().max().item()
    assert e_native <= FP32_TOL * s
    assert e_fx <= 2 * e_native + FP32_FLOOR * s, (e_fx / s, e_native / s)
    assert (fx - native).abs().max().item() <= FP32_TOL * s

    native_b = forward(model, args, torch.bfloat16, "native")
    fx_b = forward(model, args, torch.bfloat16, "fxattn")
    assert calls[0] == 2 * fp32_calls
    e_native_b, e_fx_b = (native_b - ref).abs().max().item(), (fx_b - ref).abs().max().item()
    assert e_fx_b <= 2 * e_native_b, (e_fx_b / s, e_native_b / s)
    assert (fx_b - native_b).abs().max().item() <= BF16_TOL * s


@pytest.mark.parametrize("name", sorted(MODELS) + sorted(MASKED_MODELS))
def test_model_fp64(name, calls, masked_calls):
    """The model cast to fp64: the backend computes its attention in fp64
    (float64 in, float64 out, no rounding to fp32 anywhere), so the output
    is the native backend's fp64 output to fp64 rounding through the
    blocks (1e-12 s: about 10^3 units of 2^-53; one fp32 rounding would be
    2^-24)."""
    model, args = build(name)
    ref = forward(model, args, torch.float64, "native")
    assert calls[0] == masked_calls[0] == 0
    fx = forward(model, args, torch.float64, "fxattn")
    assert calls[0] + masked_calls[0] > 0
    s = ref.abs().max().item()
    assert (fx - ref).abs().max().item() <= 1e-12 * s


def test_tolerance_detects_a_wrong_scale(monkeypatch):
    """The fp32 tolerance is far below what a 1% error of the softmax scale
    does to a model's output."""
    model, args = build("wan_i2v")
    native = forward(model, args, torch.float32, "native")
    run = fxattn.attention

    def wrong(q, k, v, *, scale=None, **kw):
        return run(q, k, v, scale=1.01 * q.shape[-1] ** -0.5, **kw)

    monkeypatch.setattr(backend, "attention", wrong)
    fx = forward(model, args, torch.float32, "fxattn")
    assert (fx - native).abs().max().item() > 16 * FP32_TOL * native.abs().max().item()


def test_context_manager(calls):
    """attention_backend("fxattn") runs the model's attention in fxattn (the
    same calls as set_attention_backend: bit-identical output) and restores
    the active backend on exit."""
    model, args = build("flux")
    with attention_backend("fxattn"):
        assert dispatch._AttentionBackendRegistry.get_active_backend()[0] == "fxattn"
        ctx = forward(model, args, torch.float32)
    assert calls[0] > 0
    assert dispatch._AttentionBackendRegistry.get_active_backend()[0] == AttentionBackendName.NATIVE
    n = calls[0]
    assert torch.equal(ctx, forward(model, args, torch.float32, "fxattn"))
    assert calls[0] == 2 * n


_ENV_SCRIPT = textwrap.dedent(
    """
    import json, torch
    import fxattn.diffusers
    import fxattn.integrations.diffusers.backend as backend
    from diffusers import WanTransformer3DModel
    from diffusers.models.attention_dispatch import _AttentionBackendRegistry, attention_backend
    n = [0]
    run = backend.attention
    def counted(*a, **k):
        n[0] += 1
        return run(*a, **k)
    backend.attention = counted
    torch.manual_seed(0)
    m = WanTransformer3DModel(**json.loads(CONFIG)).eval()
    x = torch.randn(1, 4, 3, 8, 10); ctx = torch.randn(1, 512, 16)
    with torch.no_grad():
        y = m(x, torch.tensor([500]), ctx, return_dict=False)[0]
        fx_calls = n[0]
        with attention_backend("native"):
            y_native = m(x, torch.tensor([500]), ctx, return_dict=False)[0]
    print(json.dumps(dict(active=str(_AttentionBackendRegistry._active_backend.value), calls=fx_calls,
                          native_calls=n[0] - fx_calls, diff=(y - y_native).abs().max().item(), s=y_native.abs().max().item())))
    """
)


def _python(script, **env):
    return subprocess.run(
        [sys.executable, "-c", script.replace("CONFIG", repr(json.dumps(T2V)))],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_environment_variable():
    """DIFFUSERS_ATTN_BACKEND=fxattn, with fxattn.diffusers imported before
    any diffusers model: the active backend is fxattn from the start."""
    r = _python(_ENV_SCRIPT, DIFFUSERS_ATTN_BACKEND="fxattn")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["active"] == "fxattn"
    assert out["calls"] == 4 and out["native_calls"] == 0  # 2 blocks x (self, cross)
    assert out["diff"] <= FP32_TOL * out["s"]


def test_environment_variable_needs_fxattn_first():
    """diffusers turns DIFFUSERS_ATTN_BACKEND into a backend name when its
    dispatcher is first imported: a model imported before fxattn.diffusers
    fails there with diffusers' own error (the documented ordering)."""
    r = _python("from diffusers import WanTransformer3DModel\nWanTransformer3DModel", DIFFUSERS_ATTN_BACKEND="fxattn")
    assert r.returncode != 0
    assert "'fxattn' is not a valid AttentionBackendName" in r.stderr


def _qkv(b=2, sq=33, skv=40, hq=4, hkv=4, d=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    # [B, H, S, D] storage seen as [B, S, H, D]: the strided views attention
    # processors often pass.
    q = torch.randn(b, hq, sq, d, generator=g).to(dtype).transpose(1, 2)
    k = torch.randn(b, hkv, skv, d, generator=g).to(dtype).transpose(1, 2)
    v = torch.randn(b, hkv, skv, d, generator=g).to(dtype).transpose(1, 2)
    return q, k, v


def _sdpa64(q, k, v, **kw):
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw).transpose(1, 2)


def test_dispatch_views_lse_scale():
    """dispatch_attention_fn(backend=fxattn) on strided views: the output of
    the contiguous copies bit for bit, within fp32 rounding of fp64, and
    with return_lse the same output and lse [B, Sq, H] fp32 (diffusers'
    model layout), the log-sum-exp of the scaled scores, which merges
    partial attentions as diffusers' ring attention does."""
    q, k, v = _qkv()
    assert not q.is_contiguous()
    name = AttentionBackendName("fxattn")
    out = dispatch_attention_fn(q, k, v, scale=0.3, backend=name)
    assert out.shape == q.shape and out.dtype == torch.float32
    assert torch.equal(out, dispatch_attention_fn(q.contiguous(), k.contiguous(), v.contiguous(), scale=0.3, backend=name))
    assert (out - _sdpa64(q, k, v, scale=0.3)).abs().max().item() < 1e-5
    out2, lse = dispatch_attention_fn(q, k, v, scale=0.3, backend=name, attention_kwargs={"return_lse": True})
    assert torch.equal(out2, out)
    assert lse.shape == q.shape[:3] and lse.dtype == torch.float32
    scores = torch.einsum("bqhd,bkhd->bqhk", q.double(), k.double()) * 0.3
    assert (lse - scores.logsumexp(-1)).abs().max().item() < 1e-5
    # Two key halves merged by the ring update of diffusers'
    # TemplatedRingAttention (lse as [B, S, H, 1]) give the whole attention.
    (o1, l1), (o2, l2) = (
        dispatch_attention_fn(q, k[:, i : i + 20], v[:, i : i + 20], scale=0.3, backend=name, attention_kwargs={"return_lse": True})
        for i in (0, 20)
    )
    l1, l2 = l1.unsqueeze(-1), l2.unsqueeze(-1)
    merged = o1 - torch.sigmoid(l2 - l1) * (o1 - o2)
    assert (merged - out).abs().max().item() < 1e-5
    assert ((l1 - torch.nn.functional.logsigmoid(l1 - l2)).squeeze(-1) - lse).abs().max().item() < 1e-5


def test_dispatch_gqa_bf16():
    """enable_gqa with 4 query heads on 2 key heads (one key head without
    it), and bf16 inputs run in the compute fxattn chooses for this machine
    (compute="auto"): as close to fp64 as torch's bf16 SDPA (within 2x) and
    bit-identical to fxattn.attention with compute=fxattn.compute_choice's."""
    q, k, v = _qkv(hq=4, hkv=2, dtype=torch.bfloat16)
    name = AttentionBackendName("fxattn")
    out = dispatch_attention_fn(q, k, v, enable_gqa=True, backend=name)
    assert out.dtype == torch.bfloat16
    chosen = fxattn.compute_choice(torch.bfloat16, q.shape[-1]).compute
    assert torch.equal(out, fxattn.attention(q, k, v, layout="bshd", compute=chosen))
    ref = _sdpa64(q, k, v, enable_gqa=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), enable_gqa=True).transpose(1, 2)
    assert (out.double() - ref).abs().max().item() <= 2 * (sdpa.double() - ref).abs().max().item()
    with pytest.raises(ValueError, match="enable_gqa"):
        dispatch_attention_fn(q, k, v, backend=name)
    # One key head broadcasts without enable_gqa, as in torch's SDPA.
    k1, v1 = k[:, :, :1], v[:, :, :1]
    assert torch.equal(dispatch_attention_fn(q, k1, v1, backend=name), fxattn.attention(q, k1, v1, layout="bshd", compute=chosen))


def test_dispatch_compiles():
    """torch.compile(fullgraph=True) traces a dispatch_attention_fn call on
    the fxattn backend (named, active through attention_backend, and with a
    key mask) without a graph break, with the eager result."""
    q, k, v = _qkv()

    def named(q, k, v):
        return dispatch_attention_fn(q, k, v, backend=AttentionBackendName("fxattn")) * 2

    def active(q, k, v):
        return dispatch_attention_fn(q, k, v) * 2

    assert torch.equal(torch.compile(named, fullgraph=True, backend="aot_eager")(q, k, v), named(q, k, v))
    with attention_backend("fxattn"):
        assert torch.equal(torch.compile(active, fullgraph=True, backend="aot_eager")(q, k, v), named(q, k, v))

    def masked(q, k, v, m):
        return dispatch_attention_fn(q, k, v, attn_mask=m, backend=AttentionBackendName("fxattn")) * 2

    m = torch.arange(40).expand(2, 40) < torch.tensor([[31], [40]])
    assert torch.equal(torch.compile(masked, fullgraph=True, backend="aot_eager")(q, k, v, m), masked(q, k, v, m))


@pytest.mark.parametrize(
    "mask",
    ["bool", "additive", "key_mask", "causal"],
)
def test_dispatch_masks(mask):
    """attn_mask and is_causal as torch's SDPA takes them (a boolean
    [B, H, Sq, Skv] mask, an additive [Sq, Skv] one, is_causal) and the
    2-D [B, Skv] key mask diffusers' native backend reads as
    [B, 1, 1, Skv]: the native backend's result within fp32 rounding of
    fp64, for fp32 inputs on strided views."""
    q, k, v = _qkv(sq=40)
    g = torch.Generator().manual_seed(3)
    kw = {}
    if mask == "bool":
        kw["attn_mask"] = torch.rand(2, 4, 40, 40, generator=g) < 0.7
        kw["attn_mask"][..., 0] = True  # no fully masked row
    elif mask == "additive":
        kw["attn_mask"] = torch.randn(40, 40, generator=g)
    elif mask == "key_mask":
        kw["attn_mask"] = torch.arange(40).expand(2, 40) < torch.tensor([[31], [40]])
    else:
        kw["is_causal"] = True
    out = dispatch_attention_fn(q, k, v, backend=AttentionBackendName("fxattn"), **kw)
    ref_mask = kw.get("attn_mask")
    if mask == "key_mask":
        ref_mask = ref_mask[:, None, None, :]
    native = dispatch_attention_fn(q, k, v, backend=AttentionBackendName.NATIVE, **dict(kw, attn_mask=ref_mask))
    ref = _sdpa64(
        q,
        k,
        v,
        attn_mask=None if ref_mask is None else (ref_mask if ref_mask.dtype == torch.bool else ref_mask.double()),
        is_causal=kw.get("is_causal", False),
    )
    assert out.shape == q.shape and out.dtype == torch.float32
    e_native, e_fx = (native.double() - ref).abs().max().item(), (out.double() - ref).abs().max().item()
    assert e_fx <= 2 * e_native + 1e-6, (e_fx, e_native)
    with pytest.raises(ValueError, match="return_lse"):
        dispatch_attention_fn(q, k, v, backend=AttentionBackendName("fxattn"), attention_kwargs={"return_lse": True}, **kw)


def test_dropout_runs_sdpa_dropout():
    """dropout_p > 0 runs fxattn.scaled_dot_product_attention's dropout
    ("philox", seeded by torch's generator): the same seed gives the same
    output, the BSHD layout kept; an lse with dropout is refused."""
    q, k, v = _qkv()
    name = AttentionBackendName("fxattn")
    torch.manual_seed(3)
    out = dispatch_attention_fn(q, k, v, dropout_p=0.25, backend=name)
    torch.manual_seed(3)
    want = fxattn.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), dropout_p=0.25).transpose(1, 2)
    assert out.shape == q.shape and torch.equal(out, want)
    assert not torch.equal(out, dispatch_attention_fn(q, k, v, backend=name))
    with pytest.raises(ValueError, match="return_lse"):
        backend.fxattn_attention(q, k, v, dropout_p=0.25, return_lse=True)


def test_unsupported_arguments():
    """context parallelism is refused with a message naming it."""
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="context parallelism"):
        backend.fxattn_attention(q, k, v, _parallel_config=object())


def test_registration():
    """One member "fxattn" (FXATTN), known to set_attention_backend's name
    check and to AttentionBackendName("fxattn"); register() again changes
    nothing."""
    member = AttentionBackendName("fxattn")
    assert member is AttentionBackendName.FXATTN and member == "fxattn"
    assert [m for m in AttentionBackendName if m.value == "fxattn"] == [member]
    assert "fxattn" in {m.value for m in AttentionBackendName.__members__.values()}
    assert backend.register() is member
    assert [m for m in AttentionBackendName if m.value == "fxattn"] == [member]
    assert dispatch._AttentionBackendRegistry._backends[member] is backend.fxattn_attention
    assert "return_lse" in dispatch._AttentionBackendRegistry._supported_arg_names[member]


def test_registration_refuses_another_shape(monkeypatch):
    """A dispatcher of another shape raises ImportError naming the
    installed diffusers version."""
    import diffusers

    monkeypatch.setattr(dispatch, "_AttentionBackendRegistry", type("Other", (), {}))
    with pytest.raises(ImportError, match=f"diffusers {diffusers.__version__}'s attention dispatcher"):
        backend.register()
