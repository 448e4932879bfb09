"""The `fxattn` console script: runs the CLI that the wheel bundles
(fxattn/bin/fxattn, the C program of tools/fxattn) with this process's
arguments, replacing this process."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def binary() -> Path:
    """The bundled CLI's path (fxattn/bin/fxattn beside this package)."""
    return Path(__file__).resolve().parent / "bin" / "fxattn"


def main() -> None:
    path = binary()
    if not os.access(path, os.X_OK):
        sys.exit(f"fxattn: error: the CLI {path} is not installed (the package was not built as a wheel)")
    os.execv(path, [str(path), *sys.argv[1:]])


if __name__ == "__main__":
    main()
