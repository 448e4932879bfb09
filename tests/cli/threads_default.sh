#!/usr/bin/env bash
# The default thread count is the number of CPUs the process may run on:
#  - `fxattn info` reports the affinity mask's CPU count, `taskset -c C`
#    gives 1 thread, and `--threads N` still wins;
#  - a cgroup CPU quota (a child cgroup this test makes, v2 cpu.max or v1
#    cpu.cfs_quota_us, removed afterwards) caps it: 1 CPU of quota gives 1
#    thread, 0.5 gives 1;
#  - under mpirun each rank gets its share: unbound ranks split the mask,
#    ranks pinned to one CPU get 1; `--threads N` still wins.
# Without root or a writable cgroup the quota part cannot run: the test
# then exits 77 (skipped, never passed) after the other parts pass.
# Usage: threads_default.sh FXATTN [MPIRUN]
set -u
fxattn=$1
mpirun=${2:-}
fail=0
bad() { echo "FAIL: $*"; fail=1; }

threads_of() { "$@" | sed -n 's/^threads: //p'; }
cpus=$(python3 -c 'import os; print(len(os.sched_getaffinity(0)))')
first=$(python3 -c 'import os; print(min(os.sched_getaffinity(0)))')

got=$(threads_of "$fxattn" info)
echo "mask $cpus CPUs: info reports $got threads"
[ "$got" = "$cpus" ] || bad "default $got threads, affinity mask holds $cpus CPUs"
got=$(threads_of taskset -c "$first" "$fxattn" info)
echo "taskset -c $first: $got threads"
[ "$got" = 1 ] || bad "taskset -c $first: $got threads, expected 1"
got=$(threads_of taskset -c "$first" "$fxattn" info --threads 3)
[ "$got" = 3 ] || bad "taskset with --threads 3: $got threads"

if [ -n "$mpirun" ]; then
    # per_rank "MPIRUN OPTIONS" [FXATTN OPTIONS]: rank 0's threads per rank
    per_rank() {
        # shellcheck disable=SC2086 # word splitting of the option lists is wanted
        timeout -k 5 60 "${pin[@]}" "$mpirun" --oversubscribe --allow-run-as-root $1 "$fxattn" bench \
            --seq 64 --heads 2 --dim 32 --repeats 1 ${2:-} 2>&1 |
            sed -n 's/.* \([0-9]*\) threads per rank.*/\1/p' | head -1
    }
    pin=(env)
    want=$((cpus / 2 > 0 ? cpus / 2 : 1))
    got=$(per_rank "--bind-to none -np 2")
    echo "mpirun -np 2, unbound: $got threads per rank"
    [ "$got" = "$want" ] || bad "mpirun -np 2 unbound: $got threads per rank, expected $want"
    got=$(per_rank "--bind-to core -np 1")
    echo "mpirun -np 1, bound to a core: $got threads per rank"
    [ "$got" = 1 ] || bad "mpirun -np 1 bound to a core: $got threads, expected 1"
    got=$(per_rank "--bind-to core -np 1" "--threads 3")
    [ "$got" = 3 ] || bad "mpirun -np 1 bound, --threads 3: $got threads per rank"
    pin=(taskset -c "$first")
    got=$(per_rank "--bind-to none -np 1")
    echo "taskset -c $first mpirun -np 1: $got threads per rank"
    [ "$got" = 1 ] || bad "taskset mpirun -np 1: $got threads per rank, expected 1"
fi

# A cgroup with a CPU quota: v2 where the cpu controller is enabled, else v1.
cg=""
kind=""
v2=$(awk '$9 == "cgroup2" { print $5; exit }' /proc/self/mountinfo)
v1=$(awk '$9 == "cgroup" && $NF ~ /(^|,)cpu(,|$)/ { print $5; exit }' /proc/self/mountinfo)
if [ -n "$v2" ] && [ -f "$v2/cgroup.subtree_control" ] && grep -qw cpu "$v2/cgroup.controllers" 2>/dev/null; then
    cg="$v2/fxa_threads_test_$$"
    kind=v2
elif [ -n "$v1" ] && [ -w "$v1" ]; then
    cg="$v1/fxa_threads_test_$$"
    kind=v1
fi
if [ -z "$cg" ] || ! mkdir "$cg" 2>/dev/null; then
    echo "no writable cgroup with the cpu controller here: quota part skipped"
    [ "$fail" = 0 ] && exit 77
    exit 1
fi
trap 'rmdir "$cg" 2>/dev/null' EXIT
set_quota() { # CPUs as quota/period in microseconds
    if [ "$kind" = v2 ]; then
        echo "$1 100000" >"$cg/cpu.max"
    else
        echo 100000 >"$cg/cpu.cfs_period_us" && echo "$1" >"$cg/cpu.cfs_quota_us"
    fi
}
in_cgroup() { sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" "$@"; }
for q in 100000:1 50000:1; do
    quota=${q%%:*}
    want=${q##*:}
    set_quota "$quota" || { bad "cannot set the $kind quota"; continue; }
    got=$(in_cgroup "$fxattn" info | sed -n 's/^threads: //p')
    echo "$kind quota $quota/100000 us: $got threads"
    [ "$got" = "$want" ] || bad "$kind quota $quota/100000: $got threads, expected $want"
    got=$(in_cgroup "$fxattn" info --threads 2 | sed -n 's/^threads: //p')
    [ "$got" = 2 ] || bad "$kind quota with --threads 2: $got threads"
done
if [ "$cpus" -ge 3 ]; then
    set_quota 200000
    got=$(in_cgroup "$fxattn" info | sed -n 's/^threads: //p')
    echo "$kind quota 2 CPUs: $got threads"
    [ "$got" = 2 ] || bad "$kind quota of 2 CPUs: $got threads, expected 2"
fi
exit $fail
