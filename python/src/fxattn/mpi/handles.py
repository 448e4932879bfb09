"""The libfxattn_mpi handles (fxa_mpi, one per communicator, grid,
prefetch, timeout and thread count) with their plans, and the per-communicator
facts the package caches beside them (grid ranks, default thread counts, the
planner's picks); release() frees them, collectively."""

from __future__ import annotations

import ctypes
import threading
from collections import OrderedDict

from .. import _capi
from .._capi import core
from .._capi.mpi import MpiParams, comm_handle, mpi
from .._common import validate
from .collective import allgather_int, placement_code, timeout_seconds

PLAN_CACHE = 16
#: Guards every cache here and every call on a handle.
lock = threading.RLock()


def shard(n: int, rank: int, size: int, reproducible: bool = False) -> tuple:
    """(start, length) of shard `rank` of n tokens over `size` ranks
    (fxa_mpi_shard: contiguous, the first n mod size shards one longer; with
    reproducible=True fxa_canonical_shard: whole canonical groups of 256
    tokens, split alike, the shards fxattn.mpi.attention(reproducible=True)
    takes). Local."""
    n = validate.integer("n", n, 0, validate.INT64_MAX)
    size = validate.integer("size", size, 1, validate.INT32_MAX)
    rank = validate.integer("rank", rank, 0, size - 1)
    reproducible = validate.boolean("reproducible", reproducible)
    start, length = ctypes.c_int64(), ctypes.c_int64()
    split = core.fxa_canonical_shard if reproducible else mpi.fxa_mpi_shard
    split(n, size, rank, ctypes.byref(start), ctypes.byref(length))
    return start.value, length.value


def grid_ranks(comm, placement: str, timeout: float | None = None) -> list:
    """Collective on the first call per (communicator, placement): the grid
    rank of every rank of comm (fxa_mpi_grid_rank), cached after."""
    code = placement_code(placement)
    key = (comm_key(comm), code)
    with lock:
        if key not in grid_cache:
            seconds = timeout_seconds(timeout)
            mine = ctypes.c_int(-1)
            status = mpi.fxa_mpi_grid_rank(comm_handle(comm), code, ctypes.byref(mine))
            _capi.raise_status(status, mpi.fxa_mpi_create_error().decode())
            grid_cache[key] = allgather_int(comm, mine.value, seconds, "fxattn.mpi.rank")
        return grid_cache[key]


def rank(comm, placement: str = "hosts", timeout=None) -> int:
    """This rank's grid rank in comm: the rank to shard by (fxattn.mpi.shard(S,
    rank(comm), size)), as attention() with the same placement lays out the
    grid. "hosts" (the default): comm's ranks grouped by host (hosts in the
    order of their lowest rank, rank order within a host; rank 0 stays 0);
    "ranks": comm.Get_rank(). Collective on the first call per communicator
    and placement, cached after; timeout as attention()'s."""
    comm_handle(comm)
    return grid_ranks(comm, placement, timeout)[comm.Get_rank()]


class Handle:
    """An fxa_mpi on a duplicate of comm, with its plans (LRU)."""

    def __init__(self, comm, ctx, ulysses: int, ring: int, prefetch: int, timeout: float, placement: int):
        params = MpiParams()
        mpi.fxa_mpi_params_init(ctypes.byref(params))
        params.ulysses, params.ring, params.prefetch, params.timeout_seconds = ulysses, ring, prefetch, timeout
        params.placement = placement
        handle = ctypes.c_void_p()
        status = mpi.fxa_mpi_create(comm_handle(comm), ctx.handle, ctypes.byref(params), ctypes.byref(handle))
        _capi.raise_status(status, mpi.fxa_mpi_create_error().decode())
        self.comm = comm  # kept alive: the key holds its handle value
        self.ctx = ctx
        self.handle = handle
        self.plans: OrderedDict[bytes, ctypes.c_void_p] = OrderedDict()
        self.bwd_plans: OrderedDict[bytes, ctypes.c_void_p] = OrderedDict()

    def last_error(self) -> str:
        return mpi.fxa_mpi_last_error(self.handle).decode()

    def plan(self, desc: _capi.AttnDesc, backward: bool = False) -> ctypes.c_void_p:
        """The cached forward (or backward) plan of desc or a new one
        (collective when new: every rank makes the same cache decisions,
        since all pass the same desc)."""
        plans = self.bwd_plans if backward else self.plans
        create, destroy = (
            (mpi.fxa_mpi_attn_bwd_plan_create, mpi.fxa_mpi_attn_bwd_plan_destroy)
            if backward
            else (mpi.fxa_mpi_attn_plan_create, mpi.fxa_mpi_attn_plan_destroy)
        )
        key = bytes(desc)
        plan = plans.get(key)
        if plan is not None:
            plans.move_to_end(key)
            return plan
        plan = ctypes.c_void_p()
        status = create(self.handle, ctypes.byref(desc), ctypes.byref(plan))
        _capi.raise_status(status, self.last_error())
        plans[key] = plan
        if len(plans) > PLAN_CACHE:
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


handles: dict[tuple, Handle] = {}
default_thread_counts: dict[int, int] = {}
grid_cache: dict[tuple, list] = {}
#: The planner's (U, R) per communicator, shape, dtype and placement (planner.auto_pick).
auto_picks: dict[tuple, tuple] = {}


def comm_key(comm) -> int:
    return int(comm_handle(comm).value or 0)


def default_threads(comm) -> int:
    """Collective on the first call per communicator: this rank's share of
    the node's CPUs (fxa_mpi_default_threads), cached after."""
    key = comm_key(comm)
    with lock:
        if key not in default_thread_counts:
            default_thread_counts[key] = int(mpi.fxa_mpi_default_threads(comm_handle(comm)))
        return default_thread_counts[key]


def release(comm=None) -> None:
    """Collective: destroy the cached handles and plans of comm (None: all),
    in the order they were created on every rank. Call before freeing a
    communicator that attention() used."""
    key = None if comm is None else comm_key(comm)
    with lock:
        for k in [k for k in handles if key is None or k[0] == key]:
            handles.pop(k).destroy()
        if key is None:
            default_thread_counts.clear()
            grid_cache.clear()
            auto_picks.clear()
        else:
            default_thread_counts.pop(key, None)
            for cache in (grid_cache, auto_picks):
                for k in [k for k in cache if k[0] == key]:
                    del cache[k]
