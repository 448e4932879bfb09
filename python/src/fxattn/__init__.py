"""fxattn: exact fixed-max attention for long-sequence diffusion transformers.

Python bindings of the C libraries (ctypes; no second implementation):

    fxattn.attention(q, k, v, ...)   numpy arrays or torch tensors
    fxattn.scaled_dot_product_attention(query, key, value, ...)
                                     torch's SDPA call (masks, causal, GQA) on fxattn
    fxattn.varlen_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, ...)
                                     packed variable-length sequences (flash-attn's varlen)
    fxattn.check(q, k, v)            does the fixed-max bound suit these inputs?
    fxattn.wan                       the Wan2.2 self-attention layer
    fxattn.diffusers                 an attention processor for diffusers' Wan
    fxattn.mpi                       context parallelism with mpi4py

Errors raise fxattn.FxattnError subclasses carrying the library's message;
bad input raises InvalidArgumentError, which is a ValueError.
"""

import sys as _sys

from ._capi import (
    FxattnError,
    FxattnIOError,
    InvalidArgumentError,
    MPIError,
    OutOfMemoryError,
    PeerTimeoutError,
    UnsupportedError,
)
from ._capi import core as _core
from .attn import CheckReport, attention, check, scaled_dot_product_attention, varlen_attention

#: The C library's version (the same as __version__ in a consistent install).
library_version = _core.fxa_version().decode()


def _package_version() -> str:
    """The version has one source, project(VERSION) in the top CMakeLists.txt:
    the C library is configured from it (fxa_version) and the wheel's
    metadata reads it (pyproject.toml's dynamic version). The installed
    distribution's version when it is this very package, else (a source
    tree on PYTHONPATH) the C library's."""
    from importlib import metadata
    from pathlib import Path

    try:
        dist = metadata.distribution("fxattn")
        if Path(str(dist.locate_file("fxattn/__init__.py"))).resolve() == Path(__file__).resolve():
            return dist.version
    except (metadata.PackageNotFoundError, OSError):
        pass
    return library_version


__version__ = _package_version()


def available_cpus() -> int:
    """The CPUs this process may run on (affinity mask and cgroup quota)."""
    return _core.fxa_available_cpus()


def kernel_info(threads=None) -> str:
    """One line naming the kernel set and tiles a context of `threads` runs."""
    from ._common.context import context

    return context(threads).kernel_info


def compute_choice(dtype="bfloat16", head_dim=128, threads=None):
    """What compute="auto" (the default of attention,
    scaled_dot_product_attention, the diffusers backend and processor, and
    fxattn.mpi) runs for inputs of dtype ("float32", "bfloat16", "float16",
    "float64", or a numpy or torch dtype) with head_dim on this machine: a
    ComputeChoice with compute ("fp32", "bf16" or "fp64") and the one-thread tile
    rates it was chosen by (GFLOP/s; 0.0 where nothing was measured: f32
    and f16 inputs always compute in fp32, f64 inputs in fp64). bf16 compute is chosen where
    the bf16 tile runs at least 1.25x the fp32 tile (AMD Zen 4 and 5, AMX);
    on Intel cores whose vdpbf16ps runs at half the FMA rate, fp32. The
    environment variable FXA_AUTO_COMPUTE ("fp32" or "bf16"), read when a
    context is created, pins it."""
    from ._capi import INVALID_ARG
    from ._common import arrays, validate
    from .attn.options import compute_choice_code

    try:
        code = arrays.dtype_code(dtype)
    except InvalidArgumentError:
        raise InvalidArgumentError(f"dtype {dtype} is not float32, bfloat16, float16 or float64", INVALID_ARG) from None
    return compute_choice_code(code, validate.integer("head_dim", head_dim, 1, validate.INT32_MAX), threads)


def release_contexts() -> None:
    """Free the cached thread pools: every context (worker threads, plans,
    workspace) is destroyed once no call in progress and no object (a
    fxattn.wan layer) holds it. Later calls make new ones. The cache keeps
    the 4 most recently used thread counts on its own."""
    from ._common.context import release_contexts as release

    release()


# torch users get the custom operator registered at import, outside any
# torch.compile trace.
if "torch" in _sys.modules:
    from .attn import torch_op  # noqa: F401

__all__ = [
    "FxattnError",
    "FxattnIOError",
    "InvalidArgumentError",
    "MPIError",
    "OutOfMemoryError",
    "PeerTimeoutError",
    "UnsupportedError",
    "CheckReport",
    "attention",
    "scaled_dot_product_attention",
    "varlen_attention",
    "check",
    "available_cpus",
    "kernel_info",
    "compute_choice",
    "library_version",
    "release_contexts",
]
