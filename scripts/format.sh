#!/usr/bin/env bash
# Format the tree's C sources with clang-format (.clang-format), or with
# --check list the files that differ from it and exit 1 (the test suite's
# test_format). Only files git tracks (or would track) are touched.
# Usage: scripts/format.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
[ "${1:-}" = --check ] && check=1
cf=$(command -v clang-format-14 || command -v clang-format || true)
[ -n "$cf" ] || { echo "format.sh: clang-format is not installed (scripts/deps.sh --test)" >&2; exit 1; }
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.c' '*.h' '*.cpp')
if [ $check = 0 ]; then
    "$cf" -i "${files[@]}"
    exit 0
fi
bad=0
for f in "${files[@]}"; do
    if ! "$cf" --dry-run --Werror "$f" >/dev/null 2>&1; then
        echo "format.sh: $f differs from .clang-format (run scripts/format.sh)"
        bad=1
    fi
done
[ $bad = 0 ] && echo "format.sh: ${#files[@]} files match .clang-format"
exit $bad
