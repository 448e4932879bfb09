#!/usr/bin/env bash
# `fxattn layer` under mpirun refuses ranks that read different bytes
# under the same options: each rank runs in its own folder (mpirun -wdir)
# where the same relative --weights and -x name a copy; one copy is stale
# in a single value. Every rank hashes every piece of the inputs that any
# rank uses, so the job exits 2 with one message naming the file, also
# when the stale bytes lie in another rank's shard (heads of rank 0 under
# --tp 2, tokens of rank 0 under the ring) and never in the stale rank's
# own. Identical copies run (exit 0). Each run under `timeout -k`.
# Usage: layer_inputs_agree.sh MPIRUN FXATTN
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"
fxattn=$(realpath "$fxattn") # absolute: the ranks start in their own folders
h=32 # hidden: 2 heads x 16

# write PATH KIND INDEX: KIND ckpt (block 0, F32, hidden 32) or x ([8, 32]
# f32), value INDEX (of q.weight, or of x; -1: none) plus 0.25.
write() {
    python3 - "$@" <<'PY'
import json, struct, sys
path, kind, index = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = 32
state = [7]
def rnd():
    state[0] = (state[0] * 6364136223846793005 + 1442695040888963407) % 2**64
    return (state[0] >> 40) / 2**24 - 0.5
def bump(vals):
    if index >= 0:
        vals[index] += 0.25
    return vals
if kind == "x":
    vals = bump([rnd() * 2 for _ in range(8 * h)])
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (8, %d), }" % h
    hdr += " " * (64 - (10 + len(hdr) + 1) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(struct.pack("<%df" % len(vals), *vals))
    sys.exit(0)
tensors = []
for m in "qkvo":
    w = [rnd() / h ** 0.5 for _ in range(h * h)]
    tensors.append(("blocks.0.self_attn.%s.weight" % m, [h, h], bump(w) if m == "q" else w))
    tensors.append(("blocks.0.self_attn.%s.bias" % m, [h], [rnd() * 0.2 for _ in range(h)]))
for m in "qk":
    tensors.append(("blocks.0.self_attn.norm_%s.weight" % m, [h], [1 + rnd() * 0.4 for _ in range(h)]))
header, data = {}, b""
for name, shape, vals in tensors:
    b = struct.pack("<%df" % len(vals), *vals)
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
    data += b
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
PY
}

# folders a (rank 0) and b (rank 1): ckpt and x, b's with one value off.
# setup CKPT_INDEX X_INDEX
setup() {
    mkdir -p "$dir/a" "$dir/b"
    write "$dir/a/ckpt.safetensors" ckpt -1 && write "$dir/a/x.npy" x -1 &&
        write "$dir/b/ckpt.safetensors" ckpt "$1" && write "$dir/b/x.npy" x "$2" ||
        { echo "FAIL: cannot write the inputs"; exit 1; }
}

# job NAME EXPECT(empty: success) GRID_OPTIONS...
job() {
    local name=$1 expect=$2
    shift 2
    rm -f "$dir/a/y.npy" "$dir/b/y.npy"
    folders_job "$name" "$expect" "$dir/a/y.npy" "$dir/a" "$dir/b" layer \
        --weights ckpt.safetensors -x x.npy --grid 1,2,4 --heads 2 --threads 1 -o y.npy "$@"
}

wmsg="ranks read different weights (block 0 of --weights ckpt.safetensors): rank 1 differs from rank 0"
xmsg="ranks read different bytes of -x x.npy: rank 1 differs from rank 0"

setup -1 -1
job "identical copies, ring" ""
job "identical copies, --tp 2" "" --tp 2

# q.weight[0][0]: head 0, which rank 0 holds under --tp 2 and both ranks
# under the ring.
setup 0 -1
job "stale head 0, ring" "$wmsg"
job "stale head 0 on rank 1, --tp 2" "$wmsg" --tp 2
job "stale head 0, --ulysses 2" "$wmsg" --ulysses 2
# q.weight[31][5]: head 1, rank 1's own under --tp 2.
setup $((31 * h + 5)) -1
job "stale head 1, --tp 2" "$wmsg" --tp 2
# x[0][3]: token 0, rank 0's shard under the ring (rank 1 reads tokens 4-7).
setup -1 3
job "stale token 0 on rank 1, ring" "$xmsg"
job "stale token 0, --tp 2" "$xmsg" --tp 2

[ "$fail" -eq 0 ] && echo "layer_inputs_agree: all passed"
exit "$fail"
