"""fxattn's Python binding against the C library, torch's
scaled_dot_product_attention and ONNX Runtime, side by side in one process.

    .venv/bin/python bench/python_attention.py [--seqs 1024,4096] [--heads 40] [--repeats 5] [--threads 2]
        [--json FILE --machine NAME]

(.venv is the environment scripts/test.sh makes, with the torch extra;
onnxruntime and onnx are optional: bench/requirements.txt pins the versions
bench/peers uses.) Each S in --seqs gets its own table.

Rows, each the median of --repeats rounds (every round times each row once,
in turn, after one warm-up each), on the same
q, k, v ~ N(0, 1) [1, S, H, 128] (BSHD memory; torch gets the [B, H, S, D]
transposed views, which fxattn takes without a copy):
  - C library: fxa_attn_run on a prepared plan, output and workspace (the
    wall time of the ctypes call), the floor the binding adds to;
  - fxattn.attention on numpy arrays and on torch tensors: the whole
    Python call (checks, plan cache lookup, output allocation), whose
    overhead over the C row is reported;
  - torch SDPA fp32 and bf16 (torch.set_num_threads(--threads)) and
    fxattn on the same bf16 tensors (fp32 compute, and bf16 compute: AMX
    tdpbf16ps on CPUs with AMX-BF16, vdpbf16ps on CPUs with AVX512-BF16,
    elsewhere a portable tile);
  - ONNX Runtime's fused com.microsoft MultiHeadAttention (CPU, fp32: its
    CPU kernel takes float only) on [1, S, H D] views of the same q, k, v,
    with --threads intra-op threads and spinning off (as bench/peers runs
    it), when onnxruntime and onnx are installed.
GFLOP/s = 4 S^2 H D / seconds; % of the machine's peak from the `fxattn
bench` probe the wheel ships (fp32 FMA peak; the bf16 rows' peak of the
units fxattn's bf16 tile runs on: AMX tdpbf16ps, else vdpbf16ps, else the
FMA peak). The outputs are checked against
each other before anything is timed. --json FILE appends one JSON object
per row to FILE (bench/README.md, "Raw results").
"""

import argparse
import ctypes
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from benchlib import append_jsonl, cpu_name, identity, ort_mha_session, peak_gflops

import fxattn
from fxattn import _capi
from fxattn._common.context import context
from fxattn.attn.inputs import Inputs
from fxattn.attn.options import Options


def interleaved_medians(calls, repeats):
    """Median seconds of each call over `repeats` rounds, every round timing
    each call once in turn (after one warm-up each), so that the machine's
    drift touches all of them alike. A call returns its own seconds or None
    (then its wall time counts)."""
    for fn in calls.values():
        fn()  # warm-up: plans, workspaces, pages
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            t = time.perf_counter()
            own = fn()
            times[name].append(own if isinstance(own, float) else time.perf_counter() - t)
    return {name: statistics.median(x) for name, x in times.items()}


def c_library_call(q, k, v, threads):
    """A call of fxa_attn_run alone on a prepared plan, output buffer and
    workspace, returning the wall time of the C call (its input checks
    included)."""
    opts = Options.parse(None, "bshd", compute="fp32", threads=threads)
    x = Inputs.of(q, k, v, "bshd")
    d = x.descriptor(opts, _capi.F32)
    out = np.empty(q.shape, np.float32)
    ctx = context(threads)

    def call():
        with ctx.lock:
            plan = ctx.plan(d)
            ws = ctx.workspace(plan.workspace_bytes)
            args = _capi.new(_capi.AttnArgs, q=x.q.ptr, k=x.k.ptr, v=x.v.ptr, out=out.ctypes.data)
            t0 = time.perf_counter()
            status = _capi.core.fxa_attn_run(plan.handle, ctypes.byref(args), ws, None)
            seconds = time.perf_counter() - t0
            _capi.raise_status(status, ctx.last_error())
        return seconds

    return call


def onnxruntime_mha(s, h, d, threads):
    """(onnxruntime module, a call running com.microsoft MultiHeadAttention
    on fp32 [1, S, H D] feeds), or (None, the reason) when onnxruntime or
    onnx is missing."""
    try:
        import onnx
        import onnxruntime as ort

        sess = ort_mha_session(1, s, h, d, threads)
    except ImportError as e:
        return None, str(e)
    ort.onnx_version = onnx.__version__
    return ort, sess


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", "--seq", default="1024,4096", help="sequence lengths S (comma list)")
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="FILE", help="append one JSON object per row to FILE (- for stdout)")
    ap.add_argument("--machine", default=platform.node(), help="the results page's name for --json (default: host name)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    peaks = {"fp32": peak_gflops(a.threads, "fp32")}
    peaks["bf16"] = peak_gflops(a.threads, "bf16") or peaks["fp32"]  # 0: no bf16 dot units on this CPU
    for s in (int(x) for x in str(a.seqs).split(",") if x):
        run_seq(a, s, peaks)


def run_seq(a, s, peaks):
    h, d, t = a.heads, a.dim, a.threads
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, s, h, d), dtype=np.float32) for _ in range(3))
    tq, tk, tv = (torch.from_numpy(x).transpose(1, 2) for x in (q, k, v))  # [B, H, S, D] views
    bq, bk, bv = (x.to(torch.bfloat16) for x in (tq, tk, tv))
    flops = 4.0 * s * s * h * d

    def fx(qq, kk, vv, **kw):
        return fxattn.attention(qq, kk, vv, layout="bhsd", threads=t, **kw)

    # Agreement first (fp32 rounding for fp32; bf16 output rounding and bf16 products for bf16).
    ref = F.scaled_dot_product_attention(tq, tk, tv)
    assert float((fx(tq, tk, tv) - ref).abs().max()) < 1e-4
    ref_b = F.scaled_dot_product_attention(bq, bk, bv).float()
    assert float((fx(bq, bk, bv).float() - ref_b).abs().max()) < 2e-2
    vdpbf16ps = "portable" not in fxattn.kernel_info(t).split("bf16 compute:")[-1]
    if vdpbf16ps:
        assert float((fx(bq, bk, bv, compute="bf16").float() - ref_b).abs().max()) < 2e-2

    ort, sess = onnxruntime_mha(s, h, d, t)
    if ort is not None:
        feeds = {n: x.reshape(1, s, h * d) for n, x in zip("qkv", (q, k, v))}  # views, same memory
        o = sess.run(None, feeds)[0].reshape(q.shape)
        assert float(np.abs(o - ref.transpose(1, 2).numpy()).max()) < 1e-4

    sdpa = F.scaled_dot_product_attention
    # name: (peak, engine, api, dtype, compute, call)
    calls = {
        "C library fxa_attn_run (fp32)": ("fp32", "fxattn", "C fxa_attn_run", "fp32", "fp32", c_library_call(q, k, v, t)),
        "fxattn.attention numpy fp32": (
            "fp32",
            "fxattn",
            "fxattn.attention, numpy",
            "fp32",
            "fp32",
            lambda: fxattn.attention(q, k, v, threads=t, layout="bshd"),
        ),
        "fxattn.attention torch fp32": ("fp32", "fxattn", "fxattn.attention, torch", "fp32", "fp32", lambda: fx(tq, tk, tv)),
        "torch SDPA fp32": ("fp32", "torch SDPA", "scaled_dot_product_attention", "fp32", "fp32", lambda: sdpa(tq, tk, tv)),
        "fxattn.attention torch bf16": ("fp32", "fxattn", "fxattn.attention, torch", "bf16", "fp32", lambda: fx(bq, bk, bv)),
    }
    if vdpbf16ps:  # elsewhere bf16 compute runs a portable tile, far slower than fp32
        calls["fxattn.attention torch bf16, compute bf16"] = (
            "bf16",
            "fxattn",
            "fxattn.attention, torch",
            "bf16",
            "bf16",
            lambda: fx(bq, bk, bv, compute="bf16"),
        )
    calls["torch SDPA bf16"] = ("bf16", "torch SDPA", "scaled_dot_product_attention", "bf16", "bf16", lambda: sdpa(bq, bk, bv))
    if ort is not None:
        calls["ONNX Runtime MultiHeadAttention fp32"] = (
            "fp32",
            "ONNX Runtime",
            "MultiHeadAttention",
            "fp32",
            "fp32",
            lambda: sess.run(None, feeds),
        )
    medians = interleaved_medians({name: c[-1] for name, c in calls.items()}, a.repeats)
    rows = [(name, c[0], medians[name]) for name, c in calls.items()]
    if a.json:
        versions = {"fxattn": fxattn.__version__, "torch": torch.__version__, "numpy": np.__version__}
        if ort is not None:
            versions.update(onnxruntime=ort.__version__, onnx=ort.onnx_version)
        build = Path(os.environ.get("FXATTN_LIBRARY_PATH", "build/lib")).parent
        ident = identity(a.machine, build, versions)
        append_jsonl(
            a.json,
            [
                {
                    **ident,
                    "kind": "python_attention",
                    "engine": calls[name][1],
                    "api": calls[name][2],
                    "dtype": calls[name][3],
                    "compute": calls[name][4],
                    "B": 1,
                    "S": s,
                    "H": h,
                    "D": d,
                    "threads": t,
                    "kernels": fxattn.kernel_info(t),
                    "repeats": a.repeats,
                    "seconds": sec,
                    "gflops": flops / sec / 1e9,
                    "peak": kind,
                    "peak_gflops": peaks[kind],
                    "peak_share": flops / sec / 1e9 / peaks[kind],
                }
                for name, kind, sec in rows
            ],
        )
    versions = f"onnxruntime {ort.__version__}, onnx {ort.onnx_version}" if ort is not None else f"no ONNX Runtime ({sess})"
    print(f"\n# fxattn {fxattn.__version__} ({fxattn.kernel_info(t)}), torch {torch.__version__}, {versions}, numpy {np.__version__}")
    print(f"# python {platform.python_version()}, {cpu_name()}, {os.cpu_count()} CPUs")
    print(f"# S={s} H={h} D={d} threads={t}, median of {a.repeats} interleaved rounds; peaks {peaks} GFLOP/s")
    print(f"{'what':44s} {'seconds':>8s} {'GFLOP/s':>8s} {'% peak':>7s}")
    for name, kind, sec in rows:
        gf = flops / sec / 1e9
        print(f"{name:44s} {sec:8.3f} {gf:8.1f} {100 * gf / peaks[kind]:6.1f}%")
    sec = {name: x for name, _, x in rows}
    c = sec["C library fxa_attn_run (fp32)"]
    print(
        f"python overhead over the C library: numpy {100 * (sec['fxattn.attention numpy fp32'] / c - 1):+.2f}%, "
        f"torch {100 * (sec['fxattn.attention torch fp32'] / c - 1):+.2f}%"
    )
    line = (
        f"SDPA / fxattn: fp32 {sec['torch SDPA fp32'] / sec['fxattn.attention torch fp32']:.2f}x, "
        f"bf16 {sec['torch SDPA bf16'] / sec['fxattn.attention torch bf16']:.2f}x"
    )
    if vdpbf16ps:
        line += f" (bf16 compute {sec['torch SDPA bf16'] / sec['fxattn.attention torch bf16, compute bf16']:.2f}x)"
    print(line)
    if ort is not None:
        line = f"ONNX Runtime fp32 / fxattn: fp32 {sec['ONNX Runtime MultiHeadAttention fp32'] / sec['fxattn.attention torch fp32']:.2f}x"
        if vdpbf16ps:
            line += f", bf16 compute {sec['ONNX Runtime MultiHeadAttention fp32'] / sec['fxattn.attention torch bf16, compute bf16']:.2f}x"
        print(line)


if __name__ == "__main__":
    main()
