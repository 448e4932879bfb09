"""fxattn's backward (autograd through fxattn.attention) against torch's
scaled_dot_product_attention backward, side by side in one process.

    .venv/bin/python bench/python_backward.py [--seqs 1024,4096] [--heads 8] [--dim 128]
        [--repeats 5] [--threads 2] [--json FILE --machine NAME]

On the same q, k, v, dout ~ N(0, 1) [1, H, S, D] (fp32, and the same values
rounded to bf16), one forward each keeps its graph; a row times
torch.autograd.grad(out, (q, k, v), dout) on it, that is the backward
alone: fxattn's (torch.ops.fxattn.attention_backward, the C library's
fxa_attn_bwd_run, in the forward's compute: fp32 for fp32 inputs; for bf16
inputs twice, in the default compute (auto: what fxattn.compute_choice names
for this machine) and in bf16 compute) and torch's (the CPU
kernel SDPA picks: flash attention's backward). Medians of --repeats rounds,
each round timing every row once in turn after one warm-up each. Each call
follows another, so torch's OpenMP workers may still spin when fxattn's call
starts (the header prints OMP_WAIT_POLICY; docs/python.md, "Beside torch's
own threads").
GFLOP/s = 10 S^2 H D / seconds (FlashAttention's count, as
fxa_attn_bwd_flops). The gradients are checked against each other first.
--json FILE appends one JSON object per (S, dtype) to FILE (kind
python_backward: both medians and torch's seconds over fxattn's) for
bench/results/render.py.
"""

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from benchlib import append_jsonl, identity

import fxattn


def interleaved_medians(calls, repeats):
    for fn in calls.values():
        fn()
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, fn in calls.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(x) for name, x in times.items()}


def backward_call(fn, q, k, v, dout):
    """A call timing fn's backward alone: the forward runs once here."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    return lambda: torch.autograd.grad(out, leaves, dout, retain_graph=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="1024,4096", help="sequence lengths S (comma list)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="FILE", help="append one JSON object per row to FILE (- for stdout)")
    ap.add_argument("--machine", default=platform.node(), help="the results page's name for --json (default: host name)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    wait_policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    print(
        f"fxattn {fxattn.__version__} ({fxattn.kernel_info(a.threads)}), torch {torch.__version__}, "
        f"{a.threads} threads, H {a.heads}, D {a.dim}, medians of {a.repeats}, OMP_WAIT_POLICY {wait_policy}"
    )

    auto = fxattn.compute_choice(torch.bfloat16, a.dim, a.threads).compute
    print(f"compute auto for bf16 inputs at D {a.dim}: {auto}")

    def fx_in(compute):
        return lambda q, k, v: fxattn.attention(q, k, v, layout="bhsd", compute=compute, threads=a.threads)

    recs = []
    for s in (int(x) for x in a.seqs.split(",") if x):
        g = torch.Generator().manual_seed(0)
        q, k, v, dout = (torch.randn(1, a.heads, s, a.dim, generator=g) for _ in range(4))
        flops = 10.0 * s * s * a.heads * a.dim
        calls = {}
        rows = (("fp32", torch.float32, "auto"), ("bf16", torch.bfloat16, "auto"), ("bf16 compute", torch.bfloat16, "bf16"))
        for name, dtype, compute in rows:
            args = [t.to(dtype) for t in (q, k, v, dout)]
            fx_call = backward_call(fx_in(compute), *args)
            sdpa_call = backward_call(F.scaled_dot_product_attention, *args)
            got, want = fx_call(), sdpa_call()
            tol = 1e-3 if dtype == torch.float32 else 5e-2
            for x, y in zip(got, want):
                err = float((x.float() - y.float()).abs().max() / y.float().abs().max())
                assert err < tol, (name, err)
            calls[f"fxattn backward {name}"] = fx_call
            if name != "bf16 compute":  # torch's bf16 row is the same call
                calls[f"torch SDPA backward {name}"] = sdpa_call
        med = interleaved_medians(calls, a.repeats)
        print(f"\nS = {s}")
        print(f"{'':28} {'seconds':>9} {'GFLOP/s':>9}")
        for name, sec in med.items():
            print(f"{name:28} {sec:9.4f} {flops / sec / 1e9:9.1f}")
        for name, _, compute in rows:
            dtype = name.split()[0]
            ran = "fp32" if dtype == "fp32" else (auto if compute == "auto" else compute)
            fx_s, torch_s = med[f"fxattn backward {name}"], med[f"torch SDPA backward {dtype}"]
            print(f"{name} (compute {ran}): fxattn is {torch_s / fx_s:.2f}x torch SDPA's backward speed")
            recs.append(
                {
                    "kind": "python_backward",
                    "B": 1,
                    "S": s,
                    "H": a.heads,
                    "D": a.dim,
                    "dtype": dtype,
                    "compute": ran,
                    "threads": a.threads,
                    "repeats": a.repeats,
                    "omp_wait_policy": wait_policy,
                    "fxattn_seconds": fx_s,
                    "fxattn_gflops": flops / fx_s / 1e9,
                    "torch_seconds": torch_s,
                    "torch_gflops": flops / torch_s / 1e9,
                    "fxattn_over_torch": torch_s / fx_s,
                }
            )
    if a.json:
        versions = {"fxattn": fxattn.__version__, "torch": torch.__version__, "python": platform.python_version()}
        ident = identity(a.machine, Path(os.environ.get("FXATTN_LIBRARY_PATH", "build/lib")).parent, versions)
        append_jsonl(a.json, [{**ident, **r, "kernels": fxattn.kernel_info(a.threads)} for r in recs])


if __name__ == "__main__":
    main()
