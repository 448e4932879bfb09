"""One attention call on caller memory: the forward (fxa_attn_run) and the
backward (fxa_attn_bwd_run) of Inputs run with Options, and the numpy path
of fxattn.attention and fxattn.scaled_dot_product_attention."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from .. import _capi
from .._capi import core
from .._common import arrays
from .._common.context import BwdPlan, context
from .inputs import Inputs, lse_shape
from .options import Options


def _ptr(m):
    return None if m is None else m.ptr


_U64 = (1 << 64) - 1


@dataclass(frozen=True)
class Dropout:
    """Dropout on the softmax weights of one run: probability p (0 < p < 1)
    and where its keep decisions come from: the Philox stream of seed and
    offset (read as uint64), or keep_ptr, the address of [B, Hq, Sq, Skv]
    uint8 decisions (nonzero = kept; seed and offset then unused)."""

    p: float
    seed: int = 0
    offset: int = 0
    keep_ptr: int | None = None

    def args(self) -> dict:
        """The dropout fields of fxa_attn_args and fxa_attn_bwd_args."""
        return {"dropout_seed": self.seed & _U64, "dropout_offset": self.offset & _U64, "dropout_keep": self.keep_ptr}


def _dropout_p(dropout: Dropout | None) -> float:
    return 0.0 if dropout is None else dropout.p


def _dropout_args(dropout: Dropout | None) -> dict:
    return {} if dropout is None else dropout.args()


def _lse_args(x: Inputs, lse_ptr: int | None, parts_ptr: int | None) -> dict:
    """The lse fields of fxa_attn_args and fxa_attn_bwd_args: float64 inputs
    (an fp64 plan) take their lse in lse_f64 (double) and no parts."""
    if x.q.dtype == _capi.F64:
        assert parts_ptr is None, "an fp64 plan takes no lse_parts"
        return {"lse_f64": lse_ptr}
    return {"lse": lse_ptr, "lse_parts": parts_ptr}


def run(
    x: Inputs,
    opts: Options,
    out_code: int,
    out_ptr: int,
    lse_ptr: int | None = None,
    parts_ptr: int | None = None,
    dropout: Dropout | None = None,
) -> None:
    """fxa_attn_run into caller memory: out (contiguous, q's shape, fp32 or
    bf16 as out_code; fp64 for float64 inputs), lse [B, Hq, Sq] fp32 (fp64
    for float64 inputs) or None, its parts [B, Hq, Sq, 3] fp32 (for the
    backward; None for float64 inputs, whose backward reads the fp64 lse)
    or None; dropout on the softmax weights (None: none)."""
    d = x.descriptor(opts, out_code, dropout_p=_dropout_p(dropout))
    ctx = context(opts.threads)
    with ctx.lock:
        plan = ctx.plan(d)
        ws = ctx.workspace(plan.workspace_bytes)
        lse_args = _lse_args(x, lse_ptr, parts_ptr)
        args = _capi.new(
            _capi.AttnArgs, q=x.q.ptr, k=x.k.ptr, v=x.v.ptr, out=out_ptr, mask=_ptr(x.mask), **lse_args, **_dropout_args(dropout)
        )
        status = core.fxa_attn_run(plan.handle, ctypes.byref(args), ws, None)
        _capi.raise_status(status, ctx.last_error())


def run_backward(
    x: Inputs,
    opts: Options,
    out_code: int,
    out_ptr: int,
    dout_ptr: int,
    lse_ptr: int,
    parts_ptr: int | None,
    grads,
    grad_code: int,
    dropout: Dropout | None = None,
) -> None:
    """fxa_attn_bwd_run of the forward of x with opts: out and dout
    contiguous in q's shape (fp32 or bf16 as out_code), lse [B, Hq, Sq]
    fp32 (the forward's) and its parts [B, Hq, Sq, 3] (parts_ptr, the
    forward's, or None), into grads = (dq, dk, dv) addresses of memory in
    grad_code's dtype (fp32, bf16 or fp16, rounded once from the fp32
    gradients) with q's, k's and v's element strides. opts.compute is the
    forward's: bf16 compute (bf16 inputs) runs the backward's products on
    bf16 operands too; fp32 compute in fp32; the gradients accumulate in
    fp32 either way. float64 inputs run in fp64 throughout: out, dout, the
    lse (the forward's fp64 lse, no parts) and the gradients fp64. dropout:
    the forward's (its seed and offset, or its keep decisions), None without."""
    d = x.descriptor(opts, out_code, dropout_p=_dropout_p(dropout))
    ctx = context(opts.threads)
    with ctx.lock:
        plan = ctx.plan(d, BwdPlan)
        ws = ctx.workspace(plan.workspace_bytes)
        dq, dk, dv = grads
        args = _capi.new(
            _capi.AttnBwdArgs,
            q=x.q.ptr,
            k=x.k.ptr,
            v=x.v.ptr,
            out=out_ptr,
            dout=dout_ptr,
            dq=dq,
            dk=dk,
            dv=dv,
            mask=_ptr(x.mask),
            grad_dtype=grad_code,
            **_lse_args(x, lse_ptr, parts_ptr),
            **_dropout_args(dropout),
        )
        status = core.fxa_attn_bwd_run(plan.handle, ctypes.byref(args), ws, None)
        _capi.raise_status(status, ctx.last_error())


def numpy_bf16():
    """numpy's bfloat16 dtype (ml_dtypes)."""
    try:
        import ml_dtypes
    except ImportError as e:
        raise _capi.UnsupportedError("a bfloat16 numpy output needs the ml_dtypes package", _capi.UNSUPPORTED) from e
    return ml_dtypes.bfloat16


def attention_numpy(x: Inputs, opts: Options, return_lse: bool, out_dtype, dropout: Dropout | None = None):
    """The numpy path of fxattn.attention and scaled_dot_product_attention
    (options already checked; dropout: scaled_dot_product_attention's)."""
    out_code = arrays.out_code(x.q.dtype, out_dtype)
    wide = np.float64 if out_code == _capi.F64 else np.float32
    if out_code == _capi.BF16:
        bf16 = x.q.obj.dtype if x.q.dtype == _capi.BF16 else numpy_bf16()
        out = np.empty(x.q.shape, np.uint16).view(bf16)
    else:
        out = np.empty(x.q.shape, wide)
    lse = np.empty(lse_shape(opts.layout, x.q.shape), wide) if return_lse else None
    run(x, opts, out_code, out.ctypes.data, lse.ctypes.data if return_lse else None, dropout=dropout)
    if out_code == _capi.F16:
        out = arrays.to_float16(out)
    return (out, lse) if return_lse else out
