"""fxattn attention as a torch custom operator, `torch.ops.fxattn.attention`.

The operator has a fake (meta) implementation that gives the outputs'
shapes and dtypes, so torch.compile traces a call without running it and
without a graph break. Its autograd formula calls a second operator,
`torch.ops.fxattn.attention_backward` (the C library's backward, with a
fake implementation too), so torch.compile traces the backward as well.
Imported by fxattn when torch is.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import torch

from .. import _capi
from .._common import arrays
from . import masks
from .inputs import Inputs, lse_shape, mask_shape
from .options import Options
from .run import Dropout, run, run_backward

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def _out_dtype(q: torch.Tensor, out_dtype: str) -> torch.dtype:
    if out_dtype != "" and out_dtype not in _DTYPES:
        raise _capi.InvalidArgumentError(f"out_dtype {out_dtype!r} is not float32, bfloat16, float16 or float64", _capi.INVALID_ARG)
    if q.dtype == torch.float64 or out_dtype == "float64":
        code = arrays.torch_dtype_code(torch, q.dtype)
        if code is not None:  # other dtypes are refused with the inputs
            arrays.out_code(code, None if out_dtype == "" else out_dtype)
    return q.dtype if out_dtype == "" else _DTYPES[out_dtype]


def _lse_dtype(q: torch.Tensor) -> torch.dtype:
    """The lse's dtype: float64 for float64 inputs (computed in fp64), else float32."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _parts_shape(q: torch.Tensor, layout: str, return_lse: bool) -> tuple:
    """lse_parts' shape: [B, Hq, Sq, 3] with return_lse, except for float64
    inputs, whose backward reads the fp64 lse alone: [0] otherwise."""
    return lse_shape(layout, q.shape) + (3,) if return_lse and q.dtype != torch.float64 else (0,)


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
    causal_lower_right: bool = False,
    dropout_p: float = 0.0,
    dropout_seed_offset: Optional[torch.Tensor] = None,
    dropout_keep: Optional[torch.Tensor] = None,
    reproducible: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fxattn.attention on CPU tensors. scale 0: 1/sqrt(D); out_dtype "":
    q's dtype; threads 0: the CPUs this process may use. attn_mask: a
    [B, Hq, Sq, Skv] mask (any strides, 0 broadcasts), bool (True =
    attend), float32 (added to the scores) or float64 (added, with float64
    q, k, v); is_causal: top-left causal,
    or with causal_lower_right bottom-right (query i attends keys
    j <= i + Skv - Sq, torch's causal_lower_right).
    Returns (out, lse, lse_parts), lse [B, Hq, Sq] and lse_parts
    [B, Hq, Sq, 3] (the softmax state for the backward,
    fxa_attn_args.lse_parts) empty [0] unless return_lse. float64 q, k, v
    are computed in fp64: out and lse float64, lse_parts always empty (the
    backward reads the fp64 lse).

    dropout_p (0 <= p < 1; 0: off): torch's dropout on the softmax weights,
    the lse the softmax's; its keep decisions are the Philox stream of
    dropout_seed_offset, an int64 tensor [2] (seed, offset), or the given
    dropout_keep, uint8 or bool [B, Hq, Sq, Skv] (nonzero = kept). fp32 and
    bf16 compute only (float64 inputs raise UnsupportedError). reproducible:
    fxa_attn_desc.reproducible (the same bytes on every canonical split of
    the keys)."""
    opts = Options.from_op(scale, layout, mode, center, compute, threads, is_causal, causal_lower_right, reproducible)
    x = _inputs(q, k, v, attn_mask, layout)
    dropout, _keep = _dropout(dropout_p, dropout_seed_offset, dropout_keep, mask_shape(layout, x.q.shape, x.k.shape))
    dtype = _out_dtype(q, out_dtype)
    out_code = arrays.torch_dtype_code(torch, dtype)
    # fp16 outputs are written as fp32 and rounded once by torch.
    out = torch.empty(x.q.shape, dtype=torch.float32 if out_code == _capi.F16 else dtype)
    lse = torch.empty(lse_shape(layout, x.q.shape) if return_lse else (0,), dtype=_lse_dtype(q))
    parts = torch.empty(_parts_shape(q, layout, return_lse), dtype=torch.float32)
    ptrs = (lse.data_ptr(), None if q.dtype == torch.float64 else parts.data_ptr()) if return_lse else (None, None)
    run(x, opts, out_code, out.data_ptr(), *ptrs, dropout=dropout)
    return (arrays.to_float16(out) if out_code == _capi.F16 else out), lse, parts


def _inputs(q, k, v, attn_mask, layout: str) -> Inputs:
    """The operators' tensors as Inputs, the mask read as it is."""
    x = Inputs.of(q, k, v, layout)
    if attn_mask is None:
        return x
    return x.with_mask(masks.torch_mask(attn_mask, mask_shape(layout, x.q.shape, x.k.shape)))


def _check_dropout(dropout_p: float, seed_offset, keep, weights_shape=None) -> None:
    """The operators' dropout arguments checked (weights_shape: [B, Hq, Sq,
    Skv], None where the shapes are not checked yet)."""
    if not 0.0 <= dropout_p < 1.0:
        raise _capi.InvalidArgumentError(f"dropout_p must be in [0, 1), not {dropout_p}", _capi.INVALID_ARG)
    if not dropout_p:
        return
    if keep is not None:
        if keep.dtype not in (torch.uint8, torch.bool):
            raise _capi.InvalidArgumentError(f"dropout_keep has dtype {keep.dtype}; it takes uint8 or bool", _capi.INVALID_ARG)
        if weights_shape is not None and tuple(keep.shape) != tuple(weights_shape):
            raise _capi.InvalidArgumentError(
                f"dropout_keep has shape {list(keep.shape)}; the weights are {list(weights_shape)} [B, Hq, Sq, Skv]", _capi.INVALID_ARG
            )
    elif seed_offset is None or tuple(seed_offset.shape) != (2,) or seed_offset.dtype != torch.int64:
        raise _capi.InvalidArgumentError(
            "dropout_p > 0 takes dropout_seed_offset, an int64 tensor [2] (seed, offset), or dropout_keep", _capi.INVALID_ARG
        )


def _dropout(dropout_p: float, seed_offset, keep, weights_shape):
    """(Dropout or None, the keep tensor the library reads or None) of the
    operators' dropout arguments."""
    _check_dropout(dropout_p, seed_offset, keep, weights_shape)
    if not dropout_p:
        return None, None
    if keep is not None:
        keep = keep.detach().contiguous()
        if keep.dtype == torch.bool:
            keep = keep.view(torch.uint8)
        return Dropout(dropout_p, keep_ptr=keep.data_ptr()), keep
    seed, offset = (int(n) for n in seed_offset.tolist())
    return Dropout(dropout_p, seed, offset), None


@attention_op.register_fake
def _(
    q,
    k,
    v,
    scale,
    layout,
    mode,
    center,
    compute,
    return_lse,
    out_dtype,
    threads,
    attn_mask=None,
    is_causal=False,
    causal_lower_right=False,
    dropout_p=0.0,
    dropout_seed_offset=None,
    dropout_keep=None,
    reproducible=False,
):
    same_device(q, k, v, attn_mask)
    _check_dropout(dropout_p, dropout_seed_offset, dropout_keep)
    if attn_mask is not None and q.dim() == k.dim() == 4:
        masks.check_mask_shape(attn_mask, mask_shape(layout, q.shape, k.shape))
    out = q.new_empty(q.shape, dtype=_out_dtype(q, out_dtype))
    lse = q.new_empty(lse_shape(layout, q.shape) if return_lse else (0,), dtype=_lse_dtype(q))
    parts = q.new_empty(_parts_shape(q, layout, return_lse), dtype=torch.float32)
    return out, lse, parts


def same_device(q, k, v, mask=None) -> None:
    """Refuse q, k, v (and a mask) on different devices. The operator's fake kernel
    runs for a call with any meta tensor and gives an output on q's device:
    uninitialised memory for a CPU q next to a meta k or v."""
    devices = [t.device for t in (q, k, v) + (() if mask is None else (mask,))]
    if len(set(devices)) > 1:
        names = ", ".join(map(str, devices))
        what = "q, k and v" if mask is None else "q, k, v and attn_mask"
        raise _capi.InvalidArgumentError(f"{what} are on {names}; they must be on one device (the CPU)", _capi.INVALID_ARG)


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
    causal_lower_right: bool = False,
    dropout_p: float = 0.0,
    dropout_seed_offset: Optional[torch.Tensor] = None,
    dropout_keep: Optional[torch.Tensor] = None,
    reproducible: bool = False,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of fxattn::attention from its inputs (the forward's
    attn_mask, is_causal and causal_lower_right too), its output out, its lse (empty [0]:
    computed again here, with its parts) and lse_parts (the forward's; None
    or empty: P is rebuilt from lse alone, fxa_attn_bwd_args.lse_parts),
    and the output's gradient grad_out; gradients in
    q's, k's and v's dtypes, computed by the C library in the forward's
    compute (bf16 compute: bf16 operands, fp32 accumulation; fp32 with a
    mask or causal; float64 inputs in fp64, from the forward's float64 lse,
    with no lse_parts). grad_lse: the lse output's gradient (None: zero). A row
    with every key masked is a constant 0: its gradients are 0. dropout_p,
    dropout_seed_offset and dropout_keep: the forward's (the same keep
    decisions are regenerated, or read)."""
    opts = Options.from_op(scale, layout, mode, center, compute, threads, is_causal, causal_lower_right, reproducible)
    drop = {"dropout_p": dropout_p, "dropout_seed_offset": dropout_seed_offset, "dropout_keep": dropout_keep}
    if grad_lse is not None and grad_lse.numel() and bool(torch.any(grad_lse != 0)):
        return _backward_with_lse(grad_out, q, k, v, out, lse, opts, grad_lse, attn_mask, lse_parts, drop)
    x = _inputs(*(_dense(t) for t in (q, k, v)), None if attn_mask is None else attn_mask.detach(), layout)
    dropout, _keep = _dropout(dropout_p, dropout_seed_offset, dropout_keep, mask_shape(layout, x.q.shape, x.k.shape))
    fp64 = q.dtype == torch.float64
    if lse.numel() == 0 and fp64:
        lse = torch.empty(lse_shape(layout, x.q.shape), dtype=torch.float64)
        scratch = torch.empty(x.q.shape, dtype=torch.float64)
        run(x, opts, _capi.F64, scratch.data_ptr(), lse.data_ptr(), dropout=dropout)
    elif lse.numel() == 0:
        lse = torch.empty(lse_shape(layout, x.q.shape), dtype=torch.float32)
        lse_parts = torch.empty(lse_shape(layout, x.q.shape) + (3,), dtype=torch.float32)
        scratch = torch.empty(x.q.shape, dtype=out.dtype if out.dtype == torch.bfloat16 else torch.float32)
        code = arrays.torch_dtype_code(torch, scratch.dtype)
        run(x, opts, code, scratch.data_ptr(), lse.data_ptr(), lse_parts.data_ptr(), dropout=dropout)
    parts = None if fp64 or lse_parts is None or lse_parts.numel() == 0 else lse_parts.contiguous()
    if fp64:
        wide = torch.float64
        lse = lse.to(torch.float64)
    else:
        wide = torch.bfloat16 if out.dtype == torch.bfloat16 else torch.float32
    out = out.to(wide).contiguous()
    grad_out = grad_out.to(wide).contiguous()
    lse = lse.contiguous()
    # The library rounds the fp32 gradients to q's dtype as it stores them
    # (nearest even: the bits torch's conversion gives), on its own threads,
    # so that no torch parallel region (whose OpenMP workers spin after it)
    # runs beside the next call of the library's threads.
    grads = [torch.empty_like(t, dtype=q.dtype) for t in (x.q.obj, x.k.obj, x.v.obj)]
    code = arrays.torch_dtype_code(torch, wide)
    ptrs = [g.data_ptr() for g in grads]
    grad_code = arrays.torch_dtype_code(torch, q.dtype)
    parts_ptr = None if parts is None else parts.data_ptr()
    run_backward(x, opts, code, out.data_ptr(), grad_out.data_ptr(), lse.data_ptr(), parts_ptr, ptrs, grad_code, dropout)
    return tuple(grads)


def _backward_with_lse(grad_out, q, k, v, out, lse, opts: Options, grad_lse, attn_mask, lse_parts, drop: dict):
    """The backward with the lse's gradient g: it adds g_i P_ij to dS_ij =
    P_ij (dO_i . v_j - dO_i . O_i), which the C backward computes with one
    more feature: q, k, v get a zero column (the scores, dO . v and the lse
    parts stay), O gets -g_i and dO gets 1, so dO . O becomes dO_i . O_i - g_i
    exactly (with dropout too: the keep decisions depend on no head dim)."""
    dim = q.shape[-1]
    opts = dataclasses.replace(opts, scale=opts.scale or dim**-0.5)
    q2, k2, v2 = (torch.nn.functional.pad(t, (0, 1)) for t in (q, k, v))
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    g = (grad_lse if opts.layout == "bhsd" else grad_lse.transpose(1, 2)).unsqueeze(-1).to(wide)
    out2 = torch.cat([out.to(wide), -g], -1)
    dout2 = torch.cat([grad_out.to(wide), torch.ones_like(g)], -1)
    grads = attention_backward_op(dout2, q2, k2, v2, out2, lse, **opts.op_kwargs(), attn_mask=attn_mask, lse_parts=lse_parts, **drop)
    return tuple(torch.empty_like(_dense(t)).copy_(d[..., :dim]) for t, d in zip((q, k, v), grads))


@attention_backward_op.register_fake
def _(
    grad_out,
    q,
    k,
    v,
    out,
    lse,
    scale,
    layout,
    mode,
    center,
    compute,
    threads,
    grad_lse=None,
    attn_mask=None,
    is_causal=False,
    lse_parts=None,
    causal_lower_right=False,
    dropout_p=0.0,
    dropout_seed_offset=None,
    dropout_keep=None,
    reproducible=False,
):
    same_device(q, k, v, attn_mask)
    _check_dropout(dropout_p, dropout_seed_offset, dropout_keep)
    return tuple(torch.empty_like(_dense(t)) for t in (q, k, v))


def _named(op, inputs) -> dict:
    """An operator's inputs (as setup_context gets them, in schema order) by
    parameter name."""
    return {arg.name: value for arg, value in zip(op.default._schema.arguments, inputs)}


def _setup_context(ctx, inputs, output):
    a = _named(torch.ops.fxattn.attention, inputs)
    attn_mask = a["attn_mask"]
    if attn_mask is not None and attn_mask.requires_grad:
        raise _capi.UnsupportedError(
            "attn_mask requires grad: fxattn's backward gives the gradients of query, key and value "
            "only (an additive mask is a constant to it); pass attn_mask.detach()",
            _capi.UNSUPPORTED,
        )
    out, lse, lse_parts = output
    ctx.save_for_backward(a["q"], a["k"], a["v"], out, lse, attn_mask, lse_parts, a["dropout_seed_offset"], a["dropout_keep"])
    ctx.dropout_p = a["dropout_p"]
    ctx.opts = Options.from_op(
        *(a[n] for n in ("scale", "layout", "mode", "center", "compute", "threads", "is_causal", "causal_lower_right", "reproducible"))
    )
    ctx.return_lse = a["return_lse"]
    ctx.inputs = len(inputs)


def _backward(ctx, grad_out, grad_lse, _grad_parts):
    q, k, v, out, lse, attn_mask, lse_parts, dropout_seed_offset, dropout_keep = ctx.saved_tensors
    dq, dk, dv = torch.ops.fxattn.attention_backward(
        grad_out,
        q,
        k,
        v,
        out,
        lse,
        **ctx.opts.op_kwargs(),
        grad_lse=grad_lse if ctx.return_lse else None,
        attn_mask=attn_mask,
        lse_parts=lse_parts,
        dropout_p=ctx.dropout_p,
        dropout_seed_offset=dropout_seed_offset,
        dropout_keep=dropout_keep,
    )
    return (dq, dk, dv) + (None,) * (ctx.inputs - 3)


torch.library.register_autograd("fxattn::attention", _backward, setup_context=_setup_context)


def second_order_error() -> Exception:
    """The error of a double backward through fxattn attention."""
    return _capi.UnsupportedError(
        "fxattn has no second-order gradients: double backward through fxattn attention "
        "(backward of gradients taken with create_graph=True, e.g. a gradient penalty) is not "
        "supported; use torch.nn.functional.scaled_dot_product_attention for that term",
        _capi.UNSUPPORTED,
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
    return arrays.DTYPE_NAMES[arrays.dtype_code(out_dtype)]


def attention(q, k, v, opts: Options, return_lse: bool, out_dtype):
    """fxattn.attention's torch path: one call of the custom operator."""
    q, k, v = (arrays.torch_values(t, name) for t, name in ((q, "q"), (k, "k"), (v, "v")))
    same_device(q, k, v)
    out, lse, _ = torch.ops.fxattn.attention(
        q, k, v, **opts.op_kwargs(), return_lse=return_lse or needs_grad(q, k, v), out_dtype=_dtype_name(out_dtype)
    )
    return (out, lse) if return_lse else out
