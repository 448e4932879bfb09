#!/usr/bin/env bash
# `fxattn layer --weights` on the checkpoints users download (hidden 256 =
# 8 heads x 32, grid 2x3x6, block 3, x from a file):
#  - one file under Wan2.2's original names (blocks.3.self_attn.q, ...);
#  - the same tensors under diffusers' names (blocks.3.attn1.to_q, ...,
#    to_out.0) sharded over three files plus an index
#    (diffusion_pytorch_model.safetensors.index.json), given as the index
#    and as its folder; a fourth shard that the index lists for another
#    block's tensors does not exist, so opening it would fail: only the
#    shards that hold block 3 are opened;
#  - all give the same bytes, also under mpirun --tp 2 (each rank opens only
#    block 3's shards) against --tp 2 on the single file;
#  - a checkpoint with neither naming is refused naming both names looked
#    for; a missing shard that holds block 3 is an error naming it.
# Usage: checkpoints.sh FXATTN [MPIRUN]
set -u
fxattn=$1
mpirun=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
bad() { echo "FAIL: $*"; fail=1; }

python3 - "$dir" "$here/../common" <<'PY' || { echo "FAIL: cannot write the checkpoints"; exit 1; }
import os, sys
d = sys.argv[1]
sys.path.insert(0, sys.argv[2])
import testfiles as tf
tf.write_npy(os.path.join(d, "x.npy"), (36, 256), tf.lcg(4242, 36 * 256, 3.0))
orig = tf.wan_attention_tensors(256, 3, dtype="BF16", seed=21)
tf.write_safetensors(os.path.join(d, "orig.safetensors"), orig)
diff = tf.wan_attention_tensors(256, 3, dtype="BF16", seed=21, naming="diffusers")
# another block's tensors, in a shard that is never written
other = {k.replace("blocks.3.", "blocks.4."): v for k, v in diff.items()}
diff.update(other)
def shard(name):
    if name.startswith("blocks.4."):
        return 4
    if ".to_q." in name or ".to_k." in name:
        return 1
    return 2 if ".to_v." in name or ".to_out." in name else 3
os.mkdir(os.path.join(d, "sharded"))
tf.write_sharded(os.path.join(d, "sharded"), diff, shard, missing=(4,))
# block 3's shard 2 missing
os.mkdir(os.path.join(d, "gap"))
tf.write_sharded(os.path.join(d, "gap"), diff, shard, missing=(2, 4))
# neither naming
odd = {k.replace("self_attn", "attention"): v for k, v in orig.items()}
tf.write_safetensors(os.path.join(d, "odd.safetensors"), odd)
PY

idx=$dir/sharded/diffusion_pytorch_model.safetensors.index.json
args="--block 3 --heads 8 --grid 2,3,6 -x $dir/x.npy"
# shellcheck disable=SC2086
"$fxattn" layer $args --weights "$dir/orig.safetensors" -o "$dir/orig.npy" ||
    { echo "FAIL: the original single file"; exit 1; }
for w in "$idx" "$dir/sharded"; do
    # shellcheck disable=SC2086
    if "$fxattn" layer $args --weights "$w" -o "$dir/y.npy" 2>"$dir/err.txt"; then
        cmp -s "$dir/orig.npy" "$dir/y.npy" && echo "ok: diffusers names, sharded ($w): same bytes" ||
            bad "diffusers names, sharded ($w): y differs from the original names' single file"
    else
        bad "diffusers names, sharded ($w): $(cat "$dir/err.txt")"
    fi
    rm -f "$dir/y.npy"
done

# shellcheck disable=SC2086
"$fxattn" layer $args --weights "$dir/odd.safetensors" -o "$dir/y.npy" 2>"$dir/err.txt" &&
    bad "a checkpoint with neither naming was accepted"
grep -q "looked for 'blocks.3.self_attn.q.weight' (Wan2.2's names) and 'blocks.3.attn1.to_q.weight' (diffusers' names)" "$dir/err.txt" ||
    bad "neither naming: message does not name both: $(cat "$dir/err.txt")"
# shellcheck disable=SC2086
"$fxattn" layer $args --weights "$dir/gap" -o "$dir/y.npy" 2>"$dir/err.txt" &&
    bad "a missing shard was not noticed"
grep -q "diffusion_pytorch_model-00002-of-00004.safetensors" "$dir/err.txt" ||
    bad "a missing shard: message does not name it: $(cat "$dir/err.txt")"
[ -e "$dir/y.npy" ] && bad "a failed run wrote y"
echo "errors: $(head -c 300 "$dir/err.txt")"

if [ -n "$mpirun" ]; then
    run() { timeout -k 10 120 "$mpirun" --oversubscribe --allow-run-as-root --bind-to none -np 2 "$@"; }
    # shellcheck disable=SC2086
    run "$fxattn" layer $args --tp 2 --weights "$dir/orig.safetensors" -o "$dir/tp_orig.npy" ||
        bad "--tp 2 on the single file"
    # shellcheck disable=SC2086
    if run "$fxattn" layer $args --tp 2 --weights "$idx" -o "$dir/tp_sharded.npy" 2>"$dir/err.txt"; then
        cmp -s "$dir/tp_orig.npy" "$dir/tp_sharded.npy" &&
            echo "ok: --tp 2, diffusers names, sharded: the single file's bytes" ||
            bad "--tp 2: sharded diffusers checkpoint differs from the single file"
    else
        bad "--tp 2 on the sharded checkpoint: $(cat "$dir/err.txt")"
    fi
fi
[ $fail = 0 ] && echo "checkpoints: ok"
exit $fail
