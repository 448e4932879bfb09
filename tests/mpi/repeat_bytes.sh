#!/usr/bin/env bash
# Distributed results do not depend on timing: repeated `mpirun` runs of the
# same ring and 2-D grids write the same bytes, on a quiet machine and under
# CPU load (busy loops started here, killed by PID). The ring adds its
# blocks in a fixed order (rank c: its own block, then c - 1, c - 2, ...),
# whatever the arrival times, so the prefetch depth must not change the
# bytes either.
#  - `fxattn attn` (300 tokens, 5 heads x 32, with --lse): ring 2 and the
#    2 x 2 grid (whose columns are the same rings of 2: the same bytes), ring
#    3 at prefetch 1 and 2, ring 4 at prefetch 1 and 3.
#  - `fxattn layer` (36 tokens, 8 heads x 32, x read in shards with -x): ring
#    2, the 2 x 2 grid and tensor x ring (--tp 2 --ring 2).
# Each case runs REPEATS times (default 5; the later half under load); every
# output must equal its key's first run byte for byte.
# Usage: repeat_bytes.sh MPIRUN FXATTN [REPEATS]
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"
repeats=${3:-5}
load=()
stop_load() {
    for pid in "${load[@]}"; do
        kill "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    load=()
}
trap 'stop_load; mpi_lib_cleanup' EXIT
# One busy loop per CPU, at normal priority, so that ranks are preempted.
start_load() {
    for _ in $(seq "$(nproc)"); do
        (while :; do :; done) &
        load+=("$!")
    done
}

demo_inputs "$dir" --frames 3 --height 10 --width 10 --heads 5 --dim 32
# x [36, 256] as a .npy file ('<f4', values from a fixed LCG).
"$(dirname "$0")/lcg_npy.py" "$dir/x.npy" 12345 3.0 36 256 ||
    { echo "FAIL: cannot write x.npy"; exit 1; }

# key, name, ranks, fxattn arguments (writing $dir/out.npy, maybe
# $dir/out_lse.npy): every run must write the bytes of the first run of key.
repeat() {
    local key=$1 name=$2 np=$3
    shift 3
    local i f
    for i in $(seq "$repeats"); do
        [ "$i" -gt $((repeats / 2)) ] && [ ${#load[@]} -eq 0 ] && start_load
        rm -f "$dir/out.npy" "$dir/out_lse.npy"
        run -np "$np" "$fxattn" "$@" >/dev/null || { bad "$name, run $i: exit $?"; break; }
        for f in out out_lse; do
            [ -e "$dir/$f.npy" ] || continue
            if [ -e "$dir/$key.$f.npy" ]; then
                cmp -s "$dir/$key.$f.npy" "$dir/$f.npy" ||
                    bad "$name, run $i: $f.npy differs from the first run of $key"
            else
                cp "$dir/$f.npy" "$dir/$key.$f.npy"
            fi
        done
    done
    stop_load
    echo "$name: $repeats runs"
}

a=(attn "${in[@]}" -o "$dir/out.npy" --lse "$dir/out_lse.npy")
repeat ring2 "attn ring 2" 2 "${a[@]}" --ring 2
# The 2 x 2 grid's columns are rings of 2 over the same token blocks.
repeat ring2 "attn 2 x 2" 4 "${a[@]}" --ulysses 2 --ring 2
for k in 1 2; do
    repeat ring3 "attn ring 3, prefetch $k" 3 "${a[@]}" --ring 3 --prefetch "$k"
done
for k in 1 3; do
    repeat ring4 "attn ring 4, prefetch $k" 4 "${a[@]}" --ring 4 --prefetch "$k"
done

l=(layer --grid 2,3,6 --heads 8 --dim 32 --seed 3 -x "$dir/x.npy" -o "$dir/out.npy")
repeat layer_ring2 "layer ring 2" 2 "${l[@]}" --ring 2
repeat layer_2x2 "layer 2 x 2" 4 "${l[@]}" --ulysses 2 --ring 2
repeat layer_tp2_ring2 "layer tp 2 x ring 2" 4 "${l[@]}" --tp 2 --ring 2
exit $fail
