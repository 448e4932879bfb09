"""fxattn.mpi: context-parallel attention over an mpi4py communicator.

Bindings of libfxattn_mpi (include/fxattn_mpi.h): each rank holds its
contiguous token shard of q, k and v (fxattn.mpi.shard's split: the first
S mod P ranks one token longer) by its grid rank, fxattn.mpi.rank(comm)
(the communicator's ranks grouped by host, so that Ulysses rows stay inside
a host whatever mpirun's rank order; placement="ranks": comm's order), the
ranks form a U x R grid (grid rank = ring_index * U + ulysses_index:
Ulysses all-to-alls within rows of U adjacent grid ranks, the ring along
columns of R), and each rank gets its shard
of the output of the global problem that fxattn.attention would compute on
one process: bit for bit for pure Ulysses, within fp32 summation order for
the ring.

Every function here except shard() is collective over the communicator:
every rank calls it, in the same order, with the same options. A bad
argument on one rank (a wrong shard length, a dtype, a NaN) raises the same
exception with the same message on every rank instead of hanging. The
package's own collectives are non-blocking and polled against the
deadline (wait()): a rank that never makes the call fails the others with
PeerTimeoutError.

Handles (fxa_mpi, one per communicator, grid, prefetch, timeout and thread
count) and their plans (one per descriptor) are cached; release() frees
them, collectively.
"""

from __future__ import annotations

import ctypes
import dataclasses
import pickle
import threading
import time
from collections import OrderedDict

import numpy as np

from . import _arrays, _check_args, _lib
from ._context import context
from ._mpilib import MPI, PLACE_HOSTS, PLACE_RANKS, MpiParams, comm_handle, mpi
from .attention import Options, descriptor, lse_shape

__all__ = ["attention", "shard", "rank", "default_threads", "release"]

_PLAN_CACHE = 16
_lock = threading.RLock()


def shard(n: int, rank: int, size: int) -> tuple:
    """(start, length) of shard `rank` of n tokens over `size` ranks
    (fxa_mpi_shard: contiguous, the first n mod size shards one longer). Local."""
    n = _check_args.integer("n", n, 0, _check_args.INT64_MAX)
    size = _check_args.integer("size", size, 1, _check_args.INT32_MAX)
    rank = _check_args.integer("rank", rank, 0, size - 1)
    start, length = ctypes.c_int64(), ctypes.c_int64()
    mpi.fxa_mpi_shard(n, size, rank, ctypes.byref(start), ctypes.byref(length))
    return start.value, length.value


_PLACEMENTS = {"hosts": PLACE_HOSTS, "ranks": PLACE_RANKS}


def _placement_code(placement) -> int:
    if not isinstance(placement, str) or placement not in _PLACEMENTS:
        raise _bad(f"placement must be 'hosts' or 'ranks', not {placement!r}")
    return _PLACEMENTS[placement]


def timeout_seconds(timeout) -> float:
    """A timeout= argument: None ($FXA_MPI_TIMEOUT or 60, as the library
    takes it) or a positive number of seconds up to 1e9."""
    if timeout is None:
        t = float(mpi.fxa_mpi_default_timeout())
        if t <= 0:
            raise _bad("FXA_MPI_TIMEOUT is not a positive number of seconds")
        return t
    t = _check_args.positive_real("timeout", timeout)
    if t > 1e9:
        raise _bad(f"timeout must be a positive number of seconds up to 1e9, not {timeout!r}")
    return t


def wait(comm, request, timeout: float, what: str) -> None:
    """Complete the non-blocking MPI request, polling it until timeout
    seconds have passed; then raise PeerTimeoutError (the request stays
    posted: end the job). Every collective of the package goes through
    this, so a dead, stopped or absent peer fails every waiting rank."""
    deadline = time.monotonic() + timeout
    pause = 1e-5
    while not request.Test():
        if time.monotonic() > deadline:
            raise _lib.PeerTimeoutError(
                f"rank {comm.Get_rank()}: {what}: not every rank of the communicator took part within "
                f"{timeout:g} s (a peer is dead, stopped or did not make the same call); end the job",
                _lib.TIMEOUT,
            )
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)


def allgather_int(comm, value: int, timeout: float, what: str) -> list:
    """Every rank's int value, by rank (an MPI_Iallgather under the deadline)."""
    mine = np.array([value], np.int64)
    every = np.empty(comm.Get_size(), np.int64)
    wait(comm, comm.Iallgather([mine, MPI.INT64_T], [every, MPI.INT64_T]), timeout, what)
    return [int(x) for x in every]


def allgather_object(comm, obj, timeout: float, what: str) -> list:
    """Every rank's picklable obj, by rank (two MPI_Iallgather(v) calls
    under the deadline)."""
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = allgather_int(comm, data.size, timeout, what)
    displs = [sum(sizes[:r]) for r in range(len(sizes))]
    recv = np.empty(sum(sizes), np.uint8)
    wait(comm, comm.Iallgatherv([data, MPI.BYTE], [recv, (sizes, displs), MPI.BYTE]), timeout, what)
    return [pickle.loads(recv[d : d + n].tobytes()) for d, n in zip(displs, sizes)]


def _grid_ranks(comm, placement: str, timeout: float | None = None) -> list:
    """Collective on the first call per (communicator, placement): the grid
    rank of every rank of comm (fxa_mpi_grid_rank), cached after."""
    code = _placement_code(placement)
    key = (_comm_key(comm), code)
    with _lock:
        if key not in _grid:
            seconds = timeout_seconds(timeout)
            mine = ctypes.c_int(-1)
            status = mpi.fxa_mpi_grid_rank(comm_handle(comm), code, ctypes.byref(mine))
            _lib.raise_status(status, mpi.fxa_mpi_create_error().decode())
            _grid[key] = allgather_int(comm, mine.value, seconds, "fxattn.mpi.rank")
        return _grid[key]


def rank(comm, placement: str = "hosts", timeout=None) -> int:
    """This rank's grid rank in comm: the rank to shard by (fxattn.mpi.shard(S,
    rank(comm), size)), as attention() with the same placement lays out the
    grid. "hosts" (the default): comm's ranks grouped by host (hosts in the
    order of their lowest rank, rank order within a host; rank 0 stays 0);
    "ranks": comm.Get_rank(). Collective on the first call per communicator
    and placement, cached after; timeout as attention()'s."""
    comm_handle(comm)
    return _grid_ranks(comm, placement, timeout)[comm.Get_rank()]


# ---- handles and plans -------------------------------------------------------


class _Handle:
    """An fxa_mpi on a duplicate of comm, with its plans (LRU)."""

    def __init__(self, comm, ctx, ulysses: int, ring: int, prefetch: int, timeout: float, placement: int):
        params = MpiParams()
        mpi.fxa_mpi_params_init(ctypes.byref(params))
        params.ulysses, params.ring, params.prefetch, params.timeout_seconds = ulysses, ring, prefetch, timeout
        params.placement = placement
        handle = ctypes.c_void_p()
        status = mpi.fxa_mpi_create(comm_handle(comm), ctx.handle, ctypes.byref(params), ctypes.byref(handle))
        _lib.raise_status(status, mpi.fxa_mpi_create_error().decode())
        self.comm = comm  # kept alive: the key holds its handle value
        self.ctx = ctx
        self.handle = handle
        self.plans: OrderedDict[bytes, ctypes.c_void_p] = OrderedDict()

    def last_error(self) -> str:
        return mpi.fxa_mpi_last_error(self.handle).decode()

    def plan(self, desc: _lib.AttnDesc) -> ctypes.c_void_p:
        """The cached plan of desc or a new one (collective when new: every
        rank makes the same cache decisions, since all pass the same desc)."""
        key = bytes(desc)
        plan = self.plans.get(key)
        if plan is not None:
            self.plans.move_to_end(key)
            return plan
        plan = ctypes.c_void_p()
        status = mpi.fxa_mpi_attn_plan_create(self.handle, ctypes.byref(desc), ctypes.byref(plan))
        _lib.raise_status(status, self.last_error())
        self.plans[key] = plan
        if len(self.plans) > _PLAN_CACHE:
            mpi.fxa_mpi_attn_plan_destroy(self.plans.popitem(last=False)[1])
        return plan

    def destroy(self) -> None:
        """Collective (fxa_mpi_destroy frees communicators)."""
        for plan in self.plans.values():
            mpi.fxa_mpi_attn_plan_destroy(plan)
        self.plans.clear()
        if self.handle:
            mpi.fxa_mpi_destroy(self.handle)
            self.handle = None


_handles: dict[tuple, _Handle] = {}
_default_threads: dict[int, int] = {}
_grid: dict[tuple, list] = {}


def _comm_key(comm) -> int:
    return int(comm_handle(comm).value or 0)


def default_threads(comm) -> int:
    """Collective on the first call per communicator: this rank's share of
    the node's CPUs (fxa_mpi_default_threads), cached after."""
    key = _comm_key(comm)
    with _lock:
        if key not in _default_threads:
            _default_threads[key] = int(mpi.fxa_mpi_default_threads(comm_handle(comm)))
        return _default_threads[key]


def release(comm=None) -> None:
    """Collective: destroy the cached handles and plans of comm (None: all),
    in the order they were created on every rank. Call before freeing a
    communicator that attention() used."""
    key = None if comm is None else _comm_key(comm)
    with _lock:
        for k in [k for k in _handles if key is None or k[0] == key]:
            _handles.pop(k).destroy()
        if key is None:
            _default_threads.clear()
            _grid.clear()
        else:
            _default_threads.pop(key, None)
            for k in [k for k in _grid if k[0] == key]:
                del _grid[k]


# ---- attention ---------------------------------------------------------------


def _bad(message: str):
    return _lib.InvalidArgumentError(message, _lib.INVALID_ARG)


def _contiguous(x, name: str) -> _arrays.Operand:
    """x as a C-contiguous operand: libfxattn_mpi takes no strides."""
    if _arrays.is_torch(x):
        return _arrays.operand(_arrays.torch_values(x.detach(), name).contiguous(), name)
    return _arrays.operand(np.ascontiguousarray(_arrays.native_array(x, name)), name)


def _check_grid(ulysses, ring, prefetch, timeout, placement, size):
    ulysses = _check_args.integer("ulysses", ulysses, 1, _check_args.INT32_MAX)
    if ring is None:
        ring = size // ulysses if size % ulysses == 0 else 0  # 0: the library says why
    else:
        ring = _check_args.integer("ring", ring, 1, _check_args.INT32_MAX)
    prefetch = _check_args.integer("prefetch", prefetch, 1, _check_args.INT32_MAX)
    _placement_code(placement)
    timeout = 0.0 if timeout is None else timeout_seconds(timeout)  # 0: the library's default
    return ulysses, ring, prefetch, timeout, placement


def _prepare(q, k, v, size, ulysses, ring, prefetch, timeout, placement, opts_args, out_dtype):
    """This rank's checked inputs (local; may raise)."""
    opts = Options.parse(*opts_args)
    grid = _check_grid(ulysses, ring, prefetch, timeout, placement, size)
    _arrays.same_kind(q, k, v)
    ops = tuple(_contiguous(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    d = descriptor(*ops, opts, _lib.F32)  # checks ranks, dtypes, batch, head_dim
    out_code = ops[0].dtype if out_dtype is None else _arrays.dtype_code(out_dtype)
    same = dataclasses.replace(opts, threads=0)  # ranks may run different thread counts
    info = (d.batch, d.heads_q, d.heads_kv, d.head_dim, d.dtype, out_code, same, grid)
    return opts, grid, ops, d, out_code, info


_DTYPE_NAMES = {_lib.F32: "float32", _lib.BF16: "bfloat16", _lib.F16: "float16"}


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
    names = ("batch", "heads_q", "heads_kv", "head_dim", "dtype", "out_dtype", "options", "grid")
    first = everyone[0][3]
    for r, e in enumerate(everyone):
        for name, theirs, base in zip(names, e[3], first):
            if theirs != base:
                if name in ("dtype", "out_dtype"):  # codes shown by name: float32, bfloat16, float16
                    base, theirs = (_DTYPE_NAMES.get(c, c) for c in (base, theirs))
                raise _bad(f"ranks disagree on {name}: rank 0 has {base!r}, rank {r} has {theirs!r}")
    grid = _grid_ranks(comm, info[-1][-1], timeout)  # the same placement everywhere (checked above)
    sq = sum(e[1] for e in everyone)
    skv = sum(e[2] for e in everyone)
    for what, n, i in (("query", sq, 1), ("key/value", skv, 2)):
        lengths = [e[i] for e in everyone]
        wanted = [shard(n, grid[r], size)[1] for r in range(size)]
        if lengths != wanted:
            r = next(r for r in range(size) if lengths[r] != wanted[r])
            g = grid[r]
            raise _bad(
                f"the ranks' {what} shard lengths {lengths} are not fxattn.mpi.shard's split of "
                f"their sum {n} over {size} ranks by grid rank, {wanted}: rank {r} (grid rank {g}) "
                f"holds {lengths[r]} {what} tokens, fxattn.mpi.shard({n}, {g}, {size}) = {shard(n, g, size)}"
            )
    return sq, skv


def _agreed_float16(comm, out32, timeout: float):
    """out32 rounded once to float16 on every rank; when some rank's values
    overflow float16, the same InvalidArgumentError on every rank (one
    allgather under the deadline), naming the lowest such rank."""
    try:
        out16, error = _arrays.to_float16(out32), ""
    except _lib.InvalidArgumentError as e:
        out16, error = None, str(e)
    for r, theirs in enumerate(allgather_object(comm, error, timeout, "fxattn.mpi.attention's float16 output")):
        if theirs:
            raise _bad(f"rank {r}: {theirs}")
    return out16


def attention(
    q,
    k,
    v,
    comm,
    *,
    ulysses=1,
    ring=None,
    scale=None,
    layout="bshd",
    mode="auto",
    center=True,
    compute="fp32",
    return_lse=False,
    out_dtype=None,
    threads=None,
    prefetch=1,
    timeout=None,
    placement="hosts",
):
    """Collective: this rank's shard of attention over the whole sequence.

    q, k, v: this rank's contiguous token shards, as fxattn.attention takes
    them (layout "bshd" [B, S_r, H, D] or "bhsd" [B, H, S_r, D]; numpy or
    CPU torch; float32, bfloat16 or float16). The global S is the sum of
    the ranks' S_r, and S_r must be fxattn.mpi.shard(S, fxattn.mpi.rank(comm,
    placement), size)[1] (for q and for k/v separately). comm: an mpi4py
    communicator of P = U * R ranks. placement: "hosts" (Ulysses rows inside
    a host, the ring across hosts; see rank()) or "ranks" (comm's order).
    ulysses: U; ring: R (None: P // U). prefetch: ring blocks in flight;
    timeout: seconds without progress from a peer, in the agreement on
    options and shards as in the library's exchanges, before
    fxattn.PeerTimeoutError (None: $FXA_MPI_TIMEOUT or 60; after a timeout
    end the job). threads: worker threads of this rank (None: its share of
    the node, fxa_mpi_default_threads). Other options as fxattn.attention.

    Returns this rank's output shard (q's shape, out_dtype or q's dtype, the
    same kind as q) or (out, lse) with lse [B, Hq, S_r] fp32. Inputs are
    copied when not C-contiguous (the library takes no strides); the library
    writes fp32 and other output dtypes are rounded once from it. Raises the
    package's exceptions with the same message on every rank.
    """
    comm_handle(comm)  # a TypeError, locally, for a non-communicator
    size = comm.Get_size()
    opts_args = (scale, layout, mode, center, compute, threads)
    local_error, prepared, seq_q, seq_kv, info = None, None, -1, -1, None
    try:
        seconds = timeout_seconds(timeout)
    except _lib.FxattnError:
        seconds = 60.0  # the agreement's deadline; _prepare's error is raised after it
    try:
        return_lse = _check_args.boolean("return_lse", return_lse)
        prepared = _prepare(q, k, v, size, ulysses, ring, prefetch, timeout, placement, opts_args, out_dtype)
        _, _, _, d, _, info = prepared
        seq_q, seq_kv = d.seq_q, d.seq_kv
    except _lib.FxattnError as e:
        local_error = (type(e), e.status, str(e))
    except (TypeError, ValueError) as e:
        local_error = (_lib.InvalidArgumentError, _lib.INVALID_ARG, f"{type(e).__name__}: {e}")
    sq, skv = _agree(comm, local_error, seq_q, seq_kv, info, seconds)
    opts, (u, r, pf, to, pl), (qo, ko, vo), d, out_code, _ = prepared

    n_threads = opts.threads or default_threads(comm)
    ctx = context(n_threads)
    key = (_comm_key(comm), u, r, pf, to, pl, n_threads)
    d.seq_q, d.seq_kv = sq, skv
    zero = _lib.AttnStrides(0, 0, 0)
    d.q_strides = d.k_strides = d.v_strides = d.o_strides = zero
    d.out_dtype = _lib.F32

    torch_in = _arrays.is_torch(q)
    shape_lse = lse_shape(opts.layout, qo.shape)
    if torch_in:
        torch = _arrays.torch_module()
        out = torch.empty(qo.shape, dtype=torch.float32)
        lse = torch.empty(shape_lse, dtype=torch.float32) if return_lse else None
        out_ptr, lse_ptr = out.data_ptr(), (lse.data_ptr() if return_lse else None)
    else:
        out = np.empty(qo.shape, np.float32)
        lse = np.empty(shape_lse, np.float32) if return_lse else None
        out_ptr, lse_ptr = out.ctypes.data, (lse.ctypes.data if return_lse else None)

    with _lock, ctx.lock:
        h = _handles.get(key)
        if h is None:
            h = _handles[key] = _Handle(comm, ctx, u, r, pf, to, _placement_code(pl))
        plan = h.plan(d)
        args = _lib.new(_lib.AttnArgs, q=qo.ptr, k=ko.ptr, v=vo.ptr, out=out_ptr, lse=lse_ptr)
        status = mpi.fxa_mpi_attn_run(plan, ctypes.byref(args), None)
        _lib.raise_status(status, h.last_error())

    if out_code == _lib.F16:
        out = _agreed_float16(comm, out, seconds)
    elif out_code == _lib.BF16:
        if torch_in:
            out = out.to(torch.bfloat16)
        else:
            from .attention import _numpy_bf16

            out = out.astype(qo.obj.dtype if qo.dtype == _lib.BF16 else _numpy_bf16())
    return (out, lse) if return_lse else out

