"""The package's process resources: the context (thread pool) cache stays
bounded and can be released, a forked child makes its own contexts, and
importing fxattn.diffusers does not initialise MPI."""

import gc
import multiprocessing
import os
import subprocess
import sys

import numpy as np

import fxattn
import fxattn.wan as fw


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def data(seed=0, shape=(1, 16, 2, 8)):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


def test_thread_pools_stay_bounded_and_can_be_released():
    """24 distinct threads= values (a pool of n threads each, 300 in all):
    the process keeps at most the 4 most recent pools (<= 21 + 22 + 23 + 24
    workers); release_contexts() joins them all."""
    q, k, v = data()
    fxattn.release_contexts()
    gc.collect()
    base = os_threads()
    want = fxattn.attention(q, k, v, threads=1, layout="bshd")
    for n in range(1, 25):
        assert fxattn.attention(q, k, v, threads=n, layout="bshd").tobytes() == want.tobytes()
        assert os_threads() - base <= 4 * 24
    assert os_threads() - base >= 23  # the last pool is still there
    fxattn.release_contexts()
    gc.collect()
    assert os_threads() == base


def test_a_layer_keeps_its_context_through_a_release():
    layer = fw.WanSelfAttention.synthetic(16, 2, seed=1, threads=3)
    x = fw.synth(2, 6 * 16).reshape(6, 16)
    y = layer(x, (1, 2, 3))
    fxattn.release_contexts()
    for n in range(4, 10):  # push threads=3 out of the cache
        fxattn.attention(*data(), threads=n, layout="bshd")
    assert layer(x, (1, 2, 3)).tobytes() == y.tobytes()
    fxattn.release_contexts()


def _child(conn):
    q, k, v = data(1)
    layer = _FORK_LAYER
    conn.send((fxattn.attention(q, k, v, threads=2, layout="bshd").tobytes(), layer(_FORK_X, (1, 2, 3)).tobytes()))
    conn.close()


_FORK_LAYER = None
_FORK_X = None


def test_forked_child_makes_its_own_contexts():
    """The parent runs attention and a layer on 2-thread pools, then a
    'fork' child runs both: it must finish (within 60 s), not wait forever
    on workers that exist only in the parent. Attention gives the parent's
    bytes; the layer's fp32 projections run on OpenBLAS in a child whose
    parent ran oneDNN (OpenMP does not survive fork), a GEMM of another
    summation order: within 2^-16 of max|y| (length-16 dot products differ
    by a few fp32 ulps)."""
    global _FORK_LAYER, _FORK_X
    q, k, v = data(1)
    want = fxattn.attention(q, k, v, threads=2, layout="bshd").tobytes()
    _FORK_LAYER = fw.WanSelfAttention.synthetic(16, 2, seed=1, threads=2)
    _FORK_X = fw.synth(2, 6 * 16).reshape(6, 16)
    want_y = _FORK_LAYER(_FORK_X, (1, 2, 3)).tobytes()
    mp = multiprocessing.get_context("fork")
    parent_end, child_end = mp.Pipe(duplex=False)
    p = mp.Process(target=_child, args=(child_end,))
    p.start()
    child_end.close()
    got = parent_end.recv() if parent_end.poll(60) else None
    p.join(10)
    if p.is_alive():
        p.kill()
        p.join()
    assert got is not None, "the forked child did not answer within 60 s"
    assert got[0] == want
    y_want = np.frombuffer(want_y, np.float32)
    y_got = np.frombuffer(got[1], np.float32)
    assert np.abs(y_got - y_want).max() <= 2.0**-16 * np.abs(y_want).max()
    assert p.exitcode == 0
    # the parent's pools still work
    assert fxattn.attention(q, k, v, threads=2, layout="bshd").tobytes() == want


def test_import_diffusers_does_not_initialise_mpi():
    code = "import sys, fxattn.diffusers; print('mpi4py.MPI' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
