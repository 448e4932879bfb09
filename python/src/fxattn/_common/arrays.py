"""numpy arrays and torch tensors as the C API sees them: a data pointer, a
dtype code and element strides, with no copy where the C API can take the
memory as it is (any non-negative strides with a unit last-axis stride)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import numpy as np

from .. import _capi

_NUMPY_DTYPES = {"float32": _capi.F32, "bfloat16": _capi.BF16, "float16": _capi.F16, "float64": _capi.F64}
DTYPE_NAMES = {_capi.F32: "float32", _capi.BF16: "bfloat16", _capi.F16: "float16", _capi.F64: "float64"}


def torch_module():
    """torch when it is already imported (a tensor exists only then), else None."""
    return sys.modules.get("torch")


def is_torch(x) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def torch_of_numpy(a: np.ndarray):
    """A torch tensor of numpy array a's values (ml_dtypes bfloat16 as
    torch.bfloat16), sharing memory where torch can."""
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def numpy_of_torch(t, dtype) -> np.ndarray:
    """torch tensor t's values as a numpy array of dtype (t's own dtype:
    float32, float64, float16 or ml_dtypes bfloat16)."""
    import torch

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtype)
    return t.numpy().astype(dtype, copy=False)


@dataclass
class Operand:
    """One input tensor: the object kept alive, its dtype code, shape,
    element strides and data address."""

    obj: object
    dtype: int
    shape: tuple
    strides: tuple
    ptr: int


def _bad(message: str):
    return _capi.InvalidArgumentError(message, _capi.INVALID_ARG)


def _usable(shape, strides) -> bool:
    """The C API takes non-negative strides with the last axis contiguous."""
    return all(s >= 0 for s in strides) and (shape[-1] <= 1 or strides[-1] == 1)


def native_array(x, name: str = "the array") -> np.ndarray:
    """x as a numpy array in the machine's byte order: a big- or
    little-endian array of the other order is converted (a copy), as the
    C API reads raw native bytes. A masked array with masked entries is
    refused (InvalidArgumentError): its data under the mask would be read
    as values (attention masks are scaled_dot_product_attention's attn_mask)."""
    if isinstance(x, np.ma.MaskedArray) and np.ma.is_masked(x):
        raise _bad(
            f"{name} is a masked array with masked entries, whose data would be read as values: pass "
            f"{name}.filled(value) (attention masks go to scaled_dot_product_attention's attn_mask)"
        )
    a = np.asarray(x)
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return a


def numpy_operand(x, name: str) -> Operand:
    a = native_array(x, name)
    code = _NUMPY_DTYPES.get(a.dtype.name)
    if code is None:
        raise _bad(f"{name} has dtype {a.dtype.name}; fxattn takes float32, bfloat16, float16 or float64")
    item = a.itemsize
    if a.ndim == 0 or any(s % item for s in a.strides) or not _usable(a.shape, [s // item for s in a.strides]):
        a = np.ascontiguousarray(a)
    strides = tuple(0 if n == 1 else s // item for n, s in zip(a.shape, a.strides))
    return Operand(a, code, a.shape, strides, a.ctypes.data)


def torch_dtype_code(torch, dtype) -> int | None:
    return {torch.float32: _capi.F32, torch.bfloat16: _capi.BF16, torch.float16: _capi.F16, torch.float64: _capi.F64}.get(dtype)


def torch_values(t, name: str):
    """t as a plain strided tensor whose memory holds its values: sparse,
    mkldnn, nested and quantized tensors are refused (InvalidArgumentError),
    and a lazily negated or conjugated view (its neg or conj bit set,
    e.g. torch._neg_view or complex.conj().imag) is materialised, as its
    memory holds the other sign."""
    torch = torch_module()
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        kind = "quantized" if t.is_quantized else "nested" if t.is_nested else str(t.layout)
        raise _bad(f"{name} is a {kind} tensor; fxattn takes dense (torch.strided) tensors")
    return t.resolve_conj().resolve_neg()


def torch_operand(t, name: str) -> Operand:
    torch = torch_module()
    t = torch_values(t, name)
    if t.device.type != "cpu":
        raise _bad(f"{name} is on {t.device}; fxattn runs on the CPU")
    code = torch_dtype_code(torch, t.dtype)
    if code is None:
        raise _bad(f"{name} has dtype {t.dtype}; fxattn takes torch.float32, torch.bfloat16, torch.float16 or torch.float64")
    if t.dim() == 0 or not _usable(t.shape, t.stride()):
        t = t.contiguous()
    strides = tuple(0 if n == 1 else s for n, s in zip(t.shape, t.stride()))
    return Operand(t, code, tuple(t.shape), strides, t.data_ptr())


def same_kind(q, k, v) -> None:
    """Refuse q, k and v that mix torch tensors with numpy arrays (or
    other array-likes): the output's kind follows q, so a mix is ambiguous."""
    kinds = [is_torch(t) for t in (q, k, v)]
    if len(set(kinds)) > 1:
        names = ", ".join(f"{n} is {'a torch tensor' if t else type(x).__name__}" for n, x, t in zip("qkv", (q, k, v), kinds))
        raise _bad(f"q, k and v must be all torch tensors or all numpy arrays: {names}")


def to_float16(out32, name: str = "out_dtype float16"):
    """out32 (finite fp32, numpy or torch) rounded once to float16; raises
    InvalidArgumentError when a value overflows (its magnitude rounds
    above 65504, the largest finite float16) instead of returning inf."""
    torch = torch_module()
    if torch is not None and isinstance(out32, torch.Tensor):
        out16 = out32.to(torch.float16)
        overflow = bool(torch.isinf(out16).any())
    else:
        with np.errstate(over="ignore"):
            out16 = out32.astype(np.float16)
        overflow = bool(np.isinf(out16).any())
    if overflow:
        big = float(abs(out32).max())
        raise _bad(
            f"{name}: the output holds values up to {big:.6g} in magnitude, beyond float16's largest "
            f"finite value 65504; ask for out_dtype float32 or bfloat16"
        )
    return out16


def operand(x, name: str) -> Operand:
    return torch_operand(x, name) if is_torch(x) else numpy_operand(x, name)


def dtype_code(dtype) -> int:
    """The code of a numpy or torch dtype, or of its name ('float32',
    'bfloat16', 'float16', 'float64')."""
    torch = torch_module()
    if torch is not None and isinstance(dtype, torch.dtype):
        code = torch_dtype_code(torch, dtype)
    elif isinstance(dtype, str):
        code = _NUMPY_DTYPES.get(dtype)
    else:
        try:
            dt = np.dtype(dtype)
        except TypeError:
            dt = None
        code = _NUMPY_DTYPES.get(dt.name) if dt is not None and dt.isnative else None
    if code is None:
        raise _bad(f"out_dtype {dtype} is not float32, bfloat16, float16 or float64")
    return code


def out_code(in_code: int, out_dtype) -> int:
    """The output dtype code of inputs of in_code with out_dtype (None: the
    inputs'). float64 inputs are computed in fp64 and give a float64
    output; float64 is the output of float64 inputs only."""
    code = in_code if out_dtype is None else dtype_code(out_dtype)
    if (code == _capi.F64) != (in_code == _capi.F64):
        if in_code == _capi.F64:
            raise _bad(
                f"out_dtype {DTYPE_NAMES[code]} with float64 inputs: float64 inputs are computed in fp64 and give a "
                "float64 output (out_dtype None or float64); round the result yourself"
            )
        raise _bad(f"out_dtype float64 with {DTYPE_NAMES[in_code]} inputs: a float64 output needs float64 inputs (computed in fp64)")
    return code
