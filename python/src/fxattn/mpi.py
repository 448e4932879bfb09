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
import inspect
import pickle
import threading
import time
from collections import OrderedDict

import numpy as np

from . import _arrays, _attention, _check_args, _gridlib, _lib
from ._context import context
from ._mpilib import MPI, PLACE_HOSTS, PLACE_RANKS, MpiParams, comm_handle, mpi
from ._attn_core import Options, descriptor, lse_shape, numpy_bf16

__all__ = ["attention", "plan", "GridPlan", "Link", "shard", "rank", "default_threads", "release"]

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
        self.bwd_plans: OrderedDict[bytes, ctypes.c_void_p] = OrderedDict()

    def last_error(self) -> str:
        return mpi.fxa_mpi_last_error(self.handle).decode()

    def plan(self, desc: _lib.AttnDesc, backward: bool = False) -> ctypes.c_void_p:
        """The cached forward (or backward) plan of desc or a new one
        (collective when new: every rank makes the same cache decisions,
        since all pass the same desc)."""
        plans = self.bwd_plans if backward else self.plans
        create, destroy = ((mpi.fxa_mpi_attn_bwd_plan_create, mpi.fxa_mpi_attn_bwd_plan_destroy) if backward
                           else (mpi.fxa_mpi_attn_plan_create, mpi.fxa_mpi_attn_plan_destroy))
        key = bytes(desc)
        plan = plans.get(key)
        if plan is not None:
            plans.move_to_end(key)
            return plan
        plan = ctypes.c_void_p()
        status = create(self.handle, ctypes.byref(desc), ctypes.byref(plan))
        _lib.raise_status(status, self.last_error())
        plans[key] = plan
        if len(plans) > _PLAN_CACHE:
            destroy(plans.popitem(last=False)[1])
        return plan

    def destroy(self) -> None:
        """Collective (fxa_mpi_destroy frees communicators)."""
        for plan in self.plans.values():
            mpi.fxa_mpi_attn_plan_destroy(plan)
        self.plans.clear()
        for plan in self.bwd_plans.values():
            mpi.fxa_mpi_attn_bwd_plan_destroy(plan)
        self.bwd_plans.clear()
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
            _auto_picks.clear()
        else:
            _default_threads.pop(key, None)
            for cache in (_grid, _auto_picks):
                for k in [k for k in cache if k[0] == key]:
                    del cache[k]


# ---- the planner ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Link:
    """A link of the cost model: latency (seconds per message), bandwidth
    (bytes per second out of one host between hosts, out of one rank inside
    a host) and the CPU seconds a rank spends per byte it sends or receives."""

    latency_seconds: float
    bytes_per_second: float
    cpu_seconds_per_byte: float = 0.0


@dataclasses.dataclass(frozen=True)
class GridPlan:
    """What fxattn.mpi.plan chose and why (fxa_mpi_grid_plan).

    ulysses, ring: the fastest grid; seconds, compute_seconds, comm_seconds:
    its predicted time of one call (the slowest rank's); grids: every
    (ulysses, ring, seconds, compute_seconds, comm_seconds) of the ranks,
    ulysses ascending, and allgather the all-gather alternative's
    (seconds, compute_seconds, comm_seconds); the model: ranks, hosts,
    rank_flops (FLOP/s of one rank), inter and intra (Link), call_seconds,
    and measured: the names of what this job measured ("inter", "inter_cpu",
    "intra", "intra_cpu", "compute", "call"); uneven_hosts: the job's hosts
    run different numbers of ranks (the model assumes P / N on each)."""

    ulysses: int
    ring: int
    seconds: float
    compute_seconds: float
    comm_seconds: float
    grids: tuple
    allgather: tuple
    ranks: int
    hosts: int
    rank_flops: float
    inter: Link
    intra: Link
    call_seconds: float
    measured: frozenset
    uneven_hosts: bool


_MEASURED = (("inter", _gridlib.MEASURE_INTER), ("inter_cpu", _gridlib.MEASURE_INTER_CPU),
             ("intra", _gridlib.MEASURE_INTRA), ("intra_cpu", _gridlib.MEASURE_INTRA_CPU),
             ("compute", _gridlib.MEASURE_COMPUTE), ("call", _gridlib.MEASURE_CALL))


def _link(name: str, value) -> Link:
    if not isinstance(value, Link):
        raise _bad(f"{name} must be None (measured) or an fxattn.mpi.Link, not {type(value).__name__}")
    _check_args.positive_real(f"{name}.bytes_per_second", value.bytes_per_second)
    for field in ("latency_seconds", "cpu_seconds_per_byte"):
        x = getattr(value, field)
        if x != 0:
            _check_args.positive_real(f"{name}.{field}", x)
    return value


def _grid_model(seq, heads, head_dim, dtype, ranks, hosts, rank_gflops, inter, intra, ulysses_groups,
                measure_call) -> _gridlib.GridModel:
    """The fxa_grid_model of plan()'s arguments (local; may raise)."""
    m = _gridlib.GridModel()
    _lib.core.fxa_grid_model_init(ctypes.byref(m))
    m.seq = _check_args.integer("seq", seq, 1, _check_args.INT64_MAX)
    m.heads = _check_args.integer("heads", heads, 1, _check_args.INT64_MAX)
    m.head_dim = _check_args.integer("head_dim", head_dim, 1, _check_args.INT64_MAX)
    try:
        m.dtype = _arrays.dtype_code(dtype)
    except _lib.InvalidArgumentError:
        raise _bad(f"dtype {dtype!r} is not float32, bfloat16 or float16") from None
    m.ranks = 0 if ranks is None else _check_args.integer("ranks", ranks, 1, 4096)
    m.hosts = 0 if hosts is None else _check_args.integer("hosts", hosts, 1, 4096)
    m.ulysses_groups = _check_args.integer("ulysses_groups", ulysses_groups, 1, 64)
    measure = _gridlib.MEASURE_ALL
    if rank_gflops is not None:
        m.rank_flops = _check_args.positive_real("rank_gflops", rank_gflops) * 1e9
        measure &= ~_gridlib.MEASURE_COMPUTE
    for name, value, bits in (("inter", inter, _gridlib.MEASURE_INTER | _gridlib.MEASURE_INTER_CPU),
                              ("intra", intra, _gridlib.MEASURE_INTRA | _gridlib.MEASURE_INTRA_CPU)):
        if value is not None:
            link = _link(name, value)
            setattr(m, name, _gridlib.GridLink(link.latency_seconds, link.bytes_per_second,
                                               link.cpu_seconds_per_byte))
            measure &= ~bits
    if not _check_args.boolean("measure_call", measure_call):
        measure &= ~_gridlib.MEASURE_CALL
    m.measure = measure
    return m


def _agree_local(comm, local_error, timeout: float, what: str) -> None:
    """Every rank raises the lowest failing rank's local error (one
    allgather under the deadline)."""
    for r, err in enumerate(allgather_object(comm, local_error, timeout, what)):
        if err is not None:
            cls, status, message = err
            raise cls(f"rank {r}: {message}", status)


def _local_error(e: Exception):
    if isinstance(e, _lib.FxattnError):
        return (type(e), e.status, str(e))
    return (_lib.InvalidArgumentError, _lib.INVALID_ARG, f"{type(e).__name__}: {e}")


def _grid_plan(model: _gridlib.GridModel, best: _gridlib.GridTime) -> GridPlan:
    """The GridPlan of a planned model (every grid costed locally)."""
    grids = []
    for u in range(1, model.ranks + 1):
        if model.ranks % u == 0:
            t = _lib.new(_gridlib.GridTime)
            _lib.core.fxa_grid_cost(ctypes.byref(model), u, model.ranks // u, ctypes.byref(t), None, 0)
            grids.append((t.ulysses, t.ring, t.seconds, t.compute_seconds, t.comm_seconds))
    ag = _lib.new(_gridlib.GridTime)
    _lib.core.fxa_grid_cost(ctypes.byref(model), 0, 0, ctypes.byref(ag), None, 0)

    def link(x):
        return Link(x.latency_seconds, x.bytes_per_second, x.cpu_seconds_per_byte)

    return GridPlan(
        ulysses=best.ulysses, ring=best.ring, seconds=best.seconds, compute_seconds=best.compute_seconds,
        comm_seconds=best.comm_seconds, grids=tuple(grids),
        allgather=(ag.seconds, ag.compute_seconds, ag.comm_seconds), ranks=model.ranks, hosts=model.hosts,
        rank_flops=model.rank_flops, inter=link(model.inter), intra=link(model.intra),
        call_seconds=model.call_seconds,
        measured=frozenset(name for name, bit in _MEASURED if model.measure & bit),
        uneven_hosts=bool(model.measure & _gridlib.UNEVEN_HOSTS),
    )


def plan(
    comm,
    seq,
    heads,
    head_dim,
    *,
    dtype="float32",
    ranks=None,
    hosts=None,
    rank_gflops=None,
    inter=None,
    intra=None,
    ulysses_groups=4,
    measure_call=True,
    threads=None,
    timeout=None,
    placement="hosts",
) -> GridPlan:
    """Collective: which U x R grid to run attention of this shape on
    (libfxattn_mpi's planner, fxa_mpi_grid_plan; the model in
    docs/cluster.md).

    seq, heads, head_dim, dtype: the global problem (self-attention, S
    tokens, H heads). ranks, hosts: P and N of the model (None: this job's
    comm size and host count). rank_gflops: one rank's compute rate (None:
    measured by every rank at once on `threads` threads, the slowest
    rank's). inter, intra: the links between hosts and inside a host as
    fxattn.mpi.Link (None: measured by a ping-pong on this job where it has
    such a link, else the library's assumption: 10 Gbit/s and 20 us, 100
    Gbit/s and 1 us). ulysses_groups: the head groups pure Ulysses
    pipelines by. measure_call: measure the fixed cost of one call.
    timeout, placement: as attention()'s. Every rank must pass the same
    arguments (threads may differ). Returns a GridPlan, the same on every
    rank; attention(..., grid="auto") plans with this and runs its choice.
    """
    comm_handle(comm)
    seconds, local_error, model = 60.0, None, None
    try:
        seconds = timeout_seconds(timeout)
        model = _grid_model(seq, heads, head_dim, dtype, ranks, hosts, rank_gflops, inter, intra,
                            ulysses_groups, measure_call)
        _placement_code(placement)
        n_threads = _check_args.threads(threads) if threads is not None else 0
    except (_lib.FxattnError, TypeError, ValueError) as e:
        local_error = _local_error(e)
    _agree_local(comm, local_error, seconds, "fxattn.mpi.plan's arguments")
    return _plan_model(comm, model, n_threads or default_threads(comm), seconds, placement)


def _plan_model(comm, model, n_threads: int, seconds: float, placement: str) -> GridPlan:
    """Collective: fxa_mpi_grid_plan on the ring of comm's ranks."""
    ctx = context(n_threads)
    size = comm.Get_size()
    key = (_comm_key(comm), 1, size, 1, seconds, placement, n_threads)
    best = _lib.new(_gridlib.GridTime)
    with _lock, ctx.lock:
        h = _handles.get(key)
        if h is None:
            h = _handles[key] = _Handle(comm, ctx, 1, size, 1, seconds, _placement_code(placement))
        status = mpi.fxa_mpi_grid_plan(h.handle, ctypes.byref(model), ctypes.byref(best))
        _lib.raise_status(status, h.last_error())
    return _grid_plan(model, best)


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


def _prepare(q, k, v, size, ulysses, ring, prefetch, timeout, placement, opts_args, out_dtype, grad):
    """This rank's checked inputs (local; may raise). grad: autograd records
    this call (every rank must agree: the backward is collective)."""
    opts = Options.parse(*opts_args)
    grid = _check_grid(ulysses, ring, prefetch, timeout, placement, size)
    _arrays.same_kind(q, k, v)
    ops = tuple(_contiguous(t, n) for t, n in ((q, "q"), (k, "k"), (v, "v")))
    d = descriptor(*ops, opts, _lib.F32, resolve_compute=False)  # checks ranks, dtypes, batch, head_dim
    out_code = ops[0].dtype if out_dtype is None else _arrays.dtype_code(out_dtype)
    same = dataclasses.replace(opts, threads=0)  # ranks may run different thread counts
    info = (d.batch, d.heads_q, d.heads_kv, d.head_dim, d.dtype, out_code, same, grad, grid)
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
    names = ("batch", "heads_q", "heads_kv", "head_dim", "dtype", "out_dtype", "options", "requires_grad", "grid")
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


def _auto_grid(grid, ulysses, ring) -> bool:
    """True for grid="auto" (local; raises for another value, or with
    ulysses or ring)."""
    if grid is None:
        return False
    if not isinstance(grid, str) or grid != "auto":
        raise _bad(f"grid must be None or 'auto' (the planner's choice), not {grid!r}")
    if ulysses != 1 or ring is not None:
        raise _bad("grid='auto' picks ulysses and ring: give one or the other")
    return True


_auto_picks: dict[tuple, tuple] = {}


def _auto_pick(comm, seq: int, d: _lib.AttnDesc, n_threads: int, seconds: float, placement: str) -> tuple:
    """Collective on the first call per communicator, shape, dtype and
    placement (every rank makes the same cache decision): the planner's
    (U, R), cached after."""
    key = (_comm_key(comm), seq, d.heads_q, d.head_dim, d.dtype, placement)
    with _lock:
        if key not in _auto_picks:
            model = _grid_model(seq, d.heads_q, d.head_dim, _DTYPE_NAMES[d.dtype], None, None, None, None,
                                None, 4, True)
            p = _plan_model(comm, model, n_threads, seconds, placement)
            _auto_picks[key] = (p.ulysses, p.ring)
        return _auto_picks[key]


# fxattn.attention's keywords and defaults, which attention(**options) takes.
_ATTENTION_SIGNATURE = inspect.signature(_attention.attention)


def _needs_grad(q, k, v) -> bool:
    """True when autograd records a call on these torch tensors."""
    if not _arrays.is_torch(q) or not _arrays.torch_module().is_grad_enabled():
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
    CPU torch; float32, bfloat16 or float16). The global S is the sum of
    the ranks' S_r, and S_r must be fxattn.mpi.shard(S, fxattn.mpi.rank(comm,
    placement), size)[1] (for q and for k/v separately). comm: an mpi4py
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
    out_dtype, threads), with its defaults; another keyword raises TypeError.

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
    opts_args = tuple(kw[name] for name in ("scale", "layout", "mode", "center", "compute", "threads"))
    return_lse, out_dtype = kw["return_lse"], kw["out_dtype"]
    local_error, prepared, seq_q, seq_kv, info = None, None, -1, -1, None
    try:
        seconds = timeout_seconds(timeout)
    except _lib.FxattnError:
        seconds = 60.0  # the agreement's deadline; _prepare's error is raised after it
    try:
        return_lse = _check_args.boolean("return_lse", return_lse)
        grad = _needs_grad(q, k, v)
        auto = _auto_grid(grid, ulysses, ring)
        prepared = _prepare(q, k, v, size, ulysses, ring, prefetch, timeout, placement, opts_args, out_dtype, grad)
        _, _, _, d, _, info = prepared
        if auto:  # ranks agree on "auto", not on the placeholder grid
            info = info[:-1] + (("auto", "auto") + info[-1][2:],)
        seq_q, seq_kv = d.seq_q, d.seq_kv
    except _lib.FxattnError as e:
        local_error = (type(e), e.status, str(e))
    except (TypeError, ValueError) as e:
        local_error = (_lib.InvalidArgumentError, _lib.INVALID_ARG, f"{type(e).__name__}: {e}")
    sq, skv = _agree(comm, local_error, seq_q, seq_kv, info, seconds)
    opts, (u, r, pf, to, pl), (qo, ko, vo), d, out_code, _ = prepared

    n_threads = opts.threads or default_threads(comm)
    if info[-1][0] == "auto":
        u, r = _auto_pick(comm, skv, d, n_threads, seconds, pl)
    ctx = context(n_threads)
    key = (_comm_key(comm), u, r, pf, to, pl, n_threads)
    d.seq_q, d.seq_kv = sq, skv
    zero = _lib.AttnStrides(0, 0, 0)
    d.q_strides = d.k_strides = d.v_strides = d.o_strides = zero
    d.out_dtype = _lib.F32

    torch_in = _arrays.is_torch(q)
    grad = info[-2]
    want_lse = return_lse or grad  # the backward needs the forward's lse
    shape_lse = lse_shape(opts.layout, qo.shape)
    if torch_in:
        torch = _arrays.torch_module()
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

    with _lock, ctx.lock:
        h = _handles.get(key)
        if h is None:
            h = _handles[key] = _Handle(comm, ctx, u, r, pf, to, _placement_code(pl))
        plan = h.plan(d)
        args = _lib.new(_lib.AttnArgs, q=qo.ptr, k=ko.ptr, v=vo.ptr, out=out_ptr, lse=lse_ptr,
                        lse_parts=None if parts is None else parts.data_ptr())
        status = mpi.fxa_mpi_attn_run(plan, ctypes.byref(args), None)
        _lib.raise_status(status, h.last_error())

    if out_code == _lib.F16:
        out = _agreed_float16(comm, out, seconds)
    elif out_code == _lib.BF16:
        if torch_in:
            out = out.to(torch.bfloat16)
        else:
            out = out.astype(qo.obj.dtype if qo.dtype == _lib.BF16 else numpy_bf16())
    if grad:
        from . import _mpi_autograd

        state = _mpi_autograd.Saved(h, _lock, ctx, d, (qo.obj, ko.obj, vo.obj), out, lse, parts, opts.layout,
                                    return_lse)
        out, lse = _mpi_autograd.record(q, k, v, out, lse, state)
    return (out, lse) if return_lse else out

