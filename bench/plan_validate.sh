#!/usr/bin/env bash
# The planner against measurements (docs/cluster.md): on test hosts made of
# network namespaces (tests/multihost/hosts.sh; root), for each layout of
# hosts x ranks per host and each link setting (unshaped, tc tbf 1 Gbit,
# tc tbf 200 Mbit on every host's link), `fxattn plan --measure` predicts
# every U x R grid and the all-gather alternative, and `fxattn bench`
# measures each (median of its --repeats); prints predicted vs measured
# seconds per call and the planner's choice vs the fastest measured grid.
# Each setting runs PV_ROUNDS rounds of (plan, every grid) one after the
# other and compares the medians over the rounds, so that a machine whose
# speed drifts between runs moves predictions and measurements alike.
# One rank per CPU core is the fair setting; more ranks than cores share
# them (the plan measures each rank's compute with all ranks running).
# Usage: plan_validate.sh FXATTN [MPIRUN]
#   PV_SEQ, PV_HEADS, PV_DIM (2048, 4, 128), PV_REPEATS (3), PV_ROUNDS (3),
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
S=${PV_SEQ:-2048} H=${PV_HEADS:-4} D=${PV_DIM:-128} reps=${PV_REPEATS:-3} rounds=${PV_ROUNDS:-3}
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
        rm -f "$dir"/plan.*.json
        : >"$dir/bench.jsonl"
        for ((round = 1; round <= rounds; round++)); do
            hosts_mpirun "$list" -np $P "$fxattn" plan --measure --json --seq "$S" --heads "$H" \
                --dim "$D" --threads 1 >"$dir/plan.$round.json" ||
                { echo "plan --measure failed" >&2; exit 1; }
            for ((u = 1; u <= P; u++)); do
                [ $((P % u)) -eq 0 ] || continue
                hosts_mpirun "$list" -np $P "$fxattn" bench --seq "$S" --heads "$H" --dim "$D" \
                    --threads 1 --repeats "$reps" --ulysses $u --ring $((P / u)) --json |
                    grep '^{' >>"$dir/bench.jsonl" ||
                    { echo "bench $u x $((P / u)) failed" >&2; exit 1; }
            done
        done
        python3 - "$dir" "$n" "$per" "$link" <<'PY'
import glob, json, statistics, sys
d, n, per, link = sys.argv[1:5]
plans = [json.load(open(f)) for f in sorted(glob.glob(d + "/plan.*.json"))]
runs = [json.loads(l) for l in open(d + "/bench.jsonl")]
med = statistics.median
pred = {k: med(g["seconds"] for p in plans for g in p[:-1] if (g["ulysses"], g["ring"]) == k)
        for k in {(g["ulysses"], g["ring"]) for g in plans[0][:-1]}}
meas = {k: med(r["fxattn_seconds"] for r in runs if (r["ulysses"], r["ring"]) == k)
        for k in {(r["ulysses"], r["ring"]) for r in runs}}
spread = {k: (min(r["fxattn_seconds"] for r in runs if (r["ulysses"], r["ring"]) == k),
              max(r["fxattn_seconds"] for r in runs if (r["ulysses"], r["ring"]) == k)) for k in meas}
ag = med(r["allgather_seconds"] for r in runs)
worst = 0.0
for (u, r), t in sorted(meas.items()):
    p = pred[(u, r)]
    err = (p - t) / t
    worst = max(worst, abs(err))
    lo, hi = spread[(u, r)]
    print(f"{n:<6} {per:<8} {link:<9} {'Ulysses %d x ring %d' % (u, r):<22} {p:10.4f} {t:10.4f} "
          f"{100 * err:+7.1f}%  (measured {lo:.4f}-{hi:.4f})")
p = pred[(0, 0)]
print(f"{n:<6} {per:<8} {link:<9} {'all-gather + local':<22} {p:10.4f} {ag:10.4f} {100 * (p - ag) / ag:+7.1f}%")
best = min((k for k in pred if k != (0, 0)), key=pred.get)
choice = meas[best]
fu, fr = min(meas, key=meas.get)
last = plans[-1][-1]
print(f"  plan (median of {len(plans)} rounds): Ulysses {best[0]} x ring {best[1]} ({choice:.4f} s "
      f"measured); fastest measured: Ulysses {fu} x ring {fr} ({meas[(fu, fr)]:.4f} s); choice "
      f"within {100 * (choice / meas[(fu, fr)] - 1):.1f}%; worst grid error {100 * worst:.1f}%; "
      f"rates per rank {', '.join('%.1f' % p[-1]['rank_gflops'] for p in plans)} GFLOP/s, link "
      f"{last['link_gbps']:.3g} Gbit/s {last['latency_us']:.3g} us "
      f"{last['link_cpu_us_per_mb']:.3g} CPU us/MB, intra {last['intra_gbps']:.3g} Gbit/s "
      f"{last['intra_cpu_us_per_mb']:.3g} CPU us/MB, call {', '.join('%.3g' % p[-1]['call_ms'] for p in plans)} ms")
PY
    done
done
