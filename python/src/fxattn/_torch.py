"""fxattn attention as a torch custom operator, `torch.ops.fxattn.attention`.

The operator has a fake (meta) implementation that gives the outputs'
shapes and dtypes, so torch.compile traces a call without running it and
without a graph break. Its autograd formula calls a second operator,
`torch.ops.fxattn.attention_backward` (the C library's backward, with a
fake implementation too), so torch.compile traces the backward as well.
Imported by fxattn when torch is.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from . import _arrays, _lib
from ._attn_core import Mask, Options, lse_shape, operands, run, run_backward

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
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fxattn.attention on CPU tensors. scale 0: 1/sqrt(D); out_dtype "":
    q's dtype; threads 0: the CPUs this process may use. attn_mask: a
    [B, Hq, Sq, Skv] mask (any strides, 0 broadcasts), bool (True =
    attend) or float32 (added to the scores); is_causal: top-left causal.
    Returns (out, lse, lse_parts), lse [B, Hq, Sq] and lse_parts
    [B, Hq, Sq, 3] (the softmax state for the backward,
    fxa_attn_args.lse_parts) empty [0] unless return_lse."""
    opts = Options.parse(scale or None, layout, mode, center, compute, threads or None)
    qo, ko, vo = operands(q, k, v, layout)
    mask = None if attn_mask is None else mask_operand(attn_mask, mask_shape(layout, qo.shape, ko.shape))
    dtype = _out_dtype(q, out_dtype)
    out_code = _arrays.torch_dtype_code(torch, dtype)
    # fp16 outputs are written as fp32 and rounded once by torch.
    out = torch.empty(qo.shape, dtype=torch.float32 if out_code == _lib.F16 else dtype)
    lse = torch.empty(lse_shape(layout, qo.shape) if return_lse else (0,), dtype=torch.float32)
    parts = torch.empty(lse_shape(layout, qo.shape) + (3,) if return_lse else (0,), dtype=torch.float32)
    ptrs = (lse.data_ptr(), parts.data_ptr()) if return_lse else (None, None)
    run(qo, ko, vo, opts, out_code, out.data_ptr(), ptrs[0], mask, is_causal, ptrs[1])
    return (_arrays.to_float16(out) if out_code == _lib.F16 else out), lse, parts


def mask_shape(layout: str, q_shape, k_shape) -> tuple:
    """[B, Hq, Sq, Skv] of q and k shapes in layout."""
    b, h, sq = lse_shape(layout, q_shape)
    return (b, h, sq, lse_shape(layout, k_shape)[2])


def check_mask(m: torch.Tensor, shape) -> None:
    """Refuse a mask that is not a plain tensor (a subclass's memory need
    not hold its values) or not of check_mask_shape's shape, before its
    memory is read."""
    if type(m) not in (torch.Tensor, torch.nn.Parameter):
        raise _lib.InvalidArgumentError(
            f"attn_mask is a {type(m).__module__}.{type(m).__qualname__}, a tensor subclass whose memory "
            "need not hold its values; the operator takes a plain torch.Tensor "
            "(fxattn.scaled_dot_product_attention also takes torch's causal biases)",
            _lib.INVALID_ARG,
        )
    check_mask_shape(m, shape)


def check_mask_shape(m: torch.Tensor, shape) -> None:
    """Refuse a mask that is not a 4-D bool or float32 tensor whose shape
    broadcasts to shape = [B, Hq, Sq, Skv] (each axis 1 or the full
    extent)."""
    if m.dim() != 4 or m.dtype not in (torch.bool, torch.float32):
        raise _lib.InvalidArgumentError(
            f"attn_mask must be a 4-D [B, Hq, Sq, Skv] bool or float32 tensor, not {m.dtype} {list(m.shape)}", _lib.INVALID_ARG
        )
    if any(n not in (1, want) for n, want in zip(m.shape, shape)):
        raise _lib.InvalidArgumentError(
            f"attn_mask has shape {list(m.shape)}, which does not broadcast to [B, Hq, Sq, Skv] = "
            f"{list(shape)}: each axis must be 1 or the full extent",
            _lib.INVALID_ARG,
        )


def mask_operand(m: torch.Tensor, shape) -> Mask:
    """A bool or float32 CPU tensor that broadcasts to shape = [B, Hq, Sq, Skv]
    as the C API's mask (check_mask; its strides as they are, 0 on the axes
    it broadcasts along; negative ones copied)."""
    check_mask(m, shape)
    m = _arrays.torch_values(m, "attn_mask")
    if any(st < 0 for st in m.stride()):
        m = m.contiguous()
    if m.dtype == torch.bool:
        m = m.view(torch.uint8)
    kind = _lib.MASK_BOOL if m.dtype == torch.uint8 else _lib.MASK_ADD
    strides = tuple(0 if n == 1 else st for n, st in zip(m.shape, m.stride()))
    return Mask(kind, strides, m.data_ptr(), m)


@attention_op.register_fake
def _(q, k, v, scale, layout, mode, center, compute, return_lse, out_dtype, threads, attn_mask=None, is_causal=False):
    same_device(q, k, v, attn_mask)
    if attn_mask is not None and q.dim() == k.dim() == 4:
        check_mask_shape(attn_mask, mask_shape(layout, q.shape, k.shape))
    out = q.new_empty(q.shape, dtype=_out_dtype(q, out_dtype))
    lse = q.new_empty(lse_shape(layout, q.shape) if return_lse else (0,), dtype=torch.float32)
    parts = q.new_empty(lse_shape(layout, q.shape) + (3,) if return_lse else (0,), dtype=torch.float32)
    return out, lse, parts


def same_device(q, k, v, mask=None) -> None:
    """Refuse q, k, v (and a mask) on different devices. The operator's fake kernel
    runs for a call with any meta tensor and gives an output on q's device:
    uninitialised memory for a CPU q next to a meta k or v."""
    devices = [t.device for t in (q, k, v) + (() if mask is None else (mask,))]
    if len(set(devices)) > 1:
        names = ", ".join(map(str, devices))
        what = "q, k and v" if mask is None else "q, k, v and attn_mask"
        raise _lib.InvalidArgumentError(f"{what} are on {names}; they must be on one device (the CPU)", _lib.INVALID_ARG)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """t itself when its strides give distinct elements distinct addresses
    (torch.empty_like keeps them) with a contiguous last axis, else a
    contiguous copy: the backward writes t's gradient with t's strides."""
    like = torch.empty_like(t)
    if like.stride() == t.stride() and (t.shape[-1] <= 1 or t.stride(-1) == 1):
        return t
    return t.contiguous()


@torch.library.custom_op("fxattn::attention_backward", mutates_args=(), device_types="cpu")
def attention_backward_op(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    scale: float,
    layout: str,
    mode: str,
    center: bool,
    compute: str,
    threads: int,
    grad_lse: Optional[torch.Tensor] = None,
    attn_mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
    lse_parts: Optional[torch.Tensor] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of fxattn::attention from its inputs (the forward's
    attn_mask and is_causal too), its output out, its lse (empty [0]:
    computed again here, with its parts) and lse_parts (the forward's; None
    or empty: P is rebuilt from lse alone, fxa_attn_bwd_args.lse_parts),
    and the output's gradient grad_out; gradients in
    q's, k's and v's dtypes, computed by the C library in the forward's
    compute (bf16 compute: bf16 operands, fp32 accumulation; fp32 with a
    mask or causal). grad_lse: the lse output's gradient (None: zero). A row
    with every key masked is a constant 0: its gradients are 0."""
    if grad_lse is not None and grad_lse.numel() and bool(torch.any(grad_lse != 0)):
        return _backward_with_lse(
            grad_out, q, k, v, out, lse, scale, layout, mode, center, compute, threads, grad_lse, attn_mask, is_causal, lse_parts
        )
    opts = Options.parse(scale or None, layout, mode, center, compute, threads or None)
    dense = [_dense(t) for t in (q, k, v)]
    qo, ko, vo = operands(*dense, layout)
    mask = None if attn_mask is None else mask_operand(attn_mask.detach(), mask_shape(layout, qo.shape, ko.shape))
    if lse.numel() == 0:
        lse = torch.empty(lse_shape(layout, qo.shape), dtype=torch.float32)
        lse_parts = torch.empty(lse_shape(layout, qo.shape) + (3,), dtype=torch.float32)
        scratch = torch.empty(qo.shape, dtype=out.dtype if out.dtype == torch.bfloat16 else torch.float32)
        code = _arrays.torch_dtype_code(torch, scratch.dtype)
        run(qo, ko, vo, opts, code, scratch.data_ptr(), lse.data_ptr(), mask, is_causal, lse_parts.data_ptr())
    parts = None if lse_parts is None or lse_parts.numel() == 0 else lse_parts.contiguous()
    wide = torch.bfloat16 if out.dtype == torch.bfloat16 else torch.float32
    out = out.to(wide).contiguous()
    grad_out = grad_out.to(wide).contiguous()
    lse = lse.contiguous()
    # The library rounds the fp32 gradients to q's dtype as it stores them
    # (nearest even: the bits torch's conversion gives), on its own threads,
    # so that no torch parallel region (whose OpenMP workers spin after it)
    # runs beside the next call of the library's threads.
    grads = [torch.empty_like(t, dtype=q.dtype) for t in (qo.obj, ko.obj, vo.obj)]
    code = _arrays.torch_dtype_code(torch, wide)
    ptrs = [g.data_ptr() for g in grads]
    grad_code = _arrays.torch_dtype_code(torch, q.dtype)
    run_backward(
        qo,
        ko,
        vo,
        opts,
        code,
        out.data_ptr(),
        grad_out.data_ptr(),
        lse.data_ptr(),
        ptrs,
        grad_code,
        mask,
        is_causal,
        None if parts is None else parts.data_ptr(),
    )
    return tuple(grads)


def _backward_with_lse(
    grad_out, q, k, v, out, lse, scale, layout, mode, center, compute, threads, grad_lse, attn_mask=None, is_causal=False, lse_parts=None
):
    """The backward with the lse's gradient g: it adds g_i P_ij to dS_ij =
    P_ij (dO_i . v_j - dO_i . O_i), which the C backward computes with one
    more feature: q, k, v get a zero column (the scores, dO . v and the lse
    parts stay), O gets -g_i and dO gets 1, so dO . O becomes dO_i . O_i - g_i
    exactly."""
    dim = q.shape[-1]
    scale = scale or dim**-0.5
    q2, k2, v2 = (torch.nn.functional.pad(t, (0, 1)) for t in (q, k, v))
    g = (grad_lse if layout == "bhsd" else grad_lse.transpose(1, 2)).unsqueeze(-1).float()
    out2 = torch.cat([out.float(), -g], -1)
    dout2 = torch.cat([grad_out.float(), torch.ones_like(g)], -1)
    grads = attention_backward_op(
        dout2, q2, k2, v2, out2, lse, scale, layout, mode, center, compute, threads, None, attn_mask, is_causal, lse_parts
    )
    return tuple(torch.empty_like(_dense(t)).copy_(d[..., :dim]) for t, d in zip((q, k, v), grads))


@attention_backward_op.register_fake
def _(
    grad_out, q, k, v, out, lse, scale, layout, mode, center, compute, threads, grad_lse=None, attn_mask=None, is_causal=False, lse_parts=None
):
    same_device(q, k, v, attn_mask)
    return tuple(torch.empty_like(_dense(t)) for t in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, scale, layout, mode, center, compute, return_lse, _, threads = inputs[:11]
    attn_mask, is_causal = (tuple(inputs[11:]) + (None, False))[:2]
    if attn_mask is not None and attn_mask.requires_grad:
        raise _lib.UnsupportedError(
            "attn_mask requires grad: fxattn's backward gives the gradients of query, key and value "
            "only (an additive mask is a constant to it); pass attn_mask.detach()",
            _lib.UNSUPPORTED,
        )
    out, lse, lse_parts = output
    ctx.save_for_backward(q, k, v, out, lse, attn_mask, lse_parts)
    ctx.options = (scale, layout, mode, center, compute, threads)
    ctx.return_lse = return_lse
    ctx.is_causal = bool(is_causal)


def _backward(ctx, grad_out, grad_lse, _grad_parts):
    q, k, v, out, lse, attn_mask, lse_parts = ctx.saved_tensors
    dq, dk, dv = torch.ops.fxattn.attention_backward(
        grad_out, q, k, v, out, lse, *ctx.options, grad_lse if ctx.return_lse else None, attn_mask, ctx.is_causal, lse_parts
    )
    return (dq, dk, dv) + (None,) * 10


torch.library.register_autograd("fxattn::attention", _backward, setup_context=_setup_context)


def second_order_error() -> Exception:
    """The error of a double backward through fxattn attention."""
    return _lib.UnsupportedError(
        "fxattn has no second-order gradients: double backward through fxattn attention "
        "(backward of gradients taken with create_graph=True, e.g. a gradient penalty) is not "
        "supported; use torch.nn.functional.scaled_dot_product_attention for that term",
        _lib.UNSUPPORTED,
    )


def _no_second_order(ctx, *grads):
    raise second_order_error()


torch.library.register_autograd("fxattn::attention_backward", _no_second_order, setup_context=lambda ctx, inputs, output: None)


def needs_grad(*tensors) -> bool:
    """True when autograd records a call on these tensors."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _dtype_name(out_dtype) -> str:
    if out_dtype is None:
        return ""
    return _arrays.DTYPE_NAMES[_arrays.dtype_code(out_dtype)]


def attention(q, k, v, opts: Options, return_lse: bool, out_dtype):
    """fxattn.attention's torch path: one call of the custom operator."""
    q, k, v = (_arrays.torch_values(t, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    same_device(q, k, v)
    out, lse, _ = torch.ops.fxattn.attention(
        q,
        k,
        v,
        opts.scale,
        opts.layout,
        opts.mode,
        opts.center,
        opts.compute,
        return_lse or needs_grad(q, k, v),
        _dtype_name(out_dtype),
        opts.threads,
    )
    return (out, lse) if return_lse else out
