#!/usr/bin/env bash
# The planner against measurements (docs/cluster.md): on test hosts made of
# network namespaces (tests/multihost/hosts.sh; root), for each layout of
# hosts x ranks per host and each link setting (unshaped, tc tbf 1 Gbit,
# tc tbf 200 Mbit on every host's link), `fxattn plan --measure` predicts
# every U x R grid and the all-gather alternative, and `fxattn bench`
# measures each (median of its --repeats); prints predicted vs measured
# seconds per call and the planner's choice vs the fastest measured grid.
# One rank per CPU core is the fair setting; more ranks than cores share
# them (the plan measures each rank's compute with all ranks running).
# Usage: plan_validate.sh FXATTN [MPIRUN]
#   PV_SEQ, PV_HEADS, PV_DIM (2048, 4, 128), PV_REPEATS (3),
#   PV_LAYOUTS ("2:1 2:2 4:1": hosts:ranks per host), PV_LINKS ("none 1gbit 200mbit")
set -u
if [ "$(id -u)" -ne 0 ]; then
    echo "plan_validate.sh: network namespaces need root" >&2
    exit 77
fi
fxattn=$(realpath "$1")
export FXH_MPIRUN=${2:-mpirun}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/multihost/hosts.sh
source "$here/../tests/multihost/hosts.sh"
S=${PV_SEQ:-2048} H=${PV_HEADS:-4} D=${PV_DIM:-128} reps=${PV_REPEATS:-3}
layouts=${PV_LAYOUTS:-"2:1 2:2 4:1"}
links=${PV_LINKS:-"none 1gbit 200mbit"}
export FXH_TIMEOUT=300
dir=$(mktemp -d)
trap 'hosts_down; rm -rf "$dir"' EXIT
max_hosts=0
for l in $layouts; do [ "${l%%:*}" -gt "$max_hosts" ] && max_hosts=${l%%:*}; done
hosts_up "$max_hosts" || { echo "cannot make the test hosts" >&2; exit 1; }
trap 'hosts_down; rm -rf "$dir"' EXIT

shape() { # LINK: the same tbf on every host's fx0 (none: removed)
    local i
    for ((i = 1; i <= max_hosts; i++)); do
        tc -n "$(fxh_host "$i")" qdisc del dev fx0 root 2>/dev/null
        [ "$1" = none ] ||
            tc -n "$(fxh_host "$i")" qdisc add dev fx0 root tbf rate "$1" burst 128kb latency 100ms ||
            return 1
    done
}

printf '%-6s %-8s %-9s %-22s %10s %10s %8s\n' hosts ranks link grid predicted measured error
for link in $links; do
    shape "$link" || { echo "tc tbf $link failed" >&2; exit 1; }
    for l in $layouts; do
        n=${l%%:*} per=${l##*:} P=$((${l%%:*} * ${l##*:})) list=""
        for ((i = 1; i <= n; i++)); do list+="${list:+,}$(fxh_host "$i"):$per"; done
        hosts_mpirun "$list" -np $P "$fxattn" plan --measure --json --seq "$S" --heads "$H" \
            --dim "$D" --threads 1 >"$dir/plan.json" || { echo "plan --measure failed" >&2; exit 1; }
        : >"$dir/bench.jsonl"
        for ((u = 1; u <= P; u++)); do
            [ $((P % u)) -eq 0 ] || continue
            hosts_mpirun "$list" -np $P "$fxattn" bench --seq "$S" --heads "$H" --dim "$D" \
                --threads 1 --repeats "$reps" --ulysses $u --ring $((P / u)) --json |
                grep '^{' >>"$dir/bench.jsonl" || { echo "bench $u x $((P / u)) failed" >&2; exit 1; }
        done
        python3 - "$dir/plan.json" "$dir/bench.jsonl" "$n" "$per" "$link" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
runs = [json.loads(l) for l in open(sys.argv[2])]
n, per, link = sys.argv[3], sys.argv[4], sys.argv[5]
pred = {(g["ulysses"], g["ring"]): g["seconds"] for g in plan[:-1]}
meas = {(r["ulysses"], r["ring"]): r["fxattn_seconds"] for r in runs}
ag = sum(r["allgather_seconds"] for r in runs) / len(runs)
worst = 0.0
for (u, r), t in sorted(meas.items()):
    p = pred[(u, r)]
    err = (p - t) / t
    worst = max(worst, abs(err))
    print(f"{n:<6} {per:<8} {link:<9} {'Ulysses %d x ring %d' % (u, r):<22} {p:10.4f} {t:10.4f} {100 * err:+7.1f}%")
p = pred[(0, 0)]
print(f"{n:<6} {per:<8} {link:<9} {'all-gather + local':<22} {p:10.4f} {ag:10.4f} {100 * (p - ag) / ag:+7.1f}%")
best = plan[-1]["best"]
choice = meas[(best["ulysses"], best["ring"])]
fu, fr = min(meas, key=meas.get)
print(f"  plan: Ulysses {best['ulysses']} x ring {best['ring']} ({choice:.4f} s measured); "
      f"fastest measured: Ulysses {fu} x ring {fr} ({meas[(fu, fr)]:.4f} s); choice within "
      f"{100 * (choice / meas[(fu, fr)] - 1):.1f}%; worst grid error {100 * worst:.1f}%; "
      f"measured: {plan[-1]['rank_gflops']:.2f} GFLOP/s per rank, link {plan[-1]['link_gbps']:.3g} "
      f"Gbit/s {plan[-1]['latency_us']:.3g} us, intra {plan[-1]['intra_gbps']:.3g} Gbit/s")
PY
    done
done
