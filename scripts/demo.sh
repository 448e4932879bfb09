#!/usr/bin/env bash
# Install dependencies, build fxattn (Release) and run the demo: a
# Wan2.2-like attention layer, fixed-max vs online softmax vs fp64.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DFXA_BUILD_TESTS=OFF
cmake --build build -j "$(nproc)"
./build/fxattn demo "$@"
