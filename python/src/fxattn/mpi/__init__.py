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

from .handles import default_threads, rank, release, shard
from .interface import attention
from .planner import GridPlan, Link, plan

__all__ = ["attention", "plan", "GridPlan", "Link", "shard", "rank", "default_threads", "release"]
