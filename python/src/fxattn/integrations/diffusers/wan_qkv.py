"""Q, K and V of a diffusers WanAttention as diffusers' processor makes
them: what fxattn.diffusers' WanAttnProcessor and fxattn.diffusers.parallelize's
ShardedWanAttnProcessor (wan_parallel) share."""

from __future__ import annotations

import torch
from diffusers.models.transformers.transformer_wan import _get_qkv_projections


def _apply_rotary_emb(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """Diffusers' Wan RoPE on interleaved pairs (2i, 2i+1), verbatim."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def heads_qkv(attn, hidden_states, context, rotary_emb):
    """Q, K, V [B, S, heads, D] of a WanAttention as diffusers' processor
    makes them: its projections (fused or not), norm_q/norm_k, and the RoPE
    of rotary_emb (None: none) on Q and K. context: the K/V source (None:
    hidden_states)."""
    query, key, value = _get_qkv_projections(attn, hidden_states, context)
    query, key = attn.norm_q(query), attn.norm_k(key)
    query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
    if rotary_emb is not None:
        query = _apply_rotary_emb(query, *rotary_emb)
        key = _apply_rotary_emb(key, *rotary_emb)
    return query, key, value
