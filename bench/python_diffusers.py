#!/usr/bin/env python3
"""diffusers' Wan and Flux transformers with the "fxattn" attention backend
against diffusers' native one (torch SDPA), side by side in one process.

    .venv/bin/python bench/python_diffusers.py [--models wan,flux] [--parts attention,model]
        [--dtypes fp32,bf16] [--repeats 3] [--json FILE --machine NAME]
    .venv/bin/python bench/python_diffusers.py --tokens 256 --repeats 1   # a quick check (seconds)

Tiny random models built from configs (no hub access) at the real head dim
128, 2 heads (hidden 256), a few thousand tokens, so that attention is most
of the time:
  - Wan: WanTransformer3DModel, 2 layers, FFN 1024, text 512 tokens x 256;
    latents [1, 16, 3, 64, 64], patches 1 x 2 x 2: S = 3072 tokens (a
    9-frame 512 x 512 video through Wan's VAE).
  - Flux: FluxTransformer2DModel, 1 double and 2 single blocks, packed
    latents [1, 2304, 64] (a 48 x 48 grid: a 768 x 768 image), text 512
    tokens x 256, pooled 256: joint attention over 2816 tokens.
On 2 cores a whole fp32 forward takes about 0.5 s with the native backend.
--tokens N shrinks the latents to about N image tokens (for quick checks).

Parts: "attention" calls one attention module directly (Wan: blocks[0].attn1,
self-attention with RoPE; Flux: transformer_blocks[0].attn, the joint
text + image attention) on N(0, 1) hidden states and the model's own RoPE
tables; "model" is the whole forward. The backend is switched with
model.set_attention_backend("fxattn" / "native") between calls (outside
the timed region). fp32, and bf16 (parameters in bf16 but those of the
model's _keep_in_fp32_modules, as from_pretrained(torch_dtype=...) casts
them; fxattn's backend computes bf16 inputs in its bf16 compute).

First one call with each backend; their outputs must agree: max|y_fxattn -
y_native| / max|y_native| below 1e-4 for fp32 and 5e-2 for bf16 (else exit
1); these calls are the warm-up. Then --repeats rounds, each timing both
backends once, fxattn first in even rounds and native first in odd ones;
the table gives medians and the speed-up (native seconds over fxattn's).

Threads: torch (its matmuls and the native backend) runs on --threads
threads (torch.set_num_threads; default: the CPUs this process may use);
fxattn's backend on the CPUs this process may use (restrict both with
taskset). --json FILE appends one JSON object per (model, part, dtype)
to FILE (bench/README.md, "Raw results"; kind python_diffusers).
"""

import argparse
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import diffusers
import torch
from benchlib import append_jsonl, cpu_name, identity
from diffusers import FluxTransformer2DModel, WanTransformer3DModel

import fxattn
import fxattn.diffusers  # noqa: F401  (registers the "fxattn" backend)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOLERANCE = {"fp32": 1e-4, "bf16": 5e-2}  # max relative difference fxattn against native
HEADS, HEAD_DIM, TEXT, TEXT_DIM = 2, 128, 512, 256


def wan(tokens):
    """(model, {part: (module, kwargs(dtype))}, S) of the tiny Wan."""
    config = dict(
        patch_size=(1, 2, 2),
        num_attention_heads=HEADS,
        attention_head_dim=HEAD_DIM,
        in_channels=16,
        out_channels=16,
        text_dim=TEXT_DIM,
        freq_dim=256,
        ffn_dim=1024,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        eps=1e-6,
        rope_max_seq_len=1024,
    )
    side = 32 if tokens is None else max(1, round(math.sqrt(tokens)))
    frames = 3 if tokens is None else 1
    torch.manual_seed(0)
    model = WanTransformer3DModel(**config).eval()
    g = torch.Generator().manual_seed(1)
    latents = torch.randn(1, 16, frames, 2 * side, 2 * side, generator=g)
    text = torch.randn(1, TEXT, TEXT_DIM, generator=g)
    s = frames * side * side
    x = torch.randn(1, s, HEADS * HEAD_DIM, generator=g)

    def attention(dtype):
        return dict(hidden_states=x.to(dtype), rotary_emb=model.rope(latents.to(dtype)))

    def whole(dtype):
        return dict(hidden_states=latents.to(dtype), timestep=torch.tensor([500]), encoder_hidden_states=text.to(dtype))

    return model, {"attention": (model.blocks[0].attn1, attention), "model": (model, whole)}, s


def flux(tokens):
    """(model, {part: (module, kwargs(dtype))}, S) of the tiny Flux (S: text + image tokens)."""
    config = dict(
        patch_size=1,
        in_channels=64,
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=HEAD_DIM,
        num_attention_heads=HEADS,
        joint_attention_dim=TEXT_DIM,
        pooled_projection_dim=256,
        guidance_embeds=False,
        axes_dims_rope=(16, 56, 56),
    )
    side = 48 if tokens is None else max(1, round(math.sqrt(tokens)))
    torch.manual_seed(0)
    model = FluxTransformer2DModel(**config).eval()
    g = torch.Generator().manual_seed(1)
    img = torch.randn(1, side * side, 64, generator=g)
    text = torch.randn(1, TEXT, TEXT_DIM, generator=g)
    pooled = torch.randn(1, 256, generator=g)
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    img_ids = torch.stack([torch.zeros_like(rows), rows, cols], -1).reshape(-1, 3).float()
    txt_ids = torch.zeros(TEXT, 3)
    x = torch.randn(1, side * side, HEADS * HEAD_DIM, generator=g)
    c = torch.randn(1, TEXT, HEADS * HEAD_DIM, generator=g)

    def attention(dtype):
        return dict(
            hidden_states=x.to(dtype), encoder_hidden_states=c.to(dtype), image_rotary_emb=model.pos_embed(torch.cat((txt_ids, img_ids), 0))
        )

    def whole(dtype):
        return dict(
            hidden_states=img.to(dtype),
            encoder_hidden_states=text.to(dtype),
            pooled_projections=pooled.to(dtype),
            timestep=torch.tensor([0.5]),
            img_ids=img_ids,
            txt_ids=txt_ids,
        )

    return model, {"attention": (model.transformer_blocks[0].attn, attention), "model": (model, whole)}, TEXT + side * side


MODELS = {"wan": ("WanTransformer3DModel", wan), "flux": ("FluxTransformer2DModel", flux)}


def cast(model, dtype):
    """model's parameters and buffers in dtype, except those of its
    _keep_in_fp32_modules (fp32): what from_pretrained(torch_dtype=dtype) makes."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            t.data = t.data.to(torch.float32 if keep & set(name.split(".")) else dtype)


def output(y):
    """The output tensor of a call (the model's sample; Flux attention's
    image and text outputs joined)."""
    if hasattr(y, "sample"):
        return y.sample
    if isinstance(y, tuple):
        return torch.cat([t.flatten() for t in y])
    return y


def run_case(a, model, module, kwargs, dtype):
    """(fxattn median seconds, native median seconds, max relative difference)."""
    args = kwargs(DTYPES[dtype])

    def call(backend):
        def fn():
            model.set_attention_backend(backend)
            with torch.no_grad():
                t0 = time.perf_counter()
                y = output(module(**args))
                return time.perf_counter() - t0, y

        return fn

    fx, native = call("fxattn"), call("native")
    _, y_fx = fx()
    _, y_nat = native()
    diff = float((y_fx.float() - y_nat.float()).abs().max() / y_nat.float().abs().max())
    times = {fx: [], native: []}
    for r in range(a.repeats):
        for fn in (fx, native) if r % 2 == 0 else (native, fx):
            times[fn].append(fn()[0])
    model.reset_attention_backend()
    return statistics.median(times[fx]), statistics.median(times[native]), diff


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="wan,flux")
    ap.add_argument("--parts", default="attention,model", help="attention (one attention module), model (forward)")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--tokens", type=int, help="about this many image tokens instead of the defaults (quick checks)")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch's threads")
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (medians reported)")
    ap.add_argument("--json", metavar="FILE", help="append one JSON object per row to FILE (- for stdout)")
    ap.add_argument("--machine", default=platform.node(), help="the results page's name for --json (default: host name)")
    a = ap.parse_args()
    lists = {"models": (a.models, MODELS), "parts": (a.parts, ("attention", "model")), "dtypes": (a.dtypes, DTYPES)}
    for opt, (value, known) in lists.items():
        if any(x not in known for x in value.split(",")):
            ap.error(f"--{opt}: {value!r}: a comma list of {', '.join(known)}")
    if a.repeats < 1 or a.threads < 1:
        ap.error("--repeats and --threads must be at least 1")
    torch.set_num_threads(a.threads)
    diffusers.utils.logging.set_verbosity_error()  # set_attention_backend warns "experimental" at every call
    kernels = fxattn.kernel_info()
    print(f"# fxattn {fxattn.__version__} ({kernels}), torch {torch.__version__}, diffusers {diffusers.__version__}")
    print(
        f"# python {platform.python_version()}, {cpu_name()}, {os.cpu_count()} CPUs; torch {a.threads} threads, "
        f"fxattn {len(os.sched_getaffinity(0))}; median of {a.repeats} alternating rounds after a checked warm-up"
    )
    print(f"{'model':24} {'part':9} {'S':>5} {'dtype':5} {'fxattn s':>9} {'native s':>9} {'speed-up':>8} {'max rel diff':>12}", flush=True)
    recs = []
    for name in a.models.split(","):
        cls, build = MODELS[name]
        model, parts, s = build(a.tokens)
        state = {k: v.clone() for k, v in model.state_dict().items()}
        for dtype in a.dtypes.split(","):
            model.load_state_dict(state)
            cast(model, DTYPES[dtype])
            for part in a.parts.split(","):
                module, kwargs = parts[part]
                fx_s, nat_s, diff = run_case(a, model, module, kwargs, dtype)
                what = type(module).__name__ if part == "attention" else cls
                print(f"{cls:24} {part:9} {s:5d} {dtype:5} {fx_s:9.4f} {nat_s:9.4f} {nat_s / fx_s:7.2f}x {diff:12.2e}", flush=True)
                if not diff < TOLERANCE[dtype]:
                    sys.exit(f"python_diffusers.py: {cls} {part} {dtype}: max relative difference {diff:.3e}, above {TOLERANCE[dtype]:g}")
                recs.append(
                    {
                        "kind": "python_diffusers",
                        "model": cls,
                        "part": part,
                        "module": what,
                        "S": s,
                        "heads": HEADS,
                        "head_dim": HEAD_DIM,
                        "text": TEXT,
                        "dtype": dtype,
                        "threads": a.threads,
                        "repeats": a.repeats,
                        "fxattn_seconds": fx_s,
                        "native_seconds": nat_s,
                        "speedup": nat_s / fx_s,
                        "max_rel_diff": diff,
                    }
                )
    if a.json:
        versions = {"fxattn": fxattn.__version__, "torch": torch.__version__, "diffusers": diffusers.__version__}
        ident = identity(a.machine, Path(os.environ.get("FXATTN_LIBRARY_PATH", "build/lib")).parent, versions)
        append_jsonl(a.json, [{**ident, **r, "kernels": kernels} for r in recs])


if __name__ == "__main__":
    main()
