#!/usr/bin/env bash
# A rank that stops making progress (SIGSTOP mid-run) must not hang the
# job: with --timeout T every surviving rank reports "rank N: no progress
# from ... for T s" and the whole job ends within T + 10 s of the freeze,
# with a failing status and no output written. Ring 2, Ulysses 2 and the
# 2 x 2 grid of `fxattn attn`, and `attn --grid auto` frozen while it
# measures for the planner; a bad --timeout or FXA_MPI_TIMEOUT is refused
# on every rank.
# Usage: no_hang.sh MPIRUN FXATTN
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"
T=5

# 8192 tokens, 8 heads x 64: a run takes seconds per rank on one thread.
demo_inputs "$dir" --frames 1 --height 64 --width 128 --heads 8 --dim 64

# frozen NAME RANKS ULYSSES RING: freeze the last rank 3 s into the run.
frozen() {
    local name=$1 np=$2 u=$3 r=$4
    rm -f "$dir/out.npy"
    timeout -k 10 120 "${mpi[@]}" -np "$np" "$fxattn" attn "${in[@]}" -o "$dir/out.npy" \
        --ulysses "$u" --ring "$r" --threads 1 --repeats 50 --timeout "$T" >"$dir/log" 2>&1 &
    local tpid=$! mpid="" ranks="" victim=""
    pids+=("$tpid")
    sleep 3
    mpid=$(pgrep -P "$tpid" | head -1)
    [ -n "$mpid" ] && ranks=$(pgrep -P "$mpid")
    victim=$(echo "$ranks" | tail -1)
    if [ -z "$victim" ] || [ "$(echo "$ranks" | wc -l)" -ne "$np" ]; then
        bad "$name: could not find the $np ranks (mpirun $mpid: $ranks)"
        wait "$tpid"
        return
    fi
    pids+=("$mpid" $ranks)
    kill -STOP "$victim"
    local t0=$SECONDS
    wait "$tpid"
    local rc=$? took=$((SECONDS - t0))
    local reports
    reports=$(grep -c "fxattn: error: rank [0-9]*: no progress from .* for $T s" "$dir/log")
    echo "$name: rank PID $victim stopped; mpirun exit $rc after $took s, $reports of $((np - 1)) survivors reported"
    grep "no progress" "$dir/log" | head -3
    [ "$rc" -ne 0 ] || bad "$name: the job reported success"
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || bad "$name: the job hung until the outer timeout"
    [ "$took" -le $((T + 10)) ] || bad "$name: the job took $took s after the freeze (limit $((T + 10)) s)"
    [ "$reports" -ge 1 ] || { tail -20 "$dir/log"; bad "$name: no rank reported the missing progress"; }
    [ ! -e "$dir/out.npy" ] || bad "$name: an output was written"
    local p n
    for p in $ranks; do # mpirun may exit a moment before its ranks are gone
        for ((n = 0; n < 50; n++)); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$p" 2>/dev/null && bad "$name: rank PID $p still alive 5 s after mpirun"
    done
}
frozen "ring 2" 2 1 2
frozen "Ulysses 2" 2 2 1
frozen "2 x 2" 4 2 2

# A deadline that is not a positive number of seconds: refused on every rank.
for bad_t in "--timeout -1" "--timeout nan"; do
    # shellcheck disable=SC2086
    err=$(timeout -k 10 60 "${mpi[@]}" -np 2 "$fxattn" attn "${in[@]}" -o "$dir/out.npy" \
        --ring 2 $bad_t 2>&1 >/dev/null)
    rc=$?
    [ "$rc" -eq 2 ] || bad "$bad_t: exit $rc, expected 2"
    echo "$err" | grep -q "fxattn: error:.*--timeout" || bad "$bad_t: no message"
done
# Past the longest deadline: the message says so (not "not positive").
err=$(timeout -k 10 60 "${mpi[@]}" -np 2 "$fxattn" attn "${in[@]}" -o "$dir/out.npy" --ring 2 \
    --timeout 1e10 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 2 ] || bad "--timeout 1e10: exit $rc, expected 2"
echo "$err" | grep -q "fxattn: error: --timeout 1e+10 is longer than the longest deadline, 1e9 s" ||
    bad "--timeout 1e10: the message does not name the limit: $err"
err=$(FXA_MPI_TIMEOUT=soon timeout -k 10 60 "${mpi[@]}" -x FXA_MPI_TIMEOUT -np 2 "$fxattn" attn \
    "${in[@]}" -o "$dir/out.npy" --ring 2 2>&1 >/dev/null)
rc=$?
[ "$rc" -eq 2 ] || bad "FXA_MPI_TIMEOUT=soon: exit $rc, expected 2"
echo "$err" | grep -q "FXA_MPI_TIMEOUT=soon is not" || bad "FXA_MPI_TIMEOUT=soon: no message"
[ ! -e "$dir/out.npy" ] || bad "a refused run wrote its output"

# A rank frozen while `attn --grid auto` measures for the planner (its
# compute rates take ~1.5 s of CPU per rank here): the job must end within
# T + 10 s too. The victim stops once it has used 0.5 s of CPU, after MPI's
# start and the input files, in the middle of the measurements; rank 0
# prints "grid auto: ..." only after them, so its absence shows where the
# freeze landed.
mkdir "$dir/p"
demo_inputs "$dir/p" --frames 1 --height 64 --width 128 --heads 8 --dim 128
rm -f "$dir/out.npy"
timeout -k 10 120 "${mpi[@]}" -np 2 "$fxattn" attn "${in[@]}" -o "$dir/out.npy" --grid auto \
    --threads 1 --timeout "$T" >"$dir/log" 2>&1 &
tpid=$!
pids+=("$tpid")
victim="" ranks=""
for ((n = 0; n < 400; n++)); do # up to 20 s
    mpid=$(pgrep -P "$tpid" | head -1)
    [ -n "$mpid" ] && ranks=$(pgrep -P "$mpid")
    victim=$(echo "$ranks" | tail -1)
    # utime + stime in clock ticks (fields 14 and 15 of /proc/PID/stat)
    if [ -n "$victim" ] && [ "$(echo "$ranks" | wc -l)" -eq 2 ]; then
        ticks=$(awk '{print $14 + $15}' "/proc/$victim/stat" 2>/dev/null || echo 0)
        [ "$ticks" -ge $(($(getconf CLK_TCK) / 2)) ] && break
    fi
    victim=""
    sleep 0.05
done
if [ -z "$victim" ]; then
    bad "planner: no rank used 0.5 s of CPU within 20 s"
    wait "$tpid"
else
    pids+=("$mpid" $ranks)
    kill -STOP "$victim"
    t0=$SECONDS
    wait "$tpid"
    rc=$? took=$((SECONDS - t0))
    echo "planner: rank PID $victim stopped; mpirun exit $rc after $took s"
    grep "no progress" "$dir/log" | head -3
    ! grep -q "^grid auto:" "$dir/log" || bad "planner: the freeze landed after the planning"
    [ "$rc" -ne 0 ] || bad "planner: the job reported success"
    [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || bad "planner: the job hung until the outer timeout"
    [ "$took" -le $((T + 10)) ] || bad "planner: the job took $took s after the freeze"
    grep -q "fxattn: error: rank [0-9]*: no progress from .* for $T s" "$dir/log" ||
        { tail -20 "$dir/log"; bad "planner: no rank reported the missing progress"; }
    [ ! -e "$dir/out.npy" ] || bad "planner: an output was written"
fi
exit $fail
