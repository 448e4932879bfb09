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

--json FILE appends one JSON object per row to FILE (bench/README.md, "Raw
results"); fxattn's fused rows carry the fused layer's stage times.
"""

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import diffusers
import torch
from diffusers import WanTransformer3DModel
from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor, WanRotaryPosEmbed

import fxattn
from benchlib import append_jsonl, cpu_name, identity
from fxattn.diffusers import WanAttnProcessor as FxProcessor

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TEXT = 512  # Wan's text context length


def interleaved_medians(calls, rounds):
    """{(dtype, name): (median seconds, last output)}: every call once to warm up,
    then `rounds` rounds timing each call once, in turn."""
    outs = {name: fn() for name, fn in calls.items()}
    times = {name: [] for name in calls}
    for r in range(rounds):
        for name, fn in calls.items():
            t0 = time.perf_counter()
            outs[name] = fn()
            times[name].append(time.perf_counter() - t0)
        print(f"# round {r + 1}/{rounds}: " + ", ".join(f"{' '.join(n)} {times[n][-1]:.2f} s" for n in calls), flush=True)
    return {name: (statistics.median(times[name]), outs[name]) for name in calls}


def keep_fp32_cast(model, dtype):
    """model's parameters and buffers in dtype, except those of its
    _keep_in_fp32_modules (fp32): what from_pretrained(torch_dtype=dtype) makes."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            t.data = t.data.to(torch.float32 if keep & set(name.split(".")) else dtype)
    return model


def table(title, rows, flops):
    """Prints rows [(dtype, processor, seconds, output)] and returns them as
    [{dtype, processor, seconds, gflops, speedup, error}]: speed-up against
    the same dtype's default row, error against the fp32 default's output."""
    print(f"\n{title}")
    print(f"{'dtype':5} {'processor':26} {'seconds':>8} {'GFLOP/s':>8} {'speed-up':>9} {'err vs fp32 default':>20}")
    base = {dt: sec for dt, name, sec, _ in rows if name.startswith("diffusers")}
    ref = next(y for dt, name, _, y in rows if dt == "fp32" and name.startswith("diffusers"))
    ref = ref.float() if ref is not None else None
    out = []
    for dt, name, sec, y in rows:
        err = ((y.float() - ref).abs().max() / ref.abs().max()).item() if ref is not None else float("nan")
        print(f"{dt:5} {name:26} {sec:8.3f} {flops / sec / 1e9:8.1f} {base[dt] / sec:8.2f}x {err:20.2e}")
        out.append({"dtype": dt, "processor": name, "engine": "diffusers" if name.startswith("diffusers") else "fxattn",
                    "seconds": sec, "gflops": flops / sec / 1e9, "speedup": base[dt] / sec, "error": err})
    return out


def bench_layer(a, grid, hidden):
    s = grid[0] * grid[1] * grid[2]
    flops = 4.0 * s * s * hidden + 8.0 * s * hidden * hidden
    torch.manual_seed(0)
    attn32 = WanAttention(dim=hidden, heads=a.heads, dim_head=a.head_dim, eps=1e-6, processor=WanAttnProcessor()).eval()
    with torch.no_grad():
        attn32.norm_q.weight.copy_(1 + 0.1 * torch.randn(hidden))
        attn32.norm_k.weight.copy_(1 + 0.1 * torch.randn(hidden))
    rope = WanRotaryPosEmbed(a.head_dim, (1, 2, 2), 1024)
    rotary_emb = rope(torch.empty(1, 1, grid[0], 2 * grid[1], 2 * grid[2]))  # fp64 tables
    emb32 = tuple(t.float() for t in rotary_emb)
    x32 = torch.randn(1, s, hidden)
    print(f"\nWan self-attention (WanAttention): S {s} (grid {grid[0]}x{grid[1]}x{grid[2]}), hidden {hidden} = "
          f"{a.heads} x {a.head_dim}, {flops / 1e9:.1f} GFLOP per call")

    calls, meta, fused = {}, {}, {}
    for dt in a.dtypes:
        dtype = DTYPES[dt]
        attn = attn32 if dtype == torch.float32 else WanAttention(
            dim=hidden, heads=a.heads, dim_head=a.head_dim, eps=1e-6, processor=WanAttnProcessor()).eval()
        if attn is not attn32:
            attn.load_state_dict(attn32.state_dict())
            attn.to(dtype)
        x = x32.to(dtype)
        emb = rotary_emb if dtype == torch.float32 else emb32
        procs = [("diffusers default (SDPA)", WanAttnProcessor())]
        if a.per_op:
            procs.append(("fxattn per op", FxProcessor(fused=False, threads=a.threads)))
        procs.append(("fxattn fused", FxProcessor(fused=True, threads=a.threads)))
        for name, proc in procs:
            def call(attn=attn, proc=proc, x=x, emb=emb):
                attn.set_processor(proc)
                with torch.no_grad():
                    return attn(x, None, None, emb)
            calls[(dt, name)] = call
            meta[(dt, name)] = (attn, proc)
            if name == "fxattn fused":
                fused[dt] = (attn, proc)
    res = interleaved_medians(calls, a.rounds)
    recs = table("one WanAttention call:", [(dt, name, *res[(dt, name)]) for dt, name in calls], flops)
    for dt, (attn, proc) in fused.items():
        assert proc.fused_calls == a.rounds + 1, (dt, proc.fused_calls)
        st = proc._layers[attn][1].last_stats
        print(f"{dt:5} fxattn fused stages (last run): qkv {st.qkv_seconds:.3f} s, attention {st.attention_seconds:.3f} s, "
              f"out {st.out_seconds:.3f} s, fallback rows {st.fallback_rows} of {st.rows}")
        rec = next(r for r in recs if r["dtype"] == dt and r["processor"] == "fxattn fused")
        rec.update(qkv_seconds=st.qkv_seconds, attention_seconds=st.attention_seconds, out_seconds=st.out_seconds,
                   fallback_rows=st.fallback_rows, rows=st.rows)
    return [{"kind": "python_wan", "module": "WanAttention", "S": s, "grid": list(grid), "hidden": hidden,
             "heads": a.heads, "head_dim": a.head_dim, "threads": a.threads, "rounds": a.rounds,
             "gflop": flops / 1e9, **r} for r in recs]


def bench_model(a, grid, hidden):
    s = grid[0] * grid[1] * grid[2]
    h, f, L = hidden, a.ffn_dim, TEXT
    flops = 8.0 * s * h * h + 4.0 * s * s * h + 4.0 * s * h * h + 4.0 * L * h * h + 4.0 * s * L * h + 4.0 * s * h * f
    config = dict(patch_size=(1, 2, 2), num_attention_heads=a.heads, attention_head_dim=a.head_dim, in_channels=16,
                  out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=f, num_layers=1, cross_attn_norm=True,
                  qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
    torch.manual_seed(0)
    m32 = WanTransformer3DModel(**config).eval()
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, grid[0], 2 * grid[1], 2 * grid[2], generator=g)
    text = torch.randn(1, L, 4096, generator=g)
    print(f"\none-layer WanTransformer3DModel forward: {sum(p.numel() for p in m32.parameters()) / 1e6:.0f} M parameters, "
          f"S {s}, text {L} x 4096, FFN {f}, {flops / 1e9:.1f} GFLOP in the block's matmuls")
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
    return [{"kind": "python_wan", "module": "WanTransformer3DModel, one layer", "S": s, "grid": list(grid),
             "hidden": hidden, "heads": a.heads, "head_dim": a.head_dim, "ffn_dim": f, "threads": a.threads,
             "rounds": a.rounds, "gflop": flops / 1e9, **r} for r in recs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", default="4,32,32", help="latent grid F,H,W after patching (S = F H W)")
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (medians reported)")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--per-op", action="store_true", help="also fxattn's per-op processor (fxattn.attention)")
    ap.add_argument("--model", action="store_true", help="also a one-layer WanTransformer3DModel forward")
    ap.add_argument("--ffn-dim", type=int, default=13824, help="--model's FFN width (Wan2.2 A14B: 13824)")
    ap.add_argument("--json", metavar="FILE", help="append one JSON object per row to FILE (- for stdout)")
    ap.add_argument("--machine", default=platform.node(), help="the results page's name for --json (default: host name)")
    a = ap.parse_args()
    a.dtypes = a.dtypes.split(",")
    for dt in a.dtypes:
        if dt not in DTYPES:
            ap.error(f"--dtypes: {dt!r} is not fp32 or bf16")
    grid = tuple(int(g) for g in a.grid.split(","))
    hidden = a.heads * a.head_dim
    torch.set_num_threads(a.threads)
    print(f"# torch {torch.__version__}, diffusers {diffusers.__version__}, fxattn {fxattn.__version__} "
          f"({fxattn.kernel_info(a.threads)})")
    print(f"# python {platform.python_version()}, {cpu_name()}, {os.cpu_count()} CPUs; {a.threads} threads "
          f"(torch.set_num_threads, fxattn threads=); median of {a.rounds} interleaved rounds after one warm-up")
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
