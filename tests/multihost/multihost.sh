#!/usr/bin/env bash
# fxattn across hosts: 4 test hosts (network namespaces on one bridge,
# tests/multihost/hosts.sh), Open MPI over TCP on their links only, one
# rank per host, against one process on the same files:
#  - `fxattn attn`: pure Ulysses on 2 and 4 hosts writes the same bytes;
#    the ring on 2 and 4 hosts and the 2-D grid (Ulysses 2 x ring 2) on 4
#    are within 1e-5 max|out| (other summation order) and pass --verify;
#    with --reproducible (1100 tokens) ring 2, ring 4 and 2 x 2 write one
#    process's output and LSE bytes;
#  - `fxattn layer` (72 tokens, hidden 512): --ulysses 2 and --tp 2 on 2
#    hosts, --tp 2 --ring 2 on 4 hosts within 1e-5 max|y|, with --verify;
#  - the links' byte counters show the data crossed them: each host sent at
#    least what the algorithm must move (Ulysses: its share of Q, K, V and
#    of the output; ring: its K/V block; both: its output shard to rank 0);
#  - a cut link (host 2's fx0 down mid-run, --timeout 5) ends the job
#    within 15 s with an error naming the lost peer, nothing written;
#  - afterwards no namespace, hosts file or process of the test is left.
# Needs root (exits 77, skipped, without it).
# Usage: multihost.sh MPIRUN FXATTN NPY_CLOSE
# shellcheck source=tests/multihost/multihost_lib.sh
. "$(dirname "$0")/multihost_lib.sh"
hosts_test_up 4
h() { fxh_host "$1"; }

# S = 250 tokens (uneven shards on 4 ranks), 4 heads x 64, fp32.
S=250 H=4 D=64
"$fxattn" demo --frames 2 --height 5 --width 25 --heads $H --dim $D --save-inputs "$dir" \
    >/dev/null || { echo "FAIL: demo inputs"; exit 1; }
in="-q $dir/q.npy -k $dir/k.npy -v $dir/v.npy"
# shellcheck disable=SC2086
"$fxattn" attn $in -o "$dir/ref.npy" --threads 1 || { echo "FAIL: one process"; exit 1; }

# Per host: bytes sent (tx) during one run.
declare -A tx0
counters_start() {
    local i
    for ((i = 1; i <= $1; i++)); do tx0[$i]=$(link_bytes "$(h "$i")" | cut -d' ' -f2); done
}
sent() { echo $(($(link_bytes "$(h "$1")" | cut -d' ' -f2) - tx0[$1])); }

# attn NAME HOSTS ULYSSES RING same|close [MIN_TX_BYTES_OF_HOST_2]
attn() {
    local name=$1 n=$2 u=$3 r=$4 how=$5 min=${6:-0} list="" i
    for ((i = 1; i <= n; i++)); do list+="${list:+,}$(h "$i"):1"; done
    counters_start "$n"
    # shellcheck disable=SC2086
    out=$(hosts_mpirun "$list" -np "$n" "$fxattn" attn $in -o "$dir/mpi.npy" --ulysses "$u" \
        --ring "$r" --threads 1 --verify 2>&1) || { echo "$out"; bad "$name: exit $?"; return; }
    echo "$name: $(echo "$out" | tail -1)"
    if [ "$how" = same ]; then
        cmp -s "$dir/ref.npy" "$dir/mpi.npy" || bad "$name: output differs from one process"
    else
        "$npy_close" "$dir/ref.npy" "$dir/mpi.npy" 1e-5 || bad "$name: not within 1e-5 of one process"
    fi
    local tx
    tx=$(sent 2)
    echo "$name: host 2 sent $tx bytes (at least $min needed)"
    [ "$tx" -ge "$min" ] || bad "$name: host 2 sent $tx bytes, the algorithm moves at least $min"
    rm -f "$dir/mpi.npy"
}

# Rank 1 of 2 holds 125 tokens: a tensor shard is 125 H D 4 bytes.
shard=$((125 * H * D * 4))
# Ulysses 2: half of its Q, K, V shards out, half of the output back, then
# its output shard to rank 0. Ring 2: its K and V block, then its output.
attn "Ulysses 2 on 2 hosts" 2 2 1 same $((3 * shard / 2 + shard / 2 + shard))
attn "ring 2 on 2 hosts" 2 1 2 close $((2 * shard + shard))
attn "Ulysses 4 on 4 hosts" 4 4 1 same 1
attn "ring 4 on 4 hosts" 4 1 4 close 1
attn "2-D 2x2 on 4 hosts" 4 2 2 close 1

# --reproducible: 1100 tokens (four whole canonical groups and a short one),
# every grid across hosts writes one process's bytes.
mkdir -p "$dir/r" && "$fxattn" demo --frames 2 --height 22 --width 25 --heads $H --dim $D \
    --save-inputs "$dir/r" >/dev/null || { echo "FAIL: demo inputs"; exit 1; }
rin="-q $dir/r/q.npy -k $dir/r/k.npy -v $dir/r/v.npy --reproducible"
# shellcheck disable=SC2086
"$fxattn" attn $rin -o "$dir/r/ref.npy" --lse "$dir/r/ref_lse.npy" --threads 1 ||
    { echo "FAIL: one process, reproducible"; exit 1; }
reproducible() {
    local name=$1 n=$2 u=$3 r=$4 list="" i
    for ((i = 1; i <= n; i++)); do list+="${list:+,}$(h "$i"):1"; done
    # shellcheck disable=SC2086
    out=$(hosts_mpirun "$list" -np "$n" "$fxattn" attn $rin -o "$dir/r/mpi.npy" \
        --lse "$dir/r/mpi_lse.npy" --ulysses "$u" --ring "$r" --threads 1 2>&1) ||
        { echo "$out"; bad "$name: exit $?"; return; }
    cmp -s "$dir/r/ref.npy" "$dir/r/mpi.npy" && cmp -s "$dir/r/ref_lse.npy" "$dir/r/mpi_lse.npy" ||
        bad "$name: output or LSE differs from one process"
    echo "$name: one process's bytes"
    rm -f "$dir/r/mpi.npy" "$dir/r/mpi_lse.npy"
}
reproducible "reproducible ring 2 on 2 hosts" 2 1 2
reproducible "reproducible ring 4 on 4 hosts" 4 1 4
reproducible "reproducible 2-D 2x2 on 4 hosts" 4 2 2

# The layer: 72 tokens, hidden 512. Its projections go through OpenBLAS,
# whose rounding of a token's row depends on the rows in the GEMM (see
# tests/mpi/layer_mpi.sh), so every grid is held to 1e-5 max|y|.
g="--grid 2,6,6 --heads 8 --dim 64 --seed 3"
# shellcheck disable=SC2086
"$fxattn" layer $g -o "$dir/ref_y.npy" --threads 1 || { echo "FAIL: one process layer"; exit 1; }
layer() { # NAME HOSTS GRID-OPTIONS
    local name=$1 n=$2 opts=$3 list="" i
    for ((i = 1; i <= n; i++)); do list+="${list:+,}$(h "$i"):1"; done
    counters_start "$n"
    # shellcheck disable=SC2086
    out=$(hosts_mpirun "$list" -np "$n" "$fxattn" layer $g $opts -o "$dir/y.npy" --threads 1 \
        --verify 2>&1) || { echo "$out"; bad "$name: exit $?"; return; }
    echo "$name: $(echo "$out" | tail -1)"
    "$npy_close" "$dir/ref_y.npy" "$dir/y.npy" 1e-5 || bad "$name: y not within 1e-5 of one process"
    local tx
    tx=$(sent 2)
    echo "$name: host 2 sent $tx bytes"
    [ "$tx" -gt 0 ] || bad "$name: nothing crossed host 2's link"
    rm -f "$dir/y.npy"
}
layer "layer --ulysses 2 on 2 hosts" 2 "--ulysses 2 --ring 1"
layer "layer --tp 2 on 2 hosts" 2 "--tp 2"
layer "layer --tp 2 --ring 2 on 4 hosts" 4 "--tp 2 --ring 2"

# A cut link: host 2's link goes down 3 s into a long ring run (8192
# tokens, 50 repeats). With --timeout 5 the job ends within 5 + 10 s with
# an error naming the lost peer (fxattn's, or the runtime's when its
# keepalive notices first); no process of the test hosts outlives it by
# more than 5 s, and nothing is written.
T=5
mkdir -p "$dir/big"
"$fxattn" demo --frames 1 --height 64 --width 128 --heads 8 --dim 64 --save-inputs "$dir/big" \
    >/dev/null || bad "big demo inputs"
hosts_mpirun "$(h 1):1,$(h 2):1" -np 2 "$fxattn" attn -q "$dir/big/q.npy" -k "$dir/big/k.npy" \
    -v "$dir/big/v.npy" -o "$dir/big/out.npy" --ring 2 --threads 1 --repeats 50 --timeout $T \
    >"$dir/cut.log" 2>&1 &
cut_pid=$!
sleep 3
ip -n "$(h 2)" link set fx0 down
t0=$SECONDS
wait $cut_pid
rc=$? took=$((SECONDS - t0))
echo "link cut: mpirun exit $rc after $took s"
grep "no progress" "$dir/cut.log" | head -2
[ "$rc" -ne 0 ] || bad "link cut: the job reported success"
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || bad "link cut: the job hung until the outer timeout"
[ "$took" -le $((T + 10)) ] || bad "link cut: took $took s after the cut (limit $((T + 10)) s)"
# Whichever notices first ends the job: fxattn's deadline on rank 0, or the
# runtime's keepalive (3 s + 3 x 1 s here), which loses host 2's daemon.
grep -Eq "fxattn: error: rank 0: no progress from .* for $T s|lost communication with a remote daemon" \
    "$dir/cut.log" || { tail -30 "$dir/cut.log"; bad "link cut: no error names the lost peer"; }
[ ! -e "$dir/big/out.npy" ] || bad "link cut: an output was written"
for ((n = 0; n < 50; n++)); do
    [ -z "$(ip netns pids "$(h 1)")$(ip netns pids "$(h 2)")" ] && break
    sleep 0.1
done
left=$(ip netns pids "$(h 1)")$(ip netns pids "$(h 2)")
[ -z "$left" ] || bad "link cut: processes left on the test hosts: $left"
ip -n "$(h 2)" link set fx0 up

hosts_test_end
