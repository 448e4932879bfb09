#!/usr/bin/env bash
# Placement by hosts across test hosts (tests/multihost/hosts.sh): 2 hosts
# of 2 ranks each, started with mpirun --map-by node, so that world ranks
# 0, 2 are on host 1 and 1, 3 on host 2 (interleaved):
#  - `fxattn attn --ulysses 2 --ring 2` (GQA: 4 q heads, 2 kv heads, so
#    that the Ulysses exchange and the ring move different byte counts) is
#    within 1e-5 max|out| of one process and passes --verify, with the
#    default placement (hosts) and with --placement ranks;
#  - --stats' grid_hosts (the host of each grid rank) puts each Ulysses row
#    (grid ranks 2c, 2c + 1) on one host by default, and on two with
#    --placement ranks;
#  - host 2's link byte counter: by hosts it sends its ring K/V blocks and
#    its output shards but not the Ulysses exchange (less than the exchange
#    plus the output), with --placement ranks at least the exchange plus
#    the output;
#  - `fxattn layer --tp 2 --ring 2` on the same interleaved ranks is within
#    1e-5 max|y| of one process (its TP groups are placed inside hosts);
#  - afterwards no namespace or hosts file of the test is left.
# Needs root (exits 77, skipped, without it).
# Usage: placement.sh MPIRUN FXATTN NPY_CLOSE
# shellcheck source=tests/multihost/multihost_lib.sh
. "$(dirname "$0")/multihost_lib.sh"
hosts_test_up 2
h1=$(fxh_host 1) h2=$(fxh_host 2)

# S = 256 tokens, 4 q heads and 2 kv heads of 64, fp32, BSHD.
S=256 D=64
lcg="$here/../mpi/lcg_npy.py"
"$lcg" "$dir/q.npy" 1 4.0 1 $S 4 $D && "$lcg" "$dir/k.npy" 2 4.0 1 $S 2 $D &&
    "$lcg" "$dir/v.npy" 3 4.0 1 $S 2 $D || { echo "FAIL: inputs"; exit 1; }
in="-q $dir/q.npy -k $dir/k.npy -v $dir/v.npy"
# shellcheck disable=SC2086
"$fxattn" attn $in -o "$dir/ref.npy" --threads 1 || { echo "FAIL: one process"; exit 1; }

# Bytes host 2 (world ranks 1 and 3, 64 tokens each) must send. Output to
# rank 0: 64 tokens x 4 heads x D floats and 64 x 4 lse each. Ring (R = 2,
# one hop): its K and V block, 128 tokens x 1 local kv head x D each.
# Ulysses (U = 2) with its partner on host 1: half of its Q (2 heads), K
# and V (1 head each) shards, then half of its output and lse back.
out_bytes=$((2 * (64 * 4 * D * 4 + 64 * 4 * 4)))
ring_bytes=$((2 * 2 * 128 * 1 * D * 4))
ulysses_bytes=$((2 * (64 * 2 * D * 4 + 2 * 64 * 1 * D * 4 + 64 * 2 * D * 4)))

# attn NAME PLACEMENT-OPTION EXPECTED-GRID-HOSTS
attn() {
    local name=$1 opt=$2 want=$3 tx0 tx
    tx0=$(link_bytes "$h2" | cut -d' ' -f2)
    # shellcheck disable=SC2086
    out=$(hosts_mpirun "$h1:2,$h2:2" --map-by node -np 4 "$fxattn" attn $in -o "$dir/mpi.npy" \
        --ulysses 2 --ring 2 --threads 1 --verify --stats $opt 2>&1) ||
        { echo "$out"; bad "$name: exit $?"; return; }
    tx=$(($(link_bytes "$h2" | cut -d' ' -f2) - tx0))
    echo "$name: $(echo "$out" | grep -o '"placement".*')"
    echo "$name: host 2 sent $tx bytes (ring $ring_bytes, Ulysses $ulysses_bytes, output $out_bytes)"
    "$npy_close" "$dir/ref.npy" "$dir/mpi.npy" 1e-5 || bad "$name: not within 1e-5 of one process"
    echo "$out" | grep -q "\"grid_hosts\": \[$want\]" || bad "$name: grid hosts are not [$want]"
    rm -f "$dir/mpi.npy"
    last_tx=$tx
}
attn "by hosts" "" "\"$h1\", \"$h1\", \"$h2\", \"$h2\""
[ "$last_tx" -ge $((ring_bytes + out_bytes)) ] ||
    bad "by hosts: host 2 sent $last_tx bytes, less than its ring blocks and output"
[ "$last_tx" -lt $((ulysses_bytes + out_bytes)) ] ||
    bad "by hosts: host 2 sent $last_tx bytes: the Ulysses exchange crossed the hosts"
attn "--placement ranks" "--placement ranks" "\"$h1\", \"$h2\", \"$h1\", \"$h2\""
[ "$last_tx" -ge $((ulysses_bytes + out_bytes)) ] ||
    bad "--placement ranks: host 2 sent $last_tx bytes, less than the Ulysses exchange and output"

# The layer on the interleaved ranks (72 tokens, hidden 512).
g="--grid 2,6,6 --heads 8 --dim 64 --seed 3"
# shellcheck disable=SC2086
"$fxattn" layer $g -o "$dir/ref_y.npy" --threads 1 || { echo "FAIL: one process layer"; exit 1; }
# shellcheck disable=SC2086
out=$(hosts_mpirun "$h1:2,$h2:2" --map-by node -np 4 "$fxattn" layer $g --tp 2 --ring 2 \
    -o "$dir/y.npy" --threads 1 --verify 2>&1) || { echo "$out"; bad "layer: exit $?"; }
echo "layer --tp 2 --ring 2: $(echo "$out" | tail -1)"
"$npy_close" "$dir/ref_y.npy" "$dir/y.npy" 1e-5 || bad "layer: y not within 1e-5 of one process"

hosts_test_end
