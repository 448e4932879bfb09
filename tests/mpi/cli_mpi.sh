#!/usr/bin/env bash
# `mpirun -np P fxattn attn --ulysses U --ring R` end to end on the same
# files as a single-process run: pure Ulysses writes the same bytes, the
# ring agrees with the fp64 reference (--verify), and a bad value on one
# rank's shard fails every rank with one message and writes nothing.
# Runs beyond the node's memory fail on every rank within seconds.
# Usage: cli_mpi.sh MPIRUN FXATTN
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"

demo_inputs "$dir" --frames 3 --height 10 --width 10 --heads 5 --dim 32
"$fxattn" attn "${in[@]}" -o "$dir/ref.npy" --lse "$dir/ref_lse.npy" --threads 1 ||
    { echo "FAIL: single-process run"; exit 1; }

for grid in "1 1" "2 1" "3 1" "4 1"; do
    set -- $grid
    run -np $(($1 * $2)) "$fxattn" attn "${in[@]}" -o "$dir/u.npy" --lse "$dir/u_lse.npy" \
        --ulysses "$1" --ring "$2" || bad "Ulysses $1 x ring $2 exited $?"
    cmp -s "$dir/ref.npy" "$dir/u.npy" || bad "Ulysses $1: output differs from the single process"
    cmp -s "$dir/ref_lse.npy" "$dir/u_lse.npy" || bad "Ulysses $1: lse differs"
done
for grid in "1 2" "1 3" "2 2" "1 4"; do
    set -- $grid
    out=$(run -np $(($1 * $2)) "$fxattn" attn "${in[@]}" -o "$dir/r.npy" --ulysses "$1" \
        --ring "$2" --verify --stats) || bad "Ulysses $1 x ring $2 exited $?"
    echo "$out"
    rel=$(echo "$out" | sed -n 's/.*"max_rel_err": \([0-9.e+-]*\).*/\1/p')
    # fp32 attention: a few ulps of max|v| (the single process measures ~3e-7).
    awk -v r="${rel:-1}" 'BEGIN { exit !(r < 2e-6) }' ||
        bad "Ulysses $1 x ring $2: relative error ${rel:-missing} vs fp64"
    [ -s "$dir/r.npy" ] || bad "Ulysses $1 x ring $2: no output"
done

# A NaN in Q token 130 (rank 2's shard of 300 tokens on 4 ranks: 150..224
# is rank 2, so use 160): every rank fails, one message, no output.
cp "$dir/q.npy" "$dir/qbad.npy"
hdr=$(( $(od -An -tu2 -j8 -N2 "$dir/q.npy") + 10 ))
printf '\x00\x00\xc0\x7f' | dd of="$dir/qbad.npy" bs=1 seek=$((hdr + 160 * 5 * 32 * 4)) \
    conv=notrunc status=none
echo "stale" > "$dir/bad_out.npy"
for grid in "1 4" "4 1" "2 2"; do
    set -- $grid
    err=$(run -np 4 "$fxattn" attn -q "$dir/qbad.npy" -k "$dir/k.npy" -v "$dir/v.npy" \
        -o "$dir/bad_out.npy" --ulysses "$1" --ring "$2" 2>&1 >/dev/null)
    rc=$?
    echo "$err" | grep "fxattn: error" 
    [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || bad "NaN on rank 2 ($1 x $2): exit $rc"
    n=$(echo "$err" | grep -c "fxattn: error: rank 2: Q has a non-finite value (nan) at batch 0, token 160,")
    [ "$n" -eq 1 ] || bad "NaN on rank 2 ($1 x $2): expected one message naming rank 2, got $n"
    [ "$(cat "$dir/bad_out.npy")" = "stale" ] || bad "NaN on rank 2: the output was touched"
done
# Files that do not fit each other: the same error on every rank.
err=$(run -np 2 "$fxattn" attn -q "$dir/q.npy" -k "$dir/k.npy" -v "$dir/ref_lse.npy" \
    -o "$dir/bad_out.npy" --ring 2 2>&1 >/dev/null)
rc=$?
echo "$err" | grep "fxattn: error"
[ "$rc" -eq 2 ] || bad "mismatched V: exit $rc, expected 2"
# Grid that does not match the ranks.
err=$(run -np 3 "$fxattn" attn "${in[@]}" -o "$dir/bad_out.npy" --ulysses 2 --ring 2 2>&1 >/dev/null)
rc=$?
echo "$err" | grep "fxattn: error"
[ "$rc" -eq 2 ] || bad "2 x 2 grid on 3 ranks: exit $rc, expected 2"
[ "$(cat "$dir/bad_out.npy")" = "stale" ] || bad "a failed run touched the output"
# Runs that need more memory than the node has fail within seconds on every
# rank, before anything large is allocated: attn on three 4 TiB sparse
# files, a layer of 160 heads x 256, a bench of 2^21 tokens.
for t in q k v; do
    cp "$dir/$t.npy" "$dir/huge_$t.npy" && truncate -s 4T "$dir/huge_$t.npy"
done
beyond() { # NAME COMMAND...
    local name=$1 start=$SECONDS err rc
    shift
    err=$(run -np 2 "$fxattn" "$@" 2>&1 >/dev/null)
    rc=$?
    echo "$err" | grep "fxattn: error" | head -1
    [ "$rc" -eq 1 ] || bad "$name beyond memory: exit $rc, expected 1"
    echo "$err" | grep -q "fxattn: error: .*GiB available" || bad "$name beyond memory: no message"
    [ $((SECONDS - start)) -le 20 ] || bad "$name beyond memory: took $((SECONDS - start)) s"
}
beyond attn attn -q "$dir/huge_q.npy" -k "$dir/huge_k.npy" -v "$dir/huge_v.npy" \
    -o "$dir/bad_out.npy" --ring 2
[ "$(cat "$dir/bad_out.npy")" = "stale" ] || bad "attn beyond memory touched the output"
beyond layer layer --heads 160 --dim 256 --ring 2
beyond bench bench --seq 2097152 --heads 8 --dim 128
rm -f "$dir"/huge_*.npy
exit $fail
