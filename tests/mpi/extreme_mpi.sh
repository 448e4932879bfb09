#!/usr/bin/env bash
# "Exact or refused" under mpirun: inputs at the edges of fp32 (q.k far past
# FLT_MAX while the scaled scores fit, scales up to 3e38 and 1e300, norms
# near 1e19, subnormal q and k) through `fxattn attn` on one process and on
# ring, Ulysses and 2-D grids of 2 and 4 ranks. Each run either exits 0 with
# an output within 1e-5 max|v| of attention in double (computed here, in
# Python, from the same float32 inputs) and an LSE within 1e-5 of its
# magnitude, or exits 2 with `fxattn: error:` naming the fp32 range and
# writes nothing; every grid answers like the single process.
# Usage: extreme_mpi.sh MPIRUN FXATTN
# shellcheck source=tests/mpi/mpi_lib.sh
. "$(dirname "$0")/mpi_lib.sh"

# Cases: NAME SCALE; files NAME_{q,k,v}.npy and NAME_ref.txt (expected out
# and lse in double, or "refuse").
python3 - "$dir" >"$dir/cases" <<'EOF' || { echo "FAIL: cannot write the inputs"; exit 1; }
import math, struct, sys
d = sys.argv[1]
S, H, D = 5, 2, 4
state = 7
def rnd():
    global state
    state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
    return (state >> 40) / 2**24 - 0.5
def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]
def npy(path, vals):
    hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (1, %d, %d, %d), }" % (S, H, D)
    hdr += " " * (64 - (10 + len(hdr) + 1) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
        f.write(struct.pack("<%df" % len(vals), *vals))
def at(t, s, h, c):
    return t[(s * H + h) * D + c]
def case(name, qs, ks, scale, refuse=False):
    q = [f32(qs * rnd()) for _ in range(S * H * D)]
    k = [f32(ks * rnd()) for _ in range(S * H * D)]
    v = [f32(rnd()) for _ in range(S * H * D)]
    for t, x in (("q", q), ("k", k), ("v", v)):
        npy("%s/%s_%s.npy" % (d, name, t), x)
    with open("%s/%s_ref.txt" % (d, name), "w") as f:
        if refuse:
            f.write("refuse\n")
        else:
            for h in range(H):
                for i in range(S):
                    z = [scale * sum(at(q, i, h, c) * at(k, j, h, c) for c in range(D))
                         for j in range(S)]
                    m = max(z)
                    w = [math.exp(x - m) for x in z]
                    l = sum(w)
                    o = [sum(w[j] * at(v, j, h, c) for j in range(S)) / l for c in range(D)]
                    f.write("%d %d %s %r\n" % (h, i, " ".join(repr(x) for x in o), m + math.log(l)))
    print(name, repr(scale))
case("qk_past_fp32", 4e19, 4e19, 1e-38)        # q.k up to ~1e39, scores ~1-10
case("qk_one_hot", 2e19, 2e19, 0.5)             # q.k past FLT_MAX, scores ~1e38
case("norms_1e19", 1e19, 1e19, 1e-37)           # q.k ~ 1e37..1e38, scores ~1
case("scale_3e38", 1.0, 1e-38, 3e38)            # the scale near FLT_MAX
case("subnormal", 1e-20, 1e-20, 1.0)            # q.k underflows fp32
case("scale_1e300", 1.0, 1.0, 1e300, refuse=True)
EOF

# check NAME LABEL EXIT: the run's output against NAME_ref.txt.
check() {
    local name=$1 label=$2 rc=$3
    if grep -q '^refuse' "$dir/${name}_ref.txt"; then
        [ "$rc" = 2 ] || bad "$label: exit $rc, expected a refusal (2)"
        grep -q "fxattn: error:.*fp32 range" "$dir/err" || bad "$label: no message naming the fp32 range"
        [ ! -e "$dir/out.npy" ] && [ ! -e "$dir/lse.npy" ] || bad "$label: refused but wrote output"
        echo "$label: refused: $(head -1 "$dir/err")"
        return
    fi
    [ "$rc" = 0 ] || { cat "$dir/err"; bad "$label: exit $rc"; return; }
    python3 - "$dir" "$name" "$label" <<'EOF' || fail=1
import struct, sys
d, name, label = sys.argv[1:4]
def load(path):
    b = open(path, "rb").read()
    n = struct.unpack("<H", b[8:10])[0]
    data = b[10 + n:]
    return struct.unpack("<%df" % (len(data) // 4), data)
S, H, D = 5, 2, 4
out, lse = load(d + "/out.npy"), load(d + "/lse.npy")
worst_o = worst_l = 0.0
for line in open("%s/%s_ref.txt" % (d, name)):
    f = line.split()
    h, i = int(f[0]), int(f[1])
    o, l = [float(x) for x in f[2:2 + D]], float(f[2 + D])
    for c in range(D):
        worst_o = max(worst_o, abs(out[(i * H + h) * D + c] - o[c]))
    worst_l = max(worst_l, abs(lse[h * S + i] - l) / max(abs(l), 1.0))
ok = worst_o <= 1e-5 * 0.5 and worst_l <= 1e-5  # max|v| <= 0.5
print("%s: max |out - exact| %.3g, lse %.3g relative%s" % (label, worst_o, worst_l, "" if ok else "  FAIL"))
sys.exit(0 if ok else 1)
EOF
}

while read -r name scale; do
    files="-q $dir/${name}_q.npy -k $dir/${name}_k.npy -v $dir/${name}_v.npy --scale $scale"
    rm -f "$dir/out.npy" "$dir/lse.npy"
    # shellcheck disable=SC2086
    "$fxattn" attn $files -o "$dir/out.npy" --lse "$dir/lse.npy" --threads 1 </dev/null 2>"$dir/err"
    check "$name" "$name, one process" $?
    for grid in "2 1 2" "2 2 1" "4 2 2" "4 1 4"; do
        read -r np u r <<<"$grid"
        rm -f "$dir/out.npy" "$dir/lse.npy"
        # shellcheck disable=SC2086
        run -np "$np" "$fxattn" attn $files -o "$dir/out.npy" --lse "$dir/lse.npy" \
            --ulysses "$u" --ring "$r" --threads 1 </dev/null >/dev/null 2>"$dir/err"
        check "$name" "$name, Ulysses $u x ring $r" $?
    done
done <"$dir/cases"
exit $fail
