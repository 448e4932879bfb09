#!/usr/bin/env bash
# The installed libraries from an embedder's side: install this build into a
# fresh prefix, build examples/wan_layer.c against it twice (CMake
# find_package(fxattn CONFIG REQUIRED), and pkg-config fxattn_wan
# fxattn_io), and check that both give the bytes of `fxattn layer` on the
# same checkpoint and x. Also checks that libfxattn.so needs neither
# OpenBLAS, oneDNN nor OpenMP.
# Usage: install_example.sh BUILD_DIR FXATTN
set -u
build=$1
fxattn=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
prefix=$dir/prefix

cmake --install "$build" --prefix "$prefix" >"$dir/install.log" 2>&1 ||
    { cat "$dir/install.log"; echo "FAIL: cmake --install"; exit 1; }
lib=$prefix/lib
[ -d "$lib" ] || lib=$(dirname "$(find "$prefix" -name libfxattn.so | head -1)")
needed=$(readelf -d "$lib/libfxattn.so" | grep NEEDED)
if echo "$needed" | grep -Eq 'openblas|dnnl|gomp|omp'; then
    bad "libfxattn.so needs a BLAS, oneDNN or OpenMP: $needed"
else
    echo "ok: libfxattn.so needs only: $(echo "$needed" | sed 's/.*\[\(.*\)\]/\1/' | tr '\n' ' ')"
fi

# CMake package config
cmake -S "$src/examples" -B "$dir/ex" -DCMAKE_PREFIX_PATH="$prefix" >"$dir/ex.log" 2>&1 &&
    cmake --build "$dir/ex" >>"$dir/ex.log" 2>&1 ||
    { cat "$dir/ex.log"; bad "the example does not build with find_package(fxattn CONFIG)"; }
# pkg-config
export PKG_CONFIG_PATH=$lib/pkgconfig
if flags=$(pkg-config --cflags --libs fxattn_wan fxattn_io); then
    # shellcheck disable=SC2086
    cc -std=c11 -o "$dir/ex_pc" "$src/examples/wan_layer.c" $flags -Wl,-rpath,"$lib" ||
        bad "the example does not build with pkg-config ($flags)"
else
    bad "pkg-config fxattn_wan fxattn_io"
fi
[ "$(pkg-config --modversion fxattn)" = "$("$fxattn" info | sed -n 's/^fxattn //p')" ] ||
    bad "pkg-config's version $(pkg-config --modversion fxattn) is not fxattn info's"

# A checkpoint (block 1, hidden 256 = 8 heads x 32) and x [36, 256].
python3 -c "
import os, sys
sys.path.insert(0, os.path.join(sys.argv[2], 'tests', 'common'))
import testfiles
d = sys.argv[1]
testfiles.write_safetensors(os.path.join(d, 'w.safetensors'), testfiles.wan_attention_tensors(256, 1))
testfiles.write_npy(os.path.join(d, 'x.npy'), (36, 256), testfiles.lcg(99, 36 * 256, 3.0))
" "$dir" "$src" || { echo "FAIL: cannot write the inputs"; exit 1; }
"$fxattn" layer --weights "$dir/w.safetensors" --block 1 --heads 8 --grid 2,3,6 -x "$dir/x.npy" \
    -o "$dir/cli.npy" || { echo "FAIL: fxattn layer"; exit 1; }
for ex in "$dir/ex/wan_layer" "$dir/ex_pc"; do
    [ -x "$ex" ] || continue
    LD_LIBRARY_PATH=$lib "$ex" "$dir/w.safetensors" 1 8 2,3,6 "$dir/x.npy" "$dir/ex.npy" ||
        { bad "$ex failed"; continue; }
    cmp -s "$dir/cli.npy" "$dir/ex.npy" && echo "ok: $(basename "$ex") gives fxattn layer's bytes" ||
        bad "$(basename "$ex"): y differs from fxattn layer's"
    rm -f "$dir/ex.npy"
done
# A bad checkpoint: a status and a message, no output.
LD_LIBRARY_PATH=$lib "$dir/ex/wan_layer" "$dir/x.npy" 1 8 2,3,6 "$dir/x.npy" "$dir/ex.npy" \
    2>"$dir/err.txt" && bad "a .npy taken for a checkpoint was accepted"
grep -q "wan_layer: weights: .*x.npy" "$dir/err.txt" || bad "no message for a bad checkpoint: $(cat "$dir/err.txt")"
[ -e "$dir/ex.npy" ] && bad "a failed run wrote y"
[ $fail = 0 ] && echo "install_example: ok"
exit $fail
