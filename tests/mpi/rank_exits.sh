#!/usr/bin/env bash
# A rank that exits, or is killed, in the middle of a collective call:
# mpirun must end the whole job with an error status well before the
# timeout, so no rank hangs.
# Usage: rank_exits.sh MPIRUN TEST_MPI_MISUSE
set -u
mpirun=$1
binary=$2
log=$(mktemp)
fail=0
for how in die kill; do
    start=$(date +%s)
    timeout -k 10 60 "$mpirun" --oversubscribe --allow-run-as-root --bind-to none -np 4 "$binary" \
        "$how" >"$log" 2>&1
    rc=$?
    elapsed=$(($(date +%s) - start))
    cat "$log"
    echo "$how: mpirun exit status $rc after ${elapsed} s"
    grep -q "rank 1 .* on purpose" "$log" || { echo "FAIL ($how): rank 1 never ran"; fail=1; }
    grep -q "should have been ended" "$log" && { echo "FAIL ($how): a rank went on"; fail=1; }
    [ "$rc" -eq 124 ] && { echo "FAIL ($how): the job hung until the timeout"; fail=1; }
    [ "$rc" -eq 0 ] && { echo "FAIL ($how): the job reported success"; fail=1; }
    [ "$rc" -ge 126 ] && [ "$rc" -le 127 ] && { echo "FAIL ($how): mpirun did not start"; fail=1; }
    [ "$elapsed" -le 30 ] || { echo "FAIL ($how): took ${elapsed} s"; fail=1; }
done
rm -f "$log"
exit $fail
