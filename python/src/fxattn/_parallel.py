"""Sequence parallelism for diffusers' WanTransformer3DModel over MPI ranks
(fxattn.diffusers.parallelize).

Every rank runs the same forward on the same inputs; hooks make each rank
keep only its token shard (fxattn.mpi.shard's split, by its grid rank
fxattn.mpi.rank(comm, placement)) from the first block on:

- transformer.rope (forward hook): the rotary tables (cos, sin), [1, S, 1, D],
  are cut to this rank's tokens;
- every block (forward pre-hook): the first block's hidden_states [B, S, C]
  (patch-embedded and flattened) and, for per-token timesteps (Wan2.2 TI2V),
  every block's timestep_proj [B, S, 6, C] are cut to this rank's tokens;
- every block's attn1 (self-attention) gets a processor that runs the
  projections, RMSNorm and RoPE on the shard and the attention itself
  through fxattn.mpi.attention on the U x R grid; attn2 (cross-attention on
  the replicated text context) and the feed-forward stay local, per token;
- transformer.norm_out (forward pre-hook): the tokens are all-gathered, so
  norm_out, proj_out and unpatchify see the whole sequence and every rank
  returns the whole output.

Every other diffusers model with a context-parallel plan (`_cp_plan`) goes
through fxattn._cp_plan, which follows that plan.

Nothing in diffusers is edited; parallelize() returns a handle whose
remove() takes the hooks off and puts the original processors back.
"""

from __future__ import annotations

import numpy as np

from . import mpi as _fm

__all__ = ["parallelize", "Parallelized", "ShardedWanAttnProcessor"]


def _gather_tokens(comm, x, seq: int, placement: str = "hosts", timeout=None):
    """All-gather the token shards (dim 1) of x [B, S_r, ...] into [B, seq, ...]
    (rank r holds the shard of its grid rank); a non-blocking Allgatherv
    that raises PeerTimeoutError when not every rank took part within
    timeout seconds (None: $FXA_MPI_TIMEOUT or 60)."""
    import torch

    seconds = _fm.timeout_seconds(timeout)
    size = comm.Get_size()
    grid = _fm._grid_ranks(comm, placement, timeout)
    shards = [_fm.shard(seq, grid[r], size) for r in range(size)]
    lengths = [n for _, n in shards]
    if x.shape[1] != lengths[comm.Get_rank()]:
        raise ValueError(f"rank {comm.Get_rank()} holds {x.shape[1]} tokens, expected {lengths[comm.Get_rank()]}")
    moved = x.detach().transpose(0, 1).contiguous()  # [S_r, B, ...]: a rank's tokens are one block
    row = int(np.prod(moved.shape[1:])) * moved.element_size()  # bytes per token
    send = moved.reshape(-1).view(torch.uint8).numpy() if moved.numel() else np.empty(0, np.uint8)
    recv = np.empty(seq * row, np.uint8)
    counts = [n * row for n in lengths]
    displs = [start * row for start, _ in shards]
    request = comm.Iallgatherv([send, _fm.MPI.BYTE], [recv, (counts, displs), _fm.MPI.BYTE])
    _fm.wait(comm, request, seconds, "fxattn.diffusers.parallelize's token gather")
    full = torch.from_numpy(recv).view(x.dtype).view(seq, *moved.shape[1:])
    return full.transpose(0, 1).contiguous()


class ShardedWanAttnProcessor:
    """WanAttnProcessor for self-attention on this rank's token shard, with
    the attention over the whole sequence through fxattn.mpi.attention."""

    def __init__(self, comm, ulysses=1, ring=None, threads=None, prefetch=1, timeout=None, placement="hosts",
                 grid=None, **options):
        self.comm = comm
        self.placement = placement
        self.timeout = timeout
        self.kwargs = dict(ulysses=ulysses, ring=ring, grid=grid, threads=threads, prefetch=prefetch,
                           timeout=timeout, placement=placement, **options)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        if encoder_hidden_states is not None or attention_mask is not None:
            raise NotImplementedError("ShardedWanAttnProcessor runs self-attention without a mask only")
        import torch

        from ._wan_qkv import heads_qkv  # imported here: torch and diffusers on first use

        query, key, value = heads_qkv(attn, hidden_states, None, rotary_emb)
        if query.requires_grad and torch.is_grad_enabled():
            raise NotImplementedError("fxattn.diffusers.parallelize runs inference only (its token split and "
                                      "gather are not differentiable); call the model under torch.no_grad()")
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
        rank, size = _fm.rank(comm, processor.placement, processor.timeout), comm.Get_size()

        def local(x):
            start, n = _fm.shard(self.seq, rank, size)
            return x[:, start : start + n]

        def rope_hook(module, inputs, output):
            cos, sin = output
            self.seq = cos.shape[1]
            return local(cos), local(sin)

        def block_hook(module, args, kwargs):
            args = list(args)

            def cut(i, name, ndim):
                x = args[i] if len(args) > i else kwargs.get(name)
                if x is None or x.ndim != ndim or x.shape[1] != self.seq:
                    return
                if _fm.shard(self.seq, rank, size)[1] == self.seq:
                    return
                if len(args) > i:
                    args[i] = local(x)
                else:
                    kwargs[name] = local(x)

            cut(0, "hidden_states", 3)  # only the first block sees all tokens
            cut(2, "temb", 4)  # per-token timesteps: [B, S, 6, C]
            return tuple(args), kwargs

        def gather_hook(module, args):
            gathered = _gather_tokens(comm, args[0], self.seq, processor.placement, processor.timeout)
            return (gathered,) + tuple(args[1:])

        self._hooks.append(transformer.rope.register_forward_hook(rope_hook))
        for block in transformer.blocks:
            self._hooks.append(block.register_forward_pre_hook(block_hook, with_kwargs=True))
            self._processors.append((block.attn1, block.attn1.processor))
            block.attn1.processor = processor
        self._hooks.append(transformer.norm_out.register_forward_pre_hook(gather_hook))

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


def parallelize(transformer, comm, *, ulysses=1, ring=None, grid=None, threads=None, prefetch=1, timeout=None,
                placement="hosts", **options):
    """Sequence-parallel forward of a diffusers model over comm.

    Any model class with a context-parallel plan (`_cp_plan`: Flux, Flux2,
    LTX-Video, Qwen-Image, ...) is split and gathered by that plan and its
    self-attention runs through fxattn.mpi.attention (fxattn._cp_plan,
    returning a PlanParallelized handle); WanTransformer3DModel takes the
    path below. The grid (U * R == ranks) and every attention's heads
    (divisible by U) are checked here, before any forward.

    Collective over comm (the grid ranks are agreed on). In place: installs
    hooks on transformer.rope, its blocks and norm_out and replaces every
    block's attn1 processor with a ShardedWanAttnProcessor
    (fxattn.mpi.attention on a U x R grid: ulysses=U, ring=R, R None:
    P // U, or grid="auto": the planner's grid for each attention shape,
    fxattn.mpi.plan; placement: "hosts" or "ranks", as fxattn.mpi.rank).
    Every rank
    must then call the forward collectively with the
    same inputs; each returns the whole output, equal to one process's
    within fp32 rounding. options (scale, mode, center, compute) go to
    fxattn.mpi.attention. Returns a Parallelized handle: .remove() (or
    leaving a `with` block) restores the model.
    """
    if type(transformer).__name__ != "WanTransformer3DModel":
        from ._cp_plan import parallelize_plan

        return parallelize_plan(transformer, comm, ulysses=ulysses, ring=ring, grid=grid, threads=threads,
                                prefetch=prefetch, timeout=timeout, placement=placement, **options)
    from ._cp_plan import check_model

    auto = grid is not None
    if not auto:
        # the grid and the heads, locally, before any forward
        check_model(transformer, comm.Get_size(), ulysses, ring, auto, processors=False)
    proc = ShardedWanAttnProcessor(comm, ulysses=ulysses, ring=ring, grid=grid, threads=threads, prefetch=prefetch,
                                   timeout=timeout, placement=placement, **options)
    return Parallelized(transformer, comm, proc)
