"""Opening the shared libraries and declaring their functions' C types."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path


def library_dir() -> Path:
    """Where the shared libraries are: $FXATTN_LIBRARY_PATH (a build tree's
    folder holding libfxattn.so), else the wheel's fxattn/lib."""
    env = os.environ.get("FXATTN_LIBRARY_PATH")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "lib"


def load(name: str) -> ctypes.CDLL:
    """Open lib<name>.so.0 from the library folder. By its soname: the file
    that its fxattn dependents name (found through their RUNPATH, $ORIGIN),
    so that each library is loaded once."""
    path = library_dir() / f"lib{name}.so.0"
    if not path.exists():
        raise ImportError(
            f"fxattn: {path} not found; install the package with `pip install .` from the repository root "
            "or point FXATTN_LIBRARY_PATH at a folder holding the built libraries"
        )
    return ctypes.CDLL(str(path))


def declare(lib, name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)
