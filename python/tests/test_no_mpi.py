"""The package without Open MPI: `import fxattn` and its single-process
calls need no libmpi; `import fxattn.mpi` raises ImportError saying what
to install, and the `fxattn` console script picks the CLI built without
MPI. Open MPI is installed on this machine, so its absence is simulated in
a subprocess: ctypes refuses to open libmpi.so.40 (as the dynamic loader
does where it is missing), mpi4py is made unimportable for the second
case. tests/package/test_package.sh checks the same on a Debian root
that really has no Open MPI."""

import subprocess
import sys
import textwrap

import pytest

NO_LIBMPI = textwrap.dedent(
    """
    import ctypes, sys
    init = ctypes.CDLL.__init__
    def refusing(self, name, *args, **kwargs):
        if name is not None and "libmpi.so" in str(name).rsplit("/", 1)[-1]:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        init(self, name, *args, **kwargs)
    ctypes.CDLL.__init__ = refusing
    """
)


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_import_and_attention_without_libmpi():
    proc = run(
        NO_LIBMPI
        + textwrap.dedent(
            """
            import numpy as np, fxattn
            q, k, v = np.random.default_rng(0).standard_normal((3, 1, 64, 2, 16), dtype=np.float32)
            out = fxattn.attention(q, k, v, layout="bshd", threads=1)
            s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64)) / 4.0
            p = np.exp(s - s.max(-1, keepdims=True))
            ref = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v.astype(np.float64))
            assert np.abs(out - ref).max() < 1e-5
            assert "fxattn.mpi" not in sys.modules and "mpi4py" not in sys.modules
            try:
                import fxattn.mpi
            except ImportError as e:
                print("ImportError:", e)
            """
        )
    )
    assert proc.returncode == 0, proc.stderr
    msg = proc.stdout
    assert "ImportError: fxattn.mpi needs Open MPI's runtime (libmpi.so.40)" in msg, msg
    assert "apt-get install openmpi-bin libopenmpi3" in msg and "cannot open shared object file" in msg, msg


def test_import_without_mpi4py():
    proc = run("import sys; sys.modules['mpi4py'] = None\ntry:\n import fxattn.mpi\nexcept ImportError as e:\n print(e)")
    assert proc.returncode == 0, proc.stderr
    assert "fxattn.mpi needs mpi4py on Open MPI: `pip install mpi4py`" in proc.stdout, proc.stdout


@pytest.mark.parametrize("has_mpi", [True, False])
def test_console_script_picks_the_cli(has_mpi):
    """fxattn._cli.binary(): bin/fxattn where libmpi.so.40 loads, else
    bin/fxattn-nompi (both are in the wheel; here a fake bin/ folder)."""
    proc = run(
        (NO_LIBMPI if not has_mpi else "")
        + textwrap.dedent(
            """
            import os, tempfile, fxattn._cli as cli
            from pathlib import Path
            d = Path(tempfile.mkdtemp())
            for name in ("fxattn", "fxattn-nompi"):
                (d / "bin").mkdir(exist_ok=True)
                (d / "bin" / name).write_text("#!/bin/sh\\n")
                os.chmod(d / "bin" / name, 0o755)
            cli.__file__ = str(d / "_cli.py")
            print(cli.binary().name)
            """
        )
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ("fxattn" if has_mpi else "fxattn-nompi")
