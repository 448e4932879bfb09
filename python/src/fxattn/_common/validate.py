"""Argument validators shared by every entry point of the package.

ctypes converts Python values to C types silently (an int wraps modulo
2^64, a float truncates, any object is truthy), so every argument that
reaches a C call goes through one of these first. Each raises
InvalidArgumentError (a ValueError) naming the argument and the value.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import _capi

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


def bad(message: str) -> _capi.InvalidArgumentError:
    return _capi.InvalidArgumentError(message, _capi.INVALID_ARG)


def show(value, limit: int = 80) -> str:
    """repr(value) for a message, cut to about limit characters (an int of
    more than 4300 digits has no repr at all)."""
    try:
        text = repr(value)
    except ValueError:
        text = f"<{type(value).__name__} too large to print>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _scalar(value):
    """value itself, or the Python scalar of a 0-d numpy array or torch tensor."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if type(value).__module__ == "torch" and hasattr(value, "dim") and value.dim() == 0:
        return value.item()
    return value


def boolean(name: str, value) -> bool:
    """A bool (Python or numpy); 0 and 1 as ints too. Strings and other
    objects are refused: "off" is not False."""
    value = _scalar(value)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return bool(value)
    raise bad(f"{name} must be True or False, not {show(value)}")


def integer(name: str, value, lo: int, hi: int) -> int:
    """An integer (Python or numpy, not a bool, a float or a string) in [lo, hi]."""
    value = _scalar(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise bad(f"{name} must be an integer, not {show(value)}")
    n = int(value)
    if not lo <= n <= hi:
        raise bad(f"{name} = {show(n)} is out of range [{lo}, {hi}]")
    return n


def _real(name: str, value, positive: bool) -> float:
    """A real number (Python, numpy or 0-d) that is finite (and > 0 when
    positive), as a float."""
    what = "a positive finite number" if positive else "a finite number"
    value = _scalar(value)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise bad(f"{name} must be {what}, not {show(value)}")
    try:
        x = float(value)
    except OverflowError:  # an int or Fraction beyond the double range
        x = math.inf
    if not (math.isfinite(x) and (x > 0 or not positive)):
        raise bad(f"{name} must be {what}, not {show(value)}")
    return x


def finite_real(name: str, value) -> float:
    """A real number (Python, numpy or 0-d) that is finite, as a float."""
    return _real(name, value, False)


def positive_real(name: str, value) -> float:
    """A real number (Python, numpy or 0-d) that is finite and > 0, as a float."""
    return _real(name, value, True)


def grid(name: str, value) -> tuple:
    """A latent grid: a sequence of three integers >= 1 (not a string)."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 3:
        raise bad(f"{name} must be (frames, height, width), three positive integers, not {show(value)}")
    try:
        return tuple(integer(name, g, 1, INT64_MAX) for g in value)
    except _capi.InvalidArgumentError:
        raise bad(f"{name} must be (frames, height, width), three positive integers, not {show(value)}") from None


def threads(value) -> int:
    """A threads= argument: None (0: the CPUs available) or an int >= 1."""
    return 0 if value is None else integer("threads", value, 1, INT32_MAX)


def real_array_dtype(name: str, dtype) -> None:
    """Refuse a numpy dtype whose values are not real numbers (complex,
    bool, strings, objects, dates): converting them to float would drop or
    invent values."""
    if dtype.kind in "cbOSUVMm" and dtype.name != "bfloat16":
        raise bad(f"{name} has dtype {dtype}; it must hold real numbers (a float or integer dtype)")


def choice(name: str, value, table: dict):
    """table[value] for a string value among table's keys."""
    if not isinstance(value, str) or value not in table:
        raise bad(f"{name}={show(value)}: expected one of {', '.join(map(repr, table))}")
    return table[value]
