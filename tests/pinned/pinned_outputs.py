#!/usr/bin/env python3
"""Pinned outputs: `fxattn attn` and `fxattn layer` on fixed inputs must give
the bytes recorded (SHA-256 of the output .npy) from main before the
libraries were split by purpose (commit 82a4a45). A moved or refactored code
path that changes any bit of a result fails here. The two bf16-compute rows
were recorded again when bf16 compute's exp2 became its own degree-4
polynomial (a deliberate change of the spec: kernels/ref/exp2_ref.h).

The kernels are forced (FXA_ISA=ref and avx2: what every x86-64 CPU with
AVX2 runs the same way) and so is the fp32 GEMM (FXA_PROJ_GEMM=openblas,
which AVX-512 CPUs would otherwise run on oneDNN under Haswell kernels) and
OpenBLAS's kernels (OPENBLAS_CORETYPE=Haswell), with fixed thread counts, so the bytes do not depend on the CPU the test
runs on. The bf16/FP8 projection multiplies in bf16 only where the kernel
set's bf16 products are the faster (never on the forced sets, which have no
bf16 tile of their own), so `layer --fp8` runs its fp32 GEMM everywhere.

    pinned_outputs.py FXATTN [--record]
"""

import hashlib
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import testfiles  # noqa: E402

PINNED = {
    "attn ref": "4789009cdd0cae6e0a69372637a73b1d43d1ecdad8bed89af8aae9ac12a44418:f3cef66ebf343579ea55b67b8c51376da64ec24c47d8b85c5401167ae0974e76",
    "attn ref online": "7be27acdce0cb224b25583aa4483792aa966c4111dc93eb59fdc7d3db57975d3",
    "attn ref bhsd nocenter": "99b488ed3b24620c0d3855713508781bc0a3e68617c29f4ca4f45a80aeaeee67",
    "attn ref bf16": "e404e226bfc8aa4f3612bc1b48dd6975508f0060d69f710b7ea3992dab86015f",
    "attn ref hot": "3f1e0e066f6091b6fee5cc8ed683ce3156aef74b349916f43b049566e153421f",
    "attn avx2": "0ff1e29e2b8dc6c5e432729a1e2815fabdaa9d092d28c5f66da5d24fc0cecf29:e8001754bb3d218f6914a5b79c057b286436e97eb03d0a3d9ac8ec426f684fbd",
    "attn avx2 online": "7a61b7bd953b529b32ad52815e716db1a2592c1dcb4b8feb1a30cb3c98622e8e",
    "attn avx2 bhsd nocenter": "fcb9b43784f42e352a6dcba27b1688812decf487f25a7a3a853799448235f256",
    "attn avx2 bf16": "e404e226bfc8aa4f3612bc1b48dd6975508f0060d69f710b7ea3992dab86015f",
    "attn avx2 hot": "091788e456c45e3a6e2197b693051087a6231652ad5121d9fddc0cae543c6a92",
    "layer synthetic": "9fb23320b0d3e8d21b76727d5adb6f4b995aa925a45b837a90528fb2445b7b0b",
    "layer -x": "4992256203e7e81ae0121ee07c5577e90c0eff3a6452c874388c31fc8392b8df",
    "layer f32 checkpoint": "4e05effc3244682177ada8ecc1ed16b4ecdd033d16855ae87cb623352d9858ea",
    "layer bf16 checkpoint interleaved": "d5b16e50e4d8897715b07d0103ec8d8d78a0f0d3b82fedd539cd2df9dc7bd24b",
    "layer --fp8": "d6ad5852ccaf6e87dd50e0a8a769b9172cf0478a5b43161f48250d85668505b9",
}


def main():
    fxattn = sys.argv[1]
    record = "--record" in sys.argv[2:]
    d = tempfile.mkdtemp()
    p = lambda name: os.path.join(d, name)  # noqa: E731
    # attention inputs: B 2, S 300, H 3, D 64 (BSHD) and the same numbers as BHSD
    shape = (2, 300, 3, 64)
    n = 2 * 300 * 3 * 64
    for name, seed in (("q", 11), ("k", 12), ("v", 13)):
        testfiles.write_npy(p(name + ".npy"), shape, testfiles.lcg(seed, n, 4.0))
    # hot queries: q scaled by 8 (rows whose bound fails the strict gate)
    testfiles.write_npy(p("qh.npy"), shape, testfiles.lcg(11, n, 32.0))
    # layer: hidden 256 = 8 heads x 32, grid 2x3x6 = 36 tokens
    testfiles.write_npy(p("x.npy"), (36, 256), testfiles.lcg(12345, 36 * 256, 3.0))
    testfiles.write_safetensors(p("w32.safetensors"), testfiles.wan_attention_tensors(256, 2))
    testfiles.write_safetensors(p("w16.safetensors"), testfiles.wan_attention_tensors(256, 0, dtype="BF16"))

    qkv = ["-q", p("q.npy"), "-k", p("k.npy"), "-v", p("v.npy")]
    cases = []
    for isa in ("ref", "avx2"):
        cases += [
            ("attn %s" % isa, isa, ["attn"] + qkv + ["--lse", p("lse.npy")]),
            ("attn %s online" % isa, isa, ["attn"] + qkv + ["--mode", "online"]),
            ("attn %s bhsd nocenter" % isa, isa, ["attn"] + qkv + ["--layout", "bhsd", "--center", "off", "--scale", "0.1"]),
            ("attn %s bf16" % isa, isa, ["attn"] + qkv + ["--dtype", "bf16", "--compute", "bf16"]),
            ("attn %s hot" % isa, isa, ["attn", "-q", p("qh.npy"), "-k", p("k.npy"), "-v", p("v.npy")]),
        ]
    g = ["--grid", "2,3,6", "--heads", "8", "--dim", "32"]
    cases += [
        ("layer synthetic", "avx2", ["layer"] + g + ["--seed", "3"]),
        ("layer -x", "avx2", ["layer"] + g + ["--seed", "3", "-x", p("x.npy")]),
        (
            "layer f32 checkpoint",
            "avx2",
            ["layer", "--weights", p("w32.safetensors"), "--block", "2", "-x", p("x.npy"), "--grid", "2,3,6", "--heads", "8"],
        ),
        (
            "layer bf16 checkpoint interleaved",
            "avx2",
            [
                "layer",
                "--weights",
                p("w16.safetensors"),
                "--block",
                "0",
                "-x",
                p("x.npy"),
                "--grid",
                "2,3,6",
                "--heads",
                "8",
                "--rope-layout",
                "interleaved",
            ],
        ),
    ]
    cases.append(("layer --fp8", "avx2", ["layer"] + g + ["--seed", "5", "--fp8"]))

    env = dict(os.environ, OPENBLAS_CORETYPE="Haswell", OPENBLAS_NUM_THREADS="2", FXA_PROJ_GEMM="openblas")
    env.pop("FXA_AUTO_COMPUTE", None)  # the measured choice (fp32 on the forced sets)
    fail = 0
    for name, isa, args in cases:
        out = p("out.npy")
        cmd = [fxattn] + args + ["-o", out, "--threads", "2"]
        r = subprocess.run(cmd, env=dict(env, FXA_ISA=isa), capture_output=True, text=True)
        if r.returncode != 0:
            print("FAIL: %s: exit %d: %s" % (name, r.returncode, r.stderr.strip()))
            fail = 1
            continue
        h = hashlib.sha256(open(out, "rb").read()).hexdigest()
        if name.startswith("attn %s" % isa) and "--lse" in args:
            h += ":" + hashlib.sha256(open(p("lse.npy"), "rb").read()).hexdigest()
        if record:
            print("    %r: %r," % (name, h))
        elif PINNED.get(name) != h:
            print("FAIL: %s: output %s, pinned %s" % (name, h, PINNED.get(name)))
            fail = 1
        else:
            print("ok: %s" % name)
        os.unlink(out)
    for f in os.listdir(d):
        os.unlink(p(f))
    os.rmdir(d)
    sys.exit(fail)


if __name__ == "__main__":
    main()
