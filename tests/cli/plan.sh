#!/usr/bin/env bash
# `fxattn plan`: the JSON parses, holds every U x R grid of P ranks and the
# all-gather alternative, names the fastest grid as `best`, and matches the
# model's equations (docs/cluster.md) on cases worked by hand (the links'
# CPU time per byte included); less bandwidth, more latency or more CPU
# time per byte never makes a grid faster; the compute rates are
# measured when --gflops is not given (one per grid's step shape); bad arguments fail with the CLI's
# error prefix, exit 2 and print nothing on stdout.
# Usage: plan.sh FXATTN
set -u
fxattn=$1
fail=0
bad() { echo "FAIL: $*"; fail=1; }

plan() { "$fxattn" plan --json "$@"; }

# Every grid, best = the minimum, kinds, rows_in_host (U divides P / N).
out=$(plan --ranks 12 --hosts 3 --seq 6000 --heads 40 --gflops 200 --link-gbps 10) ||
    bad "plan 12 ranks on 3 hosts: exit $?"
echo "$out" | python3 -c '
import json, sys
g = json.load(sys.stdin)
grids, last = g[:-1], g[-1]
uls = sorted(x["ulysses"] for x in grids if x["kind"] != "allgather")
assert uls == [1, 2, 3, 4, 6, 12], uls
for x in grids:
    if x["kind"] == "allgather":
        continue
    assert x["ulysses"] * x["ring"] == 12, x
    kind = "2d" if x["ulysses"] > 1 and x["ring"] > 1 else "ulysses" if x["ulysses"] > 1 else "ring"
    assert x["kind"] == kind, x
    assert x["rows_in_host"] == (4 % x["ulysses"] == 0), x
    assert abs(x["compute_seconds"] + x["comm_seconds"] - x["seconds"]) <= 1e-5 * x["seconds"], x
    assert x["comm_seconds"] >= 0 and x["compute_seconds"] > 0, x
assert sum(x["kind"] == "allgather" for x in grids) == 1
fx = [x for x in grids if x["kind"] != "allgather"]
b = min(fx, key=lambda x: x["seconds"])
assert last["best"] == {"ulysses": b["ulysses"], "ring": b["ring"]}, (last, b)
assert last["seconds"] == b["seconds"] and last["ranks"] == 12 and last["hosts"] == 3
assert last["ranks_per_host"] == 4 and abs(last["rank_gflops"] - 50) < 1e-9, last
' || bad "plan 12 ranks on 3 hosts: wrong JSON"

# By hand: 2 ranks on 1 host, S=1024, H=2, D=64, fp32, 10 GFLOP/s for the
# host (5 per rank), intra 8 Gbit/s (1e9 B/s), 10 us.
#   ring 1 x 2: step compute 4*2*512^2*64 / 5e9 = 0.0268435456 s, block
#     2*512*2*64*4 = 524288 B: 10 us + 0.524288 ms (hidden); plus one
#     all-gather latency (log2 2 = 1): 0.0536870912 + 1e-5
#   Ulysses 2 x 1 (1 head each: one group): in 3*512*2*64*4/2 = 393216 B,
#     back 512*2*(4*64+12)/2 = 137216 B, 10 us each; compute 4*1*1024^2*64
#     / 5e9 = 0.0536870912; total 0.0536870912 + 2e-5 + 5.30432e-4 + 1e-5
#   all-gather (one round, one host): 2 * (10 us + 262144 B / 1e9) + 0.0536870912
out=$(plan --ranks 2 --seq 1024 --heads 2 --dim 64 --gflops 10 --intra-gbps 8 \
    --intra-latency-us 10) || bad "plan by hand: exit $?"
echo "$out" | python3 -c '
import json, sys
g = {(x.get("ulysses"), x.get("ring")): x for x in json.load(sys.stdin)[:-1]}
want = {(1, 2): 0.0536870912 + 1e-5,
        (2, 1): 0.0536870912 + 2e-5 + 5.30432e-4 + 1e-5,
        (0, 0): 2 * (1e-5 + 262144 / 1e9) + 0.0536870912}
for k, w in want.items():
    assert abs(g[k]["seconds"] - w) <= 1e-5 * w, (k, g[k]["seconds"], w)
' || bad "plan by hand: not the documented equations"

# CPU time per byte (--intra-cpu-us-per-mb 10000 = 1e-8 s/B) slows only the
# compute that transfers overlap, by 2 (bytes out and in) x 1e-8 s/B: 2 ranks
# on 1 host, S=1024, H=8, D=64, compute-bound at 5 GFLOP/s per rank.
#   ring 1 x 2: one overlapped step with a block of 2*512*8*64*4 = 2097152
#     B: + 2 * 2097152 * 1e-8 = 4.194304e-2 s
#   Ulysses 2 x 1 (4 heads each: 4 groups, 3 travel during compute): in
#     3*512*8*64*4/4 = 786432 B and back 512*8*(4*64+12)/4 = 274432 B per
#     group, half of each crossing: + 2 * 3 * (786432 + 274432) / 2 * 1e-8
#     = 3.182592e-2 s
#   all-gather: no overlap, + 0
hand=(--ranks 2 --seq 1024 --heads 8 --dim 64 --gflops 10 --intra-gbps 8 --intra-latency-us 10)
a=$(plan "${hand[@]}") || bad "plan (no CPU per byte): exit $?"
b=$(plan "${hand[@]}" --intra-cpu-us-per-mb 10000) ||
    bad "plan --intra-cpu-us-per-mb 10000: exit $?"
python3 -c '
import json, sys
a, b = ({(x["ulysses"], x["ring"]): x["seconds"] for x in json.loads(t)[:-1]} for t in sys.argv[1:3])
want = {(1, 2): 4.194304e-2, (2, 1): 3.182592e-2, (0, 0): 0.0}
for k, w in want.items():  # seconds printed to 6 digits
    assert abs(b[k] - a[k] - w) <= 1e-5 * (a[k] + b[k]), (k, b[k] - a[k], w)
assert json.loads(sys.argv[2])[-1]["intra_cpu_us_per_mb"] == 10000
' "$a" "$b" || bad "plan --intra-cpu-us-per-mb: not the documented overlap cost"

# Monotone: every grid (and all-gather) at lower bandwidth, higher latency
# or more CPU time per byte, between or inside hosts, is never faster.
base=(--ranks 8 --hosts 2 --seq 16384 --heads 40 --gflops 400)
for sweep in "--link-gbps 400 100 10 1 0.1" "--intra-gbps 800 100 10 1" \
    "--latency-us 0 10 100 1000 10000" "--intra-latency-us 0 1 100 10000" \
    "--link-cpu-us-per-mb 0 10 100 1000 10000" "--intra-cpu-us-per-mb 0 100 1000 100000"; do
    # shellcheck disable=SC2086
    set -- $sweep
    opt=$1
    shift
    prev=""
    for v in "$@"; do
        cur=$(plan "${base[@]}" "$opt" "$v") || { bad "plan $opt $v: exit $?"; continue; }
        if [ -n "$prev" ]; then
            python3 -c '
import json, sys
a, b = (json.loads(x)[:-1] for x in sys.argv[1:3])
for x, y in zip(a, b):
    assert (x["ulysses"], x["ring"]) == (y["ulysses"], y["ring"])
    assert y["seconds"] >= x["seconds"] * (1 - 1e-12), (x, y)
' "$prev" "$cur" || bad "plan $opt $v: a grid got faster"
        fi
        prev=$cur
    done
done

# No --gflops: short measured runs on this node, at the all-gather shape
# (rank_gflops, all-gather's rate) and at each grid's step shape (its own
# rate, its compute seconds = 4 ceil(H/U) ceil(S/R)^2 D R / rate).
out=$(plan --ranks 2 --seq 512 --heads 2 --threads 1) || bad "plan (measured): exit $?"
echo "$out" | python3 -c '
import json, math, sys
g = json.load(sys.stdin)
grids, last = g[:-1], g[-1]
assert last["rank_gflops"] > 0 and last["compute_source"].startswith("measured"), last
for x in grids:
    assert x["gflops"] > 0, x
    if x["kind"] == "allgather":
        assert x["gflops"] == last["rank_gflops"], (x, last)
        continue
    u, r = x["ulysses"], x["ring"]
    flop = 4 * math.ceil(2 / u) * math.ceil(512 / r) ** 2 * 128 * r
    assert abs(x["compute_seconds"] - flop / (x["gflops"] * 1e9)) <= 1e-4 * x["compute_seconds"], x
' || bad "plan (measured): no measured rates, or compute not at them"
# --gflops: one rate for every grid (the host's 50 among its 4 ranks).
plan --ranks 4 --seq 4096 --heads 8 --gflops 50 | python3 -c '
import json, sys
g = json.load(sys.stdin)
assert g[-1]["rank_gflops"] == 12.5 and all(x["gflops"] == 12.5 for x in g[:-1]), g
' || bad "plan --gflops: the grids do not all use the given rate"
"$fxattn" plan --ranks 4 --hosts 2 --gflops 100 | grep -q "^best: Ulysses [0-9]* x ring [0-9]*" ||
    bad "plan: the text output names no best grid"

# Bad arguments: exit 2, the error prefix, nothing on stdout.
for args in "" "--ranks 0" "--ranks 4 --hosts 3" "--ranks 4 --hosts 0" \
    "--ranks 4 --link-gbps 0" "--ranks 4 --gflops -1" "--ranks 4 --latency-us -1" \
    "--ranks 4 --intra-gbps nan" "--ranks 4 --ulysses-groups 0" "--ranks 4 --seq 0" \
    "--ranks 4 --link-cpu-us-per-mb -1" "--ranks 4 --intra-cpu-us-per-mb inf" \
    "--ranks 4 --dtype f64" "--ranks 4 --frobnicate" "--ranks x"; do
    # shellcheck disable=SC2086
    stdout=$("$fxattn" plan --gflops 1 $args 2>/tmp/plan_err.$$)
    rc=$?
    err=$(cat /tmp/plan_err.$$)
    [ "$rc" -eq 2 ] || bad "plan $args: exit $rc, expected 2"
    case $err in "fxattn: error: "*) ;; *) bad "plan $args: stderr '$err'" ;; esac
    [ -z "$stdout" ] || bad "plan $args: printed '$stdout'"
done
rm -f /tmp/plan_err.$$
[ "$fail" -eq 0 ] && echo "plan: all checks passed"
exit "$fail"
