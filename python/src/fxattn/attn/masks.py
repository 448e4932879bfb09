"""Attention masks as the C API reads them (inputs.Mask): torch's causal
biases, SDPA's broadcastable masks of either kind (numpy or torch), and the
torch operator's 4-D masks, each refused with a clear message before its
memory is read where it is not a plain tensor of a usable shape and dtype."""

from __future__ import annotations

import sys

import numpy as np

from .. import _capi
from .._common import arrays, validate
from .inputs import Mask

bad = validate.bad


def causal_bias(m, query):
    """m itself when it is one of torch.nn.attention.bias's CausalBias masks
    (causal_upper_left, causal_lower_right), None when it is a plain tensor
    (or of query's own class, as tracing passes them). Any other tensor
    subclass is refused before its memory is read: a subclass's storage need
    not hold its values (a CausalBias's never does)."""
    import torch

    bias = sys.modules.get("torch.nn.attention.bias")  # a CausalBias exists only once it is imported
    if bias is not None and isinstance(m, bias.CausalBias):
        return m
    if type(m) in (torch.Tensor, torch.nn.Parameter) or type(m) is type(query):
        return None
    name = f"{type(m).__module__}.{type(m).__qualname__}"
    raise bad(
        f"attn_mask is a {name}, a tensor subclass whose memory need not hold its values; fxattn "
        "takes a plain torch.Tensor mask or torch.nn.attention.bias.causal_upper_left / "
        "causal_lower_right"
    )


def causal_is_lower_right(bias, sq: int, skv: int) -> bool:
    """What CausalBias bias does in torch's SDPA on Sq queries and Skv keys:
    causal attention, upper-left aligned (False; also lower-right at
    Sq = Skv, the same diagonal) or lower-right (True: query i attends keys
    j <= i + Skv - Sq), which the library runs as it is."""
    from torch.nn.attention.bias import CausalVariant

    if (bias.seq_len_q, bias.seq_len_kv) != (sq, skv):
        raise bad(f"attn_mask is a causal bias for {bias.seq_len_q} queries and {bias.seq_len_kv} keys, but query has {sq} and key {skv}")
    return bias.variant == CausalVariant.LOWER_RIGHT and sq != skv


def sdpa_mask(m, lead, tail, batch: int, use_torch: bool, fp64: bool = False):
    """attn_mask as [B, Hq, Sq, Skv] (broadcast axes with stride 0): a torch tensor for the
    operator, or a Mask of a numpy array. A float mask is float32 (converted from another
    float dtype), or float64 as it is when fp64 (float64 inputs)."""
    shape = lead + tail
    if use_torch:
        import torch

        if m.dtype != torch.bool and not m.dtype.is_floating_point:
            raise bad(f"attn_mask has dtype {m.dtype}; it must be bool or floating point")
        if m.dtype not in (torch.bool, torch.float32) and not (fp64 and m.dtype == torch.float64):
            m = m.to(torch.float32)
        try:
            m = m.expand(*shape)
        except RuntimeError:
            raise bad(f"attn_mask has shape {list(m.shape)}, which does not broadcast to {list(shape)}") from None
        return m.reshape(batch, *tail)
    if m.dtype != np.bool_ and m.dtype.kind != "f" and m.dtype.name != "bfloat16":
        raise bad(f"attn_mask has dtype {m.dtype}; it must be bool or floating point")
    if m.dtype != np.bool_ and not (fp64 and m.dtype == np.float64):
        m = m.astype(np.float32, copy=False)
    try:
        m = np.broadcast_to(m, shape)
    except ValueError:
        raise bad(f"attn_mask has shape {list(m.shape)}, which does not broadcast to {list(shape)}") from None
    m = m.reshape(batch, *tail)
    if any(s < 0 or s % m.itemsize for s in m.strides):
        m = np.ascontiguousarray(m)
    if m.dtype == np.bool_:
        m = m.view(np.uint8)
    kind = {np.dtype(np.uint8): _capi.MASK_BOOL, np.dtype(np.float64): _capi.MASK_ADD_F64}.get(m.dtype, _capi.MASK_ADD)
    return Mask(kind, tuple(s // m.itemsize for s in m.strides), m.ctypes.data, m)


def check_mask(m, shape) -> None:
    """Refuse a mask that is not a plain tensor (a subclass's memory need
    not hold its values) or not of check_mask_shape's shape, before its
    memory is read."""
    import torch

    if type(m) not in (torch.Tensor, torch.nn.Parameter):
        raise _capi.InvalidArgumentError(
            f"attn_mask is a {type(m).__module__}.{type(m).__qualname__}, a tensor subclass whose memory "
            "need not hold its values; the operator takes a plain torch.Tensor "
            "(fxattn.scaled_dot_product_attention also takes torch's causal biases)",
            _capi.INVALID_ARG,
        )
    check_mask_shape(m, shape)


def check_mask_shape(m, shape) -> None:
    """Refuse a mask that is not a 4-D bool, float32 or float64 tensor
    whose shape broadcasts to shape = [B, Hq, Sq, Skv] (each axis 1 or the
    full extent)."""
    import torch

    if m.dim() != 4 or m.dtype not in (torch.bool, torch.float32, torch.float64):
        raise _capi.InvalidArgumentError(
            f"attn_mask must be a 4-D [B, Hq, Sq, Skv] bool or float32 (float64 with float64 inputs) tensor, not {m.dtype} {list(m.shape)}",
            _capi.INVALID_ARG,
        )
    if any(n not in (1, want) for n, want in zip(m.shape, shape)):
        raise _capi.InvalidArgumentError(
            f"attn_mask has shape {list(m.shape)}, which does not broadcast to [B, Hq, Sq, Skv] = "
            f"{list(shape)}: each axis must be 1 or the full extent",
            _capi.INVALID_ARG,
        )


def torch_mask(m, shape) -> Mask:
    """A bool, float32 or float64 CPU tensor that broadcasts to shape =
    [B, Hq, Sq, Skv] as the C API's mask (check_mask; its strides as they
    are, 0 on the axes it broadcasts along; negative ones copied)."""
    import torch

    check_mask(m, shape)
    m = arrays.torch_values(m, "attn_mask")
    if any(st < 0 for st in m.stride()):
        m = m.contiguous()
    if m.dtype == torch.bool:
        m = m.view(torch.uint8)
    kind = {torch.uint8: _capi.MASK_BOOL, torch.float64: _capi.MASK_ADD_F64}.get(m.dtype, _capi.MASK_ADD)
    strides = tuple(0 if n == 1 else st for n, st in zip(m.shape, m.stride()))
    return Mask(kind, strides, m.data_ptr(), m)
