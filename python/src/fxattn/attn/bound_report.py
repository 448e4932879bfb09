"""fxattn.check: does the fixed-max bound suit these q, k, v?

The per-head report of `fxattn check`, computed by the C library
(a check plan of libfxattn: fxa_check_plan_create, fxa_check_run): the spread of query and key norms, the bound
ceil(U_i) against the two gates, the predicted share of rows that fall back
to online softmax with and without key centring (from the library's own
bound pass, so exactly what attention would do), and the overshoot of the
bound over each sampled row's true maximum score. Base-2 units.
"""

from __future__ import annotations

import ctypes
from ctypes import c_size_t, c_void_p

from .. import _capi
from .._capi import CheckHead, core
from .._common import validate
from .._common.context import context
from .inputs import Inputs
from .options import Options

LN2 = 0.6931471805599453


class CheckReport:
    """What fxattn.check found. .heads: one dict per query head with the
    keys of `fxattn check --json`; .to_dict(): that whole JSON object;
    .plot(path): a PNG of it (matplotlib)."""

    def __init__(self, shape: dict, has_v: bool, heads: list):
        self.shape = shape
        self.has_v = has_v
        self.heads = heads
        n = len(heads)
        # The mean of the heads' shares, summed in head order (as the CLI does).
        self.fallback_share_centered = sum(h["fallback_share_centered"] / n for h in heads)
        self.fallback_share_raw = sum(h["fallback_share_raw"] / n for h in heads)

    def to_dict(self) -> dict:
        return {
            **self.shape,
            "has_v": self.has_v,
            "fallback_share_centered": self.fallback_share_centered,
            "fallback_share_raw": self.fallback_share_raw,
            "heads": [dict(h) for h in self.heads],
        }

    def plot(self, path) -> None:
        """Per head: the bound against the two gates, and the predicted
        fallback share, into a PNG at path (needs matplotlib)."""
        from ..plot import plot_report

        plot_report(self.to_dict(), path)

    def __repr__(self) -> str:
        return (
            f"CheckReport(heads={len(self.heads)}, fallback_share_centered={self.fallback_share_centered:.4g}, "
            f"fallback_share_raw={self.fallback_share_raw:.4g})"
        )


def _head_dict(h: int, r: CheckHead) -> dict:
    """One head as `fxattn check --json` names it (C for c), with the counts."""
    d = {"head": h}
    d.update({"C" if name == "c" else name: getattr(r, name) for name, _ in CheckHead._fields_[1:]})
    d["overshoot_max_nats"] = r.overshoot_max * LN2
    return d


def check(q, k, v=None, *, scale=None, layout="bshd", sample_rows=32, threads=None) -> CheckReport:
    """The bound report of q, k (and v: None takes Vmax as 1), numpy arrays
    or torch tensors as fxattn.attention takes them (float32, bfloat16 or
    float16: the report is the fp32 kernels' bound). sample_rows: rows per
    (batch, head) whose true maximum score measures the overshoot. Raises
    InvalidArgumentError (a ValueError) on bad input, with the library's
    message, and UnsupportedError for float64 inputs."""
    opts = Options.parse(scale, layout, compute="fp32", threads=threads)
    sample_rows = validate.integer("sample_rows", sample_rows, 1, validate.INT32_MAX)
    x = Inputs.of(q, k, k if v is None else v, layout)
    if x.q.dtype == _capi.F64:
        raise _capi.UnsupportedError(
            "fxattn.check reports the bound of the fp32 kernels: it takes float32, bfloat16 or float16 inputs, not float64 "
            "(float64 attention runs in fp64 with its own bound)",
            _capi.UNSUPPORTED,
        )
    qo, ko, vo = x.q, x.k, x.v
    d = x.descriptor(opts, _capi.F32)
    heads = (CheckHead * d.heads_q)()
    cd = _capi.new(_capi.CheckDesc, attn=ctypes.pointer(d), sample_rows=sample_rows, has_v=int(v is not None))
    args = _capi.new(_capi.AttnArgs, q=qo.ptr, k=ko.ptr, v=None if v is None else vo.ptr)
    ctx = context(opts.threads)
    with ctx.lock:
        plan, ws_bytes = c_void_p(), c_size_t()
        status = core.fxa_check_plan_create(ctx.handle, ctypes.byref(cd), ctypes.byref(plan), ctypes.byref(ws_bytes))
        _capi.raise_status(status, ctx.last_error())
        try:
            ws = ctx.workspace(ws_bytes.value)
            status = core.fxa_check_run(plan, ctypes.byref(args), ws, heads, ctypes.sizeof(CheckHead))
            _capi.raise_status(status, ctx.last_error())
        finally:
            core.fxa_check_plan_destroy(plan)
    scale_used = d.scale if d.scale > 0 else d.head_dim**-0.5
    shape = {
        "batch": d.batch,
        "heads_q": d.heads_q,
        "heads_kv": d.heads_kv,
        "seq_q": d.seq_q,
        "seq_kv": d.seq_kv,
        "head_dim": d.head_dim,
        "scale": scale_used,
    }
    return CheckReport(shape, v is not None, [_head_dict(h, heads[h]) for h in range(d.heads_q)])
