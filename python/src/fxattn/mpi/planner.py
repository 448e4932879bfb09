"""fxattn.mpi.plan: which U x R grid runs attention of a shape fastest on
this job (libfxattn_mpi's planner, fxa_mpi_grid_plan; the model in
docs/cluster.md), and the choice grid="auto" runs."""

from __future__ import annotations

import ctypes
import dataclasses

from .. import _capi
from .._capi import grid as cgrid
from .._capi.mpi import comm_handle, mpi
from .._common import arrays, validate
from .._common.context import context
from .collective import agree_local, bad, local_error, placement_code, timeout_seconds
from .handles import Handle, auto_picks, comm_key, default_threads, handles, lock


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


_MEASURED = (
    ("inter", cgrid.MEASURE_INTER),
    ("inter_cpu", cgrid.MEASURE_INTER_CPU),
    ("intra", cgrid.MEASURE_INTRA),
    ("intra_cpu", cgrid.MEASURE_INTRA_CPU),
    ("compute", cgrid.MEASURE_COMPUTE),
    ("call", cgrid.MEASURE_CALL),
)


def _link(name: str, value) -> Link:
    if not isinstance(value, Link):
        raise bad(f"{name} must be None (measured) or an fxattn.mpi.Link, not {type(value).__name__}")
    validate.positive_real(f"{name}.bytes_per_second", value.bytes_per_second)
    for field in ("latency_seconds", "cpu_seconds_per_byte"):
        x = getattr(value, field)
        if x != 0:
            validate.positive_real(f"{name}.{field}", x)
    return value


def _grid_model(seq, heads, head_dim, dtype, ranks, hosts, rank_gflops, inter, intra, ulysses_groups, measure_call) -> cgrid.GridModel:
    """The fxa_grid_model of plan()'s arguments (local; may raise)."""
    m = cgrid.GridModel()
    _capi.core.fxa_grid_model_init(ctypes.byref(m))
    m.seq = validate.integer("seq", seq, 1, validate.INT64_MAX)
    m.heads = validate.integer("heads", heads, 1, validate.INT64_MAX)
    m.head_dim = validate.integer("head_dim", head_dim, 1, validate.INT64_MAX)
    try:
        code = arrays.dtype_code(dtype)
    except _capi.InvalidArgumentError:
        code = None
    if code not in (_capi.F32, _capi.BF16, _capi.F16):  # libfxattn_mpi has no fp64 attention
        raise bad(f"dtype {dtype!r} is not float32, bfloat16 or float16")
    m.dtype = code
    m.ranks = 0 if ranks is None else validate.integer("ranks", ranks, 1, 4096)
    m.hosts = 0 if hosts is None else validate.integer("hosts", hosts, 1, 4096)
    m.ulysses_groups = validate.integer("ulysses_groups", ulysses_groups, 1, 64)
    measure = cgrid.MEASURE_ALL
    if rank_gflops is not None:
        m.rank_flops = validate.positive_real("rank_gflops", rank_gflops) * 1e9
        measure &= ~cgrid.MEASURE_COMPUTE
    for name, value, bits in (
        ("inter", inter, cgrid.MEASURE_INTER | cgrid.MEASURE_INTER_CPU),
        ("intra", intra, cgrid.MEASURE_INTRA | cgrid.MEASURE_INTRA_CPU),
    ):
        if value is not None:
            link = _link(name, value)
            setattr(m, name, cgrid.GridLink(link.latency_seconds, link.bytes_per_second, link.cpu_seconds_per_byte))
            measure &= ~bits
    if not validate.boolean("measure_call", measure_call):
        measure &= ~cgrid.MEASURE_CALL
    m.measure = measure
    return m


def _grid_plan(model: cgrid.GridModel, best: cgrid.GridTime) -> GridPlan:
    """The GridPlan of a planned model (every grid costed locally)."""
    grids = []
    for u in range(1, model.ranks + 1):
        if model.ranks % u == 0:
            t = _capi.new(cgrid.GridTime)
            _capi.core.fxa_grid_cost(ctypes.byref(model), u, model.ranks // u, ctypes.byref(t), None, 0)
            grids.append((t.ulysses, t.ring, t.seconds, t.compute_seconds, t.comm_seconds))
    ag = _capi.new(cgrid.GridTime)
    _capi.core.fxa_grid_cost(ctypes.byref(model), 0, 0, ctypes.byref(ag), None, 0)

    def link(x):
        return Link(x.latency_seconds, x.bytes_per_second, x.cpu_seconds_per_byte)

    return GridPlan(
        ulysses=best.ulysses,
        ring=best.ring,
        seconds=best.seconds,
        compute_seconds=best.compute_seconds,
        comm_seconds=best.comm_seconds,
        grids=tuple(grids),
        allgather=(ag.seconds, ag.compute_seconds, ag.comm_seconds),
        ranks=model.ranks,
        hosts=model.hosts,
        rank_flops=model.rank_flops,
        inter=link(model.inter),
        intra=link(model.intra),
        call_seconds=model.call_seconds,
        measured=frozenset(name for name, bit in _MEASURED if model.measure & bit),
        uneven_hosts=bool(model.measure & cgrid.UNEVEN_HOSTS),
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
    seconds, error, model = 60.0, None, None
    try:
        seconds = timeout_seconds(timeout)
        model = _grid_model(seq, heads, head_dim, dtype, ranks, hosts, rank_gflops, inter, intra, ulysses_groups, measure_call)
        placement_code(placement)
        n_threads = validate.threads(threads) if threads is not None else 0
    except (_capi.FxattnError, TypeError, ValueError) as e:
        error = local_error(e)
    agree_local(comm, error, seconds, "fxattn.mpi.plan's arguments")
    return plan_model(comm, model, n_threads or default_threads(comm), seconds, placement)


def plan_model(comm, model, n_threads: int, seconds: float, placement: str) -> GridPlan:
    """Collective: fxa_mpi_grid_plan on the ring of comm's ranks."""
    ctx = context(n_threads)
    size = comm.Get_size()
    key = (comm_key(comm), 1, size, 1, seconds, placement, n_threads)
    best = _capi.new(cgrid.GridTime)
    with lock, ctx.lock:
        h = handles.get(key)
        if h is None:
            h = handles[key] = Handle(comm, ctx, 1, size, 1, seconds, placement_code(placement))
        status = mpi.fxa_mpi_grid_plan(h.handle, ctypes.byref(model), ctypes.byref(best))
        _capi.raise_status(status, h.last_error())
    return _grid_plan(model, best)


def auto_pick(comm, seq: int, d: _capi.AttnDesc, n_threads: int, seconds: float, placement: str) -> tuple:
    """Collective on the first call per communicator, shape, dtype and
    placement (every rank makes the same cache decision): the planner's
    (U, R), cached after."""
    key = (comm_key(comm), seq, d.heads_q, d.head_dim, d.dtype, placement)
    with lock:
        if key not in auto_picks:
            model = _grid_model(seq, d.heads_q, d.head_dim, arrays.DTYPE_NAMES[d.dtype], None, None, None, None, None, 4, True)
            p = plan_model(comm, model, n_threads, seconds, placement)
            auto_picks[key] = (p.ulysses, p.ring)
        return auto_picks[key]
