"""fxattn.scaled_dot_product_attention: torch's scaled_dot_product_attention
on fxattn (CPU), for torch tensors and numpy arrays."""

from __future__ import annotations

import math
import numbers
import sys

import numpy as np

from . import _arrays, _check_args, _lib
from ._attn_core import Mask, Options, attention_numpy

bad = _check_args.bad


def _unsupported(message: str):
    return _lib.UnsupportedError(message, _lib.UNSUPPORTED)


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
    *,
    compute=None,
    threads=None,
):
    """torch.nn.functional.scaled_dot_product_attention's call and results,
    computed by fxattn (exact fixed-max attention, CPU; differentiable for
    torch tensors with respect to query, key and value, attn_mask and
    is_causal included; an attn_mask requiring grad raises UnsupportedError).

    query [..., Hq, Sq, E], key and value [..., Hkv, Skv, E] (any leading
    batch dims, 2-D and 3-D too; key's and value's leading dims may
    broadcast to query's): CPU torch tensors or numpy arrays of float32,
    bfloat16 or float16, one dtype. The output has query's shape and dtype
    and, for torch, SDPA's memory format (a query whose heads are
    interleaved in memory, a transposed [B, S, H, D] view, gives an output
    laid out alike).

    attn_mask: None, a bool mask (True = the key takes part) or a float
    mask added to the scores (-inf masks), broadcastable to
    [..., Hq, Sq, Skv]; a float mask of another float dtype is converted to
    float32; or torch.nn.attention.bias.causal_upper_left(Sq, Skv) (is_causal)
    or causal_lower_right(Sq, Skv) (query i attends keys j <= i + Skv - Sq),
    as SDPA reads them. Another tensor subclass raises
    InvalidArgumentError. Not together with is_causal (SDPA refuses both). is_causal:
    query i attends keys j <= i, top-left aligned as SDPA's (also when
    Sq != Skv). A row whose keys are all masked gives 0, as SDPA does, and
    gradients 0.
    dropout_p: 0 only (inference). scale: None (1/sqrt(E)), a float, a 0-d
    tensor or a numpy scalar. enable_gqa: as SDPA's: without it the head
    counts must match (or key/value have one head, broadcast); with it Hq
    must be a multiple of Hkv.

    compute (fxattn's): "fp32" (exact to fp32 rounding), "bf16" (bf16
    products, P rounded to bf16: error at most 2^-7 max|v|) or None, the
    default: fp32 for float32 and float16 inputs, and for bfloat16 the faster
    of the two on this machine (fxattn.compute_choice). threads: worker threads
    (None: the CPUs this process may use).

    torch tensors go through the custom operator torch.ops.fxattn.attention,
    so torch.compile traces the call. Raises fxattn.InvalidArgumentError (a
    ValueError) on bad arguments, fxattn.UnsupportedError for what fxattn
    does not do (dropout, value's head dim other than query's).
    """
    _no_dropout(dropout_p)
    is_causal = _check_args.boolean("is_causal", is_causal)
    enable_gqa = _check_args.boolean("enable_gqa", enable_gqa)
    _arrays.same_kind(query, key, value)
    use_torch = _arrays.is_torch(query)
    if attn_mask is not None and _arrays.is_torch(attn_mask) != use_torch:
        raise bad("attn_mask must be of the same kind as query (a torch tensor or a numpy array)")
    causal_bias = None
    if attn_mask is not None and use_torch:
        causal_bias = _causal_bias(attn_mask, query)
    if attn_mask is not None and is_causal:
        raise bad(
            "attn_mask and is_causal=True together: pass one (torch's scaled_dot_product_attention "
            "refuses both too; fold the causal part into the mask)"
        )
    names = ("query", "key", "value", "attn_mask")
    tensors = [query, key, value] + ([] if attn_mask is None else [attn_mask])
    if use_torch:
        for name, t in zip(names, tensors):
            if t.device.type not in ("cpu", "meta"):
                raise bad(
                    f"{name} is on {t.device}; fxattn.scaled_dot_product_attention runs on the CPU "
                    "(torch.nn.functional.scaled_dot_product_attention serves other devices)"
                )
    else:
        query, key, value = (_arrays.native_array(t, n) for t, n in zip((query, key, value), names))
        if attn_mask is not None:
            attn_mask = _arrays.native_array(attn_mask, "attn_mask")
    q, k, v = query, key, value
    flat = q.ndim == 2
    if flat:  # [S, E]: one head of one batch
        q, k, v = q[None], k[None], v[None]
    lead, (hq, sq, e) = tuple(q.shape[:-3]), tuple(q.shape[-3:])
    hkv, skv = _check_shapes(q, k, v, enable_gqa)
    batch = math.prod(lead)
    q4 = q.reshape(batch, hq, sq, e)
    k4 = _broadcast(k, lead + (hkv, skv, e), use_torch).reshape(batch, hkv, skv, e)
    v4 = _broadcast(v, lead + (hkv, skv, e), use_torch).reshape(batch, hkv, skv, e)
    scale = None if scale is None else _check_args.positive_real("scale", scale)
    if compute is None:
        compute = "auto"
    if causal_bias is not None:
        attn_mask, is_causal = _causal_bias_mask(causal_bias, sq, skv)
    mask4 = None
    if attn_mask is not None:
        mask4 = _mask4(attn_mask, lead, (hq, sq, skv), batch, use_torch)
    if use_torch:
        out = _run_torch(q4, k4, v4, mask4, is_causal, scale, compute, threads)
    else:
        opts = Options.parse(scale, "bhsd", "auto", True, compute, threads)
        out = attention_numpy(q4, k4, v4, opts, False, None, mask4, is_causal)
    out = out.reshape(lead + (hq, sq, e))
    return out[0] if flat else out


def _causal_bias(m, query):
    """m itself when it is one of torch.nn.attention.bias's CausalBias masks
    (causal_upper_left, causal_lower_right), None when it is a plain tensor
    (or of query's own class, as tracing passes them). Any other tensor
    subclass is refused before its memory is read: a subclass's storage need
    not hold its values (a CausalBias's never does)."""
    import torch

    bias = sys.modules.get("torch.nn.attention.bias")  # a CausalBias exists only once it is imported
    if bias is not None and isinstance(m, bias.CausalBias):
        return m
    if type(m) in (torch.Tensor, torch.nn.Parameter) or type(m) is type(query):
        return None
    name = f"{type(m).__module__}.{type(m).__qualname__}"
    raise bad(
        f"attn_mask is a {name}, a tensor subclass whose memory need not hold its values; fxattn "
        "takes a plain torch.Tensor mask or torch.nn.attention.bias.causal_upper_left / "
        "causal_lower_right"
    )


def _causal_bias_mask(bias, sq: int, skv: int):
    """(attn_mask, is_causal) doing what CausalBias bias does in torch's SDPA on
    Sq queries and Skv keys: upper-left (and lower-right at Sq = Skv) is
    is_causal; lower-right otherwise is the bool mask tril(ones(Sq, Skv),
    Skv - Sq), query i attending keys j <= i + Skv - Sq (Sq Skv bytes,
    broadcast over batch and heads)."""
    import torch
    from torch.nn.attention.bias import CausalVariant

    if (bias.seq_len_q, bias.seq_len_kv) != (sq, skv):
        raise bad(
            f"attn_mask is a causal bias for {bias.seq_len_q} queries and {bias.seq_len_kv} keys, "
            f"but query has {sq} and key {skv}"
        )
    if bias.variant == CausalVariant.UPPER_LEFT or sq == skv:
        return None, True
    return torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq), False


def _no_dropout(dropout_p) -> None:
    p = _check_args._scalar(dropout_p)
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) <= 1.0:
        raise bad(f"dropout_p must be a number in [0, 1], not {_check_args.show(dropout_p)}")
    if float(p) != 0.0:
        raise _unsupported(f"dropout_p={float(p)}: fxattn is for inference and has no dropout; pass dropout_p=0.0")


def _check_shapes(q, k, v, enable_gqa: bool):
    """(Hkv, Skv) after checking ranks, dims, heads and batch broadcasting as SDPA does."""
    if q.ndim < 3 or not (q.ndim == k.ndim == v.ndim):
        raise bad(
            f"query, key and value have shapes {list(q.shape)}, {list(k.shape)}, {list(v.shape)}; "
            "they take [..., H, S, E], all of one rank (2 or more)"
        )
    hq, e = q.shape[-3], q.shape[-1]
    hkv, skv, ek = k.shape[-3:]
    if tuple(k.shape[:-1]) != tuple(v.shape[:-1]):
        raise bad(f"key has shape {list(k.shape)} but value has {list(v.shape)}; they differ only in the last dim in SDPA")
    if ek != e:
        raise bad(f"query has head dim {e} but key has {ek}; they must match")
    if v.shape[-1] != e:
        raise _unsupported(f"value has head dim {v.shape[-1]}, query {e}: fxattn takes one head dim for query, key and value")
    for qd, kd in zip(q.shape[:-3], k.shape[:-3]):
        if kd not in (1, qd):
            raise bad(f"key's batch dims {list(k.shape[:-3])} do not broadcast to query's {list(q.shape[:-3])}")
    if hkv != hq:
        if enable_gqa and hq % hkv != 0:
            raise bad(f"enable_gqa=True: query heads ({hq}) must be a multiple of key/value heads ({hkv})")
        if not enable_gqa and hkv != 1:
            raise bad(
                f"query has {hq} heads, key and value {hkv}: they must match (or key and value have one "
                "head); pass enable_gqa=True for grouped-query attention"
            )
    return hkv, skv


def _broadcast(t, shape, use_torch: bool):
    """t with its batch dims broadcast to shape (a view: stride 0)."""
    if tuple(t.shape) == tuple(shape):
        return t
    return t.expand(*shape) if use_torch else np.broadcast_to(t, shape)


def _mask4(m, lead, tail, batch: int, use_torch: bool):
    """attn_mask as [B, Hq, Sq, Skv] (broadcast axes with stride 0): a torch tensor for the
    operator, or a Mask of a numpy array."""
    shape = lead + tail
    if use_torch:
        import torch

        if m.dtype != torch.bool and not m.dtype.is_floating_point:
            raise bad(f"attn_mask has dtype {m.dtype}; it must be bool or floating point")
        if m.dtype not in (torch.bool, torch.float32):
            m = m.to(torch.float32)
        try:
            m = m.expand(*shape)
        except RuntimeError:
            raise bad(f"attn_mask has shape {list(m.shape)}, which does not broadcast to {list(shape)}") from None
        return m.reshape(batch, *tail)
    if m.dtype != np.bool_ and m.dtype.kind != "f" and m.dtype.name != "bfloat16":
        raise bad(f"attn_mask has dtype {m.dtype}; it must be bool or floating point")
    if m.dtype != np.bool_:
        m = m.astype(np.float32, copy=False)
    try:
        m = np.broadcast_to(m, shape)
    except ValueError:
        raise bad(f"attn_mask has shape {list(m.shape)}, which does not broadcast to {list(shape)}") from None
    m = m.reshape(batch, *tail)
    if any(s < 0 or s % m.itemsize for s in m.strides):
        m = np.ascontiguousarray(m)
    if m.dtype == np.bool_:
        m = m.view(np.uint8)
    kind = _lib.MASK_BOOL if m.dtype == np.uint8 else _lib.MASK_ADD
    return Mask(kind, tuple(s // m.itemsize for s in m.strides), m.ctypes.data, m)


def _run_torch(q, k, v, mask, is_causal: bool, scale, compute: str, threads):
    """The custom operator on [B, H, S, E] tensors. A query whose heads are interleaved in
    memory (a transposed [B, S, H, E] view) runs as BSHD and gives its output in that memory
    format, as SDPA does."""
    import torch

    from . import _torch

    bshd = q.shape[1] > 1 and q.shape[2] > 1 and q.stride(1) < q.stride(2)
    if bshd:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    out, _, _ = torch.ops.fxattn.attention(
        q,
        k,
        v,
        scale or 0.0,
        "bshd" if bshd else "bhsd",
        "auto",
        True,
        compute,
        _torch.needs_grad(q, k, v),
        "",
        _check_args.threads(threads),
        mask,
        is_causal,
    )
    return out.transpose(1, 2) if bshd else out
