#!/usr/bin/env bash
# Ranks of one job given different options (mpirun's MPMD form, A : B)
# are refused before any work: every distributed subcommand (attn, bench,
# layer, plan --measure) compares every option across the ranks first, and
# the job exits 2 with one message from rank 0 that names the option, rank
# 0's value and a differing rank's; no output is written. --threads may
# differ (per rank). Each case runs under `timeout -k`, so a hang or a crash
# in a mismatched collective fails it.
# Usage: options_agree.sh MPIRUN FXATTN
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"

demo_inputs "$dir" --frames 1 --height 4 --width 8 --heads 2 --dim 16
attn=(attn "${in[@]}" -o "$dir/out.npy" --threads 1)
layer=(layer --grid 1,2,4 --heads 2 --dim 16 --threads 1 -o "$dir/out.npy")

# disagree NAME EXPECT ARGS_OF_RANK_0 -- ARGS_OF_RANK_1 [-- ARGS_OF_RANK_2]:
# refused (exit 2, exactly one error line, matching EXPECT), no output.
disagree() {
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
    refused "$name" $? "$expect" "$dir/out.npy"
}

disagree "attn --repeats" "ranks disagree on --repeats: 3 on rank 0, 1 on rank 1" \
    "${attn[@]}" --repeats 3 -- "${attn[@]}"
disagree "attn --inputs-on" "ranks disagree on --inputs-on: not given on rank 0, 'rank0' on rank 1" \
    "${attn[@]}" -- "${attn[@]}" --inputs-on rank0
disagree "attn --ulysses" "ranks disagree on --ulysses: 2 on rank 0, 0 on rank 1" \
    "${attn[@]}" --ulysses 2 -- "${attn[@]}" --ring 2
disagree "bench --repeats" "ranks disagree on --repeats: 2 on rank 0, 3 on rank 1" \
    bench --seq 64 --heads 2 --dim 16 --threads 1 --repeats 2 -- \
    bench --seq 64 --heads 2 --dim 16 --threads 1 --repeats 3
disagree "layer --dtype" "ranks disagree on --dtype: 'f32' on rank 0, 'bf16' on rank 1" \
    "${layer[@]}" -- "${layer[@]}" --dtype bf16
disagree "layer --tp vs --ulysses" "ranks disagree on --ulysses: 0 on rank 0, 2 on rank 1" \
    "${layer[@]}" --tp 2 -- "${layer[@]}" --ulysses 2
disagree "layer --seed" "ranks disagree on --seed: 1 on rank 0, 7 on rank 1" \
    "${layer[@]}" -- "${layer[@]}" --seed 7
disagree "layer --grid" "ranks disagree on --grid: '1,2,4' on rank 0, '1,4,2' on rank 1" \
    "${layer[@]}" -- layer --grid 1,4,2 --heads 2 --dim 16 --threads 1 -o "$dir/out.npy"
disagree "layer --rope-layout" "ranks disagree on --rope-layout: 'interleaved' on rank 0, 'half'" \
    "${layer[@]}" -- "${layer[@]}" --rope-layout half
disagree "layer --cp-grid auto on one rank" \
    "ranks disagree on --cp-grid: 'auto' on rank 0, not given on rank 1" \
    "${layer[@]}" --cp-grid auto --timeout 5 -- "${layer[@]}" --timeout 5
disagree "layer -o on one rank" "ranks disagree on -o:" \
    "${layer[@]}" -- layer --grid 1,2,4 --heads 2 --dim 16 --threads 1
disagree "3 ranks, 2 differ" "ranks disagree on --seed: 1 on rank 0, 5 on rank 1 (2 ranks differ" \
    "${layer[@]}" -- "${layer[@]}" --seed 5 -- "${layer[@]}" --seed 6
disagree "plan --measure --seq" "ranks disagree on --seq: 64 on rank 0, 128 on rank 1" \
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
