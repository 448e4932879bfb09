#!/usr/bin/env bash
# Reproducible attention (`fxattn attn --reproducible`) writes the same
# output and LSE bytes on every grid as on one process at 1, 2 and 3
# threads: rings of 2, 3 and 4 ranks, Ulysses 2, 3 and 4, the 2 x 2 grid.
# Inputs: 1100 tokens (four whole canonical groups of 256 and a short one),
# 4 query heads over 2 kv heads (GQA) x 32, from a fixed LCG:
#  - fp32 on every grid;
#  - bf16 inputs with bf16 compute, online mode, and queries large enough
#    that rows fall back to online softmax, on a few grids;
#  - 300 tokens over 4 ranks: two groups, so two ranks hold no tokens.
# The default (without --reproducible) ring of 2 writes other bytes than one
# process on the same inputs: these inputs do see the order in which a ring
# adds its blocks.
# Usage: reproducible.sh MPIRUN FXATTN
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"
lcg="$(dirname "$0")/lcg_npy.py"

# inputs NAME S QSPREAD: q, k, v [1, S, H, 32] in $dir/NAME_{q,k,v}.npy.
inputs() {
    "$lcg" "$dir/$1_q.npy" 11 "$3" 1 "$2" 4 32 &&
        "$lcg" "$dir/$1_k.npy" 12 4.0 1 "$2" 2 32 &&
        "$lcg" "$dir/$1_v.npy" 13 2.0 1 "$2" 2 32 ||
        { echo "FAIL: cannot write the $1 inputs"; exit 1; }
}
inputs base 1100 4.0
inputs hot 1100 60.0
inputs tiny 300 4.0

# same NAME REF OUT: OUT's output and LSE files equal REF's, byte for byte.
same() {
    cmp -s "$dir/$2.npy" "$dir/$3.npy" && cmp -s "$dir/$2_lse.npy" "$dir/$3_lse.npy" ||
        bad "$1: $3 differs from $2"
}

# check NAME INPUTS "OPTIONS" GRIDS...: one process at 1, 2 and 3 threads,
# then each grid "ranks ring ulysses", all with OPTIONS and --reproducible.
check() {
    local name=$1 in=$2 opts=$3 t g
    shift 3
    local grids=$#
    local args=(attn -q "$dir/${in}_q.npy" -k "$dir/${in}_k.npy" -v "$dir/${in}_v.npy" --reproducible)
    # shellcheck disable=SC2086 # opts holds several options
    for t in 1 2 3; do
        timeout -k 10 120 "$fxattn" "${args[@]}" $opts --threads "$t" -o "$dir/${name}_t$t.npy" \
            --lse "$dir/${name}_t${t}_lse.npy" >/dev/null || bad "$name, $t threads: exit $?"
        [ "$t" -eq 1 ] || same "$name" "${name}_t1" "${name}_t$t"
    done
    for g in "$@"; do
        # shellcheck disable=SC2086 # g is "ranks ring ulysses", opts several options
        set -- $g
        local out="${name}_np$1_r$2_u$3"
        run -np "$1" "$fxattn" "${args[@]}" $opts --threads 1 --ring "$2" --ulysses "$3" \
            -o "$dir/$out.npy" --lse "$dir/${out}_lse.npy" >/dev/null ||
            { bad "$name, $g: exit $?"; continue; }
        same "$name" "${name}_t1" "$out"
    done
    echo "$name: one process at 1-3 threads and $grids grids"
}

check fp32 base "" "2 2 1" "2 1 2" "3 3 1" "3 1 3" "4 4 1" "4 1 4" "4 2 2"
check bf16 base "--dtype bf16 --compute bf16" "2 2 1" "4 2 2"
check online base "--mode online" "3 3 1"
check fallback hot "" "4 4 1"
grep -q '"fallback_rows": 0,' <(timeout -k 10 60 "$fxattn" attn -q "$dir/hot_q.npy" \
    -k "$dir/hot_k.npy" -v "$dir/hot_v.npy" -o "$dir/x.npy" --reproducible --stats) &&
    bad "fallback: no row fell back"
check tiny tiny "" "4 4 1" "4 2 2"

# The default ring adds its blocks in another order than one process.
a=(attn -q "$dir/base_q.npy" -k "$dir/base_k.npy" -v "$dir/base_v.npy" --threads 1)
"$fxattn" "${a[@]}" -o "$dir/d1.npy" >/dev/null && run -np 2 "$fxattn" "${a[@]}" --ring 2 \
    -o "$dir/d2.npy" >/dev/null || bad "default runs: exit $?"
cmp -s "$dir/d1.npy" "$dir/d2.npy" && bad "the default ring of 2 wrote one process's bytes"
ls "$dir"/*_np*_lse.npy | wc -l | grep -qx 13 || bad "not every grid wrote its files"
exit $fail
