#!/usr/bin/env bash
# Install what fxattn needs to build and test on Debian 12: a C11 compiler,
# make and CMake (>= 3.25), clang with libFuzzer for the fuzz targets,
# Open MPI (headers, library and mpirun) for libfxattn_mpi, and OpenBLAS
# (fp32) and oneDNN (bf16) for the projection's GEMMs.
# Skips apt when everything is already there.
set -euo pipefail
need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v make >/dev/null 2>&1 || need+=(make)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v clang >/dev/null 2>&1 || need+=(clang)
# libFuzzer's runtime is only a Recommends of clang-14: ask for it by name.
ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 ||
    need+=(libclang-rt-14-dev)
command -v mpicc >/dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun >/dev/null 2>&1 || need+=(openmpi-bin)
[ -f /usr/include/x86_64-linux-gnu/cblas.h ] || [ -f /usr/include/cblas.h ] ||
    [ -f /usr/include/x86_64-linux-gnu/openblas-pthread/cblas.h ] || need+=(libopenblas-dev)
[ -f /usr/include/oneapi/dnnl/dnnl.h ] || need+=(libdnnl-dev)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
    sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
