#!/usr/bin/env python3
"""One Wan self-attention layer through diffusers' WanAttention: diffusers'
default processor (torch SDPA) against fxattn's processor
(fxattn.diffusers.WanAttnProcessor: the fused layer, fp32 or bf16), in fp32
and bf16, timed side by side in interleaved rounds.

    FXATTN_LIBRARY_PATH=build/lib PYTHONPATH=python/src .venv/bin/python bench/python_wan.py
    ... bench/python_wan.py --grid 1,16,16 --rounds 1          # a quick check
    ... bench/python_wan.py --model                              # also a one-layer WanTransformer3DModel
    ... bench/python_wan.py --json FILE --machine NAME           # also one JSON line per row into FILE

Defaults: S = 4096 tokens (latent grid 4 x 32 x 32), hidden 5120 = 40 heads
x 128 (Wan2.2 A14B), 2 threads for torch and fxattn. Every row runs once to
warm up (plans, weight copies, pages), then --rounds rounds each time every
row once in turn, so that the machine's drift touches all rows alike; the
table gives each row's median. GFLOP/s counts 8 S hidden^2 (QKV and output
projections) + 4 S^2 hidden (attention). Random weights with Wan's shapes
(torch's default init, norm gains 1 + 0.1 N(0, 1)), x ~ N(0, 1). The bf16
rows run the module and x in bf16 with the RoPE tables in fp32, as
from_pretrained(torch_dtype=torch.bfloat16) keeps them (so fxattn runs its
bf16 fused layer); "err" is max|y - y_ref| / max|y_ref| against the fp32
default row's output.

--model adds the whole forward of a one-layer WanTransformer3DModel built
from a config (Wan2.2 A14B's block: 40 x 128 heads, FFN 13824, text 512 x
4096, patches 1 x 2 x 2 of 16 channels; no hub access), default processor
against fxattn's (fused self-attention, fxattn.attention for the text
cross-attention), fp32 and bf16 (bf16: the parameters of diffusers'
_keep_in_fp32_modules in fp32, as from_pretrained(torch_dtype=...) casts
them). Its GFLOP/s counts the block's matmuls (self-attention as above,
cross-attention 4 S h^2 + 4 L h^2 + 4 S L h, FFN 4 S h F).

--hidden N runs a head slice of a layer of hidden N at long sequences: a
WanAttention(dim=N, heads=--heads) with the model's input and output width
N and only --heads heads (Q, K, V projections N -> heads x 128, attention
over all S tokens, output projection back to N). Every head of the Wan
layer is an independent problem given x: its own rows of the Q, K, V
weights, its own attention, its own columns of the output projection, so
each stage of the slice costs heads / (N / 128) of the whole layer's
(8 S N heads 128 + 4 S^2 heads 128 FLOP), at the real S and the real N.
The one thing the slice changes is RMSNorm's sum (over the slice's
channels, not all heads': the same work per channel). fxattn's fused layer
runs whole layers only (hidden = heads x head dim), so on a slice
diffusers' default processor (its native backend, torch SDPA) runs against
two fxattn rows on the same module, both with torch's projections:
fxattn's processor per op (fxattn.attention, fp32 compute whatever the
input) and diffusers' processor with the "fxattn" attention backend
("fxattn backend": bf16 inputs in bf16 compute, as the fused bf16 layer
runs them; --backend adds this row to whole layers too):

    ... bench/python_wan.py --grid 27,32,32 --hidden 3072 --heads 1 --rss   # TI2V-5B, S 27648
    ... bench/python_wan.py --grid 21,30,52 --hidden 5120 --heads 1 --rss   # A14B 480p, S 32760
    ... bench/python_wan.py --grid 21,45,80 --hidden 5120 --heads 1 --rounds 1   # A14B 720p, S 75600

Every row's output is checked before any timing (max|y - y_ref| /
max|y_ref| against the fp32 default's output, or the bf16 default's when
--dtypes bf16 runs no fp32 rows: fp32 rows 1e-4, bf16 rows 5e-2). Every
row also reports its CPU seconds (the process's, all threads; torch's idle
OpenMP workers sleep, OMP_WAIT_POLICY=PASSIVE unless set):
GFLOP per CPU-second, CPU % peak (of the fp32 FMA peak per core, bf16
rows of the larger of the bf16 and fp32 peaks, the units a bf16 row can
use at best (fp32 on Intel cores whose vdpbf16ps runs at half the FMA
rate): --peak-core, else `fxattn bench`'s probe per thread) and the speed-up in CPU seconds, which a machine shared with other
jobs leaves meaningful when the wall clock is not. --rss adds each row's
peak RSS: its first call alone in a fresh process (after one call on a
4 x 4 x 4 grid that loads its code), as the growth of the peak resident set
over the resident set with the module and x made.

--json FILE appends one JSON object per row to FILE (bench/README.md, "Raw
results"; kind "python_wan", head slices "wan_long_seq"); fxattn's fused
rows carry the fused layer's stage times.
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

import diffusers
import torch
from benchlib import append_jsonl, cold_peak_rss_mib, cpu_name, identity, peak_gflops
from diffusers import WanTransformer3DModel
from diffusers.models.attention_dispatch import AttentionBackendName
from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor, WanRotaryPosEmbed

import fxattn
from fxattn.diffusers import WanAttnProcessor as FxProcessor

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TEXT = 512  # Wan's text context length
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}  # the check before timing, relative to max|y_ref|


def relative_error(y, ref):
    """max|y - ref| / max|ref| in fp32."""
    ref = ref.float()
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


def interleaved_medians(calls, rounds):
    """{(dtype, name): (median seconds, median CPU seconds, error)}: every
    call once to warm up, its output's error against the reference's (the
    fp32 "diffusers" call, else the first "diffusers" call; relative_error)
    measured then and held to
    TOLERANCE of its dtype before any timing (exits otherwise); then
    `rounds` rounds timing each call once, in turn. CPU seconds: the
    process's, every thread. Outputs are dropped as they come (one layer
    output at a time besides the reference)."""
    defaults = [n for n in calls if n[1].startswith("diffusers")]
    ref_name = next((n for n in defaults if n[0] == "fp32"), defaults[0])
    ref = calls[ref_name]()
    err = {}
    for name, fn in calls.items():
        err[name] = 0.0 if name == ref_name else relative_error(fn(), ref)
        if not err[name] < TOLERANCE[name[0]]:
            raise SystemExit(
                f"python_wan: {' '.join(name)} differs from the {ref_name[0]} default by {err[name]:.2e} of "
                f"max|y| (tolerance {TOLERANCE[name[0]]})"
            )
    del ref
    times = {name: [] for name in calls}
    cpu = {name: [] for name in calls}
    for r in range(rounds):
        for name, fn in calls.items():
            c0, t0 = time.process_time(), time.perf_counter()
            y = fn()
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            del y
        print(f"# round {r + 1}/{rounds}: " + ", ".join(f"{' '.join(n)} {times[n][-1]:.2f} s" for n in calls), flush=True)
    return {name: (statistics.median(times[name]), statistics.median(cpu[name]), err[name]) for name in calls}


def keep_fp32_cast(model, dtype):
    """model's parameters and buffers in dtype, except those of its
    _keep_in_fp32_modules (fp32): what from_pretrained(torch_dtype=dtype) makes."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            t.data = t.data.to(torch.float32 if keep & set(name.split(".")) else dtype)
    return model


def table(title, rows, flops, core_peak=None):
    """Prints rows [(dtype, processor, seconds, CPU seconds, error)] and
    returns them as [{dtype, processor, engine, seconds, gflops, speedup,
    cpu_seconds, cpu_gflops, cpu_speedup, error[, cpu_peak_share]}]:
    speed-ups against the same dtype's default row (wall and CPU seconds),
    CPU % peak against core_peak[dtype] (GFLOP/s per core) when given."""
    ref = "fp32" if any(dt == "fp32" for dt, *_ in rows) else rows[0][0]
    print(f"\n{title}")
    print(
        f"{'dtype':5} {'processor':26} {'seconds':>8} {'GFLOP/s':>8} {'speed-up':>9} {'CPU s':>8} "
        f"{'GF/CPU-s':>9} {'CPU %pk':>8} {'CPU speed-up':>13} {'err vs ' + ref + ' default':>20}"
    )
    base = {dt: (sec, cpu) for dt, name, sec, cpu, _ in rows if name.startswith("diffusers")}  # one per dtype
    out = []
    for dt, name, sec, cpu, err in rows:
        share = flops / cpu / 1e9 / core_peak[dt] if core_peak else None
        print(
            f"{dt:5} {name:26} {sec:8.3f} {flops / sec / 1e9:8.1f} {base[dt][0] / sec:8.2f}x {cpu:8.2f} "
            f"{flops / cpu / 1e9:9.1f} {'' if share is None else f'{100 * share:7.1f}%':>8} "
            f"{base[dt][1] / cpu:12.2f}x {err:20.2e}"
        )
        rec = {
            "dtype": dt,
            "processor": name,
            "engine": "diffusers" if name.startswith("diffusers") else "fxattn",
            "seconds": sec,
            "gflops": flops / sec / 1e9,
            "speedup": base[dt][0] / sec,
            "cpu_seconds": cpu,
            "cpu_gflops": flops / cpu / 1e9,
            "cpu_speedup": base[dt][1] / cpu,
            "error": err,
        }
        if share is not None:
            rec["cpu_peak_share"] = share
        out.append(rec)
    return out


def layer_calls(a, grid, hidden, dtypes):
    """({(dtype, processor): call}, {dtype: (module, fused processor)},
    FLOPs of one call): one WanAttention of width hidden and a.heads heads
    (a head slice when hidden > heads x head dim) per dtype, the same
    weights, each call running it once on the same x with one processor."""
    s = grid[0] * grid[1] * grid[2]
    inner = a.heads * a.head_dim
    flops = 8.0 * s * hidden * inner + 4.0 * s * s * inner
    torch.manual_seed(0)
    attn32 = WanAttention(dim=hidden, heads=a.heads, dim_head=a.head_dim, eps=1e-6, processor=WanAttnProcessor()).eval()
    with torch.no_grad():
        attn32.norm_q.weight.copy_(1 + 0.1 * torch.randn(inner))
        attn32.norm_k.weight.copy_(1 + 0.1 * torch.randn(inner))
    rope = WanRotaryPosEmbed(a.head_dim, (1, 2, 2), 1024)
    rotary_emb = rope(torch.empty(1, 1, grid[0], 2 * grid[1], 2 * grid[2]))  # fp64 tables
    emb32 = tuple(t.float() for t in rotary_emb)
    x32 = torch.randn(1, s, hidden)
    calls, fused = {}, {}
    for dt in dtypes:
        dtype = DTYPES[dt]
        attn = (
            attn32
            if dtype == torch.float32
            else WanAttention(dim=hidden, heads=a.heads, dim_head=a.head_dim, eps=1e-6, processor=WanAttnProcessor()).eval()
        )
        if attn is not attn32:
            attn.load_state_dict(attn32.state_dict())
            attn.to(dtype)
        x = x32.to(dtype)
        emb = rotary_emb if dtype == torch.float32 else emb32
        procs = [("diffusers default (SDPA)", WanAttnProcessor())]
        if a.per_op or hidden != inner:
            procs.append(("fxattn per op", FxProcessor(fused=False, threads=a.threads)))
        if a.backend or hidden != inner:
            backend = WanAttnProcessor()
            backend._attention_backend = AttentionBackendName("fxattn")  # what set_attention_backend sets
            procs.append(("fxattn backend", backend))
        if hidden == inner:  # the fused layer runs whole layers only
            procs.append(("fxattn fused", FxProcessor(fused=True, threads=a.threads)))
        for name, proc in procs:

            def call(attn=attn, proc=proc, x=x, emb=emb):
                attn.set_processor(proc)
                with torch.no_grad():
                    return attn(x, None, None, emb)

            calls[(dt, name)] = call
            if name == "fxattn fused":
                fused[dt] = (attn, proc)
    return calls, fused, flops


def rss_child(a, grid, hidden, row):
    """Child mode: one cold call of row "dtype|processor"; prints the growth
    of VmHWM over VmRSS in MiB."""
    dt, name = row.split("|", 1)
    layer_calls(a, (4, 4, 4), hidden, [dt])[0][(dt, name)]()  # load the row's code paths before the reset
    call = layer_calls(a, grid, hidden, [dt])[0][(dt, name)]
    print(json.dumps({"peak_rss_mib": cold_peak_rss_mib(call)}))


def peak_rss(a, dt, name):
    """A row's peak RSS growth (MiB) from rss_child in a fresh process (None
    when the child fails)."""
    args = [
        sys.executable,
        __file__,
        "--grid",
        a.grid,
        "--heads",
        str(a.heads),
        "--head-dim",
        str(a.head_dim),
        "--hidden",
        str(a.hidden),
        "--threads",
        str(a.threads),
        "--dtypes",
        dt,
        "--rss-child",
        f"{dt}|{name}",
    ]
    args += ["--per-op"] if a.per_op else []
    out = subprocess.run(args + (["--backend"] if a.backend else []), capture_output=True, text=True, env=os.environ)
    if out.returncode != 0:
        print(f"# peak RSS of {dt} {name}: the child failed: {out.stderr.strip()[-300:]}")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mib"]


def bench_layer(a, grid, hidden):
    s = grid[0] * grid[1] * grid[2]
    inner = a.heads * a.head_dim
    calls, fused, flops = layer_calls(a, grid, hidden, a.dtypes)
    what = (
        f"hidden {hidden} = {a.heads} x {a.head_dim}"
        if hidden == inner
        else (f"a head slice of hidden {hidden} ({hidden // a.head_dim} heads): {a.heads} x {a.head_dim} heads run")
    )
    print(f"\nWan self-attention (WanAttention): S {s} (grid {grid[0]}x{grid[1]}x{grid[2]}), {what}, {flops / 1e9:.1f} GFLOP per call")
    res = interleaved_medians(calls, a.rounds)
    core_peak = a.peak_core
    if core_peak is None:
        fp32 = peak_gflops(a.threads, "fp32") / a.threads
        core_peak = {"fp32": fp32, "bf16": max(peak_gflops(a.threads, "bf16") / a.threads, fp32)}
    recs = table("one WanAttention call:", [(dt, name, *res[(dt, name)]) for dt, name in calls], flops, core_peak)
    for dt, (attn, proc) in fused.items():
        assert proc.fused_calls == a.rounds + 1, (dt, proc.fused_calls)
        st = proc._layers[attn][1].last_stats
        print(
            f"{dt:5} fxattn fused stages (last run): qkv {st.qkv_seconds:.3f} s, attention {st.attention_seconds:.3f} s, "
            f"out {st.out_seconds:.3f} s, fallback rows {st.fallback_rows} of {st.rows}"
        )
        rec = next(r for r in recs if r["dtype"] == dt and r["processor"] == "fxattn fused")
        rec.update(
            qkv_seconds=st.qkv_seconds,
            attention_seconds=st.attention_seconds,
            out_seconds=st.out_seconds,
            fallback_rows=st.fallback_rows,
            rows=st.rows,
        )
    if a.rss:
        del calls, fused, res
        for r in recs:
            r["peak_rss_mib"] = peak_rss(a, r["dtype"], r["processor"])
            if r["peak_rss_mib"] is not None:
                print(f"# peak RSS {r['dtype']} {r['processor']}: {r['peak_rss_mib']:.0f} MiB")
    kind = "python_wan" if hidden == inner else "wan_long_seq"
    return [
        {
            "kind": kind,
            "module": "WanAttention",
            "S": s,
            "grid": list(grid),
            "hidden": hidden,
            "heads": a.heads,
            "model_heads": hidden // a.head_dim,
            "head_dim": a.head_dim,
            "threads": a.threads,
            "rounds": a.rounds,
            "gflop": flops / 1e9,
            **r,
        }
        for r in recs
    ]


def bench_model(a, grid, hidden):
    s = grid[0] * grid[1] * grid[2]
    h, f, L = hidden, a.ffn_dim, TEXT
    flops = 8.0 * s * h * h + 4.0 * s * s * h + 4.0 * s * h * h + 4.0 * L * h * h + 4.0 * s * L * h + 4.0 * s * h * f
    config = dict(
        patch_size=(1, 2, 2),
        num_attention_heads=a.heads,
        attention_head_dim=a.head_dim,
        in_channels=16,
        out_channels=16,
        text_dim=4096,
        freq_dim=256,
        ffn_dim=f,
        num_layers=1,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
        rope_max_seq_len=1024,
    )
    torch.manual_seed(0)
    m32 = WanTransformer3DModel(**config).eval()
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, grid[0], 2 * grid[1], 2 * grid[2], generator=g)
    text = torch.randn(1, L, 4096, generator=g)
    print(
        f"\none-layer WanTransformer3DModel forward: {sum(p.numel() for p in m32.parameters()) / 1e6:.0f} M parameters, "
        f"S {s}, text {L} x 4096, FFN {f}, {flops / 1e9:.1f} GFLOP in the block's matmuls"
    )
    calls = {}
    for dt in a.dtypes:
        dtype = DTYPES[dt]
        m = m32
        if dtype != torch.float32:
            m = WanTransformer3DModel(**config).eval()
            m.load_state_dict(m32.state_dict())
            keep_fp32_cast(m, dtype)
        args = dict(hidden_states=latents.to(dtype), timestep=torch.tensor([500]), encoder_hidden_states=text.to(dtype))
        for name, proc in (("diffusers default (SDPA)", WanAttnProcessor()), ("fxattn", FxProcessor(threads=a.threads))):

            def call(m=m, proc=proc, args=args):
                m.set_attn_processor(proc)
                with torch.no_grad():
                    return m(**args).sample

            calls[(dt, name)] = call
    res = interleaved_medians(calls, a.rounds)
    recs = table("one-layer WanTransformer3DModel forward:", [(dt, name, *res[(dt, name)]) for dt, name in calls], flops)
    return [
        {
            "kind": "python_wan",
            "module": "WanTransformer3DModel, one layer",
            "S": s,
            "grid": list(grid),
            "hidden": hidden,
            "heads": a.heads,
            "head_dim": a.head_dim,
            "ffn_dim": f,
            "threads": a.threads,
            "rounds": a.rounds,
            "gflop": flops / 1e9,
            **r,
        }
        for r in recs
    ]


def peak_core(text):
    vals = [float(x) for x in text.split(",")]
    return {"fp32": vals[0], "bf16": vals[1] if len(vals) > 1 else 2 * vals[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", default="4,32,32", help="latent grid F,H,W after patching (S = F H W)")
    ap.add_argument("--heads", type=int, default=40, help="heads run")
    ap.add_argument(
        "--hidden", type=int, default=None, help="the layer's hidden size (default heads x head dim); larger: a head slice of that layer"
    )
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (medians reported)")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--per-op", action="store_true", help="also fxattn's per-op processor (fxattn.attention)")
    ap.add_argument("--backend", action="store_true", help='also diffusers\' processor with the "fxattn" attention backend')
    ap.add_argument("--model", action="store_true", help="also a one-layer WanTransformer3DModel forward")
    ap.add_argument("--ffn-dim", type=int, default=13824, help="--model's FFN width (Wan2.2 A14B: 13824)")
    ap.add_argument("--rss", action="store_true", help="also each WanAttention row's peak RSS (a fresh process each)")
    ap.add_argument(
        "--peak-core",
        type=peak_core,
        default=None,
        metavar="FP32[,BF16]",
        help="per-core peaks (GFLOP/s) for CPU %% peak instead of the probe's per thread (bf16 default: twice fp32)",
    )
    ap.add_argument("--json", metavar="FILE", help="append one JSON object per row to FILE (- for stdout)")
    ap.add_argument("--machine", default=platform.node(), help="the results page's name for --json (default: host name)")
    ap.add_argument("--rss-child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    a.dtypes = a.dtypes.split(",")
    for dt in a.dtypes:
        if dt not in DTYPES:
            ap.error(f"--dtypes: {dt!r} is not fp32 or bf16")
    grid = tuple(int(g) for g in a.grid.split(","))
    a.hidden = hidden = a.hidden or a.heads * a.head_dim
    if hidden % a.head_dim or hidden < a.heads * a.head_dim:
        ap.error(f"--hidden {hidden}: must be a multiple of the head dim and at least heads x head dim")
    if a.model and hidden != a.heads * a.head_dim:
        ap.error("--model builds whole layers: --hidden must be heads x head dim")
    torch.set_num_threads(a.threads)
    if a.rss_child:
        rss_child(a, grid, hidden, a.rss_child)
        return
    print(f"# torch {torch.__version__}, diffusers {diffusers.__version__}, fxattn {fxattn.__version__} ({fxattn.kernel_info(a.threads)})")
    print(
        f"# python {platform.python_version()}, {cpu_name()}, {os.cpu_count()} CPUs; {a.threads} threads "
        f"(torch.set_num_threads, fxattn threads=); median of {a.rounds} interleaved rounds after one warm-up"
    )
    recs = bench_layer(a, grid, hidden)
    if a.model:
        recs += bench_model(a, grid, hidden)
    if a.json:
        versions = {"fxattn": fxattn.__version__, "torch": torch.__version__, "diffusers": diffusers.__version__}
        ident = identity(a.machine, Path(os.environ.get("FXATTN_LIBRARY_PATH", "build/lib")).parent, versions)
        kernels = fxattn.kernel_info(a.threads)
        append_jsonl(a.json, [{**ident, **r, "kernels": kernels} for r in recs])


if __name__ == "__main__":
    main()
