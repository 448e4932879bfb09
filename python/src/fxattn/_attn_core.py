"""The pieces of fxattn.attention that its numpy path, its torch operator
(_torch), fxattn.check and fxattn.mpi share: options, descriptors,
operands and one run on caller memory."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from . import _arrays, _check_args, _lib
from ._context import BwdPlan, context
from ._lib import core

_LAYOUTS = {"bshd": _lib.LAYOUT_BSHD, "bhsd": _lib.LAYOUT_BHSD}
_MODES = {"auto": _lib.MODE_AUTO, "online": _lib.MODE_ONLINE}
_COMPUTES = {"auto": _lib.COMPUTE_AUTO, "fp32": _lib.COMPUTE_FP32, "bf16": _lib.COMPUTE_BF16}
_COMPUTE_NAMES = {_lib.COMPUTE_FP32: "fp32", _lib.COMPUTE_BF16: "bf16"}
# What compute="auto" runs, per (dtype code, head dim): asked of the library once per process,
# so that a forward and its backward agree whichever context runs them.
_AUTO_COMPUTE: dict = {}


def _bad(message: str):
    return _lib.InvalidArgumentError(message, _lib.INVALID_ARG)


@dataclass(frozen=True)
class ComputeChoice:
    """What compute="auto" runs: compute ("fp32" or "bf16") and the tile
    rates it was chosen by (one thread, attention GFLOP/s; 0.0 where nothing
    was measured)."""

    compute: str
    fp32_gflops: float
    bf16_gflops: float


def compute_choice_code(dtype_code: int, head_dim: int, threads=None) -> ComputeChoice:
    """fxa_ctx_compute_choice on the context of `threads`."""
    ctx = context(threads)
    c = _lib.ComputeChoice(struct_size=ctypes.sizeof(_lib.ComputeChoice))
    with ctx.lock:
        status = core.fxa_ctx_compute_choice(ctx.handle, dtype_code, head_dim, ctypes.byref(c))
        _lib.raise_status(status, ctx.last_error())
    return ComputeChoice(_COMPUTE_NAMES[c.compute], c.fp32_gflops, c.bf16_gflops)


def compute_code(compute: str, dtype_code: int, head_dim: int, threads=None) -> int:
    """The C compute of option `compute` for inputs of dtype_code and head_dim: "auto" resolved
    once per process (_AUTO_COMPUTE)."""
    if compute != "auto":
        return _COMPUTES[compute]
    key = (dtype_code, head_dim)
    if key not in _AUTO_COMPUTE:
        _AUTO_COMPUTE[key] = _COMPUTES[compute_choice_code(dtype_code, head_dim, threads).compute]
    return _AUTO_COMPUTE[key]


@dataclass(frozen=True)
class Options:
    """The keyword options of attention(), checked once."""

    scale: float  # 0: 1/sqrt(D)
    layout: str
    mode: str
    center: bool
    compute: str
    threads: int  # 0: the CPUs this process may use

    @staticmethod
    def parse(scale, layout, mode, center, compute, threads) -> "Options":
        _check_args.choice("layout", layout, _LAYOUTS)
        _check_args.choice("mode", mode, _MODES)
        _check_args.choice("compute", compute, _COMPUTES)
        scale = 0.0 if scale is None else _check_args.positive_real("scale", scale)
        center = _check_args.boolean("center", center)
        return Options(scale, layout, mode, center, compute, _check_args.threads(threads))


def _shapes(layout: str, shape) -> tuple:
    """(batch, seq, heads, head_dim) of a 4-D shape in layout."""
    b, x, y, d = shape
    return (b, x, y, d) if layout == "bshd" else (b, y, x, d)


def _strides(layout: str, strides) -> _lib.AttnStrides:
    b, x, y, _ = strides
    token, head = (x, y) if layout == "bshd" else (y, x)
    return _lib.AttnStrides(batch=b, token=token, head=head)


def _check(q, k, v, layout: str):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != 4:
            want = "[B, S, H, D]" if layout == "bshd" else "[B, H, S, D]"
            raise _bad(f"{name} has shape {list(t.shape)}; layout {layout!r} takes 4-D {want}")
    if tuple(k.shape) != tuple(v.shape):
        raise _bad(f"k has shape {list(k.shape)} but v has {list(v.shape)}; they must match")
    if not (q.dtype == k.dtype == v.dtype):
        names = [_arrays.DTYPE_NAMES[t.dtype] for t in (q, k, v)]
        raise _bad(f"q, k and v have dtypes {', '.join(names)}; they must match")
    bq, _, _, dq = _shapes(layout, q.shape)
    bk, _, _, dk = _shapes(layout, k.shape)
    if bq != bk:
        raise _bad(f"q has batch {bq} but k and v have {bk}")
    if dq != dk:
        raise _bad(f"q has head_dim {dq} but k and v have {dk}")


def _broadcast_safe(op: _arrays.Operand, layout: str) -> _arrays.Operand:
    """All three strides 0 means 'the layout's preset' to the C API: a
    broadcast view of one row with more than one row gets copied."""
    b, s, h, _ = _shapes(layout, op.shape)
    st = _strides(layout, op.strides)
    if st.batch == st.token == st.head == 0 and b * s * h > 1:
        obj = op.obj.contiguous() if _arrays.is_torch(op.obj) else np.ascontiguousarray(op.obj)
        return _arrays.operand(obj, "")
    return op


@dataclass
class Mask:
    """An attention mask as the C API reads it: kind (_lib.MASK_BOOL, uint8
    nonzero = attend; _lib.MASK_ADD, float32), the element strides of its
    [B, Hq, Sq, Skv] view (0 broadcasts), its address and the object kept
    alive."""

    kind: int
    strides: tuple
    ptr: int
    obj: object


def descriptor(
    q, k, v, opts: Options, out_code: int, mask: Mask | None = None, causal: bool = False, resolve_compute: bool = True
) -> _lib.AttnDesc:
    """The fxa_attn_desc of operands q, k, v (from operands()) with options
    opts, a mask and causal. compute "auto" is resolved here (compute_code)
    unless resolve_compute is False (libfxattn_mpi resolves it across ranks)."""
    b, sq, hq, dim = _shapes(opts.layout, q.shape)
    _, skv, hkv, _ = _shapes(opts.layout, k.shape)
    d = _lib.AttnDesc()
    core.fxa_attn_desc_init(ctypes.byref(d))
    d.batch, d.heads_q, d.heads_kv, d.seq_q, d.seq_kv, d.head_dim = b, hq, hkv, sq, skv, dim
    d.layout = _LAYOUTS[opts.layout]
    d.dtype = q.dtype
    d.scale = opts.scale
    d.mode = _MODES[opts.mode]
    d.center = int(opts.center)
    d.compute = compute_code(opts.compute, q.dtype, dim, opts.threads) if resolve_compute else _COMPUTES[opts.compute]
    d.q_strides = _strides(opts.layout, q.strides)
    d.k_strides = _strides(opts.layout, k.strides)
    d.v_strides = _strides(opts.layout, v.strides)
    d.out_dtype = _lib.BF16 if out_code == _lib.BF16 else _lib.F32
    d.causal = int(causal)
    if mask is not None:
        d.mask_kind = mask.kind
        d.mask_strides = _lib.MaskStrides(*mask.strides)
    return d


def operands(q, k, v, layout: str):
    """q, k, v as checked operands the C API takes as they are (copied only
    when it cannot)."""
    _arrays.same_kind(q, k, v)
    ops = tuple(_arrays.operand(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    _check(*ops, layout)
    return tuple(_broadcast_safe(op, layout) for op in ops)


def run(
    q,
    k,
    v,
    opts: Options,
    out_code: int,
    out_ptr: int,
    lse_ptr: int | None,
    mask: Mask | None = None,
    causal: bool = False,
    parts_ptr: int | None = None,
) -> None:
    """fxa_attn_run on operands into caller memory: out (contiguous, q's shape,
    fp32 or bf16 as out_code), lse [B, Hq, Sq] fp32 or None; an optional
    mask and causal; parts_ptr: the lse parts [B, Hq, Sq, 3] fp32 (for the
    backward) or None."""
    d = descriptor(q, k, v, opts, out_code, mask, causal)
    ctx = context(opts.threads)
    with ctx.lock:
        plan = ctx.plan(d)
        ws = ctx.workspace(plan.workspace_bytes)
        args = _lib.new(
            _lib.AttnArgs, q=q.ptr, k=k.ptr, v=v.ptr, out=out_ptr, lse=lse_ptr, mask=mask.ptr if mask else None, lse_parts=parts_ptr
        )
        status = core.fxa_attn_run(plan.handle, ctypes.byref(args), ws, None)
        _lib.raise_status(status, ctx.last_error())


def run_backward(
    q,
    k,
    v,
    opts: Options,
    out_code: int,
    out_ptr: int,
    dout_ptr: int,
    lse_ptr: int,
    grads,
    grad_code: int,
    mask: Mask | None = None,
    causal: bool = False,
    parts_ptr: int | None = None,
) -> None:
    """fxa_attn_bwd_run on operands: out and dout contiguous in q's shape
    (fp32 or bf16 as out_code), lse [B, Hq, Sq] fp32 (the forward's) and
    its parts [B, Hq, Sq, 3] (parts_ptr, the forward's, or None), into
    grads = (dq, dk, dv) addresses of memory in grad_code's dtype (fp32,
    bf16 or fp16, rounded once from the fp32 gradients) with q's, k's and
    v's element strides; the forward's mask and causal. opts.compute is the
    forward's: bf16 compute (bf16 inputs) runs the backward's products on
    bf16 operands too, masked or causal alike; fp32 compute in fp32; the
    gradients accumulate in fp32 either way."""
    d = descriptor(q, k, v, opts, out_code, mask, causal)
    ctx = context(opts.threads)
    with ctx.lock:
        plan = ctx.plan(d, BwdPlan)
        ws = ctx.workspace(plan.workspace_bytes)
        dq, dk, dv = grads
        args = _lib.new(
            _lib.AttnBwdArgs,
            q=q.ptr,
            k=k.ptr,
            v=v.ptr,
            out=out_ptr,
            dout=dout_ptr,
            lse=lse_ptr,
            dq=dq,
            dk=dk,
            dv=dv,
            mask=mask.ptr if mask else None,
            grad_dtype=grad_code,
            lse_parts=parts_ptr,
        )
        status = core.fxa_attn_bwd_run(plan.handle, ctypes.byref(args), ws, None)
        _lib.raise_status(status, ctx.last_error())


def lse_shape(layout: str, q_shape) -> tuple:
    b, s, h, _ = _shapes(layout, q_shape)
    return (b, h, s)


def numpy_bf16():
    try:
        import ml_dtypes
    except ImportError as e:
        raise _lib.UnsupportedError("a bfloat16 numpy output needs the ml_dtypes package", _lib.UNSUPPORTED) from e
    return ml_dtypes.bfloat16


def attention_numpy(q, k, v, opts: Options, return_lse: bool, out_dtype, mask: Mask | None = None, causal: bool = False):
    """fxattn.attention's numpy path (options already checked), with an
    optional mask and causal (fxattn.scaled_dot_product_attention)."""
    qo, ko, vo = operands(q, k, v, opts.layout)
    out_code = qo.dtype if out_dtype is None else _arrays.dtype_code(out_dtype)
    if out_code == _lib.BF16:
        bf16 = qo.obj.dtype if qo.dtype == _lib.BF16 else numpy_bf16()
        out = np.empty(qo.shape, np.uint16).view(bf16)
    else:
        out = np.empty(qo.shape, np.float32)
    lse = np.empty(lse_shape(opts.layout, qo.shape), np.float32) if return_lse else None
    run(qo, ko, vo, opts, out_code, out.ctypes.data, lse.ctypes.data if return_lse else None, mask, causal)
    if out_code == _lib.F16:
        out = _arrays.to_float16(out)
    return (out, lse) if return_lse else out
