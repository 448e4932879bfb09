#!/usr/bin/env bash
# Install dependencies, then build and run the whole suite with CTest three
# ways: the test configuration (optimised, assertions on, warnings are
# errors; it includes the fresh-machine check, scripts/fresh_machine.sh, as
# the test labelled `fresh`, and the Python package's pytest files, label
# `python`, on the package installed with every extra in .venv), the same
# under AddressSanitizer + UndefinedBehaviorSanitizer, and the threaded
# tests under ThreadSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh --test
jobs="$(nproc)"
export FUZZ_REQUIRE_CLANG=1 # a missing libFuzzer fails the run instead of skipping

# The Python package with all its extras (torch, diffusers, mpi4py) and the
# test tools, as a user installs it; mpi4py built from source against the
# system's Open MPI (mpicc).
[ -x .venv/bin/python ] || python3 -m venv .venv
PIP_NO_BINARY=mpi4py .venv/bin/pip install --quiet ".[torch,diffusers,mpi,test]"

cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFXA_WERROR=ON \
      -DFXA_PYTHON="$PWD/.venv/bin/python"
cmake --build build-test -j "$jobs"
ctest --test-dir build-test --output-on-failure -j "$jobs"

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFXA_WERROR=ON \
      -DFXA_SANITIZE=address,undefined
cmake --build build-asan -j "$jobs"
ctest --test-dir build-asan --output-on-failure -j "$jobs" -LE fuzz

cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFXA_WERROR=ON -DFXA_SANITIZE=thread
cmake --build build-tsan -j "$jobs"
# The thread-pool tests, and every MPI and layer test (Open MPI's own reports
# suppressed by library name, tests/mpi/tsan.supp).
ctest --test-dir build-tsan --output-on-failure -j "$jobs" -L 'threads|mpi|layer'
