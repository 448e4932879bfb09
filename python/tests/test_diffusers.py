"""fxattn.diffusers.WanAttnProcessor in a tiny random WanTransformer3DModel
(T2V, and I2V with the image branch), against diffusers' default processor.

Tolerances. fp32: the processors differ only in rounding: fxattn's
attention is exact to fp32 rounding, as is SDPA's, and the fused layer's
sgemm/RoPE round differently from torch's ops (diffusers' RoPE runs in
fp64). A few-ulp difference of an attention output passes through 2 blocks
(residuals, LayerNorms, FFN, 3 attentions each, the output projection) whose
gains are O(1); the runs see < 1e-6 of max|y|, so FP32_TOL = 2^-15 max|y|
(256 fp32 ulps of max|y|) leaves a margin of tens, while a wrong RoPE, image
branch, head split or scale moves y by O(max|y|) (checked below: dropping
the image branch fails it by far).
bf16: both processors round to bf16 (half an ulp, 2^-9 relative) at every
op's output (per op) or at each stage of the bf16 fused layer (x, Q, K, V,
the probabilities, the attention output), so they drift apart by a few
bf16 ulps through the model. Rather than a bare bound, fxattn in bf16 must
be as close to the fp32 model as diffusers' default in bf16 is (within 2x,
as the rounding paths differ), and within 2^-4 max|y| (8 bf16 ulps of
max|y|) of the default in bf16. The bf16 fused layer alone is held to
diffusers' bf16 error against fp64 in python/tests/test_wan.py.
"""

import copy

import pytest
import torch
from diffusers import WanTransformer3DModel
from diffusers.models.transformers.transformer_wan import WanAttention
from diffusers.models.transformers.transformer_wan import WanAttnProcessor as DefaultProcessor
from wan_configs import I2V, LAYERS, T2V

import fxattn.diffusers as fd
import fxattn.wan as fw
from fxattn.integrations.diffusers import processor

FP32_TOL = 2.0**-15
BF16_TOL = 2.0**-4

IMAGE_TOKENS = 6


def model(i2v: bool, seed: int = 0):
    torch.manual_seed(seed)
    return WanTransformer3DModel(**(I2V if i2v else T2V)).eval()


def bf16_model(m):
    """m in bf16 as from_pretrained(torch_dtype=torch.bfloat16) makes it
    (which needs accelerate): every parameter and buffer bf16 but those of
    _keep_in_fp32_modules (rope, time_embedder, norms, ...), fp32."""
    keep = set(WanTransformer3DModel._keep_in_fp32_modules)
    with torch.no_grad():
        for name, t in [*m.named_parameters(), *m.named_buffers()]:
            t.data = t.data.to(torch.float32 if keep & set(name.split(".")) else torch.bfloat16)
    assert m.rope.freqs_cos.dtype == torch.float32
    return m


def inputs(i2v: bool, dtype=torch.float32, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 4, 3, 8, 10, generator=g)  # latent grid 3 x 4 x 5 after the (1, 2, 2) patches
    ctx = torch.randn(1, fd.TEXT_CONTEXT, 16, generator=g)
    args = dict(hidden_states=x.to(dtype), timestep=torch.tensor([500]), encoder_hidden_states=ctx.to(dtype))
    if i2v:
        args["encoder_hidden_states_image"] = torch.randn(1, IMAGE_TOKENS, 8, generator=g).to(dtype)
    return args


def forward(m, processor, args):
    m.set_attn_processor(processor)
    with torch.no_grad():
        return m(**args).sample.float()


def rel(y, ref):
    return ((y - ref).abs().max() / ref.abs().max()).item()


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
@pytest.mark.parametrize("fused", [None, False], ids=["auto", "per-op"])
def test_fp32_matches_default(i2v, fused):
    m = model(i2v)
    args = inputs(i2v)
    ref = forward(m, DefaultProcessor(), args)
    p = fd.WanAttnProcessor(fused=fused, threads=2)
    y = forward(m, p, args)
    assert y.dtype == torch.float32 and y.shape == ref.shape
    assert rel(y, ref) < FP32_TOL
    assert p.calls == 2 * LAYERS  # attn1 and attn2 of each block went through it
    # auto: every self-attention ran the fused layer (fp32, Wan's RoPE of 3 x 4 x 5).
    assert p.fused_calls == (LAYERS if processor._FUSED_AUTO and fused is None else 0)


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
@pytest.mark.parametrize("cast", ["from_pretrained", "to"])
@pytest.mark.parametrize("fused", [None, False], ids=["auto", "per-op"])
def test_bf16_as_accurate_as_default(i2v, cast, fused):
    """bf16 models: from_pretrained(torch_dtype=bf16) keeps the RoPE tables
    fp32, so auto runs the bf16 fused layer on every self-attention;
    .to(torch.bfloat16) rounds the tables too (diffusers warns), which is
    no longer Wan's RoPE to fp32 precision: per op."""
    m = model(i2v)
    ref32 = forward(m, DefaultProcessor(), inputs(i2v))
    m = bf16_model(m) if cast == "from_pretrained" else m.to(torch.bfloat16)
    assert m.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16
    args = inputs(i2v, torch.bfloat16)
    ref = forward(m, DefaultProcessor(), args)
    p = fd.WanAttnProcessor(fused=fused, threads=2)
    m.set_attn_processor(p)
    with torch.no_grad():
        out = m(**args).sample
    assert out.dtype == torch.bfloat16
    y = out.float()
    fused_runs = fused is None and processor._FUSED_AUTO and cast == "from_pretrained"
    assert p.calls == 2 * LAYERS and p.fused_calls == (LAYERS if fused_runs else 0)
    assert rel(y, ref32) <= 2 * rel(ref, ref32) + 2.0**-8
    assert rel(y, ref) < BF16_TOL


def test_processor_is_really_used(monkeypatch):
    m = model(True)
    args = inputs(True)

    def boom(*a, **k):
        raise RuntimeError("fxattn.attention was called")

    monkeypatch.setattr(processor, "attention", boom)
    with pytest.raises(RuntimeError, match="fxattn.attention was called"):
        forward(m, fd.WanAttnProcessor(fused=False), args)
    # The fused self-attention does not call fxattn.attention; the cross-attention does.
    with pytest.raises(RuntimeError, match="fxattn.attention was called"):
        forward(m, fd.WanAttnProcessor(fused=True), args)


def test_image_branch_matters():
    """Without the I2V image branch y moves far outside FP32_TOL: the
    tolerance does test the branch."""
    m = model(True)
    args = inputs(True)
    ref = forward(m, DefaultProcessor(), args)
    p = fd.WanAttnProcessor(fused=False)
    saved = processor._get_added_kv_projections
    try:
        processor._get_added_kv_projections = lambda attn, c: tuple(torch.zeros_like(t) for t in saved(attn, c))
        y = forward(m, p, args)
    finally:
        processor._get_added_kv_projections = saved
    assert rel(y, ref) > 100 * FP32_TOL


def self_attention_call(seed=2, grid=(3, 4, 5), dtype=torch.float32):
    """A block's attn1 with a normalised input and diffusers' rotary_emb
    (fp64, as the model's rope makes it); bf16: the module and input in
    bf16 (a copy of the block's attn1), the tables fp32 as a bf16 model
    loaded with from_pretrained(torch_dtype=...) makes them."""
    m = model(False)
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(1, grid[0] * grid[1] * grid[2], 24, generator=g)
    rotary_emb = m.rope(torch.empty(1, 4, grid[0], 2 * grid[1], 2 * grid[2]))
    attn = m.blocks[0].attn1
    if dtype != torch.float32:
        attn, hs = copy.deepcopy(attn).to(dtype), hs.to(dtype)
        rotary_emb = tuple(t.float() for t in rotary_emb)
    return attn, hs, rotary_emb


def test_rope_grid_and_fallback():
    attn, hs, rotary_emb = self_attention_call()
    assert fd.rope_grid(rotary_emb, 60) == (3, 4, 5)
    assert fd.rope_grid(rotary_emb, 59) is None
    # Tokens out of raster order, or shifted positions: not Wan's RoPE of a grid.
    perm = torch.randperm(60, generator=torch.Generator().manual_seed(0))
    shuffled = tuple(t[:, perm] for t in rotary_emb)
    assert fd.rope_grid(shuffled, 60) is None
    m = model(False)
    shifted = m.rope(torch.empty(1, 4, 4, 8, 10))
    shifted = tuple(t[:, 20:] for t in shifted)  # frames 1..3 of 4: grid-shaped, but not from 0
    assert fd.rope_grid(shifted, 60) is None
    with torch.no_grad():
        for emb in (rotary_emb, shuffled, shifted):
            ref = DefaultProcessor()(attn, hs, None, None, emb)
            p = fd.WanAttnProcessor(threads=2)
            y = p(attn, hs, None, None, emb)
            assert rel(y, ref) < FP32_TOL
            assert p.fused_calls == (1 if emb is rotary_emb and processor._FUSED_AUTO else 0)
        with pytest.raises(ValueError, match="not Wan's 3-D RoPE"):
            fd.WanAttnProcessor(fused=True)(attn, hs, None, None, shuffled)


def test_head_slice_runs_per_op():
    """A WanAttention with fewer heads than its width (heads x head dim
    below dim: a head slice of a layer) runs per op in auto mode, as
    diffusers computes it; fused=True says why it cannot run fused."""
    _, hs, rotary_emb = self_attention_call()
    torch.manual_seed(3)
    attn = WanAttention(dim=hs.shape[-1], heads=1, dim_head=T2V["attention_head_dim"], eps=1e-6).eval()
    with torch.no_grad():
        ref = DefaultProcessor()(attn, hs, None, None, rotary_emb)
        p = fd.WanAttnProcessor(threads=2)
        assert rel(p(attn, hs, None, None, rotary_emb), ref) < FP32_TOL
        assert p.calls == 1 and p.fused_calls == 0
        with pytest.raises(ValueError, match="a head slice"):
            fd.WanAttnProcessor(fused=True)(attn, hs, None, None, rotary_emb)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_layer_follows_weight_changes_and_batches(dtype):
    attn, hs, rotary_emb = self_attention_call(dtype=dtype)
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    p = fd.WanAttnProcessor(fused=True, threads=2)
    with torch.no_grad():
        y0 = p(attn, hs, None, None, rotary_emb)
        assert y0.dtype == dtype and p.fused_calls == 1
        attn.to_v.weight.mul_(2.0)
        ref = DefaultProcessor()(attn, hs, None, None, rotary_emb)
        y = p(attn, hs, None, None, rotary_emb)
        assert rel(y.float(), ref.float()) < tol and rel(y0.float(), ref.float()) > 1e-1
        hs2 = torch.cat([hs, hs.flip(1)])
        y2 = p(attn, hs2, None, None, rotary_emb)
        assert y2.shape == hs2.shape and y2.dtype == dtype
        assert rel(y2.float(), DefaultProcessor()(attn, hs2, None, None, rotary_emb).float()) < tol
        assert p.fused_calls == 3


def lora_merge_(linear, rank=2, scale=0.5, seed=0):
    """Merge a LoRA-style low-rank delta into linear's weight as LoRA
    loaders do, through .data (which changes neither data_ptr nor _version)."""
    g = torch.Generator().manual_seed(seed)
    out_f, in_f = linear.weight.shape
    b, a = torch.randn(out_f, rank, generator=g), torch.randn(rank, in_f, generator=g)
    linear.weight.data += (scale / rank**0.5 * b @ a / in_f**0.5).to(linear.weight.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_layer_sees_a_lora_merge_through_data(dtype):
    """After a first fused call, a LoRA delta merged into q, k, v and out
    through `weight.data +=` is used by the next call: it matches diffusers'
    processor on the merged module (the module-level tolerances above) and
    differs from the pre-merge output by far more than that."""
    attn, hs, rotary_emb = self_attention_call(dtype=dtype)
    tol = FP32_TOL if dtype == torch.float32 else BF16_TOL
    p = fd.WanAttnProcessor(fused=True, threads=2)
    with torch.no_grad():
        y0 = p(attn, hs, None, None, rotary_emb)
        ptrs = [m.weight.data_ptr() for m in (attn.to_q, attn.to_k, attn.to_v, attn.to_out[0])]
        versions = [m.weight._version for m in (attn.to_q, attn.to_k, attn.to_v, attn.to_out[0])]
        for i, m in enumerate((attn.to_q, attn.to_k, attn.to_v, attn.to_out[0])):
            lora_merge_(m, seed=i)
        assert ptrs == [m.weight.data_ptr() for m in (attn.to_q, attn.to_k, attn.to_v, attn.to_out[0])]
        assert versions == [m.weight._version for m in (attn.to_q, attn.to_k, attn.to_v, attn.to_out[0])]
        ref = DefaultProcessor()(attn, hs, None, None, rotary_emb).float()
        y = p(attn, hs, None, None, rotary_emb)
    assert p.fused_calls == 2
    assert rel(y.float(), ref) < tol
    assert rel(y0.float(), ref) > 4 * tol


def test_bf16_fused_is_the_bf16_layer_on_the_module_bits():
    """A bf16 self-attention through the processor is fxattn.wan's bf16
    layer on the module's bf16 weights as they are (no second rounding):
    the same bytes; the fp32 module's copy rounded to bf16 is the same
    layer too (torch and the package round alike)."""
    attn, hs, rotary_emb = self_attention_call(dtype=torch.bfloat16)
    p = fd.WanAttnProcessor(threads=2)
    with torch.no_grad():
        y = p(attn, hs, None, None, rotary_emb)
    assert p.fused_calls == 1 and y.dtype == torch.bfloat16
    layer = p._layers[attn][1]
    assert layer.dtype == "bf16"
    expect = fw.WanSelfAttention.from_module(attn, threads=2, dtype="bf16")(hs[0], (3, 4, 5))
    assert torch.equal(y[0].view(torch.int16), expect.view(torch.int16))


def test_mask_and_bad_fused_raise():
    attn, hs, rotary_emb = self_attention_call()
    mask = torch.ones(1, 1, 60, 60, dtype=torch.bool)
    with pytest.raises(ValueError, match="attention_mask must be None"):
        fd.WanAttnProcessor()(attn, hs, None, mask, rotary_emb)
    with pytest.raises(ValueError, match="fused must be None, True or False"):
        fd.WanAttnProcessor(fused="yes")
    with pytest.raises(ValueError, match="not fp32 or bf16"):
        fd.WanAttnProcessor(fused=True)(attn, hs.half(), None, None, rotary_emb)
    # bf16 input to an fp32 module (diffusers' own processor refuses it too).
    with pytest.raises(ValueError, match="the fused layer runs in the module's dtype"):
        fd.WanAttnProcessor(fused=True)(attn, hs.bfloat16(), None, None, rotary_emb)
    # A bf16 module with its RoPE tables cast to bf16 too: not Wan's RoPE to fp32 precision.
    attn_b, hs_b, emb = self_attention_call(dtype=torch.bfloat16)
    with torch.no_grad(), pytest.raises(ValueError, match="not Wan's 3-D RoPE"):
        fd.WanAttnProcessor(fused=True)(attn_b, hs_b, None, None, tuple(t.bfloat16() for t in emb))


def test_fused_projections_model():
    """diffusers' fuse_qkv_projections (to_qkv, to_kv, to_added_kv) runs
    through the processor the same way."""
    m = model(True)
    args = inputs(True)
    ref = forward(m, DefaultProcessor(), args)
    m.fuse_qkv_projections()
    assert m.blocks[0].attn1.fused_projections and m.blocks[0].attn2.fused_projections
    for fused in (None, False):
        p = fd.WanAttnProcessor(fused=fused, threads=2)
        assert rel(forward(m, p, args), ref) < FP32_TOL
        assert p.calls == 2 * LAYERS
