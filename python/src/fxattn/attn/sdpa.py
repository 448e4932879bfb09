"""fxattn.scaled_dot_product_attention: torch's scaled_dot_product_attention
on fxattn (CPU), for torch tensors and numpy arrays."""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from .. import _capi
from .._common import arrays, validate
from . import masks
from .inputs import Inputs
from .options import Options, zero_scale_query
from .run import Dropout, attention_numpy

bad = validate.bad


def _unsupported(message: str):
    return _capi.UnsupportedError(message, _capi.UNSUPPORTED)


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
    nonfinite="propagate",
    dropout_rng="philox",
):
    """torch.nn.functional.scaled_dot_product_attention's call and results,
    computed by fxattn (exact fixed-max attention, CPU; differentiable for
    torch tensors with respect to query, key and value, attn_mask and
    is_causal included; an attn_mask requiring grad raises UnsupportedError).

    query [..., Hq, Sq, E], key and value [..., Hkv, Skv, E] (any leading
    batch dims, 2-D and 3-D too; key's and value's leading dims may
    broadcast to query's, each, a key or value of fewer dims taking leading
    1s, as torch broadcasts them): CPU torch tensors or numpy arrays of float32,
    bfloat16, float16 or float64, one dtype. The output has query's shape and dtype
    and, for torch, SDPA's memory format (a query whose heads are
    interleaved in memory, a transposed [B, S, H, D] view, gives an output
    laid out alike). float64 inputs are computed in fp64 throughout (every
    product and sum in double, exact to fp64 rounding; forward and
    backward), with a float64 output.

    attn_mask: None, a bool mask (True = the key takes part) or a float
    mask added to the scores (-inf masks), broadcastable to
    [..., Hq, Sq, Skv]; a float mask of another float dtype is converted to
    float32 (with float64 inputs a float64 mask is read as it is, in
    double); or torch.nn.attention.bias.causal_upper_left(Sq, Skv) (is_causal)
    or causal_lower_right(Sq, Skv) (query i attends keys j <= i + Skv - Sq),
    as SDPA reads them. Another tensor subclass raises
    InvalidArgumentError. Not together with is_causal (SDPA refuses both). is_causal:
    query i attends keys j <= i, top-left aligned as SDPA's (also when
    Sq != Skv). A row whose keys are all masked gives 0, as SDPA does, and
    gradients 0.
    dropout_p: as SDPA's, in [0, 1) (0: off; InvalidArgumentError, a
    RuntimeError as torch raises, outside): each softmax weight is kept with
    probability 1 - dropout_p and scaled by 1 / (1 - dropout_p), dropped
    ones are 0, whatever the training mode (pass 0.0 in eval, as with SDPA).
    float32, bfloat16 and float16 inputs, forward and backward; float64
    inputs raise UnsupportedError (fp64 compute has no dropout). A call
    with dropout takes about three times one without. dropout_rng (fxattn's,
    with dropout_p > 0): where the keep decisions come from. "philox" (the
    default): fxattn's counter-based stream (fxa_dropout_kept), keyed by a
    seed and offset drawn from torch's default CPU generator (torch
    tensors; torch.manual_seed reproduces a call) or numpy's global
    RandomState (numpy arrays; np.random.seed reproduces it); no memory
    beyond the call's, the backward regenerates the same decisions.
    "torch": the decisions torch's math SDPA draws under the same RNG state
    (torch.manual_seed(s) before either gives the same dropped weights): a
    float32 bernoulli draw of the [..., Hq, Sq, Skv] weights, kept as one
    byte per weight until the backward is done (plus the transient float32
    draw, 4 bytes per weight): for long sequences use "philox". scale: None (1/sqrt(E)), a float, a 0-d
    tensor or a numpy scalar. enable_gqa: as SDPA's: without it the head
    counts must match (or key/value have one head, broadcast); with it Hq
    must be a multiple of Hkv.

    compute (fxattn's): "fp32" (exact to fp32 rounding), "bf16" (bf16
    products, P rounded to bf16: error at most 2^-7 max|v|), "fp64"
    (float64 inputs, which take nothing else) or None, the default: fp32
    for float32 and float16 inputs, fp64 for float64, and for bfloat16 the faster
    of the two on this machine (fxattn.compute_choice). threads: worker threads
    (None: the CPUs this process may use).

    nonfinite (fxattn's): "propagate" (the default, as torch): q, k or v
    holding NaN or Inf give torch's own result for them, NaN and Inf where
    torch's scaled_dot_product_attention puts them (computed by torch's
    ATen operator: fxattn's bound and its exactness are for finite inputs);
    "raise": InvalidArgumentError naming the first such element, as
    fxattn.attention does (and the drop-in inside torch.compile'd code,
    which never leaves the traced operator).

    torch tensors go through the custom operator torch.ops.fxattn.attention,
    so torch.compile traces the call. Raises fxattn.InvalidArgumentError (a
    ValueError and a RuntimeError, what torch's SDPA raises) on bad
    arguments: malformed shapes in torch's order, with torch's words where
    they say what is wrong (fewer than 2 dims, dtypes, batch or head dims
    that do not broadcast: "The size of tensor a (2) must match the size of
    tensor b (3) at non-singleton dimension 0: ...", GQA heads: "Number of
    heads in key and value must divide the number of heads in query ..."),
    then fxattn's naming the arguments (query's and key's head dims, key's
    and value's token counts, where torch's matmul reports its flattened
    operands). fxattn.UnsupportedError (a NotImplementedError and a
    RuntimeError) for what torch takes and fxattn does not do: dropout
    with float64 inputs, a query broadcast to key's or value's batch or head dims, key and
    value of different head counts, value's head dim other than query's.
    """
    validate.choice("nonfinite", nonfinite, {"propagate": True, "raise": False})
    validate.choice("dropout_rng", dropout_rng, {"philox": True, "torch": False})
    p = _dropout_p(dropout_p)
    call = (query, key, value, attn_mask, is_causal, scale, enable_gqa)
    run = (query, key, value, attn_mask, p, dropout_rng, is_causal, scale, enable_gqa, compute, threads)
    torch = arrays.torch_module()
    if nonfinite == "raise" or (torch is not None and torch.compiler.is_compiling()):
        return _sdpa(*run)
    # torch's own call for non-finite inputs draws its dropout from the RNG state this call found
    rng_state = torch.random.get_rng_state() if p and torch is not None else None
    try:
        return _sdpa(*run)
    except _capi.InvalidArgumentError:
        if not not_finite(query, key, value):
            raise
    if rng_state is not None:
        torch.random.set_rng_state(rng_state)
    return torch_sdpa(*call, dropout_p=p)


def _sdpa(query, key, value, attn_mask, p: float, dropout_rng: str, is_causal, scale, enable_gqa, compute, threads):
    """scaled_dot_product_attention on fxattn (non-finite inputs raise;
    p: the checked dropout_p)."""
    is_causal = validate.boolean("is_causal", is_causal)
    enable_gqa = validate.boolean("enable_gqa", enable_gqa)
    arrays.same_kind(query, key, value)
    use_torch = arrays.is_torch(query)
    if attn_mask is not None and arrays.is_torch(attn_mask) != use_torch:
        raise bad("attn_mask must be of the same kind as query (a torch tensor or a numpy array)")
    causal_bias = None
    if attn_mask is not None and use_torch:
        causal_bias = masks.causal_bias(attn_mask, query)
    if attn_mask is not None and is_causal:
        raise bad(
            "Explicit attn_mask should not be set when is_causal=True (torch's "
            "scaled_dot_product_attention refuses both too; fold the causal part into the mask)"
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
        query, key, value = (arrays.native_array(t, n) for t, n in zip((query, key, value), names))
        if attn_mask is not None:
            attn_mask = arrays.native_array(attn_mask, "attn_mask")
    q = query
    _check_ranks_and_dtypes(q, key, value)
    k, v = _check_shapes(q, key, value, enable_gqa)
    if p and str(q.dtype).endswith("float64"):
        raise _unsupported(
            f"dropout_p={p} with float64 inputs: fxattn's fp64 compute has no dropout "
            "(pass float32 inputs, or torch.nn.functional.scaled_dot_product_attention)"
        )
    flat = q.ndim == 2
    if flat:  # [S, E]: one head of one batch
        q, k, v = q[None], k[None], v[None]
    lead, (hq, sq, e) = tuple(q.shape[:-3]), tuple(q.shape[-3:])
    hkv, skv = k.shape[-3], k.shape[-2]
    batch = math.prod(lead)
    q4 = q.reshape(batch, hq, sq, e)
    k4 = _broadcast(k, lead + (hkv, skv, e), use_torch).reshape(batch, hkv, skv, e)
    v4 = _broadcast(v, lead + (hkv, skv, e), use_torch).reshape(batch, hkv, skv, e)
    lower_right = False
    if causal_bias is not None:
        lower_right = masks.causal_is_lower_right(causal_bias, sq, skv)
        attn_mask, is_causal = None, True
    q4, scale = zero_scale_query(q4, scale)
    opts = Options.parse(
        scale, "bhsd", compute="auto" if compute is None else compute, threads=threads, causal=is_causal, lower_right=lower_right
    )
    mask4 = None
    if attn_mask is not None:
        fp64 = q4.dtype == (arrays.torch_module().float64 if use_torch else np.float64)
        mask4 = masks.sdpa_mask(attn_mask, lead, (hq, sq, skv), batch, use_torch, fp64)
    weights = (batch, hq, sq, skv)
    if use_torch:
        out = _run_torch(q4, k4, v4, mask4, opts, _torch_dropout(p, dropout_rng, lead, weights))
    else:
        dropout, _keep = _numpy_dropout(p, dropout_rng, lead, weights)
        out = attention_numpy(Inputs.of(q4, k4, v4, opts.layout, mask4), opts, False, None, dropout)
    out = out.reshape(lead + (hq, sq, e))
    return out[0] if flat else out


def not_finite(*tensors) -> bool:
    """Whether any of these torch tensors or numpy arrays of floats holds
    NaN or Inf (False for anything else)."""
    for t in tensors:
        if arrays.is_torch(t):
            if t.is_floating_point() and not bool(t.isfinite().all()):
                return True
        elif isinstance(t, np.ndarray) and t.dtype.kind in "fV" and t.dtype.itemsize in (2, 4, 8):
            if not np.isfinite(t if t.dtype.kind == "f" else t.astype(np.float32)).all():
                return True
    return False


def _dropout_p(dropout_p) -> float:
    """dropout_p checked: a real number in [0, 1), as a float."""
    p = validate._scalar(dropout_p)
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, numbers.Real) or not 0.0 <= float(p) < 1.0:
        raise bad(f"dropout probability has to be in [0, 1), but got {validate.show(dropout_p)} (dropout_p)")
    return float(p)


# The seed and offset of a "philox" call: two draws in [0, 2^62).
_SEED_BOUND = 1 << 62


def _torch_keep(p: float, lead: tuple, weights: tuple):
    """The keep decisions torch's math SDPA draws for weights
    [..., Hq, Sq, Skv] (lead: the batch dims): its float32 bernoulli noise
    (float32 for float32, bfloat16 and float16 inputs alike), as uint8
    [B, Hq, Sq, Skv]."""
    import torch

    noise = torch.empty(lead + weights[1:], dtype=torch.float32).bernoulli_(1.0 - p)
    return (noise != 0).to(torch.uint8).reshape(weights).contiguous()


def _torch_dropout(p: float, dropout_rng: str, lead: tuple, weights: tuple) -> dict:
    """The dropout arguments of torch.ops.fxattn.attention for a call on
    torch tensors: the seed and offset drawn from torch's default CPU
    generator ("philox"), or torch's own keep decisions ("torch")."""
    if not p:
        return {}
    import torch

    if dropout_rng == "torch":
        return {"dropout_p": p, "dropout_keep": _torch_keep(p, lead, weights)}
    return {"dropout_p": p, "dropout_seed_offset": torch.randint(0, _SEED_BOUND, (2,), dtype=torch.int64)}


def _numpy_dropout(p: float, dropout_rng: str, lead: tuple, weights: tuple):
    """(Dropout or None, the keep array it points at or None) for a call on
    numpy arrays: the seed and offset drawn from numpy's global RandomState
    ("philox"), or torch's keep decisions ("torch", which needs torch)."""
    if not p:
        return None, None
    if dropout_rng == "torch":
        if arrays.torch_module() is None:
            raise _unsupported('dropout_rng="torch" draws with torch, which is not installed; use dropout_rng="philox"')
        keep = _torch_keep(p, lead, weights).numpy()
        return Dropout(p, keep_ptr=keep.ctypes.data), keep
    seed, offset = (int(n) for n in np.random.randint(0, _SEED_BOUND, size=2, dtype=np.int64))
    return Dropout(p, seed, offset), None


def torch_sdpa(query, key, value, attn_mask, is_causal, scale, enable_gqa, dropout_p=0.0):
    """torch's own result for inputs holding NaN or Inf: its ATen operator
    (never a patched torch.nn.functional), numpy arrays through torch and
    back, torch's causal biases as SDPA dispatches them."""
    import torch
    from torch.nn.attention.bias import CausalBias

    numpy_dtype = None if arrays.is_torch(query) else query.dtype
    if numpy_dtype is not None:
        query, key, value = (arrays.torch_of_numpy(t) for t in (query, key, value))
        attn_mask = None if attn_mask is None else arrays.torch_of_numpy(attn_mask)
    if isinstance(attn_mask, CausalBias):
        sq, skv = attn_mask.seq_len_q, attn_mask.seq_len_kv
        if masks.causal_is_lower_right(attn_mask, sq, skv):
            attn_mask = torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq)
        else:
            attn_mask, is_causal = None, True
    out = torch.ops.aten.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask,
        float(dropout_p),
        bool(is_causal),
        scale=None if scale is None else float(scale),
        enable_gqa=bool(enable_gqa),
    )
    return out if numpy_dtype is None else arrays.numpy_of_torch(out, numpy_dtype)


def _check_ranks_and_dtypes(q, k, v) -> None:
    """torch's first checks, in its words (code matching on them finds them)."""
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise bad(
            "Expected query, key, and value to all be at least 2 dimensional, but got "
            f"query.dim: {q.ndim} key.dim: {k.ndim} and value.dim: {v.ndim} instead."
        )
    if not q.dtype == k.dtype == v.dtype:
        raise bad(
            "Expected query, key, and value to have the same dtype, but got "
            f"query.dtype: {q.dtype} key.dtype: {k.dtype} and value.dtype: {v.dtype} instead."
        )


def _heads(shape) -> int:
    """The head count of a [..., H, S, E] shape (1 for [S, E])."""
    return shape[-3] if len(shape) >= 3 else 1


def _mismatch(a, b):
    """Where batch shapes a and b fail to broadcast, as torch's infer_size
    reports it: (i, size of a, size of b) for the last such dim, i counted
    in the broadcast shape (the shorter shape takes leading 1s); None when
    they broadcast."""
    n = max(len(a), len(b))
    for i in range(n - 1, -1, -1):
        da, db = i - n + len(a), i - n + len(b)
        sa, sb = (a[da] if da >= 0 else 1), (b[db] if db >= 0 else 1)
        if sa != sb and sa != 1 and sb != 1:
            return i, sa, sb
    return None


def _broadcast_shape(a, b) -> tuple:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def _check_broadcast(a, b, heads_hint: str, batch_hint: str) -> None:
    """torch's words when batch shapes a and b do not broadcast (its matmul
    reports them so), then fxattn's: heads_hint when they differ in the
    head dim, batch_hint otherwise."""
    where = _mismatch(a, b)
    if where is None:
        return
    i, sa, sb = where
    hint = heads_hint if i == max(len(a), len(b)) - 1 else batch_hint
    raise bad(f"The size of tensor a ({sa}) must match the size of tensor b ({sb}) at non-singleton dimension {i}: {hint}")


def _check_shapes(q, k, v, enable_gqa: bool):
    """key and value as [..., Hkv, Skv, E] of query's rank (views with
    leading 1s where they have fewer dims), after the shape checks torch's
    SDPA makes, in its order and with its exception type (RuntimeError; its
    words where they say what is wrong), then fxattn's own limits
    (UnsupportedError, for shapes torch's SDPA takes and fxattn does not)."""
    qs, ks, vs = tuple(q.shape), tuple(k.shape), tuple(v.shape)
    hq, hk, hv, e = _heads(qs), _heads(ks), _heads(vs), qs[-1]
    kb, vb = ks[:-2], vs[:-2]
    if enable_gqa:
        if 0 in (hk, hv) or hq % hk or hq % hv:
            raise bad(
                "Number of heads in key and value must divide the number of heads in query "
                f"(enable_gqa=True; query has {hq} heads, key {hk} and value {hv})"
            )
        # torch repeats key's and value's heads to query's first
        kb, vb = (b[:-1] + (hq,) if b else b for b in (kb, vb))
    qb = qs[:-2]
    _check_broadcast(
        qb,
        kb,
        f"query has {hq} heads, key {hk}: they must match (or key and value have one head); "
        "pass enable_gqa=True for grouped-query attention",
        f"key's batch dims {list(ks[:-3])} do not broadcast with query's {list(qs[:-3])}",
    )
    if ks[-1] != e:
        raise bad(f"query has head dim {e} but key has {ks[-1]} (shapes {list(qs)} and {list(ks)}); they must match")
    scores = _broadcast_shape(qb, kb)
    _check_broadcast(
        scores,
        vb,
        f"query and key have {scores[-1] if scores else 1} heads, value {hv}: they must match (or value has one head)",
        f"value's batch dims {list(vs[:-3])} do not broadcast with query's and key's {list(scores[:-1])}",
    )
    if vs[-2] != ks[-2]:
        raise bad(f"key has {ks[-2]} tokens (dim -2) but value has {vs[-2]} (shapes {list(ks)} and {list(vs)}); they must match")
    # What torch's SDPA takes and fxattn does not.
    out = _broadcast_shape(scores, vb)
    if out != qb:
        raise _unsupported(
            f"query has batch and head dims {list(qb)}, key {list(ks[:-2])} and value {list(vs[:-2])}: torch's SDPA "
            f"broadcasts query to {list(out)} too; fxattn broadcasts key and value to query's (expand query first)"
        )
    if hk != hv:
        raise _unsupported(
            f"key has {hk} heads and value {hv}: torch's SDPA broadcasts them; fxattn takes one head count for key and value "
            "(expand the one-head tensor first)"
        )
    if vs[-1] != e:
        raise _unsupported(f"value has head dim {vs[-1]}, query {e}: fxattn takes one head dim for query, key and value")
    if len(ks) < len(qs):
        k = k[(None,) * (len(qs) - len(ks))]
    if len(vs) < len(qs):
        v = v[(None,) * (len(qs) - len(vs))]
    return k, v


def _broadcast(t, shape, use_torch: bool):
    """t with its batch dims broadcast to shape (a view: stride 0)."""
    if tuple(t.shape) == tuple(shape):
        return t
    return t.expand(*shape) if use_torch else np.broadcast_to(t, shape)


def _run_torch(q, k, v, mask, opts: Options, dropout: dict):
    """The custom operator on [B, H, S, E] tensors. A query whose heads are interleaved in
    memory (a transposed [B, S, H, E] view) runs as BSHD and gives its output in that memory
    format, as SDPA does. dropout: the operator's dropout arguments ({} without)."""
    import torch

    from . import torch_op

    bshd = q.shape[1] > 1 and q.shape[2] > 1 and q.stride(1) < q.stride(2)
    if bshd:
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        opts = dataclasses.replace(opts, layout="bshd")
    out, _, _ = torch.ops.fxattn.attention(
        q, k, v, **opts.op_kwargs(), return_lse=torch_op.needs_grad(q, k, v), out_dtype="", attn_mask=mask, **dropout
    )
    return out.transpose(1, 2) if bshd else out
