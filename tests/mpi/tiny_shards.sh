#!/usr/bin/env bash
# Any split works: `mpirun fxattn attn` on sequences shorter than the ranks
# (ranks that hold no query token, no key token, or neither), for the ring,
# Ulysses and 2-D grids on 2, 3 and 4 ranks, against one process on the
# same files: output and LSE the same bytes for pure Ulysses, within 1e-5
# of max|out| for the others, and --verify passes. bench, which times
# each rank's query tokens, refuses such a split with a clear message.
# Usage: tiny_shards.sh MPIRUN FXATTN NPY_CLOSE
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"
npy_close=$3

# [1, S, 2 heads, 8] fp32 tensors from a fixed LCG, a seed per file.
seed=99
for s in 1 2 3 53; do
    for t in q k v; do
        "$(dirname "$0")/lcg_npy.py" "$dir/$t$s.npy" $((seed++)) 4.0 1 "$s" 2 8 ||
            { echo "FAIL: cannot write the inputs"; exit 1; }
    done
done

for sizes in "1 1" "1 53" "3 53" "3 1" "2 2"; do
    read -r sq skv <<<"$sizes"
    files="-q $dir/q$sq.npy -k $dir/k$skv.npy -v $dir/v$skv.npy"
    # shellcheck disable=SC2086
    "$fxattn" attn $files -o "$dir/ref.npy" --lse "$dir/ref_lse.npy" --threads 1 ||
        { bad "Sq=$sq Skv=$skv: one process"; continue; }
    for grid in "2 1 2" "2 2 1" "3 1 3" "4 1 4" "4 2 2" "4 4 1"; do
        read -r np u r <<<"$grid"
        name="Sq=$sq Skv=$skv, $np ranks, Ulysses $u x ring $r"
        # shellcheck disable=SC2086
        out=$(run -np "$np" "$fxattn" attn $files -o "$dir/mpi.npy" --lse "$dir/mpi_lse.npy" \
            --ulysses "$u" --ring "$r" --threads 1 --verify 2>&1) ||
            { echo "$out" | tail -5; bad "$name: exit $?"; continue; }
        if [ "$r" = 1 ]; then
            cmp -s "$dir/ref.npy" "$dir/mpi.npy" || bad "$name: output differs from one process"
            cmp -s "$dir/ref_lse.npy" "$dir/mpi_lse.npy" || bad "$name: LSE differs from one process"
        else
            "$npy_close" "$dir/ref.npy" "$dir/mpi.npy" 1e-5 >/dev/null ||
                bad "$name: output not within 1e-5 of one process"
            "$npy_close" "$dir/ref_lse.npy" "$dir/mpi_lse.npy" 1e-5 >/dev/null ||
                bad "$name: LSE not within 1e-5 of one process"
        fi
        echo "$name: $(echo "$out" | tail -1)"
        rm -f "$dir/mpi.npy" "$dir/mpi_lse.npy"
    done
done

# bench times each rank's own query tokens: a sequence shorter than the
# ranks is refused up front, exit 2 and one message that says why.
timeout -k 10 60 "${mpi[@]}" -np 4 "$fxattn" bench --seq 3 --heads 2 --dim 8 --threads 1 \
    --timeout 20 >"$dir/log" 2>&1
refused "bench --seq 3 on 4 ranks" $? "bench: --seq 3 is shorter than the 4 ranks"
exit $fail
