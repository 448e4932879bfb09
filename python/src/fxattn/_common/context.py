"""Contexts (thread pools) and their cached plans.

One fxa_ctx per thread count, created on first use; the last
_CONTEXT_CACHE thread counts used stay cached (least recently used first
out). A context dropped from the cache, or by release_contexts(), is
destroyed (its worker threads joined) once nothing holds it: a call in
progress or an object that keeps it (a fxattn.wan layer) keeps it alive.
The C API allows one caller thread per context at a time, so each context
has a lock that every call holds; calls on contexts of different thread
counts run concurrently (ctypes releases the GIL). Plans are cached per
descriptor (shapes, strides, dtypes, options), least recently used first
out; one workspace per context grows to the largest plan's size.

A context belongs to the process that made it: its worker threads do not
exist in a child made by fork(). In the child the cache starts empty and
the parent's contexts are never used nor destroyed there (their handles
stay the parent's).
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import OrderedDict

import numpy as np

from .. import _capi
from .._capi import core
from . import validate

_PLAN_CACHE = 16
_CONTEXT_CACHE = 4


class Plan:
    """An fxa_attn_plan; destroyed with its context or when evicted."""

    _api = "fxa_attn_plan"  # the C functions <_api>_create and <_api>_destroy

    def __init__(self, ctx: "Context", desc: _capi.AttnDesc):
        handle = ctypes.c_void_p()
        ws = ctypes.c_size_t()
        status = getattr(core, self._api + "_create")(ctx.handle, ctypes.byref(desc), ctypes.byref(handle), ctypes.byref(ws))
        _capi.raise_status(status, ctx.last_error())
        self.handle = handle
        self.workspace_bytes = ws.value
        self.desc = desc

    def destroy(self) -> None:
        if self.handle:
            getattr(core, self._api + "_destroy")(self.handle)
            self.handle = None


class BwdPlan(Plan):
    """An fxa_attn_bwd_plan (the backward of the forward descriptor desc)."""

    _api = "fxa_attn_bwd_plan"


class Context:
    """An fxa_ctx and its plans. Use `with ctx.lock:` around every call."""

    def __init__(self, threads: int):
        params = _capi.new(_capi.CtxParams, n_threads=threads)
        handle = ctypes.c_void_p()
        status = core.fxa_ctx_create(ctypes.byref(params), ctypes.byref(handle))
        _capi.raise_status(status, core.fxa_ctx_create_error().decode())
        self.handle = handle
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()
        self._workspace = np.empty(0, np.uint8)

    @property
    def threads(self) -> int:
        return core.fxa_ctx_threads(self.handle)

    @property
    def isa(self) -> str:
        return core.fxa_ctx_isa(self.handle).decode()

    @property
    def kernel_info(self) -> str:
        return core.fxa_ctx_kernel_info(self.handle).decode()

    def last_error(self) -> str:
        return core.fxa_ctx_last_error(self.handle).decode()

    def plan(self, desc: _capi.AttnDesc, kind: type = Plan) -> Plan:
        """The cached plan of desc (kind Plan: the forward's, BwdPlan: the
        backward's), or a new one (caller holds the lock)."""
        key = (kind, bytes(desc))
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        plan = kind(self, desc)
        self._plans[key] = plan
        if len(self._plans) > _PLAN_CACHE:
            self._plans.popitem(last=False)[1].destroy()
        return plan

    def workspace(self, nbytes: int) -> int:
        """Address of nbytes of 64-byte aligned scratch (caller holds the lock)."""
        if nbytes == 0:
            return 0
        if self._workspace.nbytes < nbytes + 64:
            self._workspace = np.empty(nbytes + 64, np.uint8)
        addr = self._workspace.ctypes.data
        return addr + (-addr) % 64

    def __del__(self):
        if getattr(self, "pid", None) != os.getpid():
            return  # the parent's context in a forked child: its threads are not here
        try:
            for plan in self._plans.values():
                plan.destroy()
            self._plans.clear()
            if self.handle:
                core.fxa_ctx_destroy(self.handle)
                self.handle = None
        except Exception:  # interpreter shutdown: the process frees it
            pass


_contexts: OrderedDict[int, Context] = OrderedDict()
_contexts_lock = threading.Lock()


def _forget_after_fork() -> None:
    """In a forked child: drop the parent's contexts from the cache without
    destroying them (their pools' threads live in the parent) and make a
    fresh cache lock (the parent's may have been held at the fork)."""
    global _contexts_lock
    _contexts.clear()
    _contexts_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def context(threads: int | None) -> Context:
    """The shared context of `threads` worker threads (None or 0: the CPUs
    this process may use, fxa_available_cpus()), made by this process."""
    n = 0 if threads is None or (isinstance(threads, int) and threads == 0) else validate.threads(threads)
    with _contexts_lock:
        ctx = _contexts.get(n)
        if ctx is not None and ctx.pid != os.getpid():
            _contexts.clear()  # a child that skipped the fork hook (os.fork from C)
            ctx = None
        if ctx is None:
            ctx = _contexts[n] = Context(n)
            while len(_contexts) > _CONTEXT_CACHE:
                _contexts.popitem(last=False)  # destroyed when no call or object holds it
        else:
            _contexts.move_to_end(n)
        return ctx


def release_contexts() -> None:
    """Drop every cached context; each is destroyed (its worker threads
    joined, its plans and workspace freed) once no call in progress and no
    object (a fxattn.wan layer, an fxattn.mpi handle) holds it. The next
    call makes a new one."""
    with _contexts_lock:
        _contexts.clear()
