#!/usr/bin/env bash
# Ranks of one job given different options (mpirun's MPMD form, A : B)
# are refused before any work: every distributed subcommand (attn, bench,
# layer, plan --measure) compares every option across the ranks first, and
# the job exits 2 with one message from rank 0 that names the option, rank
# 0's value and a differing rank's; no output is written. --threads may
# differ (per rank). Each case runs under `timeout -k`, so a hang or a crash
# in a mismatched collective fails it.
# Usage: options_agree.sh MPIRUN FXATTN
set -u
mpirun=$1
fxattn=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }
mpi=("$mpirun" --oversubscribe --allow-run-as-root --bind-to none)

"$fxattn" demo --frames 1 --height 4 --width 8 --heads 2 --dim 16 --save-inputs "$dir" \
    >/dev/null || { echo "FAIL: demo inputs"; exit 1; }
attn=(attn -q "$dir/q.npy" -k "$dir/k.npy" -v "$dir/v.npy" -o "$dir/out.npy" --threads 1)
layer=(layer --grid 1,2,4 --heads 2 --dim 16 --threads 1 -o "$dir/out.npy")

# refused NAME EXPECT ARGS_OF_RANK_0 -- ARGS_OF_RANK_1 [-- ARGS_OF_RANK_2]:
# exit 2, exactly one error line, matching EXPECT, and no output.
refused() {
    local name=$1 expect=$2
    shift 2
    local cmd=("${mpi[@]}") first=1 a
    local rank=()
    for a in "$@" --; do
        if [ "$a" = -- ]; then
            [ $first -eq 1 ] || cmd+=(:)
            cmd+=(-np 1 "$fxattn" "${rank[@]}")
            rank=()
            first=0
        else
            rank+=("$a")
        fi
    done
    rm -f "$dir/out.npy"
    timeout -k 10 60 "${cmd[@]}" >"$dir/log" 2>&1
    local rc=$?
    local errors
    errors=$(grep "fxattn: error:" "$dir/log")
    echo "$name: exit $rc: $errors"
    [ "$rc" -eq 2 ] || { tail -5 "$dir/log"; bad "$name: exit $rc, not 2"; }
    [ "$(echo "$errors" | grep -c .)" -eq 1 ] || bad "$name: not exactly one error line"
    echo "$errors" | grep -q -- "$expect" || bad "$name: the message does not say '$expect'"
    [ ! -e "$dir/out.npy" ] || bad "$name: an output was written"
}

refused "attn --repeats" "ranks disagree on --repeats: 3 on rank 0, 1 on rank 1" \
    "${attn[@]}" --repeats 3 -- "${attn[@]}"
refused "attn --inputs-on" "ranks disagree on --inputs-on: not given on rank 0, 'rank0' on rank 1" \
    "${attn[@]}" -- "${attn[@]}" --inputs-on rank0
refused "attn --ulysses" "ranks disagree on --ulysses: 2 on rank 0, 0 on rank 1" \
    "${attn[@]}" --ulysses 2 -- "${attn[@]}" --ring 2
refused "bench --repeats" "ranks disagree on --repeats: 2 on rank 0, 3 on rank 1" \
    bench --seq 64 --heads 2 --dim 16 --threads 1 --repeats 2 -- \
    bench --seq 64 --heads 2 --dim 16 --threads 1 --repeats 3
refused "layer --dtype" "ranks disagree on --dtype: 'f32' on rank 0, 'bf16' on rank 1" \
    "${layer[@]}" -- "${layer[@]}" --dtype bf16
refused "layer --tp vs --ulysses" "ranks disagree on --ulysses: 0 on rank 0, 2 on rank 1" \
    "${layer[@]}" --tp 2 -- "${layer[@]}" --ulysses 2
refused "layer --seed" "ranks disagree on --seed: 1 on rank 0, 7 on rank 1" \
    "${layer[@]}" -- "${layer[@]}" --seed 7
refused "layer --grid" "ranks disagree on --grid: '1,2,4' on rank 0, '1,4,2' on rank 1" \
    "${layer[@]}" -- layer --grid 1,4,2 --heads 2 --dim 16 --threads 1 -o "$dir/out.npy"
refused "layer --rope-layout" "ranks disagree on --rope-layout: 'interleaved' on rank 0, 'half'" \
    "${layer[@]}" -- "${layer[@]}" --rope-layout half
refused "layer --cp-grid auto on one rank" \
    "ranks disagree on --cp-grid: 'auto' on rank 0, not given on rank 1" \
    "${layer[@]}" --cp-grid auto --timeout 5 -- "${layer[@]}" --timeout 5
refused "layer -o on one rank" "ranks disagree on -o:" \
    "${layer[@]}" -- layer --grid 1,2,4 --heads 2 --dim 16 --threads 1
refused "3 ranks, 2 differ" "ranks disagree on --seed: 1 on rank 0, 5 on rank 1 (2 ranks differ" \
    "${layer[@]}" -- "${layer[@]}" --seed 5 -- "${layer[@]}" --seed 6
refused "plan --measure --seq" "ranks disagree on --seq: 64 on rank 0, 128 on rank 1" \
    plan --measure --seq 64 --heads 2 --dim 16 --threads 1 -- \
    plan --measure --seq 128 --heads 2 --dim 16 --threads 1

# --threads is per rank: the job runs, and writes y.
rm -f "$dir/out.npy"
timeout -k 10 60 "${mpi[@]}" -np 1 "$fxattn" "${layer[@]}" : -np 1 "$fxattn" "${layer[@]}" \
    --threads 2 >"$dir/log" 2>&1
rc=$?
echo "layer --threads per rank: exit $rc"
[ "$rc" -eq 0 ] && [ -s "$dir/out.npy" ] || { tail -5 "$dir/log"; bad "--threads per rank: exit $rc"; }

[ "$fail" -eq 0 ] && echo "options_agree: all passed"
exit "$fail"
