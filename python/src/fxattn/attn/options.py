"""The options of one attention call, checked once, as one bundle that
travels from the public entries (attention, scaled_dot_product_attention,
fxattn.mpi.attention) through the torch operator to the C descriptor of the
forward and of the backward; and what compute="auto" runs."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from .. import _capi
from .._capi import core
from .._common import arrays, validate
from .._common.context import context

LAYOUTS = {"bshd": _capi.LAYOUT_BSHD, "bhsd": _capi.LAYOUT_BHSD}
MODES = {"auto": _capi.MODE_AUTO, "online": _capi.MODE_ONLINE}
COMPUTES = {"auto": _capi.COMPUTE_AUTO, "fp32": _capi.COMPUTE_FP32, "bf16": _capi.COMPUTE_BF16, "fp64": _capi.COMPUTE_FP64}
_COMPUTE_NAMES = {_capi.COMPUTE_FP32: "fp32", _capi.COMPUTE_BF16: "bf16", _capi.COMPUTE_FP64: "fp64"}
# What compute="auto" runs, per (dtype code, head dim): asked of the library once per process,
# so that a forward and its backward agree whichever context runs them.
_AUTO_COMPUTE: dict = {}


@dataclass(frozen=True)
class Options:
    """How one attention call runs, its arguments checked: scale (any
    finite value but 0.0, which stands for 1/sqrt(D); zero_scale_query
    turns a caller's scale of 0 into scores of 0), layout ("bshd" or "bhsd"), mode ("auto" or "online"), center
    (virtual key centring), compute ("auto", "fp32", "bf16" or "fp64"), threads (0:
    the CPUs this process may use), causal (an fxa_causal: 0 off, 1
    top-left aligned, 2 bottom-right) and reproducible (fxa_attn_desc's: the
    same bytes on every split of the keys on canonical groups)."""

    scale: float = 0.0
    layout: str = "bhsd"
    mode: str = "auto"
    center: bool = True
    compute: str = "auto"
    threads: int = 0
    causal: int = 0
    reproducible: bool = False

    @staticmethod
    def parse(
        scale=None,
        layout="bhsd",
        mode="auto",
        center=True,
        compute="auto",
        threads=None,
        causal=False,
        lower_right=False,
        reproducible=False,
    ) -> Options:
        """The Options of a caller's arguments (scale None: 1/sqrt(D);
        threads None: every CPU), each checked. A scale of 0 is refused:
        the public entries pass theirs through zero_scale_query first."""
        validate.choice("layout", layout, LAYOUTS)
        validate.choice("mode", mode, MODES)
        validate.choice("compute", compute, COMPUTES)
        given = scale is not None
        scale = validate.finite_real("scale", scale) if given else 0.0
        if given and scale == 0.0:
            raise validate.bad("scale 0 is not taken here (every score would be 0); leave scale out for 1/sqrt(D)")
        center = validate.boolean("center", center)
        causal = validate.boolean("is_causal", causal)
        lower_right = validate.boolean("causal_lower_right", lower_right)
        if lower_right and not causal:
            raise validate.bad("causal_lower_right=True needs is_causal=True")
        code = (_capi.CAUSAL_LOWER_RIGHT if lower_right else _capi.CAUSAL_UPPER_LEFT) if causal else 0
        reproducible = validate.boolean("reproducible", reproducible)
        return Options(scale, layout, mode, center, compute, validate.threads(threads), code, reproducible)

    @staticmethod
    def from_op(
        scale: float,
        layout: str,
        mode: str,
        center: bool,
        compute: str,
        threads: int,
        is_causal: bool,
        causal_lower_right: bool = False,
        reproducible: bool = False,
    ) -> Options:
        """The Options of the torch operators' parameters (op_kwargs)."""
        return Options.parse(scale or None, layout, mode, center, compute, threads or None, is_causal, causal_lower_right, reproducible)

    def op_kwargs(self) -> dict:
        """These options as the keyword arguments of torch.ops.fxattn.attention
        and attention_backward (the operators' schema takes scalars only)."""
        return {
            "scale": self.scale,
            "layout": self.layout,
            "mode": self.mode,
            "center": self.center,
            "compute": self.compute,
            "threads": self.threads,
            "is_causal": self.causal != 0,
            "causal_lower_right": self.causal == _capi.CAUSAL_LOWER_RIGHT,
            "reproducible": self.reproducible,
        }


def zero_scale_query(q, scale):
    """(q, scale) as the library takes them. A scale of 0 (torch takes any
    float) makes every score 0: the library, whose scale 0 stands for
    1/sqrt(D), gets q * 0 at scale 1, whose scores are exactly 0 too, and
    q's gradient is 0 as torch's is. Any other scale, and a q that is no
    array (refused later), pass unchanged."""
    if scale is None or validate.finite_real("scale", scale) != 0.0:
        return q, scale
    if not (arrays.is_torch(q) or isinstance(q, np.ndarray)):
        return q, scale
    return q * 0, 1.0


@dataclass(frozen=True)
class ComputeChoice:
    """What compute="auto" runs: compute ("fp32" or "bf16"; "fp64" for
    float64 inputs) and the tile rates it was chosen by (one thread,
    attention GFLOP/s; 0.0 where nothing was measured)."""

    compute: str
    fp32_gflops: float
    bf16_gflops: float


def compute_choice_code(dtype_code: int, head_dim: int, threads=None) -> ComputeChoice:
    """fxa_ctx_compute_choice on the context of `threads`."""
    ctx = context(threads)
    c = _capi.new(_capi.ComputeChoice)
    with ctx.lock:
        status = core.fxa_ctx_compute_choice(ctx.handle, dtype_code, head_dim, ctypes.byref(c))
        _capi.raise_status(status, ctx.last_error())
    return ComputeChoice(_COMPUTE_NAMES[c.compute], c.fp32_gflops, c.bf16_gflops)


def compute_code(compute: str, dtype_code: int, head_dim: int, threads=None) -> int:
    """The C compute of option `compute` for inputs of dtype_code and head_dim: "auto" resolved
    once per process (_AUTO_COMPUTE). float64 inputs compute in fp64 ("auto" or "fp64"), and
    only they do."""
    if (dtype_code == _capi.F64) != (compute == "fp64") and compute != "auto":
        if dtype_code == _capi.F64:
            raise validate.bad(f'compute="{compute}" with float64 inputs: they compute in fp64 (compute "auto" or "fp64")')
        raise validate.bad(f'compute="fp64" with {arrays.DTYPE_NAMES[dtype_code]} inputs: fp64 compute is for float64 inputs')
    if dtype_code == _capi.F64:
        return _capi.COMPUTE_FP64
    if compute != "auto":
        return COMPUTES[compute]
    key = (dtype_code, head_dim)
    if key not in _AUTO_COMPUTE:
        _AUTO_COMPUTE[key] = COMPUTES[compute_choice_code(dtype_code, head_dim, threads).compute]
    return _AUTO_COMPUTE[key]
