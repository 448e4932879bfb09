"""fxattn attention as a torch custom operator, `torch.ops.fxattn.attention`.

The operator has a fake (meta) implementation that gives the outputs'
shapes and dtypes, so torch.compile traces a call without running it and
without a graph break. It has no autograd formula (inference only): a
backward through it raises. Imported by fxattn when torch is.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _arrays, _lib
from ._attn_core import Mask, Options, lse_shape, operands, run

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _out_dtype(q: torch.Tensor, out_dtype: str) -> torch.dtype:
    if out_dtype != "" and out_dtype not in _DTYPES:
        raise _lib.InvalidArgumentError(f"out_dtype {out_dtype!r} is not float32, bfloat16 or float16", _lib.INVALID_ARG)
    return q.dtype if out_dtype == "" else _DTYPES[out_dtype]


@torch.library.custom_op("fxattn::attention", mutates_args=(), device_types="cpu")
def attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    layout: str,
    mode: str,
    center: bool,
    compute: str,
    return_lse: bool,
    out_dtype: str,
    threads: int,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """fxattn.attention on CPU tensors. scale 0: 1/sqrt(D); out_dtype "":
    q's dtype; threads 0: the CPUs this process may use. attn_mask: a
    [B, Hq, Sq, Skv] mask (any strides, 0 broadcasts), bool (True =
    attend) or float32 (added to the scores); is_causal: top-left causal.
    Returns (out, lse), lse empty [0] unless return_lse."""
    opts = Options.parse(scale or None, layout, mode, center, compute, threads or None)
    qo, ko, vo = operands(q, k, v, layout)
    mask = None if attn_mask is None else mask_operand(attn_mask)
    dtype = _out_dtype(q, out_dtype)
    out_code = _arrays.torch_dtype_code(torch, dtype)
    # fp16 outputs are written as fp32 and rounded once by torch.
    out = torch.empty(qo.shape, dtype=torch.float32 if out_code == _lib.F16 else dtype)
    lse = torch.empty(lse_shape(layout, qo.shape) if return_lse else (0,), dtype=torch.float32)
    run(qo, ko, vo, opts, out_code, out.data_ptr(), lse.data_ptr() if return_lse else None, mask, is_causal)
    return (_arrays.to_float16(out) if out_code == _lib.F16 else out), lse


def mask_operand(m: torch.Tensor) -> Mask:
    """A 4-D bool or float32 CPU tensor as the C API's mask (its strides as
    they are; negative ones copied)."""
    if m.dim() != 4 or m.dtype not in (torch.bool, torch.float32):
        raise _lib.InvalidArgumentError(
            f"attn_mask must be a 4-D [B, Hq, Sq, Skv] bool or float32 tensor, not {m.dtype} {list(m.shape)}", _lib.INVALID_ARG
        )
    m = _arrays.torch_values(m, "attn_mask")
    if any(st < 0 for st in m.stride()):
        m = m.contiguous()
    if m.dtype == torch.bool:
        m = m.view(torch.uint8)
    kind = _lib.MASK_BOOL if m.dtype == torch.uint8 else _lib.MASK_ADD
    return Mask(kind, tuple(m.stride()), m.data_ptr(), m)


@attention_op.register_fake
def _(q, k, v, scale, layout, mode, center, compute, return_lse, out_dtype, threads, attn_mask=None, is_causal=False):
    same_device(q, k, v, attn_mask)
    out = q.new_empty(q.shape, dtype=_out_dtype(q, out_dtype))
    lse = q.new_empty(lse_shape(layout, q.shape) if return_lse else (0,), dtype=torch.float32)
    return out, lse


def same_device(q, k, v, mask=None) -> None:
    """Refuse q, k, v (and a mask) on different devices. The operator's fake kernel
    runs for a call with any meta tensor and gives an output on q's device:
    uninitialised memory for a CPU q next to a meta k or v."""
    devices = [t.device for t in (q, k, v) + (() if mask is None else (mask,))]
    if len(set(devices)) > 1:
        names = ", ".join(map(str, devices))
        what = "q, k and v" if mask is None else "q, k, v and attn_mask"
        raise _lib.InvalidArgumentError(f"{what} are on {names}; they must be on one device (the CPU)", _lib.INVALID_ARG)


def _dtype_name(out_dtype) -> str:
    if out_dtype is None:
        return ""
    return _arrays.DTYPE_NAMES[_arrays.dtype_code(out_dtype)]


def attention(q, k, v, opts: Options, return_lse: bool, out_dtype):
    """fxattn.attention's torch path: one call of the custom operator."""
    q, k, v = (_arrays.torch_values(t, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    same_device(q, k, v)
    out, lse = torch.ops.fxattn.attention(
        q,
        k,
        v,
        opts.scale,
        opts.layout,
        opts.mode,
        opts.center,
        opts.compute,
        return_lse,
        _dtype_name(out_dtype),
        opts.threads,
    )
    return (out, lse) if return_lse else out
