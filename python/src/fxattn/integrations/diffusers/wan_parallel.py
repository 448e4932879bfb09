"""Sequence parallelism for diffusers' WanTransformer3DModel over MPI ranks
(fxattn.diffusers.parallelize).

Every rank runs the same forward on the same inputs; hooks make each rank
keep only its token shard (fxattn.mpi.shard's split, by its grid rank
fxattn.mpi.rank(comm, placement)) from the first block on:

- transformer.rope (forward hook): the rotary tables (cos, sin), [1, S, 1, D],
  are cut to this rank's tokens;
- transformer.condition_embedder (forward hook): for per-token timesteps
  (Wan2.2 TI2V), temb [B, S, C] and timestep_proj [B, S, 6 C] are cut to
  this rank's tokens;
- the first block (forward pre-hook): hidden_states [B, S, C]
  (patch-embedded and flattened) is cut to this rank's tokens;
- every block's attn1 (self-attention) gets a processor that runs the
  projections, RMSNorm and RoPE on the shard and the attention itself
  through fxattn.mpi.attention on the U x R grid; attn2 (cross-attention on
  the replicated text context), the feed-forward, the output norm and
  proj_out stay local, per token;
- transformer.proj_out (forward hook): its output is all-gathered
  (context_parallel's gather), so unpatchify sees the whole sequence and
  every rank returns the whole output.

Under autograd the gather's backward keeps this rank's shard of the
gradient and the handle's reduce_gradients() sums the parameters'
gradients over the ranks (context_parallel.reduce_gradients): every
parameter reaches the output through the gather, as on the plan path.

Every other diffusers model with a context-parallel plan (`_cp_plan`) goes
through context_parallel, which follows that plan.

Nothing in diffusers is edited; parallelize() returns a handle whose
remove() takes the hooks off and puts the original processors back.
"""

from __future__ import annotations

from ... import mpi as _fm
from ...mpi import collective as _coll
from ...mpi import handles as _handles
from . import context_parallel

__all__ = ["parallelize", "Parallelized", "ShardedWanAttnProcessor"]


class ShardedWanAttnProcessor:
    """WanAttnProcessor for self-attention on this rank's token shard, with
    the attention over the whole sequence through fxattn.mpi.attention."""

    def __init__(self, comm, ulysses=1, ring=None, threads=None, prefetch=1, timeout=None, placement="hosts", grid=None, **options):
        self.comm = comm
        self.placement = placement
        self.timeout = timeout
        self.kwargs = dict(
            ulysses=ulysses, ring=ring, grid=grid, threads=threads, prefetch=prefetch, timeout=timeout, placement=placement, **options
        )

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if encoder_hidden_states is not None or attention_mask is not None:
            raise NotImplementedError("ShardedWanAttnProcessor runs self-attention without a mask only")
        from .wan_qkv import heads_qkv  # imported here: torch and diffusers on first use

        query, key, value = heads_qkv(attn, hidden_states, None, rotary_emb)
        out = _fm.attention(query, key, value, self.comm, layout="bshd", out_dtype=query.dtype, **self.kwargs)
        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[0](out)
        return attn.to_out[1](out)


class Parallelized:
    """The hooks and processors parallelize() installed; remove() undoes them."""

    def __init__(self, transformer, comm, processor):
        self.transformer = transformer
        self.comm = comm
        self.seq = None  # the global token count of the current forward
        self._hooks = []
        self._processors = []
        self._seconds = seconds = _coll.timeout_seconds(processor.timeout)
        grid = _handles.grid_ranks(comm, processor.placement, processor.timeout)
        rank, size = grid[comm.Get_rank()], comm.Get_size()

        def local(x):
            start, n = _fm.shard(self.seq, rank, size)
            return x[:, start : start + n]

        def rope_hook(module, inputs, output):
            cos, sin = output
            self.seq = cos.shape[1]
            return local(cos), local(sin)

        def embedder_hook(module, inputs, output):
            # per-token timesteps (Wan2.2 TI2V): temb [B, S, C] and timestep_proj [B, S, 6 C]
            output = list(output)
            for i in (0, 1):
                x = output[i]
                if x.ndim == 3 and x.shape[1] == self.seq:
                    output[i] = local(x)
            return tuple(output)

        def block_hook(module, args, kwargs):
            x = args[0] if args else kwargs.get("hidden_states")
            if x is None or x.ndim != 3 or x.shape[1] != self.seq or _fm.shard(self.seq, rank, size)[1] == self.seq:
                return None  # only the first block sees all tokens
            if args:
                return (local(x),) + tuple(args[1:]), kwargs
            return args, dict(kwargs, hidden_states=local(x))

        def gather_hook(module, args, output):
            return context_parallel._gather(comm, output, 1, grid, seconds)

        self._hooks.append(transformer.rope.register_forward_hook(rope_hook))
        self._hooks.append(transformer.condition_embedder.register_forward_hook(embedder_hook))
        for block in transformer.blocks:
            self._hooks.append(block.register_forward_pre_hook(block_hook, with_kwargs=True))
            self._processors.append((block.attn1, block.attn1.processor))
            block.attn1.processor = processor
        self._hooks.append(transformer.proj_out.register_forward_hook(gather_hook))

    def reduce_gradients(self) -> int:
        """Sum every parameter's .grad of the transformer over the
        communicator (collective), so that every rank holds the one-process
        gradient; as PlanParallelized.reduce_gradients (every parameter
        reaches the output through the gather after proj_out)."""
        return context_parallel.reduce_gradients(self.transformer, self.comm, self._seconds)

    def remove(self) -> None:
        """Take the hooks off and restore the attn1 processors (local)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for attn, proc in self._processors:
            attn.processor = proc
        self._processors.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def parallelize(
    transformer, comm, *, ulysses=1, ring=None, grid=None, threads=None, prefetch=1, timeout=None, placement="hosts", **options
):
    """Sequence-parallel forward of a diffusers model over comm.

    Any model class with a context-parallel plan (`_cp_plan`: Flux, Flux2,
    LTX-Video, Qwen-Image, ...) is split and gathered by that plan and its
    self-attention runs through fxattn.mpi.attention (context_parallel,
    returning a PlanParallelized handle); WanTransformer3DModel takes the
    path below. The grid (U * R == ranks) and every attention's heads
    (divisible by U) are checked here, before any forward.

    Collective over comm (the grid ranks are agreed on). In place: installs
    hooks on transformer.rope, condition_embedder, its blocks and proj_out
    and replaces every
    block's attn1 processor with a ShardedWanAttnProcessor
    (fxattn.mpi.attention on a U x R grid: ulysses=U, ring=R, R None:
    P // U, or grid="auto": the planner's grid for each attention shape,
    fxattn.mpi.plan; placement: "hosts" or "ranks", as fxattn.mpi.rank).
    Every rank
    must then call the forward collectively with the
    same inputs; each returns the whole output, equal to one process's
    within fp32 rounding. options (scale, mode, center, compute) go to
    fxattn.mpi.attention. Returns a Parallelized handle: .remove() (or
    leaving a `with` block) restores the model. Under autograd: backward on
    every rank, then the handle's reduce_gradients() (collective) gives
    every rank the one-process gradient.
    """
    if type(transformer).__name__ != "WanTransformer3DModel":
        from .context_parallel import parallelize_plan

        return parallelize_plan(
            transformer,
            comm,
            ulysses=ulysses,
            ring=ring,
            grid=grid,
            threads=threads,
            prefetch=prefetch,
            timeout=timeout,
            placement=placement,
            **options,
        )
    from .context_parallel import check_model

    auto = grid is not None
    if not auto:
        # the grid and the heads, locally, before any forward
        check_model(transformer, comm.Get_size(), ulysses, ring, auto, processors=False)
    proc = ShardedWanAttnProcessor(
        comm, ulysses=ulysses, ring=ring, grid=grid, threads=threads, prefetch=prefetch, timeout=timeout, placement=placement, **options
    )
    return Parallelized(transformer, comm, proc)
