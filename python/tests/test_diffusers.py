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
bf16: both processors round every op's output to bf16 (half an ulp, 2^-9
relative), so they drift apart by a few bf16 ulps through the model. Rather
than a bare bound, fxattn in bf16 must be as close to the fp32 model as
diffusers' default in bf16 is (within 2x, as the rounding paths differ),
and within 2^-4 max|y| (8 bf16 ulps of max|y|) of the default in bf16.
"""

import pytest
import torch
from diffusers import WanTransformer3DModel
from diffusers.models.transformers.transformer_wan import WanAttnProcessor as DefaultProcessor

import fxattn
import fxattn.diffusers as fd

FP32_TOL = 2.0**-15
BF16_TOL = 2.0**-4
LAYERS = 2

T2V = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=12,
    in_channels=4,
    out_channels=4,
    text_dim=16,
    freq_dim=8,
    ffn_dim=32,
    num_layers=LAYERS,
    cross_attn_norm=True,
    qk_norm="rms_norm_across_heads",
    rope_max_seq_len=32,
)
# Wan2.1-I2V's config has image_dim 1280 (CLIP) and added_kv_proj_dim = the
# inner dim (5120); here image_dim 8 and added_kv_proj_dim = 2 x 12.
I2V = dict(T2V, image_dim=8, added_kv_proj_dim=24)
IMAGE_TOKENS = 6


def model(i2v: bool, seed: int = 0):
    torch.manual_seed(seed)
    return WanTransformer3DModel(**(I2V if i2v else T2V)).eval()


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
    assert p.fused_calls == (LAYERS if fd._FUSED_AUTO and fused is None else 0)


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
def test_bf16_as_accurate_as_default(i2v):
    m = model(i2v)
    ref32 = forward(m, DefaultProcessor(), inputs(i2v))
    m = m.to(torch.bfloat16)
    args = inputs(i2v, torch.bfloat16)
    ref = forward(m, DefaultProcessor(), args)
    p = fd.WanAttnProcessor(threads=2)
    m.set_attn_processor(p)
    with torch.no_grad():
        out = m(**args).sample
    assert out.dtype == torch.bfloat16
    y = out.float()
    assert p.calls == 2 * LAYERS and p.fused_calls == 0  # bf16: never the fp32 fused layer
    assert rel(y, ref32) <= 2 * rel(ref, ref32) + 2.0**-8
    assert rel(y, ref) < BF16_TOL


def test_processor_is_really_used(monkeypatch):
    m = model(True)
    args = inputs(True)

    def boom(*a, **k):
        raise RuntimeError("fxattn.attention was called")

    monkeypatch.setattr(fxattn, "attention", boom)
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
    saved = fd._get_added_kv_projections
    try:
        fd._get_added_kv_projections = lambda attn, c: tuple(torch.zeros_like(t) for t in saved(attn, c))
        y = forward(m, p, args)
    finally:
        fd._get_added_kv_projections = saved
    assert rel(y, ref) > 100 * FP32_TOL


def self_attention_call(seed=2, grid=(3, 4, 5)):
    """A block's attn1 with a normalised input and diffusers' rotary_emb."""
    m = model(False)
    g = torch.Generator().manual_seed(seed)
    hs = torch.randn(1, grid[0] * grid[1] * grid[2], 24, generator=g)
    rotary_emb = m.rope(torch.empty(1, 4, grid[0], 2 * grid[1], 2 * grid[2]))
    return m.blocks[0].attn1, hs, rotary_emb


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
            assert p.fused_calls == (1 if emb is rotary_emb and fd._FUSED_AUTO else 0)
        with pytest.raises(ValueError, match="not Wan's 3-D RoPE"):
            fd.WanAttnProcessor(fused=True)(attn, hs, None, None, shuffled)


def test_fused_layer_follows_weight_changes_and_batches():
    attn, hs, rotary_emb = self_attention_call()
    p = fd.WanAttnProcessor(fused=True, threads=2)
    with torch.no_grad():
        y0 = p(attn, hs, None, None, rotary_emb)
        attn.to_v.weight.mul_(2.0)
        ref = DefaultProcessor()(attn, hs, None, None, rotary_emb)
        y = p(attn, hs, None, None, rotary_emb)
        assert rel(y, ref) < FP32_TOL and rel(y0, ref) > 1e-2
        hs2 = torch.cat([hs, hs.flip(1)])
        y2 = p(attn, hs2, None, None, rotary_emb)
        assert y2.shape == hs2.shape
        assert rel(y2, DefaultProcessor()(attn, hs2, None, None, rotary_emb)) < FP32_TOL


def test_mask_and_bad_fused_raise():
    attn, hs, rotary_emb = self_attention_call()
    mask = torch.ones(1, 1, 60, 60, dtype=torch.bool)
    with pytest.raises(ValueError, match="attention_mask must be None"):
        fd.WanAttnProcessor()(attn, hs, None, mask, rotary_emb)
    with pytest.raises(ValueError, match="fused must be None, True or False"):
        fd.WanAttnProcessor(fused="yes")
    with pytest.raises(ValueError, match="not fp32"):
        fd.WanAttnProcessor(fused=True)(attn, hs.bfloat16(), None, None, rotary_emb)


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
