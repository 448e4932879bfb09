"""fxattn.mpi.attention: this rank's shard of attention over the whole
sequence, on libfxattn_mpi (fxa_mpi_attn_run), every rank's options and
shards agreed before anything runs."""

from __future__ import annotations

import ctypes
import dataclasses
import inspect

import numpy as np

from .. import _capi
from .._capi.mpi import comm_handle, mpi
from .._common import arrays, validate
from .._common.context import context
from ..attn import interface as _interface
from ..attn.inputs import Inputs, lse_shape
from ..attn.options import Options, zero_scale_query
from ..attn.run import numpy_bf16
from .collective import allgather_object, bad, placement_code, timeout_seconds
from .handles import Handle, comm_key, default_threads, grid_ranks, handles, lock, shard
from .planner import auto_pick


def _contiguous(x, name: str) -> arrays.Operand:
    """x as a C-contiguous operand: libfxattn_mpi takes no strides."""
    if arrays.is_torch(x):
        return arrays.operand(arrays.torch_values(x.detach(), name).contiguous(), name)
    return arrays.operand(np.ascontiguousarray(arrays.native_array(x, name)), name)


def _check_grid(ulysses, ring, prefetch, timeout, placement, size):
    ulysses = validate.integer("ulysses", ulysses, 1, validate.INT32_MAX)
    if ring is None:
        ring = size // ulysses if size % ulysses == 0 else 0  # 0: the library says why
    else:
        ring = validate.integer("ring", ring, 1, validate.INT32_MAX)
    prefetch = validate.integer("prefetch", prefetch, 1, validate.INT32_MAX)
    placement_code(placement)
    timeout = 0.0 if timeout is None else timeout_seconds(timeout)  # 0: the library's default
    return ulysses, ring, prefetch, timeout, placement


def _prepare(q, k, v, size, ulysses, ring, prefetch, timeout, placement, options: dict, out_dtype, grad):
    """This rank's checked inputs (local; may raise). grad: autograd records
    this call (every rank must agree: the backward is collective)."""
    opts = Options.parse(**options)
    if opts.reproducible and grad:
        raise _capi.UnsupportedError(
            "fxattn.mpi.attention(reproducible=True) is for the forward: libfxattn_mpi's backward is not reproducible "
            "across grids yet (call it without grad, or with reproducible=False)",
            _capi.UNSUPPORTED,
        )
    grid = _check_grid(ulysses, ring, prefetch, timeout, placement, size)
    arrays.same_kind(q, k, v)
    ops = tuple(_contiguous(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    d = Inputs(*ops).descriptor(opts, _capi.F32, resolve_compute=False)  # checks ranks, dtypes, batch, head_dim
    if d.dtype == _capi.F64:
        raise _capi.UnsupportedError(
            "fxattn.mpi.attention takes float32, bfloat16 or float16 inputs, not float64 (libfxattn_mpi has no fp64 "
            "attention; fxattn.attention and fxattn.scaled_dot_product_attention compute float64 on one process)",
            _capi.UNSUPPORTED,
        )
    out_code = ops[0].dtype if out_dtype is None else arrays.dtype_code(out_dtype)
    same = dataclasses.replace(opts, threads=0)  # ranks may run different thread counts
    info = (d.batch, d.heads_q, d.heads_kv, d.head_dim, d.dtype, out_code, same, grad, grid)
    return opts, grid, ops, d, out_code, info


def _agree(comm, local_error, seq_q, seq_kv, info, timeout: float):
    """One allgather under the deadline: every rank raises the lowest
    failing rank's error, or the same mismatch message (options against
    rank 0's; shards by grid rank, of the agreed placement); returns
    (global Sq, global Skv)."""
    size = comm.Get_size()
    everyone = allgather_object(comm, (local_error, seq_q, seq_kv, info), timeout, "fxattn.mpi.attention's agreement")
    for r, (err, *_rest) in enumerate(everyone):
        if err is not None:
            cls, status, message = err
            raise cls(f"rank {r}: {message}", status)
    names = ("batch", "heads_q", "heads_kv", "head_dim", "dtype", "out_dtype", "options", "requires_grad", "grid")
    first = everyone[0][3]
    for r, e in enumerate(everyone):
        for name, theirs, base in zip(names, e[3], first):
            if theirs != base:
                if name in ("dtype", "out_dtype"):  # codes shown by name: float32, bfloat16, float16
                    base, theirs = (arrays.DTYPE_NAMES.get(c, c) for c in (base, theirs))
                raise bad(f"ranks disagree on {name}: rank 0 has {base!r}, rank {r} has {theirs!r}")
    grid = grid_ranks(comm, info[-1][-1], timeout)  # the same placement everywhere (checked above)
    sq = sum(e[1] for e in everyone)
    skv = sum(e[2] for e in everyone)
    for what, n, i in (("query", sq, 1), ("key/value", skv, 2)):
        lengths = [e[i] for e in everyone]
        reproducible = info[6].reproducible
        wanted = [shard(n, grid[r], size, reproducible)[1] for r in range(size)]
        if lengths != wanted:
            r = next(r for r in range(size) if lengths[r] != wanted[r])
            g = grid[r]
            raise bad(
                f"the ranks' {what} shard lengths {lengths} are not fxattn.mpi.shard's split of "
                f"their sum {n} over {size} ranks by grid rank, {wanted}: rank {r} (grid rank {g}) "
                f"holds {lengths[r]} {what} tokens, fxattn.mpi.shard({n}, {g}, {size}"
                f"{', reproducible=True' if reproducible else ''}) = {shard(n, g, size, reproducible)}"
            )
    return sq, skv


def _agreed_float16(comm, out32, timeout: float):
    """out32 rounded once to float16 on every rank; when some rank's values
    overflow float16, the same InvalidArgumentError on every rank (one
    allgather under the deadline), naming the lowest such rank."""
    try:
        out16, error = arrays.to_float16(out32), ""
    except _capi.InvalidArgumentError as e:
        out16, error = None, str(e)
    for r, theirs in enumerate(allgather_object(comm, error, timeout, "fxattn.mpi.attention's float16 output")):
        if theirs:
            raise bad(f"rank {r}: {theirs}")
    return out16


def _auto_grid(grid, ulysses, ring) -> bool:
    """True for grid="auto" (local; raises for another value, or with
    ulysses or ring)."""
    if grid is None:
        return False
    if not isinstance(grid, str) or grid != "auto":
        raise bad(f"grid must be None or 'auto' (the planner's choice), not {grid!r}")
    if ulysses != 1 or ring is not None:
        raise bad("grid='auto' picks ulysses and ring: give one or the other")
    return True


# fxattn.attention's keywords and defaults, which attention(**options) takes.
_ATTENTION_SIGNATURE = inspect.signature(_interface.attention)


def _needs_grad(q, k, v) -> bool:
    """True when autograd records a call on these torch tensors."""
    if not arrays.is_torch(q) or not arrays.torch_module().is_grad_enabled():
        return False
    return any(getattr(x, "requires_grad", False) for x in (q, k, v))


def attention(
    q,
    k,
    v,
    comm,
    *,
    ulysses=1,
    ring=None,
    grid=None,
    prefetch=1,
    timeout=None,
    placement="hosts",
    **options,
):
    """Collective: this rank's shard of attention over the whole sequence.

    q, k, v: this rank's contiguous token shards, as fxattn.attention takes
    them (layout "bshd" [B, S_r, H, D] or "bhsd" [B, H, S_r, D]; numpy or
    CPU torch; float32, bfloat16 or float16; float64 raises
    UnsupportedError). The global S is the sum of
    the ranks' S_r, and S_r must be fxattn.mpi.shard(S, fxattn.mpi.rank(comm,
    placement), size)[1] (for q and for k/v separately; with
    reproducible=True fxattn.mpi.shard(..., reproducible=True)'s, and then
    every grid returns the bytes of fxattn.attention(..., reproducible=True)
    on one process, forward only). comm: an mpi4py
    communicator of P = U * R ranks. placement: "hosts" (Ulysses rows inside
    a host, the ring across hosts; see rank()) or "ranks" (comm's order).
    ulysses: U; ring: R (None: P // U). grid="auto": the planner's U x R
    for this shape on this job (fxattn.mpi.plan, its links and compute
    measured on the first call per communicator, shape, dtype and
    placement, cached after; give ulysses and ring or grid, not both).
    prefetch: ring blocks in flight;
    timeout: seconds without progress from a peer, in the agreement on
    options and shards as in the library's exchanges, before
    fxattn.PeerTimeoutError (None: $FXA_MPI_TIMEOUT or 60; after a timeout
    end the job). threads: worker threads of this rank (None: its share of
    the node, fxa_mpi_default_threads). options: the keywords of
    fxattn.attention (scale, layout, mode, center, compute, return_lse,
    out_dtype, threads, reproducible), with its defaults; another keyword
    raises TypeError.

    Returns this rank's output shard (q's shape, out_dtype or q's dtype, the
    same kind as q) or (out, lse) with lse [B, Hq, S_r] fp32.
    Differentiable for torch tensors that require grad (every rank's must,
    or none's): the backward is libfxattn_mpi's (fxa_mpi_attn_bwd_run,
    collective: every rank runs its backward), with out and lse's gradients
    (lse's through return_lse); gradients in q's, k's, v's dtypes,
    computed in fp32. Inputs are
    copied when not C-contiguous (the library takes no strides); the library
    writes fp32 and other output dtypes are rounded once from it. Raises the
    package's exceptions with the same message on every rank.
    """
    comm_handle(comm)  # a TypeError, locally, for a non-communicator
    size = comm.Get_size()
    call = _ATTENTION_SIGNATURE.bind(q, k, v, **options)  # a TypeError as fxattn.attention's
    call.apply_defaults()
    kw = call.kwargs
    options = {name: kw[name] for name in ("scale", "layout", "mode", "center", "compute", "threads", "reproducible")}
    return_lse, out_dtype = kw["return_lse"], kw["out_dtype"]
    local_error, prepared, seq_q, seq_kv, info = None, None, -1, -1, None
    try:
        seconds = timeout_seconds(timeout)
    except _capi.FxattnError:
        seconds = 60.0  # the agreement's deadline; _prepare's error is raised after it
    try:
        return_lse = validate.boolean("return_lse", return_lse)
        q, options["scale"] = zero_scale_query(q, options["scale"])
        grad = _needs_grad(q, k, v)
        auto = _auto_grid(grid, ulysses, ring)
        prepared = _prepare(q, k, v, size, ulysses, ring, prefetch, timeout, placement, options, out_dtype, grad)
        _, _, _, d, _, info = prepared
        if auto:  # ranks agree on "auto", not on the placeholder grid
            info = info[:-1] + (("auto", "auto") + info[-1][2:],)
        seq_q, seq_kv = d.seq_q, d.seq_kv
    except _capi.FxattnError as e:
        local_error = (type(e), e.status, str(e))
    except (TypeError, ValueError) as e:
        local_error = (_capi.InvalidArgumentError, _capi.INVALID_ARG, f"{type(e).__name__}: {e}")
    sq, skv = _agree(comm, local_error, seq_q, seq_kv, info, seconds)
    opts, (u, r, pf, to, pl), (qo, ko, vo), d, out_code, _ = prepared

    n_threads = opts.threads or default_threads(comm)
    if info[-1][0] == "auto":
        u, r = auto_pick(comm, skv, d, n_threads, seconds, pl)
    ctx = context(n_threads)
    key = (comm_key(comm), u, r, pf, to, pl, n_threads)
    d.seq_q, d.seq_kv = sq, skv
    zero = _capi.AttnStrides(0, 0, 0)
    d.q_strides = d.k_strides = d.v_strides = d.o_strides = zero
    d.out_dtype = _capi.F32

    torch_in = arrays.is_torch(q)
    grad = info[-2]
    want_lse = return_lse or grad  # the backward needs the forward's lse
    shape_lse = lse_shape(opts.layout, qo.shape)
    if torch_in:
        torch = arrays.torch_module()
        out = torch.empty(qo.shape, dtype=torch.float32)
        lse = torch.empty(shape_lse, dtype=torch.float32) if want_lse else None
        out_ptr, lse_ptr = out.data_ptr(), (lse.data_ptr() if want_lse else None)
        # the rows' softmax state for the backward: its P at any score magnitude
        parts = torch.empty(3 * lse.numel(), dtype=torch.float32) if grad else None
    else:
        out = np.empty(qo.shape, np.float32)
        lse = np.empty(shape_lse, np.float32) if return_lse else None
        out_ptr, lse_ptr = out.ctypes.data, (lse.ctypes.data if return_lse else None)
        parts = None

    with lock, ctx.lock:
        h = handles.get(key)
        if h is None:
            h = handles[key] = Handle(comm, ctx, u, r, pf, to, placement_code(pl))
        plan = h.plan(d)
        args = _capi.new(
            _capi.AttnArgs, q=qo.ptr, k=ko.ptr, v=vo.ptr, out=out_ptr, lse=lse_ptr, lse_parts=None if parts is None else parts.data_ptr()
        )
        status = mpi.fxa_mpi_attn_run(plan, ctypes.byref(args), None)
        _capi.raise_status(status, h.last_error())

    if out_code == _capi.F16:
        out = _agreed_float16(comm, out, seconds)
    elif out_code == _capi.BF16:
        if torch_in:
            out = out.to(torch.bfloat16)
        else:
            out = out.astype(qo.obj.dtype if qo.dtype == _capi.BF16 else numpy_bf16())
    if grad:
        from . import autograd as _autograd

        state = _autograd.Saved(h, lock, ctx, d, (qo.obj, ko.obj, vo.obj), out, lse, parts, opts.layout, return_lse)
        out, lse = _autograd.record(q, k, v, out, lse, state)
    return (out, lse) if return_lse else out
