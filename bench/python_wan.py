#!/usr/bin/env python3
"""One Wan self-attention layer through diffusers' WanAttention: fxattn's
processor (fxattn.diffusers.WanAttnProcessor, per op and fused) against
diffusers' default processor (torch SDPA), fp32 and bf16, side by side.

    FXATTN_LIBRARY_PATH=build/lib PYTHONPATH=python/src python bench/python_wan.py

Defaults: S = 4096 tokens (latent grid 4 x 32 x 32), hidden 5120 = 40 heads
x 128 (Wan2.2 A14B), 2 threads for torch and fxattn, one warm-up and the
median of 3 timed runs per row. GFLOP/s counts 4 S^2 hidden (attention) +
8 S hidden^2 (QKV and output projections). Random weights with Wan's
shapes (norm gains 1 + 0.1 N(0, 1)), x ~ N(0, 1).
"""

import argparse
import statistics
import time

import torch
import diffusers
from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor, WanRotaryPosEmbed

import fxattn
from fxattn.diffusers import WanAttnProcessor as FxProcessor


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", default="4,32,32", help="latent grid F,H,W (S = F H W)")
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--dtypes", default="fp32,bf16")
    a = ap.parse_args()
    grid = tuple(int(g) for g in a.grid.split(","))
    s = grid[0] * grid[1] * grid[2]
    hidden = a.heads * a.head_dim
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    flops = 4.0 * s * s * hidden + 8.0 * s * hidden * hidden
    print(
        f"torch {torch.__version__}, diffusers {diffusers.__version__}, fxattn {fxattn.__version__} "
        f"({fxattn.kernel_info(a.threads)})"
    )
    print(f"Wan self-attention: S {s} (grid {grid[0]}x{grid[1]}x{grid[2]}), hidden {hidden} = {a.heads} x {a.head_dim}, "
          f"{a.threads} threads, {flops / 1e9:.1f} GFLOP, median of {a.runs} after {a.warmup} warm-up")

    attn = WanAttention(dim=hidden, heads=a.heads, dim_head=a.head_dim, eps=1e-6, processor=WanAttnProcessor()).eval()
    with torch.no_grad():
        attn.norm_q.weight.copy_(1 + 0.1 * torch.randn(hidden))
        attn.norm_k.weight.copy_(1 + 0.1 * torch.randn(hidden))
    rope = WanRotaryPosEmbed(a.head_dim, (1, 2, 2), 1024)
    rotary_emb = rope(torch.empty(1, 1, grid[0], 2 * grid[1], 2 * grid[2]))
    x32 = torch.randn(1, s, hidden)

    def timed(proc, x, emb):
        attn.set_processor(proc)
        times, y = [], None
        with torch.no_grad():
            for i in range(a.warmup + a.runs):
                t0 = time.perf_counter()
                y = attn(x, None, None, emb)
                if i >= a.warmup:
                    times.append(time.perf_counter() - t0)
        return statistics.median(times), y.float()

    print(f"{'dtype':5} {'processor':22} {'seconds':>8} {'GFLOP/s':>8} {'vs default':>10} {'max|dy|/max|y|':>15}")
    for dt in a.dtypes.split(","):
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dt]
        attn.to(dtype)
        x = x32.to(dtype)
        emb = tuple(t.to(dtype) for t in rotary_emb) if dtype != torch.float32 else rotary_emb
        rows = [("diffusers default (SDPA)", WanAttnProcessor())]
        rows.append(("fxattn per-op", FxProcessor(fused=False, threads=a.threads)))
        if dtype == torch.float32:
            rows.append(("fxattn fused", FxProcessor(fused=True, threads=a.threads)))
        base = ref = None
        for name, proc in rows:
            sec, y = timed(proc, x, emb)
            if base is None:
                base, ref = sec, y
            err = ((y - ref).abs().max() / ref.abs().max()).item()
            print(f"{dt:5} {name:22} {sec:8.3f} {flops / sec / 1e9:8.1f} {base / sec:9.2f}x {err:15.2e}", flush=True)
            if name == "fxattn fused":
                st = proc._layers[attn][1].last_stats
                print(f"      fused stages: qkv {st.qkv_seconds:.3f} s, attention {st.attention_seconds:.3f} s, "
                      f"out {st.out_seconds:.3f} s, fallback rows {st.fallback_rows} of {st.rows}")
            del proc
        attn.to(torch.float32)


if __name__ == "__main__":
    main()
