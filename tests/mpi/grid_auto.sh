#!/usr/bin/env bash
# --grid auto under `mpirun -np 2`: attn runs the planner's choice (named on
# rank 0 as "grid auto: Ulysses U x ring R") and writes the same bytes as
# the explicit --ulysses U --ring R run; bench runs it too and reports that
# grid; `plan --measure` measures the job (one host here: the link inside
# it); `layer --cp-grid auto` runs its choice for the layer's attention and
# writes the bytes of the explicit grid; --grid (--cp-grid) with another
# value or with --ulysses / --ring, and --cp-grid with --tp, fail on every
# rank with one error, exit 2, nothing written.
# Usage: grid_auto.sh MPIRUN FXATTN
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"

demo_inputs "$dir" --frames 2 --height 8 --width 16 --heads 4 --dim 64

out=$(run -np 2 "$fxattn" attn "${in[@]}" -o "$dir/auto.npy" --grid auto --threads 1) ||
    bad "attn --grid auto exited $?"
echo "$out"
pick=$(echo "$out" | sed -n 's/^grid auto: Ulysses \([0-9]*\) x ring \([0-9]*\) .*/\1 \2/p')
[ "$(echo "$pick" | wc -w)" -eq 2 ] || bad "attn --grid auto named no grid"
# shellcheck disable=SC2086
set -- $pick
u=${1:-1} r=${2:-2}
[ $((u * r)) -eq 2 ] || bad "attn --grid auto picked $u x $r for 2 ranks"
run -np 2 "$fxattn" attn "${in[@]}" -o "$dir/explicit.npy" --ulysses "$u" --ring "$r" \
    --threads 1 >/dev/null || bad "attn --ulysses $u --ring $r exited $?"
cmp -s "$dir/auto.npy" "$dir/explicit.npy" ||
    bad "attn --grid auto differs from --ulysses $u --ring $r"

out=$(run -np 2 "$fxattn" bench --grid auto --seq 512 --heads 2 --dim 64 --threads 1 \
    --repeats 1 --json) || bad "bench --grid auto exited $?"
bpick=$(echo "$out" | sed -n 's/^grid auto: Ulysses \([0-9]*\) x ring \([0-9]*\) .*/\1 \2/p')
json=$(echo "$out" | grep '^{')
echo "$json" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
u, r = map(int, sys.argv[1].split())
assert (j["ulysses"], j["ring"]) == (u, r) and j["ranks"] == 2, (j, u, r)
' "$bpick" || bad "bench --grid auto: ran another grid than it named ($bpick)"

out=$(run -np 2 "$fxattn" plan --measure --json --seq 512 --heads 2 --dim 64 --threads 1) ||
    bad "plan --measure exited $?"
echo "$out" | python3 -c '
import json, sys
g = json.loads(sys.stdin.read())
last = g[-1]
assert last["ranks"] == 2 and last["hosts"] == 1, last
assert last["intra_source"] == "measured" and last["intra_gbps"] > 0, last
assert last["intra_cpu_us_per_mb"] > 0 and last["link_cpu_us_per_mb"] == 0, last
assert last["compute_source"].startswith("measured") and last["rank_gflops"] > 0, last
assert sorted((x["ulysses"], x["ring"]) for x in g[:-1]) == [(0, 0), (1, 2), (2, 1)]
' || bad "plan --measure: wrong JSON"

echo "stale" >"$dir/bad.npy"
for args in "--grid auto --ring 2" "--grid auto --ulysses 2" "--grid 1x2"; do
    # shellcheck disable=SC2086
    err=$(run -np 2 "$fxattn" attn "${in[@]}" -o "$dir/bad.npy" $args 2>&1 >/dev/null)
    rc=$?
    [ "$rc" -eq 2 ] || bad "attn $args: exit $rc, expected 2"
    n=$(echo "$err" | grep -c "^fxattn: error: .*--grid")
    [ "$n" -eq 1 ] || bad "attn $args: expected one error naming --grid, got: $err"
    # shellcheck disable=SC2086
    err=$(run -np 2 "$fxattn" bench --seq 256 --heads 2 --dim 64 --repeats 1 $args 2>&1 >/dev/null)
    rc=$?
    [ "$rc" -eq 2 ] || bad "bench $args: exit $rc, expected 2"
    echo "$err" | grep -q "^fxattn: error: .*--grid" || bad "bench $args: no error naming --grid"
done
lg="--grid 2,3,6 --heads 8 --dim 32 --seed 3 --threads 1"
# shellcheck disable=SC2086
out=$(run -np 2 "$fxattn" layer $lg --cp-grid auto -o "$dir/layer_auto.npy") ||
    bad "layer --cp-grid auto exited $?"
echo "$out"
lpick=$(echo "$out" | sed -n 's/^grid auto: Ulysses \([0-9]*\) x ring \([0-9]*\) .*/\1 \2/p')
# shellcheck disable=SC2086
set -- $lpick
if [ $# -eq 2 ] && [ $(($1 * $2)) -eq 2 ]; then
    # shellcheck disable=SC2086
    run -np 2 "$fxattn" layer $lg --ulysses "$1" --ring "$2" -o "$dir/layer_explicit.npy" \
        >/dev/null || bad "layer --ulysses $1 --ring $2 exited $?"
    cmp -s "$dir/layer_auto.npy" "$dir/layer_explicit.npy" ||
        bad "layer --cp-grid auto differs from --ulysses $1 --ring $2"
else
    bad "layer --cp-grid auto named no grid for 2 ranks: '$lpick'"
fi
for args in "--cp-grid auto --ring 2" "--cp-grid 2x1" "--cp-grid auto --tp 2"; do
    # shellcheck disable=SC2086
    err=$(run -np 2 "$fxattn" layer $lg -o "$dir/bad.npy" $args 2>&1 >/dev/null)
    rc=$?
    [ "$rc" -eq 2 ] || bad "layer $args: exit $rc, expected 2"
    n=$(echo "$err" | grep -c "^fxattn: error: .*--cp-grid")
    [ "$n" -eq 1 ] || bad "layer $args: expected one error naming --cp-grid, got: $err"
done
[ "$(cat "$dir/bad.npy")" = "stale" ] || bad "a failed run touched the output"
[ "$fail" -eq 0 ] && echo "grid auto: all checks passed"
exit "$fail"
