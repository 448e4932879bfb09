"""The installed wheel on a machine without Open MPI or any -dev package
(tests/package/test_wheel_nodev.sh runs this inside its Debian root, in
the virtual environment holding the wheel, from an empty folder)."""

import subprocess
import sys
from pathlib import Path

import numpy as np

import fxattn
import fxattn.wan


def reference(q, k, v):
    """fp64 softmax(q k^T / sqrt(d)) v, BSHD."""
    s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[-1])
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v.astype(np.float64))


def cli(*args):
    return subprocess.run(["fxattn", *args], capture_output=True, text=True, timeout=120)


rng = np.random.default_rng(7)
q, k, v = rng.standard_normal((3, 2, 160, 4, 64), dtype=np.float32)
ref = reference(q, k, v)
# fp32 inputs of unit scale: the result is within a few fp32 ulps of 1.
out = fxattn.attention(q, k, v, layout="bshd", threads=2)
err = float(np.abs(out - ref).max())
assert out.shape == q.shape and out.dtype == np.float32 and err < 1e-5, err
print(f"ok: fxattn {fxattn.__version__}: attention (2, 160, 4, 64) within {err:.1e} of fp64")

layer = fxattn.wan.WanSelfAttention.synthetic(hidden=128, heads=2, seed=3, threads=2)
x = rng.standard_normal((2 * 3 * 4, 128), dtype=np.float32)
y = layer(x, (2, 3, 4))
assert y.shape == x.shape and np.isfinite(y).all() and np.abs(y).max() > 0
print("ok: Wan layer (bundled OpenBLAS, oneDNN, libgomp)")

# The CLI linked against Open MPI cannot start here; the console script runs
# the one without it.
mpi_cli = Path(fxattn.__file__).parent / "bin" / "fxattn"
direct = subprocess.run([str(mpi_cli), "info"], capture_output=True, text=True, timeout=60)
assert direct.returncode != 0 and "libmpi.so.40" in direct.stderr, (direct.returncode, direct.stderr)
info = cli("info")
assert info.returncode == 0 and fxattn.__version__ in info.stdout, (info.returncode, info.stdout, info.stderr)
for name, a in zip("qkv", (q, k, v)):
    np.save(f"{name}.npy", a)
run = cli("attn", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "-o", "o.npy", "--threads", "2")
assert run.returncode == 0, (run.returncode, run.stderr)
out_cli = np.load("o.npy")
assert out_cli.shape == q.shape and float(np.abs(out_cli - ref).max()) < 1e-5
assert out_cli.tobytes() == out.tobytes()  # the same library, same plan: same bytes
print("ok: fxattn info; fxattn attn on .npy files: the same bytes as fxattn.attention")

try:
    import fxattn.mpi  # noqa: F401
except ImportError as e:
    msg = str(e)
else:
    sys.exit("FAIL: import fxattn.mpi succeeded without Open MPI")
assert "needs Open MPI's runtime (libmpi.so.40)" in msg and "apt-get install openmpi-bin libopenmpi3" in msg, msg
print(f"ok: import fxattn.mpi: ImportError: {msg}")
dist = cli("attn", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "-o", "o2.npy", "--ulysses", "2")
assert dist.returncode != 0 and "need Open MPI's runtime (libmpi.so.40)" in dist.stderr, (dist.returncode, dist.stderr)
assert "apt-get install openmpi-bin libopenmpi3" in dist.stderr, dist.stderr
print(f"ok: fxattn attn --ulysses 2: {dist.stderr.strip()}")
