# shellcheck shell=bash
# The common start of the tests/mpi scripts (bash), which are called as
# SCRIPT MPIRUN FXATTN [...] and source this file first:
#   . "$(dirname "$0")/mpi_lib.sh"
# It sets `set -u` and
#   mpirun, fxattn    the first two arguments
#   mpi               mpirun with the options every job here takes
#   run ARGS...       "${mpi[@]}" ARGS, ended (timeout -k) after 120 s
#   dir               a temporary folder, removed on exit
#   pids              processes to continue and kill on exit (a test's
#                     frozen ranks), by PID
#   fail, bad MSG     the verdict: bad prints "FAIL: MSG" and sets fail=1
#   demo_inputs DIR DEMO-OPTIONS...
#                     `fxattn demo`'s q, k, v .npy files in DIR, and
#                     in=(-q DIR/q.npy -k DIR/k.npy -v DIR/v.npy); a demo
#                     that fails ends the test
#   refused NAME RC EXPECT [OUTPUT]
#                     the job that exited RC, its output in $dir/log, was
#                     refused: exit 2, exactly one `fxattn: error:` line,
#                     saying EXPECT, and OUTPUT (when given) not written
#   folders_job NAME EXPECT OUTPUT DIR_0 DIR_1 FXATTN-ARGS...
#                     two ranks, rank r in folder DIR_r (mpirun -wdir), each
#                     running fxattn FXATTN-ARGS, ended after 60 s, output
#                     in $dir/log: refused saying EXPECT, OUTPUT not
#                     written; or, EXPECT empty, exit 0 and OUTPUT written
# shellcheck disable=SC2034 # variables for the scripts that source this file
set -u
mpirun=$1
fxattn=$2
mpi=("$mpirun" --oversubscribe --allow-run-as-root --bind-to none)
dir=$(mktemp -d)
pids=()
mpi_lib_cleanup() {
    local p
    for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    rm -rf "$dir"
}
trap mpi_lib_cleanup EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
run() { timeout -k 10 120 "${mpi[@]}" "$@"; }
refused() {
    local name=$1 rc=$2 expect=$3 output=${4:-} errors
    errors=$(grep "fxattn: error:" "$dir/log")
    echo "$name: exit $rc: $errors"
    [ "$rc" -eq 2 ] || { tail -5 "$dir/log"; bad "$name: exit $rc, not 2"; }
    [ "$(echo "$errors" | grep -c .)" -eq 1 ] || bad "$name: not exactly one error line"
    echo "$errors" | grep -q -- "$expect" || bad "$name: the message does not say '$expect'"
    [ -z "$output" ] || [ ! -e "$output" ] || bad "$name: an output was written"
}
folders_job() {
    local name=$1 expect=$2 output=$3 dir0=$4 dir1=$5 rc
    shift 5
    timeout -k 10 60 "${mpi[@]}" -np 1 -wdir "$dir0" "$fxattn" "$@" : \
        -np 1 -wdir "$dir1" "$fxattn" "$@" >"$dir/log" 2>&1
    rc=$?
    if [ -n "$expect" ]; then
        refused "$name" "$rc" "$expect" "$output"
        return
    fi
    echo "$name: exit $rc"
    [ "$rc" -eq 0 ] || { tail -5 "$dir/log"; bad "$name: exit $rc, expected 0"; }
    [ -s "$output" ] || bad "$name: no output"
}
demo_inputs() {
    local to=$1
    shift
    "$fxattn" demo "$@" --save-inputs "$to" >/dev/null ||
        { echo "FAIL: demo inputs in $to"; exit 1; }
    in=(-q "$to/q.npy" -k "$to/k.npy" -v "$to/v.npy")
}
