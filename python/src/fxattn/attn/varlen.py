"""fxattn.varlen_attention: attention over packed variable-length sequences
(flash-attn's varlen convention). Tokens of every sequence lie one after
another in q [total_q, Hq, D] and k, v [total_k, Hkv, D]; cu_seqlens_q and
cu_seqlens_k give where each sequence starts. Each sequence runs as one
attention call of its own lengths on every thread, so no token attends
outside its sequence and no padding is computed."""

from __future__ import annotations

import numpy as np

from .. import _capi
from .._common import arrays, validate
from .inputs import Inputs
from .options import Options, zero_scale_query
from .run import attention_numpy, numpy_bf16


def _offsets(name: str, cu, total: int, name_total: str) -> list:
    """cu_seqlens as a list of ints: 1-D, integer, at least 2 entries, from 0
    to total, never decreasing."""
    if arrays.is_torch(cu):
        if cu.is_floating_point() or cu.is_complex() or cu.dtype == arrays.torch_module().bool:
            raise validate.bad(f"{name} must hold integers, not {cu.dtype}")
        cu = cu.detach().cpu().numpy()
    a = np.asarray(cu)
    if a.dtype.kind not in "iu":
        raise validate.bad(f"{name} must hold integers, not {a.dtype}")
    if a.ndim != 1 or a.shape[0] < 2:
        raise validate.bad(f"{name} must be 1-D with one entry per sequence and one more (shape {tuple(a.shape)})")
    off = [int(x) for x in a]
    if off[0] != 0:
        raise validate.bad(f"{name} must start at 0, not {off[0]}")
    for s in range(len(off) - 1):
        if off[s + 1] < off[s]:
            raise validate.bad(f"{name} decreases at sequence {s}: {off[s]} then {off[s + 1]}")
    if off[-1] != total:
        raise validate.bad(f"{name} ends at {off[-1]}, but {name_total} holds {total} tokens")
    return off


def _packed(name: str, x) -> None:
    if len(x.shape) != 3:
        raise validate.bad(f"{name} must be [tokens, heads, head_dim] (packed sequences), not of shape {tuple(x.shape)}")


def _out_dtype(in_code: int, out_dtype, use_torch: bool):
    """The dtype of the output of inputs of in_code (theirs unless out_dtype says otherwise)."""
    code = arrays.out_code(in_code, out_dtype)
    if use_torch:
        torch = arrays.torch_module()
        return {_capi.F32: torch.float32, _capi.F64: torch.float64, _capi.F16: torch.float16, _capi.BF16: torch.bfloat16}[code]
    if code == _capi.BF16:
        return numpy_bf16()
    return {_capi.F32: np.float32, _capi.F64: np.float64, _capi.F16: np.float16}[code]


def varlen_attention(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    *,
    scale=None,
    causal=False,
    mode="auto",
    center=True,
    compute="auto",
    return_lse=False,
    out_dtype=None,
    threads=None,
):
    """Exact attention over packed sequences: sequence s's queries
    q[cu_seqlens_q[s]:cu_seqlens_q[s+1]] attend only its keys and values
    k, v[cu_seqlens_k[s]:cu_seqlens_k[s+1]] (flash-attn's
    flash_attn_varlen_func convention).

    q: [total_q, Hq, D]; k, v: [total_k, Hkv, D], Hq a multiple of Hkv;
    numpy arrays or CPU torch tensors of float32, bfloat16, float16 or
    float64, as fxattn.attention takes them. cu_seqlens_q, cu_seqlens_k:
    1-D integer arrays or tensors (or lists) of n + 1 offsets for n
    sequences, from 0 to total_q (total_k), never decreasing; a sequence
    may be empty. causal: each sequence causal, aligned bottom-right as
    flash-attn's (query i attends keys j <= i + Skv - Sq of its sequence).
    A query with no key to attend (a sequence without keys, or a causal
    row before the first key) gives output 0 and lse -inf, with zero
    gradients. scale, mode, center, compute, out_dtype and threads as in
    fxattn.attention.

    Returns out [total_q, Hq, D] (q's kind) or, with return_lse=True,
    (out, lse) with lse [Hq, total_q] (fp32; fp64 for float64 inputs), the
    natural-log log-sum-exp of each row's scaled scores. Torch tensors
    requiring grad get gradients, as from fxattn.attention.
    """
    arrays.same_kind(q, k, v)
    use_torch = arrays.is_torch(q)
    if not use_torch:
        q, k, v = (arrays.native_array(x, name) for x, name in ((q, "q"), (k, "k"), (v, "v")))
    for name, x in (("q", q), ("k", k), ("v", v)):
        _packed(name, x)
    in_code = arrays.operand(q, "q").dtype
    cq = _offsets("cu_seqlens_q", cu_seqlens_q, q.shape[0], "q")
    ck = _offsets("cu_seqlens_k", cu_seqlens_k, k.shape[0], "k")
    if len(cq) != len(ck):
        raise validate.bad(f"cu_seqlens_q holds {len(cq) - 1} sequences but cu_seqlens_k {len(ck) - 1}")
    if k.shape[0] != v.shape[0]:
        raise validate.bad(f"k holds {k.shape[0]} tokens but v {v.shape[0]}")
    q, scale = zero_scale_query(q, scale)
    opts = Options.parse(scale, "bshd", mode, center, compute, threads, causal=causal, lower_right=causal)
    return_lse = validate.boolean("return_lse", return_lse)
    out_type = _out_dtype(in_code, out_dtype, use_torch)
    lse_type = np.float64 if in_code == _capi.F64 else np.float32
    hq = q.shape[1]
    outs, lses = [], []
    for s in range(len(cq) - 1):
        qs = q[cq[s] : cq[s + 1]]
        if qs.shape[0] == 0:
            continue
        ks, vs = k[ck[s] : ck[s + 1]], v[ck[s] : ck[s + 1]]
        if ks.shape[0] == 0:
            outs.append(_zeros(qs.shape, out_type, use_torch))
            lses.append(_full((hq, qs.shape[0]), -np.inf, lse_type, use_torch))
            continue
        out, lse = _one(qs[None], ks[None], vs[None], opts, out_dtype, use_torch)
        outs.append(out[0])
        lses.append(lse[0])
    if not outs:
        outs.append(_zeros(q.shape, out_type, use_torch))
        lses.append(_full((hq, 0), -np.inf, lse_type, use_torch))
    out = _cat(outs, 0, use_torch)
    return (out, _cat(lses, 1, use_torch)) if return_lse else out


def _one(q, k, v, opts: Options, out_dtype, use_torch: bool):
    """One sequence ([1, S, H, D] each): (out, lse)."""
    if use_torch:
        from . import torch_op

        return torch_op.attention(q, k, v, opts, True, out_dtype)
    return attention_numpy(Inputs.of(q, k, v, opts.layout), opts, True, out_dtype)


def _zeros(shape, dtype, use_torch: bool):
    if use_torch:
        return arrays.torch_module().zeros(shape, dtype=dtype)
    return np.zeros(shape, dtype)


def _full(shape, value, dtype, use_torch: bool):
    if use_torch:
        torch = arrays.torch_module()
        return torch.full(shape, value, dtype=torch.float64 if dtype == np.float64 else torch.float32)
    return np.full(shape, value, dtype)


def _cat(parts, axis: int, use_torch: bool):
    if use_torch:
        return arrays.torch_module().cat(parts, axis)
    return np.concatenate(parts, axis)
