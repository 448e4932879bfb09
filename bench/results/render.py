#!/usr/bin/env python3
"""Writes bench/results/ from the raw results in bench/results/raw/: one
page per machine (<machine>.md: its tables with CPU, compiler, library
versions, commit, command and date), the index (README.md) and the plots
(plots/<machine>-attention.svg: GFLOP/s against S for fxattn and its peers;
plots/<machine>-sdpa.svg: scaled_dot_product_attention's GFLOP/s against S,
fxattn and torch; plots/<machine>-long-seq.svg: long_seq's GFLOP per
CPU-second against S, fxattn fp32 and bf16 compute, ONNX Runtime and torch
SDPA, linked from the long_seq section; plots/<machine>-wan-long-seq.svg:
the same for wan_long_seq's Wan layer slices, diffusers against fxattn;
plots/<machine>-layer.svg: the Wan
layer's time by stage). Python's standard
library only; the plots are SVG written by hand.

    bench/results/render.py               # rewrite the pages and plots
    bench/results/render.py --check       # exit 1 when the committed files differ from what raw/ renders
    bench/results/render.py --out DIR     # write into DIR instead
    build/fxattn bench ... --json | bench/results/render.py append --machine zen5 \\
        --kind fxattn_bench --command "fxattn bench ..."     # add the CLI's JSON lines to raw/zen5.jsonl

raw/<machine>.jsonl holds one JSON object per line: one {"kind": "machine"}
line (the page's title and the machine's description), then one object per
measurement, each with machine, cpu, compiler, versions, commit, command,
date and kind (peers, fxattn_bench, long_seq, layer, layer_memory, proj, gemm,
python_attention, python_sdpa, python_backward, python_wan, wan_long_seq,
python_diffusers, mpi_bench, plan_validate) and the fields of the tool that measured it (bench/README.md,
"Raw results").
Exit status: 0 ok (or --check found no difference), 1 a difference or a bad
raw line, 2 bad usage."""

import argparse
import filecmp
import json
import math
import os
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------- tables

# Column: (key, header, format, param). A param column whose value is the same
# on every row of a table is printed once above the table instead.
P, V = True, False
KINDS = {
    "peers": {
        "title": "Attention against ONNX Runtime {onnxruntime}",
        "about": (
            "`bench/peers`: fxattn against ONNX Runtime's fused `com.microsoft` MultiHeadAttention on the same "
            "N(0,1) inputs, outputs checked first; medians. `fx`: fxattn's variant (`f32`; `bf16c` = `--dtype "
            "bf16 --compute bf16` against ORT fp32 on the unrounded inputs, % of the bf16 peak). `others`: "
            "cores other processes used during the timed runs; `probe`: the peak probe after the row over the "
            "best probe ([bench/README.md](../README.md))."
        ),
        "columns": [
            ("B", "B", "{}", P),
            ("H", "H", "{}", P),
            ("D", "D", "{}", P),
            ("repeats", "repeats", "{}", P),
            ("S", "S", "{}", V),
            ("threads", "threads", "{}", P),
            ("ort_path", "ORT path", "{}", P),
            ("ort_seconds", "ORT s", "{:.4f}", V),
            ("ort_gflops", "ORT GFLOP/s", "{:.1f}", V),
            ("ort_pct_peak", "ORT % peak", "{:.1f}%", V),
            ("fxattn_dtype", "fx", "`{}`", V),
            ("fxattn_seconds", "fx s", "{:.4f}", V),
            ("fxattn_gflops", "fx GFLOP/s", "{:.1f}", V),
            ("fxattn_pct_peak", "fx % peak", "{:.1f}%", V),
            ("speed_fxattn_over_ort", "ORT s / fx s", "{:.3f}x", V),
            ("max_abs_diff", "max\\|diff\\|", "{:.2e}", V),
            ("others_cores_max", "others", "{:.2f}", V),
            ("peak_probe_ratio", "probe", "{:.0%}", V),
        ],
    },
    "fxattn_bench": {
        "title": "`fxattn bench`",
        "about": (
            "Attention on Wan-like synthetic data, fixed-max (`auto`) and online alternately after a warm-up; "
            "medians; the share of the peak measured in the same process "
            "([cli.md](../../docs/cli.md#fxattn-bench))."
        ),
        "columns": [
            ("seq", "S", "{}", P),
            ("heads", "heads", "{}", P),
            ("dim", "D", "{}", P),
            ("dtype", "dtype", "{}", P),
            ("compute", "compute", "{}", P),
            ("threads", "threads", "{}", P),
            ("isa", "kernels", "`{}`", P),
            ("mode", "mode", "{}", P),
            ("peak_gflops", "peak GFLOP/s", "{:.1f}", P),
            ("seconds_median", "seconds", "{:.3f}", V),
            ("seconds_best", "best", "{:.3f}", V),
            ("gflops", "GFLOP/s", "{:.1f}", V),
            ("fraction_of_peak", "% peak", "{:.1%}", V),
            ("fallback_rows", "fallback rows", "{}", V),
            ("rows", "rows", "{}", P),
            ("fixed_over_online", "fixed-max over online", "{:.3f}x", V),
            ("bound_pass_seconds_median", "bound pass s", "{:.4f}", V),
            ("bound_pass_share", "bound pass share", "{:.1%}", V),
        ],
    },
    "layer": {
        "title": "The Wan layer: `fxattn layer`",
        "about": (
            "One Wan2.2 self-attention layer (QKV projection with RMSNorm and RoPE, attention, output "
            "projection); stage times from `--stats`; medians."
        ),
        "columns": [
            ("grid", "grid", "grid", P),
            ("tokens", "S", "{}", P),
            ("heads", "heads", "{}", P),
            ("hidden", "hidden", "{}", P),
            ("weights", "weights", "{}", P),
            ("threads", "threads", "{}", P),
            ("repeats", "repeats", "{}", P),
            ("gflop", "GFLOP per call", "{:.1f}", P),
            ("dtype", "dtype", "{}", V),
            ("fp8", "FP8 QKV", "bool", V),
            ("qkv_seconds", "QKV s", "{:.3f}", V),
            ("attention_seconds", "attention s", "{:.3f}", V),
            ("out_seconds", "output s", "{:.3f}", V),
            ("seconds", "total s", "{:.3f}", V),
            ("gflops", "GFLOP/s", "{:.0f}", V),
        ],
    },
    "layer_memory": {
        "title": "The Wan layer's peak memory",
        "about": "Peak resident set of `fxattn layer` (`/usr/bin/time -f %M`).",
        "columns": [
            ("grid", "grid", "grid", P),
            ("tokens", "S", "{}", P),
            ("heads", "heads", "{}", P),
            ("hidden", "hidden", "{}", P),
            ("dtype", "dtype", "{}", V),
            ("peak_rss_mib", "peak RSS MiB", "{}", V),
        ],
    },
    "proj": {
        "title": "The QKV projection: `fxattn bench --proj`",
        "about": (
            "The fused [Q|K|V] projection with RMSNorm across heads and RoPE against the bare sgemm, interleaved in one process; medians."
        ),
        "columns": [
            ("seq", "S", "{}", P),
            ("hidden", "hidden", "{}", P),
            ("out", "out", "{}", P),
            ("threads", "threads", "{}", P),
            ("proj", "way", "{}", V),
            ("seconds", "seconds", "{:.3f}", V),
            ("gflops", "GFLOP/s", "{:.1f}", V),
            ("fraction_of_peak", "% of its peak", "{:.1%}", V),
            ("over_bare_sgemm", "time over the bare sgemm", "{:.3f}x", V),
            ("over_bf16", "time over bf16", "{:.3f}x", V),
        ],
    },
    "gemm": {
        "title": "The projections' GEMM and its peers",
        "about": "The QKV projection's GEMM (M x K x N) in fxattn and in other libraries.",
        "columns": [
            ("shape", "M x K x N", "{}", P),
            ("threads", "threads", "{}", P),
            ("repeats", "medians of", "{}", P),
            ("engine", "GEMM", "{}", V),
            ("variant", "variant", "{}", V),
            ("dtype", "dtype", "{}", V),
            ("seconds", "seconds", "{:.3f}", V),
            ("gflops", "GFLOP/s", "{:.0f}", V),
            ("fraction_of_peak", "% FMA peak", "{:.1%}", V),
        ],
    },
    "python_attention": {
        "title": "Attention through Python: fxattn, torch SDPA, ONNX Runtime",
        "about": (
            "`bench/python_attention.py`: the C library's `fxa_attn_run`, `fxattn.attention` on numpy and torch, "
            "torch's `scaled_dot_product_attention` and ONNX Runtime's MultiHeadAttention on the same q, k, v, "
            "outputs checked first; medians of interleaved rounds. % peak: of the FMA peak, or of the bf16 "
            "peak where the peak column says bf16."
        ),
        "columns": [
            ("B", "B", "{}", P),
            ("S", "S", "{}", V),
            ("H", "H", "{}", P),
            ("D", "D", "{}", P),
            ("threads", "threads", "{}", P),
            ("repeats", "rounds", "{}", P),
            ("engine", "engine", "{}", V),
            ("api", "call", "`{}`", V),
            ("dtype", "dtype", "{}", V),
            ("compute", "compute", "{}", V),
            ("seconds", "seconds", "{:.3f}", V),
            ("gflops", "GFLOP/s", "{:.1f}", V),
            ("peak_share", "% peak", "{:.1%}", V),
            ("peak", "peak", "{}", V),
        ],
    },
    "long_seq": {
        "title": "Long sequences: fxattn, ONNX Runtime and torch SDPA",
        "about": (
            "`bench/long_seq.py`: the Wan2.2 sequence lengths at fewer heads than the models run (every head is "
            "the same independent problem), in one process, outputs checked first; medians of interleaved "
            "rounds. Sq: the query rows run (every row streams all S keys). % peak: of the fp32 FMA peak, or "
            "of the bf16 peak for bf16 compute; CPU % peak: GFLOP per CPU-second the process used, over the peak per "
            "thread (how well the row uses the cycles it gets on a shared machine). ORT / row and SDPA / row: their seconds over the row's (> 1: "
            "the row is faster); the CPU s columns compare CPU seconds. Peak RSS: a cold call's growth of the peak resident set, in a fresh process."
        ),
        "columns": [
            ("S", "S", "{}", V),
            ("Sq", "Sq", "{}", V),
            ("H", "H", "{}", V),
            ("D", "D", "{}", P),
            ("threads", "threads", "{}", P),
            ("repeats", "rounds", "{}", P),
            ("row", "row", "{}", V),
            ("seconds", "seconds", "{:.3f}", V),
            ("gflops", "GFLOP/s", "{:.1f}", V),
            ("peak_share", "% peak", "{:.1%}", V),
            ("cpu_peak_share", "CPU % peak", "{:.1%}", V),
            ("ort_over", "ORT / row", "{:.2f}x", V),
            ("sdpa_over", "SDPA / row", "{:.2f}x", V),
            ("ort_over_cpu", "ORT / row, CPU s", "{:.2f}x", V),
            ("sdpa_over_cpu", "SDPA / row, CPU s", "{:.2f}x", V),
            ("peak_rss_mib", "peak RSS MiB", "{:.0f}", V),
            ("probe_ratio", "probe", "{:.0%}", V),
        ],
    },
    "python_wan": {
        "title": "A Wan layer through diffusers",
        "about": (
            "`bench/python_wan.py`: diffusers' `WanAttention` (or a one-layer `WanTransformer3DModel`, whole "
            "forward) with its default processor and with fxattn's, in interleaved rounds; medians. Speed-up "
            "over the same dtype's default row; error max\\|y - y_ref\\| / max\\|y_ref\\| against the fp32 "
            "default's output. fxattn's fused rows carry the fused layer's stages."
        ),
        "columns": [
            ("module", "module", "`{}`", P),
            ("S", "S", "{}", P),
            ("grid", "grid", "grid", P),
            ("hidden", "hidden", "{}", P),
            ("heads", "heads", "{}", P),
            ("head_dim", "head dim", "{}", P),
            ("ffn_dim", "FFN", "{}", P),
            ("threads", "threads", "{}", P),
            ("rounds", "rounds", "{}", P),
            ("gflop", "GFLOP", "{:.1f}", P),
            ("dtype", "dtype", "{}", V),
            ("processor", "processor", "{}", V),
            ("seconds", "seconds", "{:.3f}", V),
            ("gflops", "GFLOP/s", "{:.1f}", V),
            ("speedup", "speed-up", "{:.2f}x", V),
            ("cpu_seconds", "CPU s", "{:.2f}", V),
            ("cpu_gflops", "GFLOP per CPU-s", "{:.1f}", V),
            ("cpu_peak_share", "CPU % peak", "{:.1%}", V),
            ("cpu_speedup", "speed-up, CPU s", "{:.2f}x", V),
            ("error", "error", "{:.2e}", V),
            ("qkv_seconds", "QKV s", "{:.3f}", V),
            ("attention_seconds", "attention s", "{:.3f}", V),
            ("out_seconds", "output s", "{:.3f}", V),
        ],
    },
    "wan_long_seq": {
        "title": "The Wan layer at long sequences: fxattn against diffusers",
        "about": (
            "`bench/python_wan.py --hidden N`: a head slice of the Wan2.2 self-attention layer of hidden N "
            "(3072: TI2V-5B, 24 heads; 5120: A14B, 40 heads) at the models' sequence lengths: diffusers' "
            "`WanAttention(dim=N, heads=H)` with the model's width and only H of its heads (every head is an "
            "independent problem given x: each stage costs H / model heads of the whole layer's, 8 S N H 128 + "
            "4 S^2 H 128 FLOP), diffusers' default processor (native backend, torch SDPA) against two fxattn rows "
            "with the same torch projections (fxattn's fused layer runs whole layers only): fxattn's processor "
            'per op (`fxattn.attention`; rows of commit d67a9f9: fp32 compute on any input) and diffusers\' processor with the `"fxattn"` attention '
            "backend (bf16 inputs in bf16 compute), on the same module and x, outputs checked first (error: max\\|y - y_ref\\| / "
            "max\\|y_ref\\| against the fp32 default); medians of interleaved rounds. GFLOP per CPU-s and "
            "CPU % peak: per CPU-second the process used (of the fp32 FMA peak per core, bf16 rows of the "
            "bf16 peak), the measure that holds on a loaded machine; speed-ups: the same dtype's diffusers "
            "row over the row, in wall and in CPU seconds. Peak RSS: a cold call's growth of the peak "
            "resident set, in a fresh process."
        ),
        "columns": [
            ("module", "module", "`{}`", P),
            ("S", "S", "{}", V),
            ("grid", "grid", "grid", V),
            ("hidden", "hidden", "{}", V),
            ("model_heads", "model heads", "{}", V),
            ("heads", "heads run", "{}", P),
            ("head_dim", "head dim", "{}", P),
            ("threads", "threads", "{}", P),
            ("rounds", "rounds", "{}", P),
            ("gflop", "GFLOP", "{:.1f}", V),
            ("dtype", "dtype", "{}", V),
            ("processor", "processor", "{}", V),
            ("seconds", "seconds", "{:.3f}", V),
            ("gflops", "GFLOP/s", "{:.1f}", V),
            ("speedup", "speed-up", "{:.2f}x", V),
            ("cpu_seconds", "CPU s", "{:.2f}", V),
            ("cpu_gflops", "GFLOP per CPU-s", "{:.1f}", V),
            ("cpu_peak_share", "CPU % peak", "{:.1%}", V),
            ("cpu_speedup", "speed-up, CPU s", "{:.2f}x", V),
            ("error", "error", "{:.2e}", V),
            ("peak_rss_mib", "peak RSS MiB", "{:.0f}", V),
        ],
    },
    "python_sdpa": {
        "title": "scaled_dot_product_attention: fxattn against torch",
        "about": (
            "`bench/python_sdpa.py`: `fxattn.scaled_dot_product_attention` against torch's "
            "`scaled_dot_product_attention` on the same contiguous [B, H, S, D] q, k, v, outputs checked first "
            "(max\\|diff\\|); medians of rounds alternating which runs first. fxattn compute: the compute "
            "that ran, fxattn's default (`compute=` auto, or blank in rows recorded before the automatic "
            "choice, when bf16 inputs computed in bf16 by default) or the one named. GFLOP = 4 S^2 H D, causal "
            "half of it; % peak of the FMA peak (fp32 compute) or of the bf16 peak (bf16 compute). fx / torch: "
            "torch's seconds over fxattn's; CPU fx / torch: "
            "the same ratio of the CPU seconds (all threads, `time.process_time`) a call takes, which other jobs "
            "on the shared machine change far less."
        ),
        "columns": [
            ("B", "B", "{}", P),
            ("H", "H", "{}", P),
            ("D", "D", "{}", P),
            ("threads", "threads", "{}", P),
            ("repeats", "rounds", "{}", P),
            ("S", "S", "{}", V),
            ("dtype", "dtype", "{}", V),
            ("compute", "fxattn compute", "{}", V),
            ("compute_option", "compute=", "{}", V),
            ("causal", "causal", "bool", V),
            ("fxattn_seconds", "fxattn s", "{:.4f}", V),
            ("fxattn_gflops", "fxattn GFLOP/s", "{:.1f}", V),
            ("fxattn_peak_share", "fxattn % peak", "{:.1%}", V),
            ("torch_seconds", "torch s", "{:.4f}", V),
            ("torch_gflops", "torch GFLOP/s", "{:.1f}", V),
            ("torch_peak_share", "torch % peak", "{:.1%}", V),
            ("fxattn_over_torch", "fx / torch", "{:.2f}x", V),
            ("fxattn_cpu_seconds", "fxattn CPU s", "{:.4f}", V),
            ("torch_cpu_seconds", "torch CPU s", "{:.4f}", V),
            ("cpu_fxattn_over_torch", "CPU fx / torch", "{:.2f}x", V),
            ("max_abs_diff", "max\\|diff\\|", "{:.2e}", V),
        ],
    },
    "python_backward": {
        "title": "Attention's backward: fxattn against torch SDPA's",
        "about": (
            "`bench/python_backward.py`: `torch.autograd.grad` through `fxattn.attention` (the C library's "
            "`fxa_attn_bwd_run`, in the forward's compute, the column compute: bf16 for bf16 rows recorded before the automatic choice) and through torch's "
            "`scaled_dot_product_attention` (the CPU flash-attention backward) on the same [1, H, S, D] q, k, "
            "v and dout, gradients checked against each other first; the backward alone, medians of rounds "
            "timing every row once in turn. GFLOP/s = 10 S^2 H D / s (FlashAttention's count). "
            "OMP_WAIT_POLICY: the environment's (recorded from 2026-12-05 on): unset, torch's OpenMP workers "
            "still spin when fxattn's call starts; PASSIVE, they sleep. "
            "fx / torch: torch's seconds over fxattn's."
        ),
        "columns": [
            ("B", "B", "{}", P),
            ("H", "H", "{}", P),
            ("D", "D", "{}", P),
            ("threads", "threads", "{}", P),
            ("repeats", "rounds", "{}", P),
            ("omp_wait_policy", "OMP_WAIT_POLICY", "{}", P),
            ("S", "S", "{}", V),
            ("dtype", "dtype", "{}", V),
            ("compute", "fxattn compute", "{}", V),
            ("fxattn_seconds", "fxattn s", "{:.4f}", V),
            ("fxattn_gflops", "fxattn GFLOP/s", "{:.1f}", V),
            ("torch_seconds", "torch s", "{:.4f}", V),
            ("torch_gflops", "torch GFLOP/s", "{:.1f}", V),
            ("fxattn_over_torch", "fx / torch", "{:.2f}x", V),
        ],
    },
    "python_diffusers": {
        "title": "diffusers' Wan and Flux with the fxattn backend",
        "about": (
            "`bench/python_diffusers.py`: tiny random Wan and Flux transformers built from configs (head dim "
            "128), one attention module called directly and the whole forward, with "
            '`set_attention_backend("fxattn")` and with the native backend (torch SDPA); outputs compared '
            "first (max\\|y_fxattn - y_native\\| / max\\|y_native\\|); medians of rounds alternating "
            "which runs first. Speed-up: native seconds over fxattn's."
        ),
        "columns": [
            ("heads", "heads", "{}", P),
            ("head_dim", "head dim", "{}", P),
            ("text", "text tokens", "{}", P),
            ("threads", "threads", "{}", P),
            ("repeats", "rounds", "{}", P),
            ("model", "model", "`{}`", V),
            ("part", "part", "{}", V),
            ("module", "module", "`{}`", V),
            ("S", "S", "{}", V),
            ("dtype", "dtype", "{}", V),
            ("fxattn_seconds", "fxattn s", "{:.3f}", V),
            ("native_seconds", "native s", "{:.3f}", V),
            ("speedup", "speed-up", "{:.2f}x", V),
            ("max_rel_diff", "max rel diff", "{:.2e}", V),
        ],
    },
    "mpi_bench": {
        "title": "Context parallel on one host: `mpirun fxattn bench`",
        "about": (
            "Ranks on one host against one rank alone on the same problem; efficiency = T_single / "
            "(P T_parallel); all-gather + local exchanges everything first, then computes."
        ),
        "columns": [
            ("seq", "S", "{}", V),
            ("heads", "heads", "{}", P),
            ("dim", "D", "{}", P),
            ("dtype", "dtype", "{}", P),
            ("ranks", "ranks", "{}", P),
            ("threads", "threads per rank", "{}", P),
            ("grid", "grid", "{}", V),
            ("single_seconds", "one rank s", "{:.3f}", V),
            ("seconds", "fxattn s", "{:.3f}", V),
            ("efficiency_runs", "efficiency of each run", "{:.3f}", V),
            ("efficiency", "efficiency", "{:.3f}", V),
            ("mpi_wait_share", "ring steps waiting on MPI", "{:.1%}", V),
            ("allgather_seconds", "all-gather + local s", "{:.3f}", V),
            ("allgather_efficiency", "its efficiency", "{:.3f}", V),
            ("over_allgather", "fxattn over all-gather", "{:.2f}x", V),
        ],
    },
    "plan_validate": {
        "title": "The grid planner against measured grids",
        "about": (
            "`bench/plan_validate.sh`: test hosts as network namespaces on one machine, links shaped by "
            "`tc qdisc ... tbf`; the planner's predicted time of each grid against the measured median "
            "([cluster.md](../../docs/cluster.md#validation)). Error: predicted over measured, minus one."
        ),
        "columns": [
            ("seq", "S", "{}", P),
            ("heads", "heads", "{}", P),
            ("dim", "D", "{}", P),
            ("dtype", "dtype", "{}", P),
            ("threads", "threads per rank", "{}", P),
            ("rounds", "medians of", "{}", P),
            ("mpi", "MPI", "{}", P),
            ("hosts_ranks", "hosts x ranks", "{}", V),
            ("link", "link", "{}", V),
            ("grid", "grid", "{}", V),
            ("predicted_seconds", "predicted s", "{:.4f}", V),
            ("measured_seconds", "measured s", "{:.4f}", V),
            ("measured_range_seconds", "measured min-max", "{:.4f}", V),
            ("error_pct", "error", "{:+.1f}%", V),
        ],
    },
}
IDENTITY = ("commit", "command", "date")
REQUIRED = ("machine", "cpu", "compiler", "versions", "commit", "command", "date")  # null when not recorded
VERSION_NAMES = {
    "fxattn": "fxattn",
    "openblas": "OpenBLAS",
    "onednn": "oneDNN",
    "openmpi": "Open MPI",
    "onnxruntime": "ONNX Runtime",
    "onnx": "onnx",
    "torch": "torch",
    "diffusers": "diffusers",
    "numpy": "numpy",
    "python": "Python",
}


def fmt(value, spec):
    """One cell: numbers by spec, [lo, hi] ranges as lo-hi, None as empty."""
    if value is None:
        return ""
    if spec == "grid":
        return "x".join(str(v) for v in value)
    if spec == "bool":
        return "yes" if value else "no"
    if isinstance(value, list):  # a range: lo-hi, the unit once
        cells = [fmt(v, spec) for v in value]
        unit = "%" if spec.endswith("%}") else re.search(r"[^}]*$", spec).group(0)
        return "-".join(c[: len(c) - len(unit)] if unit and c.endswith(unit) else c for c in cells[:-1]) + "-" + cells[-1]
    if isinstance(value, str):
        value = value.replace("|", "\\|")
        return spec.format(value) if spec in ("{}", "`{}`") else value
    if "e}" in spec and value == 0:
        return "0"
    return spec.format(value)


def runs_fmt(key, value, spec):
    if key.endswith("_runs") and isinstance(value, list):
        return ", ".join(fmt(v, spec) for v in value)
    return fmt(value, spec)


def versions_text(versions):
    names = sorted(versions, key=lambda k: (list(VERSION_NAMES).index(k) if k in VERSION_NAMES else 99, k))
    return ", ".join(f"{VERSION_NAMES.get(k, k)} {versions[k]}" for k in names)


def group_tables(records):
    """[(title, kind, [[record] per (commit, command, date) run])] in order of first appearance."""
    tables, index = [], {}
    for r in records:
        kind = KINDS[r["kind"]]
        title = r.get("table") or kind["title"].format(**r.get("versions", {}))
        if title not in index:
            index[title] = len(tables)
            tables.append((title, r["kind"], {}))
        runs = tables[index[title]][2]
        runs.setdefault(tuple(str(r.get(k)) for k in IDENTITY + ("compiler", "versions")), []).append(r)
    return [(t, k, list(runs.values())) for t, k, runs in tables]


def render_run(rows, kind, machine):
    """Markdown of one run: its command, commit, date, the software that
    differs from the machine's, the constant settings, the table, the notes."""
    out = []
    first = rows[0]
    if first.get("command"):
        out += ["```sh", first["command"], "```", ""]
    line = f"Commit `{first['commit']}`" if first.get("commit") else "Commit not recorded"
    line += f", {first.get('date')}"
    if first.get("compiler") and first["compiler"] != machine.get("compiler"):
        line += f"; {first['compiler']}"
    extra = {k: v for k, v in first.get("versions", {}).items() if machine.get("versions", {}).get(k) != v}
    if extra:
        line += f"; {versions_text(extra)}"
    out.append(line + ".")
    cols = [c for c in KINDS[kind]["columns"] if any(c[0] in r for r in rows)]
    const = [c for c in cols if c[3] and all(r.get(c[0]) == first.get(c[0]) for r in rows)]
    if const:
        out.append("Every row: " + ", ".join(f"{c[1]} {runs_fmt(c[0], first.get(c[0]), c[2])}" for c in const) + ".")
    notes = [r.get("note") for r in rows]
    shared_note = notes[0] if notes[0] and all(n == notes[0] for n in notes) else None
    if shared_note:
        out.append(shared_note[0].upper() + shared_note[1:] + ".")
    cols = [c for c in cols if c not in const]
    if any(notes) and not shared_note:
        cols.append(("note", "note", "{}", V))
    out += ["", "| " + " | ".join(c[1] for c in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        out.append("| " + " | ".join(runs_fmt(c[0], r.get(c[0]), c[2]) for c in cols) + " |")
    if kind == "plan_validate":
        out += ["", planner_summary(rows)]
    return out


def planner_summary(rows):
    grid = [r for r in rows if "error_pct" in r and not r["grid"].startswith("all-gather")]
    within = sum(1 for r in grid if abs(r["error_pct"]) <= 20.0)
    return f"{within} of {len(grid)} grid rows (all-gather rows aside) within 20% of the measured time."


def render_page(name, machine, records, plots):
    title = machine.get("title", name)
    out = [
        f"# Results: {title}",
        "",
        f"<!-- Written by bench/results/render.py from raw/{name}.jsonl: edit the raw results, not this page. -->",
        "",
    ]
    about = " ".join(x for x in (machine.get("about"), machine.get("peaks")) if x)
    if machine.get("kernels"):
        about += f" Kernel set `{machine['kernels']}`."
    out += [f"**Machine.** {about}", "", f"**CPU as recorded.** {machine.get('cpu')}", ""]
    soft = "; ".join(x for x in (machine.get("compiler"), versions_text(machine.get("versions", {}))) if x)
    out += [f"**Software.** {soft}.", ""]
    dates = sorted({r["date"] for r in records if r.get("date")})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}" if dates else "not recorded"
    out += [
        f"**Date.** {when}; each table names the commit and command that recorded it. Raw results: [raw/{name}.jsonl](raw/{name}.jsonl).",
        "",
    ]
    if plots:
        out += ["**Plots.** " + ", ".join(f"[{what}](plots/{file})" for what, file, _ in plots) + ".", ""]
        out += [f"![{what}](plots/{file})" for what, file, _ in plots] + [""]
    for title, kind, runs in group_tables(records):
        out += [f"## {title}", "", KINDS[kind]["about"], ""]
        out += [f"Plot: [{what}](plots/{file}).\n" for what, file, section in plots if section == kind]
        for rows in runs:
            out += render_run(rows, kind, machine) + [""]
    return "\n".join(out).rstrip("\n") + "\n"


def render_index(pages):
    out = [
        "# Benchmark results, one page per machine",
        "",
        "<!-- Written by bench/results/render.py from raw/*.jsonl: edit the raw results, not this page. -->",
        "",
        "| machine | page | kernel set | tables |",
        "|---|---|---|---|",
    ]
    for name, machine, records in pages:
        titles = "; ".join(t for t, _, _ in group_tables(records))
        out.append(f"| {machine.get('title', name)} | [{name}.md]({name}.md) | `{machine.get('kernels', '?')}` | {titles} |")
    out += [
        "",
        "Each page gives the CPU and its measured peaks, the compiler and library versions, and for each "
        "table the command, commit and date that recorded it. The pages and plots are written by "
        "[render.py](render.py) from the JSON lines in [raw/](raw/); how to run the benchmarks and add a "
        "result: [bench/README.md](../README.md#raw-results). How to measure: "
        "[docs/performance.md](../../docs/performance.md). What was measured and not kept: "
        "[docs/design/](../../docs/design/README.md).",
    ]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- plots

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def nice_step(top, ticks=5):
    raw = top / ticks
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class Svg:
    def __init__(self, width, height):
        self.w, self.h, self.items = width, height, []

    def line(self, x1, y1, x2, y2, color="#000", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.items.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}" stroke-width="{width}"{d}/>')

    def text(self, x, y, s, anchor="start", size=12, rotate=None):
        t = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate is not None else ""
        self.items.append(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{t}>{esc(s)}</text>')

    def rect(self, x, y, w, h, color):
        self.items.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{color}"/>')

    def polyline(self, pts, color):
        p = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        self.items.append(f'<polyline points="{p}" fill="none" stroke="{color}" stroke-width="2"/>')

    def circle(self, x, y, color):
        self.items.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{color}"/>')

    def __str__(self):
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.w}" height="{self.h}" '
            f'viewBox="0 0 {self.w} {self.h}" font-family="sans-serif">\n'
            f'<rect width="{self.w}" height="{self.h}" fill="#fff"/>\n' + "\n".join(self.items) + "\n</svg>\n"
        )


def series_label(engine, dtype, compute):
    if dtype in ("f32", "fp32"):
        return f"{engine} fp32"
    if engine != "fxattn":
        return f"{engine} {dtype}"
    return f"{engine} bf16 compute" if compute == "bf16" else f"{engine} bf16 in, fp32 compute"


def attention_series(records):
    """{label: {S: GFLOP/s}} at the largest thread count: python_attention's
    peers and C-library rows, then bench/peers rows (which take precedence)."""
    pts = [r for r in records if r["kind"] in ("python_attention", "peers")]
    if not pts:
        return {}, None
    threads = max(r.get("threads", 1) for r in pts)
    series = {}
    for r in pts:
        if r.get("threads", 1) != threads or r["kind"] != "python_attention":
            continue
        if r["engine"] == "fxattn" and r["api"] not in ("C fxa_attn_run", "fxattn.attention, torch"):
            continue
        if r["engine"] == "fxattn" and r["api"] == "fxattn.attention, torch" and r["compute"] != "bf16":
            continue
        gf = r.get("gflops") or 4.0 * r.get("B", 1) * r["H"] * r["S"] ** 2 * r["D"] / r["seconds"] / 1e9
        series.setdefault(series_label(r["engine"], r["dtype"], r["compute"]), {})[r["S"]] = gf
    for r in pts:
        if r.get("threads", 1) != threads or r["kind"] != "peers":
            continue
        dt = {"f32": ("fp32", "fp32"), "bf16": ("bf16", "fp32"), "bf16c": ("bf16", "bf16")}[r["fxattn_dtype"]]
        series.setdefault(series_label("fxattn", *dt), {})[r["S"]] = r["fxattn_gflops"]
        series.setdefault("ONNX Runtime fp32", {})[r["S"]] = r["ort_gflops"]
    return series, threads


def sdpa_series(records):
    """{label: {S: GFLOP/s}} of python_sdpa rows at the largest thread
    count: fxattn and torch, fp32 and bf16, causal and not; rows recorded
    with "plot": false (measured on a loaded machine) left out."""
    pts = [r for r in records if r["kind"] == "python_sdpa" and r.get("plot", True)]
    if not pts:
        return {}, None
    threads = max(r.get("threads", 1) for r in pts)
    series = {}
    for r in pts:
        if r.get("threads", 1) != threads:
            continue
        for engine in ("fxattn", "torch"):
            label = f"{engine} {r['dtype']}" + (" causal" if r["causal"] else "")
            series.setdefault(label, {})[r["S"]] = r[f"{engine}_gflops"]
    return series, threads


def long_seq_series(records):
    """({label: {S: GFLOP per CPU-second}}, threads, {peak kind: per-core
    peak}) of long_seq rows: fxattn fp32 and bf16 compute (fixed-max) and
    the peers, each S from the first run that measured it. Per CPU-second
    (4 Sq S H D over the process's CPU seconds): what a busy core does, on
    a machine where other jobs take cycles from the wall clock."""
    keep = ("fxattn fp32", "fxattn bf16 compute", "ONNX Runtime fp32", "torch SDPA fp32", "torch SDPA bf16")
    pts = [r for r in records if r["kind"] == "long_seq" and r["row"] in keep and r.get("cpu_seconds")]
    if not pts:
        return {}, None, {}
    threads = max(r["threads"] for r in pts)
    series, peaks = {}, {}
    for r in pts:
        if r["threads"] != threads:
            continue
        gf = 4.0 * r["Sq"] * r["S"] * r["H"] * r["D"] / r["cpu_seconds"] / 1e9
        series.setdefault(r["row"], {}).setdefault(r["S"], gf)
        if r.get("cpu_peak_share"):
            peaks.setdefault(r["peak"], gf / r["cpu_peak_share"])
    return series, threads, peaks


def wan_long_seq_series(records):
    """({label: {S: GFLOP per CPU-second}}, threads, subtitle) of
    wan_long_seq rows: diffusers' default processor and fxattn's rows, fp32
    and bf16, each S from the first run that measured it; the subtitle
    names the hidden size of each S."""
    pts = [r for r in records if r["kind"] == "wan_long_seq"]
    if not pts:
        return {}, None, None
    threads = max(r["threads"] for r in pts)
    series, seqs, heads = {}, {}, set()
    for r in pts:
        if r["threads"] != threads:
            continue
        who = "diffusers SDPA" if r["engine"] == "diffusers" else r["processor"]
        if series.setdefault(f"{who} {r['dtype']}", {}).setdefault(r["S"], r["cpu_gflops"]) == r["cpu_gflops"]:
            seqs.setdefault(r["hidden"], set()).add(r["S"])
            heads.add(r["heads"])
    where = "; ".join(f"{h}: S {', '.join(str(s) for s in sorted(ss))}" for h, ss in sorted(seqs.items()))
    count = "1 head" if heads == {1} else "/".join(map(str, sorted(heads))) + " heads"
    return series, threads, f"bench/python_wan.py --hidden, {count} of hidden {where}"


# (what the page calls the plot, its subtitle, x axis, y axis)
ATTENTION_PLOT = (
    "attention GFLOP/s against S",
    "bench/peers where it ran, else bench/python_attention.py; GFLOP = 4 B H S^2 D",
    "S (query = key tokens)",
    "GFLOP/s",
)
SDPA_PLOT = (
    "SDPA GFLOP/s against S, fxattn and torch",
    "bench/python_sdpa.py; GFLOP = 4 B H S^2 D, causal half of it",
    "S (query = key tokens)",
    "GFLOP/s",
)
LONG_SEQ_PLOT = (
    "GFLOP per CPU-second at long S",
    "bench/long_seq.py; 4 Sq S H D per CPU-second (the machine was loaded); dashed: per-core peaks",
    "S (key tokens; Sq query rows as in the table)",
    "GFLOP per CPU-second",
)
WAN_LONG_SEQ_PLOT = ("Wan layer GFLOP per CPU-second", None, "S (tokens)", "GFLOP per CPU-second")


def attention_plot(title, series, threads, what=ATTENTION_PLOT, hlines=None):
    """GFLOP/s (what[3]) against S (what[2], log scale) per series; hlines
    {label: value}: dashed grey reference lines (peaks)."""
    svg = Svg(720, 400)
    x0, y0, x1, y1 = 70, 350, 490, 50
    xs = sorted({s for pts in series.values() for s in pts})
    hlines = hlines or {}
    top = max([v for pts in series.values() for v in pts.values()] + list(hlines.values()))
    step = nice_step(top * 1.05)
    ymax = step * math.ceil(top * 1.05 / step)
    lo, hi = math.log2(xs[0]) - 0.5, math.log2(xs[-1]) + 0.5

    def px(s):
        return x0 + (math.log2(s) - lo) / (hi - lo) * (x1 - x0)

    def py(v):
        return y0 - v / ymax * (y0 - y1)

    svg.text((x0 + x1) / 2, 20, f"{title}: {what[0]} ({threads} threads)", "middle", 14)
    svg.text((x0 + x1) / 2, 37, what[1], "middle", 11)
    k = 0
    while k * step <= ymax + 1e-9:
        y = py(k * step)
        svg.line(x0, y, x1, y, "#ddd")
        svg.text(x0 - 6, y + 4, f"{k * step:g}", "end", 11)
        k += 1
    for s in xs:
        svg.line(px(s), y0, px(s), y0 + 5)
        svg.text(px(s), y0 + 18, str(s), "middle", 11)
    svg.line(x0, y0, x1, y0)
    svg.line(x0, y0, x0, y1)
    svg.text((x0 + x1) / 2, y0 + 38, what[2], "middle", 12)
    svg.text(20, (y0 + y1) / 2, what[3], "middle", 12, rotate=-90)
    for label, v in sorted(hlines.items()):
        svg.line(x0, py(v), x1, py(v), "#888", 1, "5,4")
        svg.text(x1 - 4, py(v) - 4, label, "end", 10)
    for i, (label, pts) in enumerate(sorted(series.items())):
        color = PALETTE[i % len(PALETTE)]
        xy = [(px(s), py(pts[s])) for s in sorted(pts)]
        if len(xy) > 1:
            svg.polyline(xy, color)
        for x, y in xy:
            svg.circle(x, y, color)
        ly = y1 + 10 + 20 * i
        svg.line(x1 + 15, ly, x1 + 35, ly, color, 2)
        svg.circle(x1 + 25, ly, color)
        svg.text(x1 + 40, ly + 4, label, size=11)
    return str(svg)


STAGES = (
    ("qkv_seconds", "QKV projection", "#1f77b4"),
    ("attention_seconds", "attention", "#d62728"),
    ("out_seconds", "output projection", "#2ca02c"),
)


def layer_bars(records):
    """[(label, {stage: seconds} or None, total seconds)] of fxattn layer
    runs and of diffusers' WanAttention rows."""
    bars = []
    for r in records:
        if r["kind"] == "layer":
            label = f"fxattn layer {r['dtype']}" + (" FP8 QKV" if r.get("fp8") else "")
        elif r["kind"] == "python_wan" and r.get("module") == "WanAttention":
            who = "diffusers SDPA" if r["engine"] == "diffusers" else r["processor"].split(" (")[0]
            label = f"WanAttention {r['dtype']}, {who}"
        else:
            continue
        stages = {k: r[k] for k, _, _ in STAGES if k in r}
        bars.append((label, stages if len(stages) == len(STAGES) else None, r["seconds"]))
    return bars


def layer_plot(title, bars):
    row, x0, x1, top = 26, 270, 610, 60
    svg = Svg(640, top + row * len(bars) + 60)
    tmax = max(t for _, _, t in bars)
    step = nice_step(tmax * 1.05)
    xmax = step * math.ceil(tmax * 1.05 / step)

    def px(t):
        return x0 + t / xmax * (x1 - x0)

    svg.text(320, 22, f"{title}: Wan layer time by stage (seconds)", "middle", 14)
    lx = 20
    for _, name, color in STAGES + ((None, "total (no stages)", "#999"),):
        svg.rect(lx, 34, 12, 12, color)
        svg.text(lx + 16, 45, name, size=11)
        lx += 24 + 7 * len(name)
    y_end = top + row * len(bars)
    k = 0
    while k * step <= xmax + 1e-9:
        svg.line(px(k * step), top - 4, px(k * step), y_end, "#ddd")
        svg.text(px(k * step), y_end + 16, f"{k * step:g}", "middle", 11)
        k += 1
    for i, (label, stages, total) in enumerate(bars):
        y = top + row * i + 4
        svg.text(x0 - 6, y + 13, label, "end", 11)
        if stages:
            x = x0
            for key, _, color in STAGES:
                svg.rect(x, y, px(stages[key]) - x0, row - 8, color)
                x += px(stages[key]) - x0
        else:
            svg.rect(x0, y, px(total) - x0, row - 8, "#999")
        svg.text(px(total) + 4, y + 13, f"{total:.3f}", size=10)
    svg.line(x0, top - 4, x0, y_end)
    return str(svg)


# ---------------------------------------------------------------- files


def load(path):
    """(machine record, measurement records) of one raw file; ValueError on a bad line."""
    machine, records = None, []
    for no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{no}: {e}") from None
        if r.get("kind") == "machine":
            machine = r
        elif r.get("kind") in KINDS:
            missing = [k for k in REQUIRED if k not in r]
            if missing or r["machine"] != path.stem:
                raise ValueError(f"{path}:{no}: " + (f"no {', '.join(missing)}" if missing else f"machine {r['machine']!r} in {path.name}"))
            records.append(r)
        else:
            raise ValueError(f"{path}:{no}: unknown kind {r.get('kind')!r}")
    if machine is None:
        raise ValueError(f'{path}: no {{"kind": "machine"}} line')
    return machine, records


def render_all(raw, out):
    """Writes every page, the index and the plots of raw/*.jsonl under out
    (plots: (name, file, the kind whose section links it, or None));
    returns the relative paths written."""
    written, pages = [], []
    (out / "plots").mkdir(parents=True, exist_ok=True)
    for path in sorted(raw.glob("*.jsonl")):
        name = path.stem
        machine, records = load(path)
        title = machine.get("title", name)
        plots = []
        series, threads = attention_series(records)
        if series:
            (out / "plots" / f"{name}-attention.svg").write_text(attention_plot(title, series, threads))
            plots.append((ATTENTION_PLOT[0], f"{name}-attention.svg", None))
        series, threads = sdpa_series(records)
        if series:
            (out / "plots" / f"{name}-sdpa.svg").write_text(attention_plot(title, series, threads, SDPA_PLOT))
            plots.append((SDPA_PLOT[0], f"{name}-sdpa.svg", None))
        series, threads, peaks = long_seq_series(records)
        if series:
            hl = {f"{k} peak per core {v:.0f}": v for k, v in peaks.items()}
            (out / "plots" / f"{name}-long-seq.svg").write_text(attention_plot(title, series, threads, LONG_SEQ_PLOT, hl))
            plots.append((LONG_SEQ_PLOT[0], f"{name}-long-seq.svg", "long_seq"))
        series, threads, sub = wan_long_seq_series(records)
        if series:
            what = (WAN_LONG_SEQ_PLOT[0], sub, *WAN_LONG_SEQ_PLOT[2:])
            (out / "plots" / f"{name}-wan-long-seq.svg").write_text(attention_plot(title, series, threads, what))
            plots.append((WAN_LONG_SEQ_PLOT[0], f"{name}-wan-long-seq.svg", "wan_long_seq"))
        bars = layer_bars(records)
        if bars:
            (out / "plots" / f"{name}-layer.svg").write_text(layer_plot(title, bars))
            plots.append(("Wan layer time by stage", f"{name}-layer.svg", None))
        (out / f"{name}.md").write_text(render_page(name, machine, records, plots))
        written += [f"{name}.md"] + [f"plots/{f}" for _, f, _ in plots]
        pages.append((name, machine, records))
    (out / "README.md").write_text(render_index(pages))
    return written + ["README.md"]


def check(raw, here):
    """Differences between here's pages and plots and a fresh rendering."""
    with tempfile.TemporaryDirectory() as tmp:
        written = render_all(raw, Path(tmp))
        bad = [f for f in written if not (here / f).is_file() or not filecmp.cmp(Path(tmp) / f, here / f, False)]
        stale = [
            f"{p.relative_to(here)}" for p in [*here.glob("*.md"), *(here / "plots").glob("*")] if str(p.relative_to(here)) not in written
        ]
    return [f"{f}: differs from what raw/ renders" for f in bad] + [f"{f}: not rendered from raw/" for f in stale]


def append(a):
    """Adds the JSON lines on stdin (a tool's --json output) to raw/<machine>.jsonl
    with the identity fields; fxattn bench's summary line joins its auto row."""
    sys.path.insert(0, str(HERE.parent))
    from benchlib import append_jsonl, identity

    versions = dict(v.split("=", 1) for v in a.version)
    ident = identity(a.machine, a.build, versions)
    ident["command"] = a.command
    recs = []
    for line in sys.stdin:
        if not line.startswith("{"):
            continue
        obj = json.loads(line)
        auto = next((r for r in reversed(recs) if r.get("mode") == "auto"), None)
        if "fixed_over_online" in obj and auto is not None:
            auto.update(obj)
        else:
            recs.append({**ident, "kind": a.kind, **obj})
    path = HERE / "raw" / f"{a.machine}.jsonl"
    if not path.exists():
        print(
            f'render.py: {path} does not exist: start it with a {{"kind": "machine"}} line (bench/README.md, "Raw results")',
            file=sys.stderr,
        )
        return 2
    append_jsonl(str(path), recs)
    print(f"render.py: {len(recs)} records added to {path}", file=sys.stderr)
    return 0


def main(argv):
    if argv[:1] == ["append"]:
        ap = argparse.ArgumentParser(prog="render.py append", description=append.__doc__)
        ap.add_argument("--machine", required=True, help="the page's name (raw/<machine>.jsonl)")
        ap.add_argument("--kind", required=True, choices=sorted(KINDS))
        ap.add_argument("--command", required=True, help="the command that printed the JSON lines")
        ap.add_argument("--build", default="build", help="the CMake build tree that built the tool (its compiler)")
        ap.add_argument(
            "--version",
            action="append",
            default=[],
            metavar="NAME=VERSION",
            help="a library version the run used (repeatable), e.g. fxattn=0.2.0 openblas=0.3.21",
        )
        return append(ap.parse_args(argv[1:]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare the committed files with a fresh rendering")
    ap.add_argument("--out", type=Path, default=HERE, help="where to write (default: bench/results/)")
    ap.add_argument("--raw", type=Path, default=HERE / "raw", help="the JSON lines (default: bench/results/raw/)")
    a = ap.parse_args(argv)
    try:
        if a.check:
            problems = check(a.raw, a.out)
            for p in problems:
                print(f"render.py --check: {p}", file=sys.stderr)
            if problems:
                print("render.py --check: run bench/results/render.py and commit its output", file=sys.stderr)
            return 1 if problems else 0
        for f in render_all(a.raw, a.out):
            print(os.path.join(str(a.out), f))
    except (ValueError, KeyError) as e:
        print(f"render.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
