#!/usr/bin/env bash
# A rank stopped (SIGSTOP) at start-up, as soon as mpirun has started it,
# must not hang the job: with --timeout T the ranks still running report
# "fxattn: error: rank N: no progress from the other ranks for T s" (a
# watchdog bounds MPI_Init and every blocking call after it) and end;
# mpirun then ends every rank, the stopped one too. The job must end
# within T + 10 s, with a failing status. `layer` on 2 ranks, `attn` and
# `bench` on 3 (the last rank stopped).
# Usage: startup_stop.sh MPIRUN FXATTN
set -u
mpirun=$1
fxattn=$2
dir=$(mktemp -d)
pids=()
cleanup() {
    local p
    for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
    rm -rf "$dir"
}
trap cleanup EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
T=3

"$fxattn" demo --frames 1 --height 4 --width 8 --heads 2 --dim 16 --save-inputs "$dir" \
    >/dev/null || { echo "FAIL: demo inputs"; exit 1; }

# stopped NAME RANKS ARGS...: stop the last rank the moment all are running fxattn.
stopped() {
    local name=$1 np=$2
    shift 2
    timeout -k 10 60 "$mpirun" --oversubscribe --allow-run-as-root --bind-to none -np "$np" \
        "$fxattn" "$@" --timeout "$T" >"$dir/log" 2>&1 &
    local tpid=$! mpid="" ranks="" victim="" i
    pids+=("$tpid")
    for i in $(seq 500); do # up to 5 s
        [ -n "$mpid" ] || mpid=$(pgrep -P "$tpid" | head -1)
        # ranks that have exec'd fxattn: a child stopped between mpirun's
        # fork and its exec would stop the launcher itself, not a rank.
        [ -n "$mpid" ] && ranks=$(pgrep -P "$mpid" -x fxattn)
        [ "$(echo "$ranks" | grep -c .)" -ge "$np" ] && break
        sleep 0.01
    done
    victim=$(echo "$ranks" | sort -n | tail -1)
    if [ "$(echo "$ranks" | grep -c .)" -ne "$np" ]; then
        bad "$name: could not find the $np ranks (mpirun $mpid: $ranks)"
        wait "$tpid"
        return
    fi
    pids+=("$mpid" $ranks)
    kill -STOP "$victim"
    local t0=$SECONDS
    wait "$tpid"
    local rc=$? took=$((SECONDS - t0))
    sleep 1
    local state
    state=$(ps -o stat= -p "$victim" 2>/dev/null)
    echo "$name: rank PID $victim stopped; mpirun exit $rc after $took s; its state after: '${state}'"
    grep "fxattn: error" "$dir/log" | head -3
    [ "$rc" -ne 0 ] || bad "$name: the job reported success (the stop came after the run?)"
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || bad "$name: the job hung until the outer timeout"
    [ "$took" -le $((T + 10)) ] || bad "$name: the job took $took s after the stop (limit $((T + 10)) s)"
    grep -q "fxattn: error: rank [0-9]*: no progress from the other ranks for $T s" "$dir/log" ||
        { tail -20 "$dir/log"; bad "$name: no rank reported the missing progress"; }
    case "$state" in "" | Z*) ;; *) bad "$name: the stopped rank is still there ($state)" ;; esac
}

stopped "layer, 2 ranks" 2 layer --grid 1,2,4 --heads 2 --dim 16 --threads 1
stopped "attn, 3 ranks" 3 attn -q "$dir/q.npy" -k "$dir/k.npy" -v "$dir/v.npy" \
    -o "$dir/out.npy" --threads 1
stopped "bench, 3 ranks" 3 bench --seq 48 --heads 2 --dim 16 --threads 1 --repeats 1
[ ! -e "$dir/out.npy" ] || bad "attn wrote an output"

[ "$fail" -eq 0 ] && echo "startup_stop: all passed"
exit "$fail"
