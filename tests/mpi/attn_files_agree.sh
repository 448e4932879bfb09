#!/usr/bin/env bash
# `fxattn attn` under mpirun, every rank reading its shard through the
# same relative paths from its own folder (mpirun -wdir: a copy per host):
# a copy of another shape, or of the same shape with other values (a stale
# or regenerated file, or one value changed anywhere), on one rank is refused with exit 2 and one message
# naming the file and the rank, and no output; identical copies run
# (exit 0). Each run under `timeout -k`.
# Usage: attn_files_agree.sh MPIRUN FXATTN
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"
fxattn=$(realpath "$fxattn") # absolute: the ranks start in their own folders
lcg="$(dirname "$0")/lcg_npy.py"
for r in 0 1; do
    mkdir "$dir/r$r"
    for t in q k v; do
        "$lcg" "$dir/r$r/$t.npy" "$(printf %d "'$t")" 2.0 1 24 2 16 || exit 1
    done
done

# job NAME EXPECT(empty: success): rank 0 in r0, rank 1 in r1.
job() {
    rm -f "$dir/out.npy"
    folders_job "$1" "$2" "$dir/out.npy" "$dir/r0" "$dir/r1" \
        attn -q q.npy -k k.npy -v v.npy -o "$dir/out.npy" --threads 1 --timeout 20
}

job "identical copies" ""
# V of rank 1: the same shape, other values (one seed apart).
"$lcg" "$dir/r1/v.npy" 119 2.0 1 24 2 16 || exit 1
job "V of other values on rank 1" \
    "ranks read different bytes of -v v.npy: rank 1 differs from rank 0"
cp "$dir/r0/v.npy" "$dir/r1/v.npy"
# K of rank 1: one value of one token changed (token 2 of 24, in rank 0's
# shard: rank 1's copy of it is never used for the result, yet the files
# differ and the job is refused).
python3 - "$dir/r1/k.npy" <<'PY' || exit 1
import struct, sys
path = sys.argv[1]
b = bytearray(open(path, "rb").read())
start = 10 + struct.unpack("<H", b[8:10])[0]  # .npy 1.0: data after the header
at = start + 2 * (2 * 16) * 4 + 5 * 4  # token 2 of [1, 24, 2, 16] <f4, element 5
b[at:at + 4] = struct.pack("<f", struct.unpack("<f", b[at:at + 4])[0] + 1.0)
open(path, "wb").write(bytes(b))
PY
job "one value of K changed on rank 1" \
    "ranks read different bytes of -k k.npy: rank 1 differs from rank 0"
cp "$dir/r0/k.npy" "$dir/r1/k.npy"
# Q of rank 1: more tokens.
"$lcg" "$dir/r1/q.npy" 113 2.0 1 30 2 16 || exit 1
job "Q of more tokens on rank 1" \
    "ranks read different shapes or dtypes of -q q.npy: rank 1 differs from rank 0"
[ "$fail" -eq 0 ] && echo "attn_files_agree: all passed"
exit "$fail"
