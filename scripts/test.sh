#!/usr/bin/env bash
# Install dependencies, build the test configuration (optimised, assertions
# on, warnings are errors) and run the whole suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFXA_WERROR=ON
cmake --build build-test -j "$(nproc)"
ctest --test-dir build-test --output-on-failure -j "$(nproc)"
