"""fxattn.attention, the public entry of the attention operator: exact
fixed-max attention on numpy arrays and torch tensors."""

from __future__ import annotations

from .._common import arrays, validate
from .inputs import Inputs
from .options import Options, zero_scale_query
from .run import attention_numpy


def attention(
    q,
    k,
    v,
    *,
    layout,
    scale=None,
    mode="auto",
    center=True,
    compute="auto",
    return_lse=False,
    out_dtype=None,
    threads=None,
    reproducible=False,
):
    """Exact softmax attention softmax(scale q k^T) v, with fixed-max shifts.

    layout (required, keyword): "bshd" (q [B, Sq, Hq, D], diffusers') or
    "bhsd" (q [B, Hq, Sq, D], torch SDPA's; fxattn.scaled_dot_product_attention
    takes SDPA's call as it is).
    q: [B, Sq, Hq, D] (layout "bshd") or [B, Hq, Sq, D] ("bhsd"); k, v:
    [B, Skv, Hkv, D] or [B, Hkv, Skv, D], Hq a multiple of Hkv (GQA/MQA).
    numpy arrays or CPU torch tensors of float32, bfloat16, float16 or
    float64, all three of one dtype, with any non-negative strides whose
    last axis is contiguous (a transposed torch view runs without a copy).
    float64 inputs are computed in fp64 throughout (exact to fp64
    rounding), with a float64 output and lse.

    scale: softmax scale (None: 1/sqrt(D)). mode: "auto" (fixed-max, rows
    that fail the gate run online softmax) or "online". center: virtual key
    centring. compute: "auto" (fp32 for float32 and float16 inputs; for
    bfloat16 inputs the faster of the two on this machine, as
    fxattn.compute_choice says; fp64 for float64 inputs), "fp32" (exact to
    fp32 rounding), "bf16" (bf16 inputs only: bf16 products, P rounded to
    bf16) or "fp64" (float64 inputs only). out_dtype: the output's
    dtype (default: the input's, like torch's scaled_dot_product_attention;
    float64 inputs give float64 only).
    threads: worker threads (None: the CPUs this process may use).
    reproducible: the bytes every fxattn.mpi grid writes with
    reproducible=True (the key sums over canonical groups of 256 keys in
    key order, short queries' keys kept whole; docs/numerics.md, "The same
    bits on any grid"); False: the same bytes at any thread count.

    Returns the output (q's shape, contiguous, the same kind as q) or, with
    return_lse=True, (out, lse) where lse [B, Hq, Sq] is the fp32 (fp64
    for float64 inputs) natural-log log-sum-exp of the scaled scores. Raises
    fxattn.InvalidArgumentError (a ValueError) with the library's message on
    bad input (shapes, dtypes, NaN or Inf in q, k or v). Torch tensors
    requiring grad get gradients (docs/python.md, "Autograd").
    """
    arrays.same_kind(q, k, v)
    q, scale = zero_scale_query(q, scale)
    opts = Options.parse(scale, layout, mode, center, compute, threads, reproducible=reproducible)
    return_lse = validate.boolean("return_lse", return_lse)
    if arrays.is_torch(q):
        from . import torch_op

        return torch_op.attention(q, k, v, opts, return_lse, out_dtype)
    return attention_numpy(Inputs.of(q, k, v, opts.layout), opts, return_lse, out_dtype)
