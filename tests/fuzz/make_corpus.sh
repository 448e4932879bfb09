#!/usr/bin/env bash
# Regenerate the committed seed corpus of the fuzz targets: builds make_corpus.c with the host
# compiler ($CC, default cc) in a temporary folder and writes
# tests/fuzz/corpus/{npy,args,safetensors}/.
# Deterministic: rerunning gives the same bytes (git diff shows no change). Files of other
# names already in those folders (for example minimised finds added by hand) are kept.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"${CC:-cc}" -std=c11 -O1 -Wall -Wextra -o "$tmp/make_corpus" "$here/make_corpus.c"
"$tmp/make_corpus" "$here/corpus"
