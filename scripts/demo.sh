#!/usr/bin/env bash
# Install dependencies, build fxattn (Release) and run the demo: a
# Wan2.2-like attention layer, fixed-max vs online softmax vs fp64. Then
# install the Python package (numpy only) into .venv and call it once.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFXA_BUILD_TESTS=OFF
cmake --build build -j "$(nproc)"
./build/fxattn demo "$@"

# The Python package (pyproject.toml, python/src/fxattn), built from the same tree by scikit-build-core.
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install --quiet .
.venv/bin/python - <<'PY'
import numpy as np, fxattn
q, k, v = np.random.default_rng(0).standard_normal((3, 1, 256, 8, 64), dtype=np.float32)
out, lse = fxattn.attention(q, k, v, layout="bshd", return_lse=True)  # [B, S, H, D] numpy arrays
print(f"python: fxattn {fxattn.__version__} in .venv: attention {out.shape} {out.dtype}, lse {lse.shape}")
PY
echo "python: use it with  source .venv/bin/activate; python -c 'import fxattn; help(fxattn.attention)'"
echo "python: torch, diffusers and mpi4py extras:  .venv/bin/pip install '.[torch,diffusers,mpi]'"
