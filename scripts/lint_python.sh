#!/usr/bin/env bash
# Format and lint every Python file of the tree with ruff (pyproject.toml's
# [tool.ruff]), or with --check report what differs or what the linter finds
# and exit 1 (the test suite's test_python_style).
# Usage: scripts/lint_python.sh [--check] [PYTHON]   (PYTHON: an interpreter
# with ruff installed; default .venv/bin/python, which scripts/test.sh makes)
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
[ "${1:-}" = --check ] && { check=1; shift; }
py="${1:-.venv/bin/python}"
"$py" -m ruff --version >/dev/null 2>&1 ||
    { echo "lint_python.sh: ruff is not installed for $py (pip install '.[test]')" >&2; exit 1; }
if [ $check = 0 ]; then
    "$py" -m ruff format .
    "$py" -m ruff check --fix .
    exit 0
fi
"$py" -m ruff format --check .
"$py" -m ruff check .
