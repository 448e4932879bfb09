#!/usr/bin/env bash
# `fxattn attn --inputs-on rank0` under mpirun -np 4: rank 0 runs in a
# folder that holds the inputs, ranks 1-3 in an empty one (mpirun's app
# contexts, each with its own --wdir; relative paths), as on a cluster
# without a shared file system:
#  - the default (every rank reads its shard) fails there, on every rank
#    with one message naming a rank that could not open a file, nothing
#    written: the other ranks really cannot read the files;
#  - --inputs-on rank0 writes the same bytes as every rank reading the
#    files itself (one folder for all), for the 2-D grid on BSHD fp32, a
#    ring on BHSD bf16 with GQA, and with the ranks placed in another
#    order than the world's (FXA_MPI_TEST_HOSTS=0,1,0,1: the library's
#    test-only host labels, so rank 0 must send each rank its grid rank's
#    shard); nothing is written in the empty folder;
#  - a missing input under --inputs-on rank0 fails on every rank with one
#    message ("rank 0: ..."), nothing written; a bad --inputs-on value is
#    refused.
# Usage: inputs_rank0.sh MPIRUN FXATTN
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"
A=$dir/with_files B=$dir/empty
mkdir -p "$A" "$B"

demo_inputs "$A" --frames 1 --height 5 --width 25 --heads 4 --dim 32
lcg="$(dirname "$0")/lcg_npy.py"
"$lcg" "$A/qb.npy" 1 4.0 1 4 123 32 && "$lcg" "$A/kb.npy" 2 4.0 1 2 123 32 &&
    "$lcg" "$A/vb.npy" 3 4.0 1 2 123 32 || { echo "FAIL: BHSD inputs"; exit 1; }

# case NAME "ATTN OPTIONS" [MPIRUN OPTIONS, given to each app context]:
# every rank in $A vs rank 0 alone.
case_() {
    local name=$1 opts=$2 mopts=${3:-}
    # shellcheck disable=SC2086
    (cd "$A" && run $mopts -np 4 "$fxattn" attn $opts -o all.npy --threads 1) ||
        { bad "$name: every rank reading: exit $?"; return; }
    # shellcheck disable=SC2086
    out=$(run $mopts -np 1 --wdir "$A" "$fxattn" attn $opts -o rank0.npy --threads 1 \
        --inputs-on rank0 : $mopts -np 3 --wdir "$B" "$fxattn" attn $opts -o rank0.npy \
        --threads 1 --inputs-on rank0 2>&1)
    local rc=$?
    [ "$rc" -eq 0 ] || { echo "$out"; bad "$name: --inputs-on rank0: exit $rc"; return; }
    cmp -s "$A/all.npy" "$A/rank0.npy" && echo "$name: the same bytes" ||
        bad "$name: --inputs-on rank0 differs from every rank reading"
    rm -f "$A/all.npy" "$A/rank0.npy"
}
case_ "2-D 2x2, BSHD fp32" "-q q.npy -k k.npy -v v.npy --ulysses 2 --ring 2"
case_ "ring 4, BHSD bf16 GQA" "-q qb.npy -k kb.npy -v vb.npy --layout bhsd --dtype bf16 --ring 4"
case_ "2-D 2x2, ranks placed 0 2 1 3" "-q q.npy -k k.npy -v v.npy --ulysses 2 --ring 2" \
    "-x FXA_MPI_TEST_HOSTS=0,1,0,1"
[ -z "$(ls -A "$B")" ] || bad "files written in the empty folder: $(ls -A "$B")"

# The default mode in the same layout: ranks 1-3 cannot open the files.
opts="-q q.npy -k k.npy -v v.npy --ulysses 2 --ring 2 --threads 1"
# shellcheck disable=SC2086
out=$(run -np 1 --wdir "$A" "$fxattn" attn $opts -o x.npy : -np 3 --wdir "$B" "$fxattn" attn $opts \
    -o x.npy 2>&1)
rc=$?
[ "$rc" -ne 0 ] || bad "every rank reading without the files: exit 0"
n=$(echo "$out" | grep -c "fxattn: error: rank 1: .*q.npy")
[ "$n" -eq 1 ] || { echo "$out"; bad "every rank reading without the files: $n messages naming rank 1"; }
[ ! -e "$A/x.npy" ] || bad "every rank reading without the files: an output was written"

# A missing input with --inputs-on rank0.
# shellcheck disable=SC2086
out=$(run -np 1 --wdir "$A" "$fxattn" attn -q missing.npy -k k.npy -v v.npy --ring 4 -o x.npy \
    --inputs-on rank0 : -np 3 --wdir "$B" "$fxattn" attn -q missing.npy -k k.npy -v v.npy \
    --ring 4 -o x.npy --inputs-on rank0 2>&1)
rc=$?
echo "missing input: exit $rc: $(echo "$out" | grep 'fxattn: error' | head -1)"
[ "$rc" -ne 0 ] || bad "a missing input with --inputs-on rank0: exit 0"
n=$(echo "$out" | grep -c "fxattn: error: rank 0: .*missing.npy")
[ "$n" -eq 1 ] || { echo "$out"; bad "a missing input: $n messages from rank 0, expected 1"; }
[ ! -e "$A/x.npy" ] || bad "a missing input: an output was written"
out=$(cd "$A" && run -np 2 "$fxattn" attn -q q.npy -k k.npy -v v.npy -o x.npy --inputs-on some 2>&1)
rc=$?
[ "$rc" -ne 0 ] && echo "$out" | grep -q "inputs-on must be all or rank0" ||
    { echo "$out"; bad "--inputs-on some: exit $rc"; }
[ ! -e "$A/x.npy" ] || bad "--inputs-on some: an output was written"
exit $fail
