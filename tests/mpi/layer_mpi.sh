#!/usr/bin/env bash
# `mpirun -np 2 fxattn layer` (-np 4 for tensor and context parallelism
# together) against the single process on the same layer (grid 2x3x6 = 36
# tokens, 8 heads x 32 = hidden 256, synthetic weights or a .safetensors
# checkpoint; x synthetic or from a file, which context-parallel ranks read
# in shards):
#  - pure Ulysses (--ulysses 2 --ring 1): every rank projects its own
#    tokens with all heads (the projection is per token), and Ulysses
#    attention is bit-identical to one process (test_mpi_attn), but
#    OpenBLAS's sgemm rounds a token's row differently depending on how many
#    rows the GEMM holds (measured: on Zen AVX2 builds rows 12-15 of a
#    16-row GEMM differ from the same rows of a 32-row one, also at Wan's
#    shape), so y is held to the same 1e-5 as the ring below.
#  - the ring (--ulysses 1 --ring 2) and tensor parallelism (--tp 2) sum in
#    other orders (the ring adds per-block partial sums; --tp joins the
#    RMSNorm sums of squares over the ranks and sums the output projection's
#    per-rank partial products), so they are not byte-identical: y must be
#    within 1e-5 max|y| of the single process (ten times the plain-fp32
#    error --verify measures at this size, ~1e-6; a shard in the wrong place
#    or a bias added twice is off by more than 1e-2), and --verify (fp64
#    reference, plain-fp32 envelope) must pass.
#  - 5 heads over 2 ranks (uneven splits) for --tp and Ulysses, and --fp8
#    under --tp.
#  - --tp 2 with --ring 2 or --ulysses 2 on 4 ranks (a rank: 18 tokens and
#    4 heads; 5 heads split 3 + 2, then over Ulysses), within the same 1e-5
#    and --verify; also from checkpoints, of which a tensor-parallel rank
#    reads only its heads' rows of q, k, v and the gammas and o.weight's
#    columns: BF16/F16/F32 weights (with -x), and F8_E4M3 weights with
#    scales of every shape ([hidden], [hidden, 1], [], [1]).
#  - the bf16 layer (--dtype bf16) on Ulysses, the ring, --tp and --tp x
#    ring: y within 2^-7 max|y| of the single process's bf16 layer (two
#    bf16 layers that sum in other orders can round a q, k, v or
#    probability to neighbouring bf16 values: each is within 2^-5 of fp64,
#    --verify's bf16 ceiling, and ~3e-3 at this size; a misplaced shard is
#    off by O(1)), and --verify (fp64 reference, plain-bf16 envelope).
#  - errors are agreed on: exit 2 on every rank, one message, no output
#    (usage errors found before MPI starts are reported by every rank), also
#    for a grid whose T x U x R is not the number of ranks.
# Usage: layer_mpi.sh MPIRUN FXATTN NPY_CLOSE
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"
npy_close=$3
np=2 # ranks of each job
tol=1e-5

# x [36, 256] as a .npy file ('<f4', values from a fixed LCG).
"$(dirname "$0")/lcg_npy.py" "$dir/x.npy" 12345 3.0 36 256 ||
    { echo "FAIL: cannot write x.npy"; exit 1; }

# name, options (besides the grid and -o), expected: same | close, the
# reference y, the tolerance of close (default $tol)
check() {
    local name=$1 opts=$2 how=$3 ref=$4 within=${5:-$tol}
    out=$(run -np "$np" "$fxattn" layer $opts -o "$dir/mpi.npy" --verify) ||
        { bad "$name: exit $?"; return; }
    echo "$name: $out"
    if [ "$how" = same ]; then
        cmp -s "$ref" "$dir/mpi.npy" || bad "$name: y differs from the single process"
    else
        # npy_close: 1 outside the tolerance or not finite, 2 unreadable.
        "$npy_close" "$ref" "$dir/mpi.npy" "$within" ||
            bad "$name: y not within $within of one process (npy_close exit $?)"
    fi
    rm -f "$dir/mpi.npy"
}

g="--grid 2,3,6 --heads 8 --dim 32 --seed 3"
"$fxattn" layer $g -o "$dir/ref.npy" --threads 1 || { echo "FAIL: single process"; exit 1; }
"$fxattn" layer $g -x "$dir/x.npy" -o "$dir/ref_x.npy" --threads 1 ||
    { echo "FAIL: single process with -x"; exit 1; }
check "Ulysses 2" "$g --ulysses 2 --ring 1" close "$dir/ref.npy"
check "Ulysses 2, -x" "$g -x $dir/x.npy --ulysses 2 --ring 1" close "$dir/ref_x.npy"
check "ring 2" "$g --ulysses 1 --ring 2" close "$dir/ref.npy"
check "ring 2, -x" "$g -x $dir/x.npy --ring 2" close "$dir/ref_x.npy"
check "tp 2" "$g --tp 2" close "$dir/ref.npy"
check "tp 2, -x" "$g -x $dir/x.npy --tp 2" close "$dir/ref_x.npy"

g5="--grid 2,3,6 --heads 5 --dim 32 --seed 4"
"$fxattn" layer $g5 -o "$dir/ref5.npy" --threads 1 ||
    { echo "FAIL: single process, 5 heads"; exit 1; }
"$fxattn" layer $g5 --fp8 -o "$dir/ref5_fp8.npy" --threads 1 ||
    { echo "FAIL: single process, --fp8"; exit 1; }
check "tp 2, 5 heads" "$g5 --tp 2" close "$dir/ref5.npy"
check "Ulysses 2, 5 heads" "$g5 --ulysses 2 --ring 1" close "$dir/ref5.npy"
check "tp 2, 5 heads, --fp8" "$g5 --fp8 --tp 2" close "$dir/ref5_fp8.npy"

"$fxattn" layer $g --dtype bf16 -o "$dir/ref_bf16.npy" --threads 1 ||
    { echo "FAIL: single process, --dtype bf16"; exit 1; }
check "Ulysses 2, bf16" "$g --dtype bf16 --ulysses 2 --ring 1" close "$dir/ref_bf16.npy" 0.0078125
check "ring 2, bf16" "$g --dtype bf16 --ring 2" close "$dir/ref_bf16.npy" 0.0078125
check "tp 2, bf16" "$g --dtype bf16 --tp 2" close "$dir/ref_bf16.npy" 0.0078125

# Errors: exit 2 on every rank, one message from rank 0, no output.
expect_error() {
    local name=$1 word=$2
    shift 2
    run -np "$np" "$fxattn" layer "$@" -o "$dir/bad.npy" 2>"$dir/log" >/dev/null
    refused "$name" $? "$word" "$dir/bad.npy"
}
expect_error "S != F*H*W under --tp" "36 tokens" -x "$dir/x.npy" --grid 2,3,5 --heads 8 --tp 2
expect_error "--tp 3 on 2 ranks" "needs 3 ranks" --grid 1,2,3 --heads 4 --dim 8 --tp 3
expect_error "more ranks than heads" "cannot be split" --grid 1,2,3 --heads 1 --dim 8 --tp 2
expect_error "a 2 x 2 grid on 2 ranks" "rank" --grid 1,2,3 --heads 4 --dim 8 --ulysses 2 --ring 2
expect_error "--tp 2 --ring 2 on 2 ranks" "needs 4 ranks" --grid 1,2,3 --heads 4 --dim 8 --tp 2 \
    --ring 2
# A usage error is found before MPI starts, so every rank reports it.
err=$(run -np "$np" "$fxattn" layer --grid 1,2,3 --heads 4 --dim 8 --tp 2 --rope-layout pairs \
    -o "$dir/bad.npy" 2>&1)
rc=$?
echo "--rope-layout pairs: $err"
[ "$rc" -eq 2 ] && [ "$(echo "$err" | grep -c -- "error: --rope-layout")" -eq 2 ] ||
    bad "--rope-layout pairs: exit $rc"
[ ! -e "$dir/bad.npy" ] || bad "--rope-layout pairs: an output was written"

# Checkpoints of block 2 (hidden 256) as .safetensors, stdlib only: "float"
# has q/v BF16, k F32 and o F16 weights, F32 biases, BF16 gammas; "fp8" has
# F8_E4M3 weights with scales of shape [hidden] (q), [hidden, 1] (k), [] (v)
# and [1] (o).
ckpt() {
    python3 - "$@" <<'PY'
import json, struct, sys
path, kind = sys.argv[1], sys.argv[2]
h = 256
state = [2024 if kind == "float" else 77]
def rnd():  # uniform in [-0.5, 0.5) from a fixed LCG
    state[0] = (state[0] * 6364136223846793005 + 1442695040888963407) % 2**64
    return (state[0] >> 40) / 2**24 - 0.5
def pack(dtype, vals):
    if dtype == "F32":
        return struct.pack("<%df" % len(vals), *vals)
    if dtype == "F16":
        return struct.pack("<%de" % len(vals), *vals)
    if dtype == "BF16":  # truncated fp32
        return b"".join(struct.pack("<f", v)[2:] for v in vals)
    # F8_E4M3 from v in [-0.5, 0.5): its sign, exponent 5..9, a random mantissa
    return bytes((0x80 if v < 0 else 0) | (5 + int(abs(v) * 8)) << 3 | int(rnd() * 8 + 4)
                 for v in vals)
tensors = []
def add(leaf, dtype, shape, vals):
    tensors.append(("blocks.2.self_attn." + leaf, dtype, shape, vals))
scales = {"q": ("weight_scale", [h]), "k": ("scale_weight", [h, 1]),
          "v": ("weight_scale", []), "o": ("scale_weight", [1])}
for m in "qkvo":
    if kind == "fp8":
        add(m + ".weight", "F8_E4M3", [h, h], [rnd() for _ in range(h * h)])
        leaf, shape = scales[m]
        n = shape[0] if shape else 1
        add(m + "." + leaf, "F32", shape, [0.02 + rnd() * 0.02 for _ in range(n)])
    else:
        dtype = {"q": "BF16", "k": "F32", "v": "BF16", "o": "F16"}[m]
        add(m + ".weight", dtype, [h, h], [rnd() * 3 / h ** 0.5 for _ in range(h * h)])
    add(m + ".bias", "F32", [h], [rnd() * 0.2 for _ in range(h)])
for m in "qk":
    add("norm_%s.weight" % m, "BF16", [h], [1 + rnd() * 0.4 for _ in range(h)])
header, data = {}, b""
for name, dtype, shape, vals in tensors:
    b = pack(dtype, vals)
    header[name] = {"dtype": dtype, "shape": shape,
                    "data_offsets": [len(data), len(data) + len(b)]}
    data += b
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + data)
PY
}
ckpt "$dir/float.safetensors" float && ckpt "$dir/fp8.safetensors" fp8 ||
    { echo "FAIL: cannot write the checkpoints"; exit 1; }
cf="--weights $dir/float.safetensors --block 2 --grid 2,3,6 --heads 8"
ce="--weights $dir/fp8.safetensors --block 2 --grid 2,3,6 --heads 8"
"$fxattn" layer $cf -x "$dir/x.npy" -o "$dir/ref_cf.npy" --threads 1 ||
    { echo "FAIL: single process, float checkpoint"; exit 1; }
"$fxattn" layer $ce -o "$dir/ref_ce.npy" --threads 1 ||
    { echo "FAIL: single process, FP8 checkpoint"; exit 1; }
check "tp 2, FP8 checkpoint" "$ce --tp 2" close "$dir/ref_ce.npy"

# Tensor and context parallel together: T x U x R = 4 ranks.
np=4
check "tp 2 x ring 2" "$g --tp 2 --ring 2" close "$dir/ref.npy"
check "tp 2 x ring 2, bf16" "$g --dtype bf16 --tp 2 --ring 2" close "$dir/ref_bf16.npy" 0.0078125
check "tp 2 x Ulysses 2" "$g --tp 2 --ulysses 2" close "$dir/ref.npy"
check "tp 2 x Ulysses 2, 5 heads, --fp8" "$g5 --fp8 --tp 2 --ulysses 2" close \
    "$dir/ref5_fp8.npy"
check "tp 2 x ring 2, float checkpoint, -x" "$cf -x $dir/x.npy --tp 2 --ring 2" close \
    "$dir/ref_cf.npy"
check "tp 2 x Ulysses 2, FP8 checkpoint" "$ce --tp 2 --ulysses 2 --ring 1" close \
    "$dir/ref_ce.npy"
expect_error "--tp 2 --ring 3 on 4 ranks" "needs 6 ranks" --grid 1,2,3 --heads 4 --dim 8 \
    --tp 2 --ring 3
expect_error "--tp 2 --ulysses 3 on 4 ranks" "multiple of 6 ranks" --grid 1,2,3 --heads 4 \
    --dim 8 --tp 2 --ulysses 3
expect_error "--tp 2 --ring 2, 1 head" "cannot be split" --grid 1,2,3 --heads 1 --dim 8 --tp 2 \
    --ring 2
exit $fail
