"""fxattn.diffusers: an attention processor for diffusers' Wan transformers.
    from fxattn.diffusers import WanAttnProcessor
    transformer.set_attn_processor(WanAttnProcessor())

WanAttnProcessor computes what diffusers' WanAttnProcessor computes (same
projections, RMSNorms, interleaved-pair RoPE, I2V image branch, output
projection) with the attention itself in fxattn.attention (BSHD CPU
tensors, no copies, output in the input's dtype). Self-attention layers
can instead run fxattn's fused Wan layer (fxattn.wan: projection + norm +
RoPE + attention + output projection in C; fp32, or the bf16 layer for bf16
models), when that computes the same thing; see WanAttnProcessor.

Importing it also registers the "fxattn" attention backend of diffusers'
dispatcher (model.set_attention_backend("fxattn")); nonfinite chooses what
that backend does with NaN or Inf inputs:

    with fxattn.diffusers.nonfinite("raise"):   # refuse them, in this block
        video = pipe(prompt).frames
"""

from .integrations.diffusers.backend import nonfinite
from .integrations.diffusers.processor import TEXT_CONTEXT, WanAttnProcessor, rope_grid

# parallelize, Parallelized and ShardedWanAttnProcessor are public too, loaded on first use.
__all__ = ["WanAttnProcessor", "rope_grid", "TEXT_CONTEXT", "nonfinite"]


def __getattr__(name):
    """parallelize (and its classes), imported on first use: it loads
    mpi4py, which initialises MPI, so a program that never asks for
    sequence parallelism never starts MPI."""
    if name in ("parallelize", "Parallelized", "ShardedWanAttnProcessor"):
        from .integrations.diffusers import wan_parallel

        return getattr(wan_parallel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
