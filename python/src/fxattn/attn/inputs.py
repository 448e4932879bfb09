"""The tensors of one attention call as the C API takes them: q, k, v as
checked operands (numpy arrays or torch tensors, no copy where the library
can read them as they are), an optional mask, and the fxa_attn_desc that
describes them with an Options bundle."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from .. import _capi
from .._capi import core
from .._common import arrays
from .options import COMPUTES, LAYOUTS, MODES, Options, compute_code


def _bad(message: str):
    return _capi.InvalidArgumentError(message, _capi.INVALID_ARG)


def shapes(layout: str, shape) -> tuple:
    """(batch, seq, heads, head_dim) of a 4-D shape in layout."""
    b, x, y, d = shape
    return (b, x, y, d) if layout == "bshd" else (b, y, x, d)


def lse_shape(layout: str, q_shape) -> tuple:
    """[B, Hq, Sq] of a query shape in layout."""
    b, s, h, _ = shapes(layout, q_shape)
    return (b, h, s)


def mask_shape(layout: str, q_shape, k_shape) -> tuple:
    """[B, Hq, Sq, Skv] of q and k shapes in layout."""
    b, h, sq = lse_shape(layout, q_shape)
    return (b, h, sq, lse_shape(layout, k_shape)[2])


def _strides(layout: str, strides) -> _capi.AttnStrides:
    b, x, y, _ = strides
    token, head = (x, y) if layout == "bshd" else (y, x)
    return _capi.AttnStrides(batch=b, token=token, head=head)


def _check(q, k, v, layout: str):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != 4:
            want = "[B, S, H, D]" if layout == "bshd" else "[B, H, S, D]"
            raise _bad(f"{name} has shape {list(t.shape)}; layout {layout!r} takes 4-D {want}")
    if tuple(k.shape) != tuple(v.shape):
        raise _bad(f"k has shape {list(k.shape)} but v has {list(v.shape)}; they must match")
    if not (q.dtype == k.dtype == v.dtype):
        names = [arrays.DTYPE_NAMES[t.dtype] for t in (q, k, v)]
        raise _bad(f"q, k and v have dtypes {', '.join(names)}; they must match")
    bq, _, _, dq = shapes(layout, q.shape)
    bk, _, _, dk = shapes(layout, k.shape)
    if bq != bk:
        raise _bad(f"q has batch {bq} but k and v have {bk}")
    if dq != dk:
        raise _bad(f"q has head_dim {dq} but k and v have {dk}")


def _broadcast_safe(op: arrays.Operand, layout: str) -> arrays.Operand:
    """All three strides 0 means 'the layout's preset' to the C API: a
    broadcast view of one row with more than one row gets copied."""
    b, s, h, _ = shapes(layout, op.shape)
    st = _strides(layout, op.strides)
    if st.batch == st.token == st.head == 0 and b * s * h > 1:
        obj = op.obj.contiguous() if arrays.is_torch(op.obj) else np.ascontiguousarray(op.obj)
        return arrays.operand(obj, "")
    return op


@dataclass
class Mask:
    """An attention mask as the C API reads it: kind (MASK_BOOL, uint8
    nonzero = attend; MASK_ADD, float32; MASK_ADD_F64, float64, with
    float64 inputs only), the element strides of its
    [B, Hq, Sq, Skv] view (0 broadcasts), its address and the object kept
    alive."""

    kind: int
    strides: tuple
    ptr: int
    obj: object


@dataclass(frozen=True)
class Inputs:
    """q, k, v as checked operands (arrays.Operand) and an optional Mask."""

    q: arrays.Operand
    k: arrays.Operand
    v: arrays.Operand
    mask: Mask | None = None

    @staticmethod
    def of(q, k, v, layout: str, mask: Mask | None = None) -> Inputs:
        """q, k, v (numpy arrays or torch tensors, one kind) checked against
        each other in layout, copied only where the C API cannot read them."""
        arrays.same_kind(q, k, v)
        ops = tuple(arrays.operand(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
        _check(*ops, layout)
        return Inputs(*(_broadcast_safe(op, layout) for op in ops), mask)

    def with_mask(self, mask: Mask | None) -> Inputs:
        return Inputs(self.q, self.k, self.v, mask)

    def descriptor(self, opts: Options, out_code: int, resolve_compute: bool = True, dropout_p: float = 0.0) -> _capi.AttnDesc:
        """The fxa_attn_desc of these inputs run with opts, the output in
        out_code (fp32 or bf16, fp64 for float64 inputs; fp16 outputs are
        written as fp32). compute "auto" is resolved here (compute_code)
        unless resolve_compute is False (libfxattn_mpi resolves it across
        ranks). dropout_p: the softmax weights' dropout probability (0: off)."""
        q, k = self.q, self.k
        b, sq, hq, dim = shapes(opts.layout, q.shape)
        _, skv, hkv, _ = shapes(opts.layout, k.shape)
        d = _capi.AttnDesc()
        core.fxa_attn_desc_init(ctypes.byref(d))
        d.batch, d.heads_q, d.heads_kv, d.seq_q, d.seq_kv, d.head_dim = b, hq, hkv, sq, skv, dim
        d.layout = LAYOUTS[opts.layout]
        d.dtype = q.dtype
        d.scale = opts.scale
        d.mode = MODES[opts.mode]
        d.center = int(opts.center)
        d.compute = compute_code(opts.compute, q.dtype, dim, opts.threads) if resolve_compute else COMPUTES[opts.compute]
        d.q_strides = _strides(opts.layout, q.strides)
        d.k_strides = _strides(opts.layout, k.strides)
        d.v_strides = _strides(opts.layout, self.v.strides)
        d.out_dtype = out_code if out_code in (_capi.BF16, _capi.F64) else _capi.F32
        d.causal = int(opts.causal)
        d.reproducible = int(opts.reproducible)
        if self.mask is not None:
            if self.mask.kind == _capi.MASK_ADD_F64 and q.dtype != _capi.F64:
                raise _bad(f"attn_mask is float64 with {arrays.DTYPE_NAMES[q.dtype]} inputs: a float64 mask goes with float64 inputs")
            d.mask_kind = self.mask.kind
            d.mask_strides = _capi.MaskStrides(*self.mask.strides)
        if dropout_p:
            d.dropout_p = dropout_p
        return d
