#!/usr/bin/env bash
# The cost of reproducible attention (fxattn attn --reproducible), side by
# side with the default: one process on 2 threads and a ring of 2 ranks on
# 1 thread each, S 4096 x 8 heads and S 27648 x 2 heads (D 128, fp32, q, k,
# v ~ N(0, 1) written by numpy), 3 rounds alternating the modes; prints each
# run's seconds (the median of --repeats 3, the slowest rank's under mpirun)
# and the medians.
#     bench/reproducible_cost.sh [FXATTN] [PYTHON]
set -euo pipefail
fxattn=${1:-build/fxattn}
python=${2:-.venv/bin/python}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$python" - "$dir" <<'PY'
import sys
import numpy as np
r = np.random.default_rng(1)
for s, h in ((4096, 8), (27648, 2)):
    for n in "qkv":
        np.save(f"{sys.argv[1]}/{n}{s}.npy", r.standard_normal((1, s, h, 128)).astype(np.float32))
PY
seconds() { grep -o '"seconds": [0-9.]*' | cut -d' ' -f2; }
median() { sort -g | sed -n 2p; }
for s in 4096 27648; do
    a=(attn -q "$dir/q$s.npy" -k "$dir/k$s.npy" -v "$dir/v$s.npy" -o "$dir/o.npy" --stats --repeats 3)
    for mode in default reproducible; do : >"$dir/$mode.one"; : >"$dir/$mode.ring"; done
    for round in 1 2 3; do
        for mode in default reproducible; do
            flag=(); [ "$mode" = reproducible ] && flag=(--reproducible)
            one=$("$fxattn" "${a[@]}" --threads 2 "${flag[@]}" | seconds)
            ring=$(mpirun -np 2 --bind-to none "$fxattn" "${a[@]}" --ring 2 --threads 1 "${flag[@]}" | seconds)
            echo "S $s round $round $mode: one process $one s, ring 2 $ring s"
            echo "$one" >>"$dir/$mode.one"
            echo "$ring" >>"$dir/$mode.ring"
        done
    done
    for mode in default reproducible; do
        echo "S $s $mode medians: one process $(median <"$dir/$mode.one") s, ring 2 $(median <"$dir/$mode.ring") s"
    done
done
