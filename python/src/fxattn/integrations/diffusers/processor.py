"""WanAttnProcessor: the attention processor of fxattn.diffusers for
diffusers' Wan transformers, and rope_grid."""

from __future__ import annotations

import weakref

import numpy as np
import torch

from ...attn import attention

# The "fxattn" attention backend, registered before any diffusers model
# module is imported: diffusers reads DIFFUSERS_ATTN_BACKEND=fxattn then.
from .backend import register as _register_backend

_register_backend()

from diffusers.models.transformers.transformer_wan import WanAttention, _get_added_kv_projections  # noqa: E402

from ... import wan as _wan  # noqa: E402
from ..._capi import wan as _wanlib  # noqa: E402
from .wan_qkv import heads_qkv  # noqa: E402

#: Diffusers' text context length in Wan's I2V cross-attention (hard-coded there too).
TEXT_CONTEXT = 512

# The auto default (fused=None), measured with bench/python_wan.py: one Wan
# self-attention layer, S = 4096 tokens, hidden 5120 = 40 heads x 128, fp32,
# 2 threads (AMD EPYC, 2 cores): fused 19.5 s, per op 25.3 s (medians of
# 3), see WanAttnProcessor's docstring.
_FUSED_AUTO = True
# hidden_states dtypes the fused layer runs on, and its dtype for each.
_FUSED_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def _linears(attn) -> tuple:
    """The linear modules of a self-attention as diffusers' processor runs
    them: to_qkv when the projections are fused, else to_q, to_k, to_v;
    then to_out[0]."""
    qkv = (attn.to_qkv,) if getattr(attn, "fused_projections", False) else (attn.to_q, attn.to_k, attn.to_v)
    return qkv + (attn.to_out[0],)


def _fused_params(attn):
    """The tensors the fused layer copies: weights and biases of the linear
    modules (_linears), and the norm gains."""
    return tuple(p for m in _linears(attn) for p in (m.weight, m.bias)) + (attn.norm_q.weight, attn.norm_k.weight)


def _plain(module, *types) -> bool:
    """module computes what its class in types computes from its
    parameters: exactly one of those classes (not a subclass with another
    forward, nor a wrapper such as a LoRA adapter), without forward hooks
    and without a forward replaced on the instance."""
    return type(module) in types and not module._forward_hooks and not module._forward_pre_hooks and "forward" not in vars(module)


def _modules_reason(attn) -> str:
    """Why the modules of attn may compute something other than the fused
    layer's fixed linear, RMSNorm and dropout stages ("" when they do not).
    A PEFT LoRA layer, a parametrised weight (torch.nn.utils.parametrize)
    or an offloading wrapper changes the module's class or its forward, so
    it is not plain."""
    if type(attn) is not WanAttention:
        return f"the module is a {type(attn).__name__}, a subclass of diffusers' WanAttention"
    hooks = torch.nn.modules.module
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return "global module forward hooks are registered"
    for m in _linears(attn):
        if not _plain(m, torch.nn.Linear):
            return f"a projection is a {type(m).__name__} with hooks or another forward, not a plain torch.nn.Linear"
    for name in ("norm_q", "norm_k"):
        norm = getattr(attn, name)
        if not _plain(norm, torch.nn.RMSNorm) or norm.weight is None or norm.eps is None or abs(norm.eps - _wanlib.EPS) > 1e-12:
            return f"{name} is not a plain RMSNorm with a gain and eps {_wanlib.EPS}"
    drop = attn.to_out[1]
    if not _plain(drop, torch.nn.Dropout, torch.nn.Identity):
        return f"to_out[1] is a {type(drop).__name__}, not a plain Dropout"
    if drop.training and getattr(drop, "p", 0) > 0:
        return "dropout in training mode"
    return ""


def _autograd_reason(attn, hidden_states, rotary_emb) -> str:
    """Why autograd would record this call ("" when it would not): grad
    mode on and hidden_states, a weight the fused layer copies or a RoPE
    table requiring grad. The fused layer has no backward, so such a call
    runs per op (torch's projections, differentiable)."""
    if not torch.is_grad_enabled():
        return ""
    tensors = [hidden_states, *_fused_params(attn), *(rotary_emb or ())]
    if any(t is not None and t.requires_grad for t in tensors):
        return "autograd records it (grad mode on and an input or weight requires grad; the fused layer has no backward)"
    return ""


def _bands(head_dim: int):
    """Pairs per RoPE band (t, h, w): fxa_wan_rope_bands' split, which is
    diffusers' WanRotaryPosEmbed split (h_dim = w_dim = 2 (D // 6))."""
    pairs = head_dim // 2
    return pairs - 2 * (pairs // 3), pairs // 3, pairs // 3


def rope_grid(rotary_emb, tokens: int):
    """The latent grid (frames, height, width) whose Wan 3-D RoPE (theta
    1e4, tokens in raster order) is rotary_emb = (cos, sin) [1, S, 1, D]
    as diffusers' WanRotaryPosEmbed gives it, or None when rotary_emb is
    not such a table. Verified: every cos/sin value the RoPE uses is
    within 1e-6 of fxattn's table of that grid (the C tables round a
    double to fp32, an error <= 3e-8; a wrong position, grid or band
    split moves some value by more than 1e-4)."""
    cos, sin = rotary_emb
    if cos.shape != sin.shape or cos.dim() != 4 or cos.shape[0] != 1 or cos.shape[2] != 1 or cos.shape[1] != tokens:
        return None
    d = cos.shape[3]
    if d % 2 or d < 6:
        return None
    c = cos[0, :, 0, 0::2].detach().to("cpu", torch.float64).numpy()  # [S, D/2]: pair p
    s = sin[0, :, 0, 1::2].detach().to("cpu", torch.float64).numpy()
    grid, p0 = [], 0
    for n in _bands(d):
        # The band's slowest pair turns by pos * theta^(-(n-1)/n): its angle
        # gives the position unambiguously while below pi.
        freq = _wanlib.ROPE_THETA ** (-(n - 1) / n)
        pos = np.rint(np.arctan2(s[:, p0 + n - 1], c[:, p0 + n - 1]) / freq)
        if not np.all(np.isfinite(pos)) or pos.min() < 0:
            return None
        grid.append(int(pos.max()) + 1)
        p0 += n
    f, h, w = grid
    if f * h * w != tokens:
        return None
    ref_c, ref_s = _wan.rope_tables((f, h, w), d)
    half = d // 2
    if np.max(np.abs(ref_c[:, :half] - c)) > 1e-6 or np.max(np.abs(ref_s[:, :half] - s)) > 1e-6:
        return None
    return f, h, w


class WanAttnProcessor:
    """diffusers' WanAttnProcessor with fxattn's attention (CPU tensors).

    WanAttnProcessor(fused=None, threads=None); use it with
    transformer.set_attn_processor(...) or attn.set_processor(...).
    Self-attention, cross-attention with the text context and the I2V image
    branch (first encoder tokens minus 512 through add_k_proj/add_v_proj,
    norm_added_k) follow diffusers' semantics; each attention is one
    fxattn.attention call on the BSHD views (no copies), output in the
    input's dtype (fp32, bf16, fp16 or fp64; bf16 inputs in the compute fxattn
    finds faster on this machine, fxattn.compute_choice, as the "fxattn"
    attention backend runs them; fp64 in fp64). attention_mask must be None
    (fxattn has no masks): anything else raises ValueError.

    attn must be a diffusers WanAttention (anything else raises TypeError).

    fused: a self-attention call runs fxattn.wan's fused layer on copies of
    the module's weights (made from the module at every call; the layer's
    plans and buffers are kept per module, never its weights, so any change
    of a weight, in place, through .data, by load_state_dict or a replaced
    parameter, is seen by the next call) when that is the same
    computation, checked on every call: a WanAttention (not a subclass)
    with heads x head dim equal to its width (a head slice, fewer heads
    than the width, runs per op) whose projections, norms and dropout are
    plain torch.nn.Linear,
    RMSNorm and Dropout modules (no PEFT LoRA layer, parametrisation,
    wrapper or forward hook: those run per op, as diffusers computes
    them), fp32 or bf16 CPU input in the module's dtype, no mask,
    norm_q/norm_k with eps 1e-6, no dropout, no autograd recording the call
    (grad mode on with an input or weight requiring grad runs per op:
    torch's projections and fxattn.attention, both differentiable: the
    model trains), not under torch.compile (which traces the per-op
    path, a custom operator, without graph breaks), and rotary_emb equal
    to Wan's 3-D RoPE of some latent grid
    (rope_grid: fp32 or fp64 tables, as diffusers makes them and
    from_pretrained(torch_dtype=torch.bfloat16) keeps them; a model cast
    whole with .to(torch.bfloat16) has bf16 tables, a coarser RoPE, and
    runs per op). The layer's dtype is the input's: fp32 input runs the
    fp32 layer on fp32 copies (4 hidden^2 floats per module), within fp32
    rounding of diffusers' processor; bf16 input runs the bf16 layer
    (WanSelfAttention dtype "bf16": x, Q, K, V, the probabilities and the
    attention output rounded to bf16, fp32 accumulation) on the module's
    bf16 weights (their bits, 4 hidden^2 uint16 per module), output bf16,
    as accurate as diffusers' own bf16 processor (python/tests/test_wan.py,
    test_diffusers.py). True forces it on every self-attention (raises
    ValueError when not valid; cross-attention always runs per op), False
    never uses it, None (auto) uses it when valid: measured on one Wan
    layer, S = 4096, hidden 5120 (40 x 128), fp32, 2 threads (AMD EPYC, 2
    cores, a machine shared with other jobs; bench/python_wan.py,
    medians of 3): fused 19.5 s (61.5 GFLOP/s), per op 25.3 s (47.4
    GFLOP/s), diffusers' default 31.1 s (38.6 GFLOP/s), so auto is fused.
    On a 2-core Zen 5 EPYC (AVX512-BF16), same layer, medians of 3
    interleaved rounds: fp32 fused 3.11 s vs diffusers' default 8.32 s
    (2.68x), bf16 fused 1.70 s vs default 3.90 s (2.30x; bench/results/zen5.md).
    threads: fxattn's worker threads (None: the CPUs available).
    .calls counts the calls, .fused_calls those that ran the fused layer.
    """

    # Attributes diffusers sets on its processors (attention backend,
    # context parallelism); fxattn ignores the backend.
    _attention_backend = None
    _parallel_config = None

    def __init__(self, fused: bool | None = None, threads: int | None = None):
        if fused not in (None, True, False):
            raise ValueError(f"fused must be None, True or False, not {fused!r}")
        self.fused = fused
        self.threads = threads
        self.calls = 0
        self.fused_calls = 0
        self._layers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __getstate__(self) -> dict:
        """The settings and counters (copy, deepcopy, pickle); the copy
        starts with empty caches and makes its own fused layers."""
        return {"fused": self.fused, "threads": self.threads, "calls": self.calls, "fused_calls": self.fused_calls}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["fused"], state["threads"])
        self.calls, self.fused_calls = state["calls"], state["fused_calls"]

    # ---- the fused self-attention ----------------------------------------

    def _fused_reason(self, attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb):
        """Why the fused layer cannot run this call ("" when it can), and the
        grid. Everything is checked on every call, from the module and the
        tensors as they are now (nothing is remembered between calls)."""
        if torch.compiler.is_compiling():
            return "torch.compile traces the call (the per-op path compiles without graph breaks)", None
        if attention_mask is not None:
            return "an attention_mask", None
        dtype = hidden_states.dtype
        if dtype not in _FUSED_DTYPES or hidden_states.device.type != "cpu" or hidden_states.dim() != 3:
            return f"hidden_states {dtype} on {hidden_states.device}, not fp32 or bf16 [B, S, hidden] on the CPU", None
        reason = _modules_reason(attn)
        if reason:
            return reason, None
        if attn.to_out[0].in_features != hidden_states.shape[-1]:
            return (
                "a head slice (heads x head dim below the module's width): the fused layer runs whole layers, heads x head dim = hidden"
            ), None
        for p in _fused_params(attn):
            if p is None:
                return "a projection without a bias", None
            if p.dtype != dtype or p.device.type != "cpu":
                return (
                    f"a weight of {p.dtype} on {p.device} next to hidden_states of {dtype} (the fused layer runs in the module's dtype)",
                    None,
                )
        reason = _autograd_reason(attn, hidden_states, rotary_emb)
        if reason:
            return reason, None
        if rotary_emb is None:
            return "no rotary_emb", None
        grid = rope_grid(rotary_emb, hidden_states.shape[1])
        if grid is None:
            return "rotary_emb is not Wan's 3-D RoPE of a latent grid", None
        return "", grid

    def _layer(self, attn, dtype) -> _wan.WanSelfAttention:
        """The fused layer of attn for hidden_states of dtype, holding
        copies of attn's weights as they are now. The layer (its plans and
        its weight buffers) is cached per module and dtype; the weights are
        copied into it anew on every call, so that no change of a parameter
        (in place, through .data, by a LoRA merge) is ever missed."""
        shape = (dtype, attn.heads, attn.to_q.weight.shape[1])
        hit = self._layers.get(attn)
        if hit is not None and hit[0] == shape:
            hit[1]._load_module(attn)
            return hit[1]
        self._layers.pop(attn, None)  # the old copies go before the new ones are made
        layer = _wan.WanSelfAttention.from_module(attn, threads=self.threads, dtype=_FUSED_DTYPES[dtype])
        self._layers[attn] = (shape, layer)
        return layer

    def _run_fused(self, attn, hidden_states, grid):
        layer = self._layer(attn, hidden_states.dtype)
        if hidden_states.shape[0] == 1:
            return layer(hidden_states, grid)
        return torch.stack([layer(x, grid) for x in hidden_states])

    # ---- diffusers' processor ---------------------------------------------

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        """Diffusers' WanAttnProcessor.__call__ contract: returns the block's
        attention output [B, S, hidden] in hidden_states' dtype."""
        if not isinstance(attn, WanAttention):
            raise TypeError(f"fxattn.diffusers.WanAttnProcessor runs diffusers' WanAttention modules, not {type(attn).__name__}")
        if attention_mask is not None:
            raise ValueError("fxattn.diffusers.WanAttnProcessor: attention_mask must be None (fxattn has no masks)")
        self.calls += 1
        self_attention = encoder_hidden_states is None and getattr(attn, "add_k_proj", None) is None and not attn.is_cross_attention
        if self.fused is not False and self_attention:
            reason, grid = self._fused_reason(attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb)
            if not reason and (self.fused or _FUSED_AUTO):
                self.fused_calls += 1
                with torch.no_grad():
                    return self._run_fused(attn, hidden_states, grid)
            if self.fused and reason:
                raise ValueError(f"WanAttnProcessor(fused=True): the fused layer cannot run this call: {reason}")
        return self._per_op(attn, hidden_states, encoder_hidden_states, rotary_emb)

    def _per_op(self, attn, hidden_states, encoder_hidden_states, rotary_emb):
        encoder_hidden_states_img = None
        if attn.add_k_proj is not None:
            image_context_length = encoder_hidden_states.shape[1] - TEXT_CONTEXT
            encoder_hidden_states_img = encoder_hidden_states[:, :image_context_length]
            encoder_hidden_states = encoder_hidden_states[:, image_context_length:]

        query, key, value = heads_qkv(attn, hidden_states, encoder_hidden_states, rotary_emb)

        hidden_states_img = None
        if encoder_hidden_states_img is not None:
            key_img, value_img = _get_added_kv_projections(attn, encoder_hidden_states_img)
            key_img = attn.norm_added_k(key_img)
            key_img = key_img.unflatten(2, (attn.heads, -1))
            value_img = value_img.unflatten(2, (attn.heads, -1))
            hidden_states_img = attention(query, key_img, value_img, threads=self.threads, layout="bshd")
            hidden_states_img = hidden_states_img.flatten(2, 3).type_as(query)

        hidden_states = attention(query, key, value, threads=self.threads, layout="bshd")
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        if hidden_states_img is not None:
            hidden_states = hidden_states + hidden_states_img
        hidden_states = attn.to_out[0](hidden_states)
        hidden_states = attn.to_out[1](hidden_states)
        return hidden_states
