"""Long-sequence attention on the shapes Wan2.2 runs: fxattn against ONNX
Runtime and torch SDPA in one process.

    python bench/long_seq.py [--shapes 4096:8,16384:2,27648:1,32760:1,75600:1:8192]
        [--rows "fxattn fp32,ONNX Runtime fp32"] [--repeats 3] [--threads 2] [--no-rss]
        [--peak-core 116,231.5] [--json FILE --machine NAME]

(Any Python with numpy and torch; onnxruntime and onnx when installed:
bench/requirements.txt pins the versions bench/peers uses. Run the tree's
package with FXATTN_LIBRARY_PATH=build/lib PYTHONPATH=python/src.)

Shapes are S:H[:Sq]: S key tokens, H heads run (D = 128), and Sq query
rows (default S). The Wan2.2 models run 24 heads (TI2V-5B, S 27648) or 40
(A14B, S 32760 and 75600) per layer; every head is the same independent
problem (its own K and V of S x 128), so one head shows the per-head
memory behaviour at that S and the defaults run fewer heads than the model
so that a row takes seconds on 2 cores. At S 75600 the default also runs
only the first 8192 query rows against all 75600 keys: every row still
streams the whole K and V of S 75600 x 128, at a ninth of the time.

Rows, each the median of --repeats interleaved rounds (each round times
every row once in turn, after one warm-up each), on the same q, k, v ~
N(0, 1) [1, S, H, 128] (BSHD memory; torch gets [B, H, S, D] views):
  - fxattn.attention fp32, fixed-max (mode auto) and online;
  - fxattn on bf16 inputs: fp32 compute, and bf16 compute (vdpbf16ps or
    AMX tdpbf16ps; skipped where only the portable tile runs) fixed-max
    and online;
  - torch SDPA fp32 and bf16 (torch.set_num_threads(--threads));
  - ONNX Runtime's fused com.microsoft MultiHeadAttention fp32 (--threads
    intra-op threads, spinning off).
--rows picks rows by name (torch SDPA of each dtype run is added: the
outputs are checked against it first). GFLOP/s = 4 Sq S H D /
seconds; % peak: of the fp32 FMA peak (bf16 compute rows: of the bf16
peak) that `fxattn bench` measures before and after each shape (the
largest probe is used; a probe under 90% of the best flags the shape).
CPU s: the process's CPU seconds in the call (every thread; torch's OpenMP
workers told to sleep when idle, OMP_WAIT_POLICY=PASSIVE unless set), and
CPU % peak the rate per busy core-second over the peak per thread (the
probe's, or --peak-core): on a shared machine, where other processes take
the cores, it still shows how well a row uses the cycles it gets; CPU
ORT/row and CPU SDPA/row compare CPU seconds the same way.
Peak RSS: each row's first call on the shape, alone in a fresh child
process (after one call on 64 tokens that loads its code), as the growth of
the peak resident set (VmHWM) over the resident set with the inputs made:
outputs, workspaces and copies included (--no-rss skips it).
--json FILE appends one object per row (kind "long_seq", bench/README.md).
"""

import argparse
import json
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's idle OpenMP workers would bill the next row's CPU time
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from benchlib import append_jsonl, cold_peak_rss_mib, cpu_name, identity, ort_mha_session, peak_gflops

import fxattn

D = 128

# name -> (engine, dtype, compute, mode, peak kind)
ROWS = {
    "fxattn fp32": ("fxattn", "fp32", "fp32", "auto", "fp32"),
    "fxattn fp32 online": ("fxattn", "fp32", "fp32", "online", "fp32"),
    "fxattn bf16 in, fp32 compute": ("fxattn", "bf16", "fp32", "auto", "fp32"),
    "fxattn bf16 compute": ("fxattn", "bf16", "bf16", "auto", "bf16"),
    "fxattn bf16 compute online": ("fxattn", "bf16", "bf16", "online", "bf16"),
    "torch SDPA fp32": ("torch SDPA", "fp32", "fp32", None, "fp32"),
    "torch SDPA bf16": ("torch SDPA", "bf16", "bf16", None, "bf16"),
    "ONNX Runtime fp32": ("ONNX Runtime", "fp32", "fp32", None, "fp32"),
}


def parse_shapes(text):
    shapes = []
    for item in text.split(","):
        parts = [int(x) for x in item.split(":")]
        if len(parts) not in (2, 3) or min(parts) < 1:
            raise argparse.ArgumentTypeError(f"shape {item!r} is not S:H or S:H:Sq")
        s, h = parts[:2]
        shapes.append((s, h, parts[2] if len(parts) == 3 else s))
    return shapes


def has_bf16_units(threads):
    return "portable" not in fxattn.kernel_info(threads).split("bf16 compute:")[-1]


def make_inputs(s, h, sq):
    rng = np.random.default_rng(0)
    k, v = (rng.standard_normal((1, s, h, D), dtype=np.float32) for _ in range(2))
    q = rng.standard_normal((1, sq, h, D), dtype=np.float32)
    return q, k, v


def make_calls(names, q, k, v, threads):
    """{row name: a call} on the inputs; a call returns its output."""
    s, h, sq = k.shape[1], k.shape[2], q.shape[1]
    tq, tk, tv = (torch.from_numpy(x).transpose(1, 2) for x in (q, k, v))  # [B, H, S, D] views
    bq, bk, bv = (x.to(torch.bfloat16) for x in (tq, tk, tv)) if any("bf16" in n for n in names) else (None,) * 3
    calls = {}
    for name in names:
        engine, dtype, compute, mode, _ = ROWS[name]
        if engine == "fxattn" and dtype == "fp32":
            calls[name] = lambda mode=mode: fxattn.attention(q, k, v, layout="bshd", mode=mode, threads=threads)
        elif engine == "fxattn":
            calls[name] = lambda c=compute, mode=mode: fxattn.attention(bq, bk, bv, layout="bhsd", compute=c, mode=mode, threads=threads)
        elif engine == "torch SDPA":
            x = (tq, tk, tv) if dtype == "fp32" else (bq, bk, bv)
            calls[name] = lambda x=x: F.scaled_dot_product_attention(*x)
        else:
            sess = ort_mha_session(1, s, h, D, threads) if sq == s else ort_cross_session(sq, s, h, threads)
            feeds = {"q": q.reshape(1, sq, h * D), "k": k.reshape(1, s, h * D), "v": v.reshape(1, s, h * D)}
            calls[name] = lambda sess=sess, feeds=feeds: sess.run(None, feeds)[0]
    return calls


def ort_cross_session(sq, s, h, threads):
    """ORT MultiHeadAttention with Sq query rows against S keys."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    vi = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, n_, h * D]) for n, n_ in (("q", sq), ("k", s), ("v", s), ("o", sq))]
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=h)
    model = helper.make_model(
        helper.make_graph([node], "mha", vi[:3], vi[3:]),
        ir_version=8,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def as_bshd(out, name):
    """A row's output as fp32 numpy [1, Sq, H, D]."""
    engine, dtype = ROWS[name][:2]
    if engine == "ONNX Runtime":
        return None  # reshaped by the caller, which knows H
    if isinstance(out, torch.Tensor):
        out = out.float()
        return out.transpose(1, 2).numpy() if (engine == "torch SDPA" or dtype == "bf16") else out.numpy()
    return out


def peak_core(text):
    vals = [float(x) for x in text.split(",")]
    return {"fp32": vals[0], "bf16": vals[1] if len(vals) > 1 else 2 * vals[0]}


def rss_child(name, s, h, sq, threads):
    """Child mode: one cold call of row `name`; prints the growth of VmHWM over VmRSS in MiB."""
    torch.set_num_threads(threads)
    small = make_inputs(64, h, 64)
    make_calls([name], *small, threads)[name]()  # load the call's code paths before the reset
    q, k, v = make_inputs(s, h, sq)
    calls = make_calls([name], q, k, v, threads)
    del small
    print(json.dumps({"peak_rss_mib": cold_peak_rss_mib(calls[name])}))


def peak_rss(name, s, h, sq, threads):
    args = [sys.executable, __file__, "--rss-child", name, "--shapes", f"{s}:{h}:{sq}", "--threads", str(threads)]
    out = subprocess.run(args, capture_output=True, text=True, env=os.environ)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mib"]


def interleaved_medians(calls, repeats):
    """Medians of wall seconds and of this process's CPU seconds (all its
    threads) per row, and every wall time."""
    for fn in calls.values():
        fn()  # warm-up: plans, workspaces, pages
    times = {name: [] for name in calls}
    cpu = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            c, t = time.process_time(), time.perf_counter()
            out = fn()
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
            del out
    med = {name: statistics.median(x) for name, x in times.items()}
    return med, {name: statistics.median(x) for name, x in cpu.items()}, times


def check_outputs(calls, q, names):
    """Every row against torch SDPA of its dtype (fp32 1e-4, bf16 2e-2)."""
    sq, h = q.shape[1], q.shape[2]
    ref = {"fp32": as_bshd(calls["torch SDPA fp32"](), "torch SDPA fp32")}
    if "torch SDPA bf16" in calls:
        ref["bf16"] = as_bshd(calls["torch SDPA bf16"](), "torch SDPA bf16")
    for name in names:
        if ROWS[name][0] == "torch SDPA":
            continue
        out = calls[name]()
        o = out.reshape(1, sq, h, D) if ROWS[name][0] == "ONNX Runtime" else as_bshd(out, name)
        dtype = ROWS[name][1]
        err = float(np.abs(o - ref[dtype]).max())
        tol = 1e-4 if dtype == "fp32" else 2e-2
        if not err < tol:
            raise SystemExit(f"long_seq: {name} differs from torch SDPA {dtype} by {err} (tolerance {tol})")


def run_shape(a, s, h, sq, peaks, names, ident):
    torch.set_num_threads(a.threads)
    q, k, v = make_inputs(s, h, sq)
    calls = make_calls(names, q, k, v, a.threads)
    check_outputs(calls, q, names)
    medians, cpu_s, all_times = interleaved_medians(calls, a.repeats)
    del calls, q, k, v
    probe = peak_gflops(a.threads, "fp32")
    peaks["fp32_all"].append(probe)
    pk = {"fp32": max(peaks["fp32_all"]), "bf16": peaks["bf16"]}
    rss = {name: (None if a.no_rss else peak_rss(name, s, h, sq, a.threads)) for name in names}
    flops = 4.0 * sq * s * h * D
    sec = medians
    print(
        f"\n# S={s} (queries {sq}) H={h} D={D} threads={a.threads}; median of {a.repeats} interleaved rounds; "
        f"peaks fp32 {pk['fp32']:.1f} (probe after this shape {probe:.1f}), bf16 {pk['bf16']:.1f} GFLOP/s"
    )
    print(
        f"{'row':30s} {'seconds':>8s} {'GFLOP/s':>8s} {'% peak':>7s} {'CPU s':>7s} {'CPU %pk':>7s} "
        f"{'ORT/row':>8s} {'SDPA/row':>9s} {'CPU ORT/row':>11s} {'CPU SDPA/row':>12s} {'peak RSS MiB':>12s}"
    )
    recs = []
    ort_s = sec.get("ONNX Runtime fp32")
    for name in names:
        engine, dtype, compute, mode, peak_kind = ROWS[name]
        gf = flops / sec[name] / 1e9
        core_peak = a.peak_core[peak_kind] if a.peak_core else pk[peak_kind] / a.threads
        cpu_share = flops / cpu_s[name] / 1e9 / core_peak  # per busy core-second
        sdpa_s = sec["torch SDPA " + dtype] if dtype == "fp32" or "torch SDPA bf16" in sec else None
        r_ort = ort_s / sec[name] if ort_s else None
        r_sdpa = sdpa_s / sec[name] if sdpa_s else None
        c_ort = cpu_s["ONNX Runtime fp32"] / cpu_s[name] if ort_s else None
        c_sdpa = cpu_s["torch SDPA " + dtype] / cpu_s[name] if sdpa_s else None
        print(
            f"{name:30s} {sec[name]:8.3f} {gf:8.1f} {100 * gf / pk[peak_kind]:6.1f}% "
            f"{cpu_s[name]:7.3f} {100 * cpu_share:6.1f}% "
            f"{'' if r_ort is None else f'{r_ort:7.3f}x':>8s} {'' if r_sdpa is None else f'{r_sdpa:8.3f}x':>9s} "
            f"{'' if c_ort is None else f'{c_ort:10.3f}x':>11s} {'' if c_sdpa is None else f'{c_sdpa:11.3f}x':>12s} "
            f"{'' if rss[name] is None else f'{rss[name]:.0f}':>12s}"
        )
        recs.append(
            {
                **ident,
                "kind": "long_seq",
                "engine": engine,
                "row": name,
                "dtype": dtype,
                "compute": compute,
                "mode": mode,
                "S": s,
                "Sq": sq,
                "H": h,
                "D": D,
                "threads": a.threads,
                "repeats": a.repeats,
                "kernels": fxattn.kernel_info(a.threads),
                "seconds": sec[name],
                "seconds_all": all_times[name],
                "gflops": gf,
                "peak": peak_kind,
                "peak_gflops": pk[peak_kind],
                "peak_share": gf / pk[peak_kind],
                "cpu_seconds": cpu_s[name],
                "cpu_peak_share": cpu_share,
                "probe_ratio": probe / max(peaks["fp32_all"]),
                "ort_over": r_ort,
                "sdpa_over": r_sdpa,
                "ort_over_cpu": c_ort,
                "sdpa_over_cpu": c_sdpa,
                "peak_rss_mib": rss[name],
            }
        )
    if "fxattn fp32 online" in sec:
        print(
            f"fixed-max over online: fp32 {sec['fxattn fp32 online'] / sec['fxattn fp32']:.3f}x"
            + (
                f", bf16 compute {sec['fxattn bf16 compute online'] / sec['fxattn bf16 compute']:.3f}x"
                if "fxattn bf16 compute online" in sec
                else ""
            )
        )
    if probe < 0.9 * max(peaks["fp32_all"]):
        print(
            f"WARNING: the peak probe after S={s} ran at {100 * probe / max(peaks['fp32_all']):.0f}% of the best: "
            "the machine was busy; these rows are suspect"
        )
    sys.stdout.flush()
    return recs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shapes",
        type=parse_shapes,
        default=parse_shapes("4096:8,16384:2,27648:1,32760:1,75600:1:8192"),
        help="S:H[:Sq] list (default: %(default)s)",
    )
    ap.add_argument("--rows", default=None, help="comma list of row names (default: all; see ROWS)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-rss", action="store_true", help="skip the peak-RSS children")
    ap.add_argument(
        "--peak-core",
        type=peak_core,
        default=None,
        metavar="FP32[,BF16]",
        help="per-core peaks (GFLOP/s) for CPU %% peak instead of the probe's per thread, for a machine "
        "too busy to probe (bf16 default: twice fp32)",
    )
    ap.add_argument("--json", metavar="FILE", help="append one JSON object per row to FILE (- for stdout)")
    ap.add_argument("--machine", default=platform.node(), help="the results page's name for --json")
    ap.add_argument("--rss-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.rss_child:
        rss_child(a.rss_child, *a.shapes[0], a.threads)
        return
    names = list(ROWS) if a.rows is None else [n.strip() for n in a.rows.split(",")]
    try:
        import onnx
        import onnxruntime as ort

        versions = {"onnxruntime": ort.__version__, "onnx": onnx.__version__}
    except ImportError as e:
        print(f"# no ONNX Runtime ({e}): its rows are left out")
        names = [n for n in names if ROWS[n][0] != "ONNX Runtime"]
        versions = {}
    if not has_bf16_units(a.threads):
        names = [n for n in names if ROWS[n][2] != "bf16" or ROWS[n][0] != "fxattn"]
    refs = ["torch SDPA fp32"] + (["torch SDPA bf16"] if any(ROWS[n][1] == "bf16" for n in names) else [])
    names += [ref for ref in refs if ref not in names]  # the outputs are checked against them
    versions.update(fxattn=fxattn.__version__, torch=torch.__version__, numpy=np.__version__)
    print(f"# fxattn {fxattn.__version__} ({fxattn.kernel_info(a.threads)})")
    print(
        "# "
        + ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
        + f", python {platform.python_version()}; {cpu_name()}, {os.cpu_count()} CPUs"
    )
    peaks = {"fp32_all": [peak_gflops(a.threads, "fp32")], "bf16": peak_gflops(a.threads, "bf16")}
    peaks["bf16"] = peaks["bf16"] or peaks["fp32_all"][0]  # 0: no bf16 dot units
    build = Path(os.environ.get("FXATTN_LIBRARY_PATH", "build/lib")).parent
    ident = identity(a.machine, build, versions)
    recs = []
    for s, h, sq in a.shapes:
        recs += run_shape(a, s, h, sq, peaks, names, ident)
    if a.json:
        append_jsonl(a.json, recs)


if __name__ == "__main__":
    main()
