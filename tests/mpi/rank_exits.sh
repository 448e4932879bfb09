#!/usr/bin/env bash
# A rank that exits in the middle of a collective call: mpirun must end the
# whole job with an error status well before the timeout, so no rank hangs.
# Usage: rank_exits.sh MPIRUN TEST_MPI_MISUSE
set -u
mpirun=$1
binary=$2
log=$(mktemp)
start=$(date +%s)
timeout 60 "$mpirun" --oversubscribe --allow-run-as-root --bind-to none -np 4 "$binary" die \
    >"$log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
cat "$log"
echo "mpirun exit status $rc after ${elapsed} s"
fail=0
grep -q "rank 1 exits on purpose" "$log" || { echo "FAIL: rank 1 never ran"; fail=1; }
grep -q "should have been ended" "$log" && { echo "FAIL: a rank went on"; fail=1; }
[ "$rc" -eq 124 ] && { echo "FAIL: the job hung until the timeout"; fail=1; }
[ "$rc" -eq 0 ] && { echo "FAIL: the job reported success"; fail=1; }
[ "$rc" -ge 126 ] && [ "$rc" -le 127 ] && { echo "FAIL: mpirun did not start"; fail=1; }
[ "$elapsed" -le 30 ] || { echo "FAIL: took ${elapsed} s"; fail=1; }
rm -f "$log"
exit $fail
