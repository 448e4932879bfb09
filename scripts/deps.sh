#!/usr/bin/env bash
# Install what fxattn needs on Debian 12, deciding from exactly what the
# build uses: each requirement below is checked by the very file CMake (or
# a test) needs (a library, its own header, a command), never by a header
# or package that could stand in for it (the reference BLAS's cblas.h is
# not OpenBLAS). Missing packages are installed in one apt-get call; a
# requirement still missing afterwards is named and the script exits 1
# before CMake runs.
#
#   scripts/deps.sh          what the build, the demo and the Python
#                            package's virtual environment need
#   scripts/deps.sh --test   also what the test suite needs (clang with
#                            libFuzzer for the fuzz targets, clang-format
#                            for the format check, Python's headers (the
#                            Python tests build mpi4py), debootstrap for the
#                            fresh-machine check, iproute2 for the test
#                            hosts)
#
# Uses sudo when not root. Does nothing when everything is there.
set -euo pipefail

with_tests=0
case "${1:-}" in
"") ;;
--test) with_tests=1 ;;
*)
    echo "usage: scripts/deps.sh [--test]" >&2
    exit 2
    ;;
esac

# One line per requirement: what | Debian package | check (a shell test).
# Libraries are looked for under every multiarch folder, as CMake does.
lib='/usr/lib/*-linux-gnu'
inc='/usr/include/*-linux-gnu'
reqs=(
    "C and C++ compilers (cc, c++) and libc headers|build-essential|command -v cc && command -v c++ && test -e /usr/include/stdio.h"
    "make|make|command -v make"
    "CMake >= 3.25|cmake|command -v cmake"
    "Open MPI compiler wrapper and library (mpicc, libmpi.so)|libopenmpi-dev|command -v mpicc && ls $lib/libmpi.so"
    "Open MPI launcher (mpirun)|openmpi-bin|command -v mpirun"
    "OpenBLAS library (libopenblas.so)|libopenblas-dev|ls $lib/libopenblas.so"
    "OpenBLAS's own cblas.h (openblas_config.h beside it)|libopenblas-dev|ls $inc/openblas*/openblas_config.h $inc/openblas*/cblas.h"
    "oneDNN library and header (libdnnl.so, dnnl.h)|libdnnl-dev|ls $lib/libdnnl.so && test -e /usr/include/oneapi/dnnl/dnnl.h"
    "python3 with venv and ensurepip (the Python package's environment)|python3-venv|python3 -c 'import venv, ensurepip'"
)
if [ "$with_tests" = 1 ]; then
    reqs+=(
        "clang (the fuzz targets)|clang|command -v clang"
        "clang-format 14 (the format check)|clang-format|command -v clang-format"
        "libFuzzer runtime (libclang_rt.fuzzer)|libclang-rt-14-dev|ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a"
        "Python headers (Python.h: mpi4py built against Open MPI)|python3-dev|python3 -c 'import os, sysconfig; assert os.path.exists(sysconfig.get_paths()[\"include\"] + \"/Python.h\")'"
        "debootstrap (fresh-machine check)|debootstrap|command -v debootstrap"
        "ip (test hosts in network namespaces)|iproute2|command -v ip"
    )
fi

have() { (eval "$1") >/dev/null 2>&1; }

need=()
for r in "${reqs[@]}"; do
    IFS='|' read -r what pkg check <<<"$r"
    if ! have "$check"; then
        echo "deps.sh: missing: $what (package $pkg)"
        [[ " ${need[*]:-} " == *" $pkg "* ]] || need+=("$pkg")
    fi
done
[ ${#need[@]} -eq 0 ] && exit 0

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "deps.sh: apt-get install ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}"

missing=0
for r in "${reqs[@]}"; do
    IFS='|' read -r what pkg check <<<"$r"
    if ! have "$check"; then
        echo "deps.sh: error: $what is still missing after installing $pkg" >&2
        missing=1
    fi
done
exit "$missing"
