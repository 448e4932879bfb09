"""WanAttnProcessor's fused self-attention runs only where it computes what
diffusers' processor computes, and never on stale weights: a PEFT LoRA
adapter (unfused, fused with fuse_lora, merged by unload_lora), forward
hooks, parametrised weights, in-place and .data edits, load_state_dict, a
swapped parameter, edited RoPE tables, autograd, and torch.compile. Each
case is compared with diffusers' own processor on the same module
(FP32_TOL of test_diffusers.py: rounding only), and each change is checked
to move the output by far more than that, so a stale or skipped change
would fail."""

import copy

import pytest
import torch
from diffusers.models.attention_processor import Attention
from diffusers.models.transformers.transformer_wan import WanAttention
from diffusers.models.transformers.transformer_wan import WanAttnProcessor as DefaultProcessor
from test_diffusers import FP32_TOL, LAYERS, forward, inputs, model, rel, self_attention_call

import fxattn.diffusers as fd
from fxattn.integrations.diffusers import processor

pytestmark = pytest.mark.skipif(not processor._FUSED_AUTO, reason="the fused layer is not the auto default")


def lora_config():
    from peft import LoraConfig

    # init_lora_weights=False: random A and B, so the adapter changes the output.
    return LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"], init_lora_weights=False)


def test_peft_lora_unfused_fused_and_merged():
    """A first call fuses the plain model; with a PEFT LoRA adapter on every
    attention projection the processor runs per op (exact for LoRA), also
    after fuse_lora (still LoRA layers); after unload_lora the projections
    are plain again, holding merged weights, and the fused layer runs on
    those weights."""
    m = model(False)
    args = inputs(False)
    p = fd.WanAttnProcessor(threads=2)
    y_base = forward(m, p, args)
    assert p.fused_calls == LAYERS
    m.add_adapter(lora_config())
    assert "lora" in type(m.blocks[0].attn1.to_q).__module__
    ref = forward(m, DefaultProcessor(), args)
    assert rel(ref, y_base) > 1e-2  # the adapter matters
    y = forward(m, p, args)
    assert p.fused_calls == LAYERS and rel(y, ref) < FP32_TOL
    m.fuse_lora()
    assert rel(forward(m, DefaultProcessor(), args), ref) < FP32_TOL
    y = forward(m, p, args)
    assert p.fused_calls == LAYERS and rel(y, ref) < FP32_TOL
    m.unload_lora()  # merged weights in plain nn.Linear modules
    assert type(m.blocks[0].attn1.to_q) is torch.nn.Linear
    y = forward(m, p, args)
    assert p.fused_calls == 2 * LAYERS and rel(y, ref) < FP32_TOL


def test_load_state_dict_data_edits_and_swapped_parameters():
    """After a first fused call, load_state_dict, a norm gain edited through
    .data and a projection's parameter replaced by a new one are all used
    by the next fused call."""
    m = model(False)
    args = inputs(False)
    p = fd.WanAttnProcessor(threads=2)
    y0 = forward(m, p, args)
    m.load_state_dict(model(False, seed=5).state_dict())
    ref = forward(m, DefaultProcessor(), args)
    assert rel(ref, y0) > 1e-2
    assert rel(forward(m, p, args), ref) < FP32_TOL
    attn = m.blocks[0].attn1
    attn.norm_k.weight.data.mul_(-1.5)  # neither data_ptr nor _version changes
    attn.to_out[0].weight = torch.nn.Parameter(attn.to_out[0].weight.detach().flip(0).clone())
    ref2 = forward(m, DefaultProcessor(), args)
    assert rel(ref2, ref) > 1e-2
    assert rel(forward(m, p, args), ref2) < FP32_TOL
    assert p.fused_calls == 3 * LAYERS


def test_rope_tables_edited_in_place_are_seen():
    """The RoPE tables are checked on every call: tables edited through
    .data after a fused call (same tensors, same _version) are no longer
    Wan's RoPE of a grid, and the call runs per op on them, as diffusers."""
    attn, hs, rotary_emb = self_attention_call()
    p = fd.WanAttnProcessor(threads=2)
    with torch.no_grad():
        y0 = p(attn, hs, None, None, rotary_emb)
        assert p.fused_calls == 1
        cos, sin = rotary_emb
        version = cos._version
        cos.data[:, 7:] = cos.data[:, :1].clone()
        sin.data[:, 7:] = sin.data[:, :1].clone()
        assert cos._version == version
        ref = DefaultProcessor()(attn, hs, None, None, rotary_emb)
        y = p(attn, hs, None, None, rotary_emb)
    assert p.fused_calls == 1 and rel(y, ref) < FP32_TOL and rel(y0, ref) > 1e-2
    # Two grids of the same 36 tokens, one after the other: each call its own grid.
    attn, hs, rope_a = self_attention_call(grid=(2, 3, 6))
    _, _, rope_b = self_attention_call(grid=(1, 6, 6))
    with torch.no_grad():
        for rope in (rope_a, rope_b, rope_a):
            ref = DefaultProcessor()(attn, hs, None, None, rope)
            assert rel(p(attn, hs, None, None, rope), ref) < FP32_TOL
    assert p.fused_calls == 4


def test_hooks_and_parametrizations_run_per_op():
    """A forward hook on a projection or a parametrised weight changes what
    diffusers computes; the processor then runs per op and agrees."""
    from torch.nn.utils import parametrize

    class Flip(torch.nn.Module):
        def forward(self, w):
            return w.flip(0)

    for case in ("hook", "parametrization"):
        attn, hs, rotary_emb = self_attention_call()
        with torch.no_grad():
            plain = DefaultProcessor()(attn, hs, None, None, rotary_emb)
            if case == "hook":
                attn.to_v.register_forward_hook(lambda mod, args, out: out * 3)
            else:
                parametrize.register_parametrization(attn.to_q, "weight", Flip())
            ref = DefaultProcessor()(attn, hs, None, None, rotary_emb)
            p = fd.WanAttnProcessor(threads=2)
            y = p(attn, hs, None, None, rotary_emb)
        assert rel(ref, plain) > 1e-2, case
        assert p.fused_calls == 0 and rel(y, ref) < FP32_TOL, case


def test_autograd_runs_per_op():
    """With grad mode on and weights requiring grad (training) the fused
    layer, which has no backward, does not run: the output is recorded by
    autograd through torch's projections and fxattn's attention, whose
    backward gives diffusers' gradients. Grad mode on with no tensor
    requiring grad still runs the fused layer."""
    attn, hs, rotary_emb = self_attention_call()
    attn.train()
    hs = hs.clone().requires_grad_(True)
    p = fd.WanAttnProcessor(threads=2)
    y = p(attn, hs, None, None, rotary_emb)
    assert p.fused_calls == 0 and y.requires_grad and y.grad_fn is not None
    ref = DefaultProcessor()(attn, hs, None, None, rotary_emb)
    assert rel(y.detach(), ref.detach()) < FP32_TOL
    y.square().sum().backward()
    got = (hs.grad, attn.to_q.weight.grad, attn.to_k.weight.grad, attn.to_v.weight.grad)
    hs.grad = None
    attn.zero_grad(set_to_none=True)
    ref.square().sum().backward()
    for g, r in zip(got, (hs.grad, attn.to_q.weight.grad, attn.to_k.weight.grad, attn.to_v.weight.grad)):
        assert g is not None and rel(g, r) < FP32_TOL
    with pytest.raises(ValueError, match="autograd"):
        fd.WanAttnProcessor(fused=True)(attn, hs, None, None, rotary_emb)
    attn.requires_grad_(False)
    y = p(attn, hs.detach(), None, None, rotary_emb)
    assert torch.is_grad_enabled() and p.fused_calls == 1 and not y.requires_grad


def test_torch_compile_fullgraph():
    """torch.compile(fullgraph=True) of a WanAttention using the processor
    compiles (the per-op path: fxattn.attention is a custom operator) and
    agrees with diffusers' processor."""
    attn, hs, rotary_emb = self_attention_call()
    p = fd.WanAttnProcessor(threads=2)
    attn.set_processor(p)
    step = torch.compile(attn, fullgraph=True)
    with torch.no_grad():
        y = step(hs, None, None, rotary_emb)
        ref = DefaultProcessor()(attn, hs, None, None, rotary_emb)
    assert p.fused_calls == 0 and rel(y, ref) < FP32_TOL
    # The whole model in one graph (backend aot_eager: dynamo's capture and
    # AOT autograd's tracing without inductor's code generation, which
    # takes a minute for the model on 2 cores).
    m, args = model(False), inputs(False)
    ref = forward(m, DefaultProcessor(), args)
    p = fd.WanAttnProcessor(threads=2)
    m.set_attn_processor(p)
    whole = torch.compile(m, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        y = whole(**args).sample.float()
    assert p.calls == 2 * LAYERS and p.fused_calls == 0 and rel(y, ref) < FP32_TOL


def test_modules_other_than_wan_attention():
    """A module that is not a WanAttention raises TypeError before anything
    runs; a subclass of WanAttention runs per op (its attributes are read
    as diffusers' processor reads them) and fused=True refuses it."""
    attn, hs, rotary_emb = self_attention_call()
    other = Attention(query_dim=hs.shape[-1], heads=attn.heads, dim_head=hs.shape[-1] // attn.heads)
    p = fd.WanAttnProcessor(threads=2)
    with pytest.raises(TypeError, match="WanAttention"):
        p(other, hs, None, None, rotary_emb)
    assert p.calls == 0

    class MyAttention(WanAttention):
        pass

    sub = copy.deepcopy(attn)
    sub.__class__ = MyAttention
    with torch.no_grad():
        y = p(sub, hs, None, None, rotary_emb)
        ref = DefaultProcessor()(attn, hs, None, None, rotary_emb)
        assert p.fused_calls == 0 and rel(y, ref) < FP32_TOL
        with pytest.raises(ValueError, match="subclass"):
            fd.WanAttnProcessor(fused=True)(sub, hs, None, None, rotary_emb)
