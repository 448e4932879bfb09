#!/usr/bin/env python3
"""fxattn.scaled_dot_product_attention against torch's
scaled_dot_product_attention on the CPU, side by side in one process.

    .venv/bin/python bench/python_sdpa.py [--seqs 1024,4096,16384] [--heads 1] [--dim 128]
        [--threads 2] [--repeats 3] [--json FILE --machine NAME]
    .venv/bin/python bench/python_sdpa.py --seqs 256 --repeats 1     # a quick check (seconds)

For each S in --seqs, fp32 and bf16 inputs, non-causal and causal
(is_causal=True), the same call on the same q, k, v ~ N(0, 1) [1, H, S, D]
(contiguous [B, H, S, D] tensors, SDPA's layout) goes to both:
  - torch.nn.functional.scaled_dot_product_attention, on
    torch.set_num_threads(--threads) threads;
  - fxattn.scaled_dot_product_attention(..., threads=--threads), with its
    default compute: fp32 for fp32 inputs; for bf16 inputs the one
    fxattn.compute_choice names for this machine (bf16 products with fp32
    accumulation where its tile is the faster, else fp32 compute).
    --bf16-computes auto,bf16,fp32 times bf16 inputs once per compute named
    (each beside torch), so that one run shows what the choice gained.
First one call of each, whose outputs must agree (max |fxattn - torch| <
1e-4 for fp32, < 2^-5 max|v| for bf16, whose early causal rows are a few
of v's rows rounded to bf16; otherwise exit 1); these calls are the
warm-up. Then --repeats rounds, each timing both calls once, fxattn first in
even rounds and torch first in odd ones, so that the machine's drift
touches both alike; the table gives medians.

GFLOP/s counts 4 S^2 H D per non-causal call and half of it, 2 S^2 H D, per
causal call (the keys a causal query row attends, summed over the rows, are
S(S+1)/2). % peak: of the machine's peak from the `fxattn bench` probe the
package ships (fp32 rows: the FMA peak; bf16 rows: the peak of the units
fxattn's bf16 compute runs on, AMX tdpbf16ps, else vdpbf16ps, else the FMA
peak; a bf16 row computed in fp32: the FMA peak) on --threads threads. fxattn / torch: torch's seconds over fxattn's
(> 1: fxattn is faster). cpu f/t: the same ratio of the CPU seconds each
call takes on all the process's threads (time.process_time, medians):
other jobs on a shared machine stretch the elapsed times, much less the
CPU seconds.

The default --heads 1 keeps a run short: at S 16384 (137 GFLOP per
non-causal call at D 128) the 8 calls of a round take ~10-15 s on 2 cores
and the whole S 16384 set, warm-up and 3 rounds, about a minute. Every
head is the same independent problem, so more heads add time and not
information.

--json FILE appends one JSON object per (S, dtype, causal) to FILE
(bench/README.md, "Raw results"; kind python_sdpa).
"""

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import diffusers
import torch
import torch.nn.functional as F
from benchlib import append_jsonl, cpu_name, identity, peak_gflops

import fxattn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# max |fxattn - torch|: fp32 rounding (absolute); for bf16 times max|v|: each engine's bf16 products and
# bf16 output are within a few bf16 ulps (2^-8 relative) of the exact output, itself at most max|v|.
TOLERANCE = {"fp32": 1e-4, "bf16": 2.0**-5}


def alternating_medians(fx, ref, repeats):
    """(median seconds of fx, of ref, median CPU seconds of fx, of ref) over
    `repeats` rounds, each timing both once: fx first in even rounds, ref
    first in odd ones. CPU seconds: the process's, all threads
    (time.process_time), which other jobs on a shared machine change far
    less than the elapsed time."""
    times = {fx: [], ref: []}
    cpu = {fx: [], ref: []}
    for r in range(repeats):
        for fn in (fx, ref) if r % 2 == 0 else (ref, fx):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            times[fn].append(time.perf_counter() - t0)
            cpu[fn].append(time.process_time() - c0)
    med = statistics.median
    return med(times[fx]), med(times[ref]), med(cpu[fx]), med(cpu[ref])


def run_case(a, s, dt, causal, peaks, compute="auto"):
    """One (S, dtype, causal, fxattn compute) case: checked, then timed;
    returns its record."""
    h, d, t = a.heads, a.dim, a.threads
    ran = "fp32" if dt == "fp32" else compute if compute != "auto" else fxattn.compute_choice(DTYPES[dt], d, t).compute
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, s, d, generator=g).to(DTYPES[dt]) for _ in range(3))

    def fx():
        return fxattn.scaled_dot_product_attention(q, k, v, is_causal=causal, threads=t, compute=compute)

    def ref():
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    diff = float((fx().float() - ref().float()).abs().max())
    limit = TOLERANCE[dt] * (float(v.float().abs().max()) if dt == "bf16" else 1.0)
    if not diff < limit:
        sys.exit(f"python_sdpa.py: S {s} {dt} causal={causal}: max |fxattn - torch| = {diff:.3e}, above {limit:.3e}")
    fx_s, torch_s, fx_cpu, torch_cpu = alternating_medians(fx, ref, a.repeats)
    flops = (2.0 if causal else 4.0) * s * s * h * d
    peak = ran
    return {
        "kind": "python_sdpa",
        "B": 1,
        "S": s,
        "H": h,
        "D": d,
        "dtype": dt,
        "compute": ran,
        "compute_option": compute,
        "causal": causal,
        "threads": t,
        "repeats": a.repeats,
        "gflop": flops / 1e9,
        "fxattn_seconds": fx_s,
        "fxattn_gflops": flops / fx_s / 1e9,
        "fxattn_peak_share": flops / fx_s / 1e9 / peaks[peak],
        "torch_seconds": torch_s,
        "torch_gflops": flops / torch_s / 1e9,
        "torch_peak_share": flops / torch_s / 1e9 / peaks[peak],
        "fxattn_over_torch": torch_s / fx_s,
        "fxattn_cpu_seconds": fx_cpu,
        "torch_cpu_seconds": torch_cpu,
        "cpu_fxattn_over_torch": torch_cpu / fx_cpu,
        "max_abs_diff": diff,
        "peak": peak,
        "peak_gflops": peaks[peak],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", "--seq", default="1024,4096,16384", help="sequence lengths S, query = key (comma list)")
    ap.add_argument("--heads", type=int, default=1, help="heads H (default 1: S 16384 in about a minute on 2 cores)")
    ap.add_argument("--dim", type=int, default=128, help="head dim D")
    ap.add_argument("--threads", type=int, default=2, help="threads of both (torch.set_num_threads, fxattn threads=)")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (medians reported)")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--causal", default="no,yes", help="non-causal (no), causal (yes) or both (no,yes)")
    ap.add_argument("--bf16-computes", default="auto", help="fxattn computes timed on bf16 inputs: auto, bf16, fp32 (comma list)")
    ap.add_argument("--json", metavar="FILE", help="append one JSON object per row to FILE (- for stdout)")
    ap.add_argument("--machine", default=platform.node(), help="the results page's name for --json (default: host name)")
    a = ap.parse_args()
    dtypes = a.dtypes.split(",")
    if any(dt not in DTYPES for dt in dtypes):
        ap.error(f"--dtypes: {a.dtypes!r}: fp32, bf16 or both")
    bf16_computes = a.bf16_computes.split(",")
    if any(c not in ("auto", "bf16", "fp32") for c in bf16_computes):
        ap.error(f"--bf16-computes: {a.bf16_computes!r}: auto, bf16, fp32 (comma list)")
    modes = a.causal.split(",")
    if any(m not in ("no", "yes") for m in modes):
        ap.error(f"--causal: {a.causal!r}: no, yes or no,yes")
    if a.repeats < 1 or a.heads < 1 or a.threads < 1:
        ap.error("--repeats, --heads and --threads must be at least 1")
    torch.set_num_threads(a.threads)
    peaks = {"fp32": peak_gflops(a.threads, "fp32")}
    peaks["bf16"] = peak_gflops(a.threads, "bf16") or peaks["fp32"]  # 0: no bf16 dot units on this CPU
    kernels = fxattn.kernel_info(a.threads)
    print(f"# fxattn {fxattn.__version__} ({kernels}), torch {torch.__version__}, diffusers {diffusers.__version__}")
    print(
        f"# python {platform.python_version()}, {cpu_name()}, {os.cpu_count()} CPUs; {a.threads} threads; "
        f"[1, {a.heads}, S, {a.dim}]; median of {a.repeats} alternating rounds after a checked warm-up"
    )
    print(f"# peaks (fxattn bench probe): fp32 {peaks['fp32']:.1f}, bf16 {peaks['bf16']:.1f} GFLOP/s; GFLOP = 4 S^2 H D, causal half of it")
    choice = fxattn.compute_choice("bfloat16", a.dim, a.threads)
    print(
        f"# compute auto for bf16 at D {a.dim}: {choice.compute} (one-thread tiles: bf16 {choice.bf16_gflops:.1f}, "
        f"fp32 {choice.fp32_gflops:.1f} GFLOP/s)"
    )
    print(
        f"{'S':>6} {'dtype':5} {'compute':10} {'causal':6} {'fxattn s':>9} {'GFLOP/s':>8} {'% peak':>7} "
        f"{'torch s':>9} {'GFLOP/s':>8} {'% peak':>7} {'fx/torch':>8} {'cpu f/t':>8} {'max|diff|':>9}",
        flush=True,
    )
    recs = []
    for s in (int(x) for x in str(a.seqs).split(",") if x):
        for dt, compute in [(d, c) for d in dtypes for c in (bf16_computes if d == "bf16" else ["auto"])]:
            for causal in (m == "yes" for m in modes):
                r = run_case(a, s, dt, causal, peaks, compute)
                recs.append(r)
                shown = f"{r['compute']}" + (" (auto)" if compute == "auto" and dt == "bf16" else "")
                print(
                    f"{s:6d} {dt:5} {shown:10} {'yes' if causal else 'no':6} {r['fxattn_seconds']:9.4f} "
                    f"{r['fxattn_gflops']:8.1f} {100 * r['fxattn_peak_share']:6.1f}% {r['torch_seconds']:9.4f} "
                    f"{r['torch_gflops']:8.1f} {100 * r['torch_peak_share']:6.1f}% "
                    f"{r['fxattn_over_torch']:7.2f}x {r['cpu_fxattn_over_torch']:7.2f}x {r['max_abs_diff']:9.2e}",
                    flush=True,
                )
    if a.json:
        versions = {"fxattn": fxattn.__version__, "torch": torch.__version__, "diffusers": diffusers.__version__}
        ident = identity(a.machine, Path(os.environ.get("FXATTN_LIBRARY_PATH", "build/lib")).parent, versions)
        append_jsonl(a.json, [{**ident, **r, "kernels": kernels} for r in recs])


if __name__ == "__main__":
    main()
