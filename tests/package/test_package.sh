#!/usr/bin/env bash
# The Python package's release files as a user gets them: scripts/wheel.sh
# makes the sdist, a wheel built by pip from that sdist alone (the
# library in Release), and the manylinux wheel auditwheel repairs from it.
# Checks: the sdist holds the CMake tree, the package and LICENSE and no
# build outputs or environments; the wheel holds LICENSE, py.typed and the
# CLI; in a fresh virtual environment (no system site packages; numpy from
# PyPI) the wheel runs an attention against an fp64 reference and the
# `fxattn` console script runs `fxattn info`; in the repaired wheel every
# library and the CLI resolve OpenBLAS, oneDNN and libgomp to the copies in
# fxattn.libs/ (ldd), and a Wan layer run from a second fresh environment
# maps those copies and no system ones and gives the raw wheel's bytes.
# Usage: test_package.sh WORKDIR (emptied first)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(realpath -m "$1")
rm -rf "$work"
mkdir -p "$work"
fail() { echo "test_package: FAIL: $*" >&2; exit 1; }
ok() { echo "ok: $*"; }
# The package under test is the installed one, never a source tree's.
unset FXATTN_LIBRARY_PATH PYTHONPATH PYTHONHOME

"$src/scripts/wheel.sh" "$work/dist"
version=$(sed -n 's/^project(fxattn VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
sdist=$work/dist/fxattn-$version.tar.gz
raw=$(ls "$work"/dist/raw/fxattn-"$version"-py3-none-linux_x86_64.whl)
repaired=$(ls "$work"/dist/fxattn-"$version"-py3-none-manylinux_*_x86_64.whl)

# ---- the sdist ---------------------------------------------------------------
list=$(tar tzf "$sdist" | sed "s|^fxattn-$version/||")
for f in pyproject.toml CMakeLists.txt LICENSE PKG-INFO src/CMakeLists.txt include/fxattn.h \
    tools/CMakeLists.txt cmake/FxaLibrary.cmake python/README.md python/src/fxattn/__init__.py \
    python/src/fxattn/py.typed python/src/fxattn/_cli.py; do
    grep -qx "$f" <<<"$list" || fail "the sdist lacks $f"
done
bad=$(grep -E '^(build[^/]*|\.venv[^/]*|dist|\.git|tmp)/|__pycache__|\.pyc$' <<<"$list" || true)
[ -z "$bad" ] || fail "the sdist holds build outputs or environments: $(head -3 <<<"$bad")"
ok "sdist $(basename "$sdist"): $(wc -l <<<"$list") entries, sources and LICENSE, no build outputs"

# ---- the wheel's contents ----------------------------------------------------
for whl in "$raw" "$repaired"; do
    names=$(unzip -Z1 "$whl")
    for f in fxattn/py.typed fxattn/_cli.py fxattn/bin/fxattn fxattn/bin/fxattn-nompi fxattn/lib/libfxattn.so.0 \
        fxattn-$version.dist-info/licenses/LICENSE fxattn-$version.dist-info/entry_points.txt; do
        grep -qx "$f" <<<"$names" || fail "$(basename "$whl") lacks $f"
    done
    unzip -p "$whl" "fxattn-$version.dist-info/licenses/LICENSE" | grep -q "Apache License" ||
        fail "$(basename "$whl"): LICENSE is not the Apache License"
    unzip -p "$whl" "fxattn-$version.dist-info/entry_points.txt" | grep -qx "fxattn = fxattn._cli:main" ||
        fail "$(basename "$whl"): no fxattn console script"
done
unzip -p "$raw" "fxattn-$version.dist-info/METADATA" | grep -q "^License: Apache-2.0" ||
    fail "the metadata does not say Apache-2.0"
ok "wheels hold LICENSE (Apache-2.0), py.typed, bin/fxattn, bin/fxattn-nompi and the fxattn console script"

# ---- a fresh environment per wheel ---------------------------------------------
# attention on 2 x 96 tokens, 3 heads of 40, against fp64; then the Wan layer
# (libfxattn_wan over OpenBLAS and oneDNN) on synthetic weights, saved as
# OUT.npy; prints the paths of the OpenBLAS, oneDNN and OpenMP libraries mapped.
cat >"$work/run.py" <<'PY'
import sys, numpy as np, fxattn, fxattn.wan
rng = np.random.default_rng(1)
q, k, v = rng.standard_normal((3, 2, 96, 3, 40), dtype=np.float32)
out = fxattn.attention(q, k, v, layout="bshd", threads=2)
s = np.einsum("bqhd,bkhd->bhqk", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(40)
p = np.exp(s - s.max(-1, keepdims=True))
ref = np.einsum("bhqk,bkhd->bqhd", p / p.sum(-1, keepdims=True), v.astype(np.float64))
err = float(np.abs(out - ref).max())
assert out.shape == q.shape and out.dtype == np.float32 and err < 1e-5, err
layer = fxattn.wan.WanSelfAttention.synthetic(hidden=128, heads=2, seed=3, threads=1)
x = rng.standard_normal((2 * 3 * 4, 128), dtype=np.float32)
y = layer(x, (2, 3, 4))
assert y.shape == x.shape and np.isfinite(y).all()
np.save(sys.argv[1], y)
maps = {line.split()[-1] for line in open("/proc/self/maps") if len(line.split()) >= 6}
print("max |out - fp64| =", err)
print("\n".join(sorted(m for m in maps if any(n in m for n in ("openblas", "dnnl", "gomp")))))
PY
fresh_env() { # fresh_env DIR WHEEL: a virtual environment holding WHEEL (and numpy)
    python3 -m venv "$1"
    "$1/bin/pip" install --quiet "$2" >"$1.log" 2>&1 || { cat "$1.log"; fail "pip install $(basename "$2")"; }
    "$1/bin/python" -c "import sys; assert sys.prefix != sys.base_prefix" || fail "$1 is not a venv"
}
fresh_env "$work/venv-raw" "$raw"
info=$(cd / && "$work/venv-raw/bin/fxattn" info) || fail "fxattn info exited $?"
grep -q "$version" <<<"$info" || fail "fxattn info does not print version $version: $info"
ok "console script: fxattn info ($(head -1 <<<"$info"))"
(cd / && "$work/venv-raw/bin/python" "$work/run.py" "$work/y-raw.npy") || fail "the raw wheel's run"
ok "raw wheel: attention within 1e-5 of fp64, Wan layer runs"

# ---- the repaired wheel ----------------------------------------------------
fresh_env "$work/venv-repaired" "$repaired"
pkg=$("$work/venv-repaired/bin/python" -c "import fxattn, os; print(os.path.dirname(fxattn.__file__))")
libs=$(dirname "$pkg")/fxattn.libs
[ -d "$libs" ] || fail "no fxattn.libs/ beside the installed package"
for elf in "$pkg"/lib/libfxattn*.so.0 "$pkg/bin/fxattn" "$pkg/bin/fxattn-nompi"; do
    deps=$(ldd "$elf")
    ! grep -q "not found" <<<"$deps" || fail "$elf: $(grep 'not found' <<<"$deps")"
    for name in openblas dnnl gomp; do
        while read -r line; do
            [ -n "$line" ] || continue
            target=$(realpath "$(awk '{print $3}' <<<"$line")")
            [ "$(dirname "$target")" = "$(realpath "$libs")" ] || fail "$elf: $line (not the bundled copy)"
        done < <(grep "$name" <<<"$deps" || true)
    done
done
! readelf -d "$pkg/bin/fxattn-nompi" | grep NEEDED | grep -q libmpi || fail "bin/fxattn-nompi needs libmpi"
readelf -d "$pkg/lib/libfxattn_proj.so.0" | grep NEEDED | grep -q "libopenblas.*-[0-9a-f]\{8\}" ||
    fail "libfxattn_proj.so.0 does not need the renamed OpenBLAS"
ok "repaired wheel: libfxattn*.so.0, bin/fxattn and bin/fxattn-nompi (no libmpi) resolve OpenBLAS, oneDNN and libgomp in fxattn.libs/"
mapped=$(cd / && "$work/venv-repaired/bin/python" "$work/run.py" "$work/y-repaired.npy") || fail "the repaired wheel's run"
echo "$mapped"
for name in openblas dnnl gomp; do
    paths=$(grep "$name" <<<"$mapped" | grep -v "/numpy.libs/" || true) # numpy's own OpenBLAS aside
    [ -n "$paths" ] || fail "the Wan layer mapped no $name library"
    ! grep -qv "/fxattn.libs/" <<<"$paths" || fail "a system $name is mapped: $paths"
done
"$work/venv-repaired/bin/python" -c "
import numpy as np, sys
a, b = np.load(sys.argv[1]), np.load(sys.argv[2])
assert a.tobytes() == b.tobytes(), float(np.abs(a - b).max())" "$work/y-raw.npy" "$work/y-repaired.npy" ||
    fail "the repaired wheel's Wan layer output differs from the raw wheel's"
(cd / && "$work/venv-repaired/bin/fxattn" info >/dev/null) || fail "the repaired wheel's fxattn info"
ok "repaired wheel: the run maps only the bundled OpenBLAS, oneDNN and libgomp; same bytes as the raw wheel"
echo "test_package: passed"
