"""The `fxattn` console script: runs the CLI that the wheel bundles
(fxattn/bin/fxattn, the C program of tools/fxattn) with this process's
arguments, replacing this process. That program is linked against Open
MPI's libmpi.so.40, which the wheel does not bundle; where it cannot be
loaded the script runs fxattn/bin/fxattn-nompi instead, the same CLI whose
distributed options say that they need Open MPI."""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path


def _has_open_mpi() -> bool:
    """Whether the dynamic loader finds Open MPI's libmpi.so.40."""
    try:
        ctypes.CDLL("libmpi.so.40")
    except OSError:
        return False
    return True


def binary() -> Path:
    """The bundled CLI's path: fxattn/bin/fxattn beside this package, or
    fxattn/bin/fxattn-nompi when Open MPI's runtime is missing."""
    bin_dir = Path(__file__).resolve().parent / "bin"
    nompi = bin_dir / "fxattn-nompi"
    if os.access(nompi, os.X_OK) and not _has_open_mpi():
        return nompi
    return bin_dir / "fxattn"


def main() -> None:
    path = binary()
    if not os.access(path, os.X_OK):
        sys.exit(f"fxattn: error: the CLI {path} is not installed (the package was not built as a wheel)")
    os.execv(path, [str(path), *sys.argv[1:]])


if __name__ == "__main__":
    main()
