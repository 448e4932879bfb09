"""Sequence parallelism over MPI ranks for any diffusers model that declares
a context-parallel plan (`_cp_plan`: Wan, Flux, Flux2, LTX-Video,
Qwen-Image, ...), driven by that plan (fxattn.diffusers.parallelize).

Every rank runs the same forward on the same inputs. The plan says where
the sequence is split and gathered; this module follows it with torch hooks:

- {module: {name or output index: ContextParallelInput(split_dim, ...)}}:
  the named forward input (or, with split_output, the output at that index)
  is cut to this rank's shard along split_dim: fxattn.mpi.shard's split by
  the grid rank fxattn.mpi.rank(comm, placement), so lengths need not
  divide by the rank count; a tensor whose ndim is not expected_dims is
  left whole, as diffusers does;
- {module: ContextParallelOutput(gather_dim, ...) or a list of them}: the
  module's outputs are all-gathered along gather_dim (None entries stay).

Attention: every attention processor of the model that calls diffusers'
dispatch_attention_fn with its `_parallel_config` gets an
MPIAttentionConfig there, and the processor module's dispatch_attention_fn
is wrapped: a call that carries an MPIAttentionConfig runs
fxattn.mpi.attention on the U x R grid on the sharded [B, S_r, H, D]
query/key/value (keys and values of every rank's tokens); every other call
goes to diffusers unchanged (cross-attention on a replicated context, which
the processors send without a parallel config). A mask, is_causal or
dropout under parallelism raises NotImplementedError (libfxattn_mpi has no
masks). Token order across ranks does not matter to unmasked attention, so
processors that concatenate two split streams (Flux: [text_r, image_r])
work when the concatenated lengths are still fxattn.mpi.shard's split of
their sum: the text's or the image's length divisible by the rank count.
Before each forward the ranks check and agree on the lengths of the inputs
the plan splits at the model (that, and no input shorter than the ranks):
a forward that cannot run raises ValueError on every rank, naming the
lengths and the rank count.

Training: every rank computes the same loss from the gathered output. The
split is a narrow (its gradient lands in this rank's shard, zeros
elsewhere), the gather a torch.autograd.Function whose backward returns
this rank's shard of the incoming gradient (the same on every rank: no
communication) and fxattn.mpi.attention is differentiable, so after
backward each rank's parameter gradients are its tokens' part, and the
handle's reduce_gradients() sums them over the ranks into the one-process
gradient. That holds when the loss depends on the parameters only through
the gathered outputs: a parameter used after a gather would count once per
rank. Every diffusers plan gathers at the model's last layer (proj_out)
except Helios, which gathers and splits again around each block's
attention and feed-forward; a split after a gather under autograd raises
NotImplementedError.

Nothing in diffusers is edited; the handle's remove() takes the hooks and
configs off and puts dispatch_attention_fn back.
"""

from __future__ import annotations

import inspect

import numpy as np

from ... import mpi as _fm
from ..._capi.mpi import MPI
from ...mpi import collective as _coll
from ...mpi import handles as _handles

__all__ = ["parallelize_plan", "PlanParallelized", "MPIAttentionConfig", "check_model", "reduce_gradients"]


def _modules(model, name: str) -> list:
    """The submodules a plan key names ("" the model, "blocks.0", "blocks.*")."""
    import torch

    found = [model]
    for atom in name.split(".") if name else []:
        nxt = []
        for m in found:
            if atom == "*":
                if not isinstance(m, torch.nn.ModuleList):
                    raise TypeError(f"_cp_plan key {name!r}: '*' on {type(m).__name__}, not a ModuleList")
                nxt.extend(m)
            elif hasattr(m, atom):
                nxt.append(getattr(m, atom))
            else:
                raise TypeError(f"_cp_plan key {name!r}: {type(m).__name__} has no submodule {atom!r}")
        found = nxt
    return found


class MPIAttentionConfig:
    """The parallel config fxattn puts on attention processors: the
    communicator and the keywords of fxattn.mpi.attention."""

    def __init__(self, comm, **kwargs):
        self.comm = comm
        self.kwargs = kwargs


def _mpi_attention(config: MPIAttentionConfig, query, key, value, attn_mask, dropout_p, is_causal, scale):
    """fxattn.mpi.attention for one dispatched call ([B, S_r, H, D] shards)."""
    if attn_mask is not None:
        raise NotImplementedError(
            "fxattn.diffusers.parallelize: masked attention is not supported under sequence parallelism "
            "(libfxattn_mpi has no masks); call the model without an attention mask"
        )
    if is_causal or dropout_p:
        raise NotImplementedError("fxattn.diffusers.parallelize: causal attention and dropout are not supported")
    return _fm.attention(query, key, value, config.comm, layout="bshd", scale=scale, out_dtype=query.dtype, **config.kwargs)


# the wrapped dispatch_attention_fn of each processor module: globals id -> [globals, original, users]
_wrapped: dict[int, list] = {}


def _wrap_dispatch(globs: dict) -> None:
    """Wrap the dispatch_attention_fn of a processor's module (globs): calls
    carrying an MPIAttentionConfig run _mpi_attention, others the original.
    Counted: one wrapper per module, however many processors use it."""
    entry = _wrapped.get(id(globs))
    if entry is not None:
        entry[2] += 1
        return
    original = globs["dispatch_attention_fn"]
    signature = inspect.signature(original)

    def dispatch_attention_fn(*args, **kwargs):
        config = kwargs.get("parallel_config")
        if not isinstance(config, MPIAttentionConfig):
            return original(*args, **kwargs)
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        a = call.arguments
        return _mpi_attention(config, a["query"], a["key"], a["value"], a["attn_mask"], a["dropout_p"], a["is_causal"], a["scale"])

    globs["dispatch_attention_fn"] = dispatch_attention_fn
    _wrapped[id(globs)] = [globs, original, 1]


def _unwrap_dispatch(globs: dict) -> None:
    """Undo one _wrap_dispatch; the last one puts the original back."""
    entry = _wrapped[id(globs)]
    entry[2] -= 1
    if entry[2] == 0:
        globs["dispatch_attention_fn"] = entry[1]
        del _wrapped[id(globs)]


def _attention_processors(model) -> list:
    """(module, processor) of every attention module of the model."""
    return [(m, m.processor) for m in model.modules() if hasattr(m, "processor") and hasattr(m, "set_processor")]


def check_model(model, size: int, ulysses: int, ring, auto: bool, processors: bool = True) -> list:
    """Local checks at parallelize() time (raise ValueError / TypeError):
    a `_cp_plan`, U * R == size, every attention module's heads divisible by
    U and (processors) every processor dispatching through diffusers'
    dispatch_attention_fn with a parallel config. Returns the (module,
    processor) pairs."""
    plan = getattr(type(model), "_cp_plan", None)
    if not plan:
        raise TypeError(f"parallelize takes a diffusers model with a context-parallel plan (_cp_plan); {type(model).__name__} has none")
    if not auto:
        if ring is None:
            if ulysses < 1 or size % ulysses:
                raise ValueError(f"ulysses={ulysses} does not divide the {size} ranks of the communicator")
            ring = size // ulysses
        if ulysses < 1 or ring < 1 or ulysses * ring != size:
            raise ValueError(f"the grid ulysses={ulysses} x ring={ring} must have as many ranks as the communicator, {size}")
    pairs = _attention_processors(model)
    if not pairs:
        raise TypeError(f"{type(model).__name__} has no attention modules with processors")
    for module, proc in pairs:
        call = type(proc).__call__ if callable(proc) else None
        globs = getattr(call, "__globals__", {})
        if processors and ("dispatch_attention_fn" not in globs or not hasattr(proc, "_parallel_config")):
            raise TypeError(
                f"{type(module).__name__}'s processor {type(proc).__name__} does not dispatch through "
                "diffusers' dispatch_attention_fn with a parallel config; set the model's default "
                "processors before parallelize"
            )
        if isinstance(getattr(proc, "_parallel_config", None), MPIAttentionConfig):
            raise ValueError(f"{type(model).__name__} is already parallelized; remove() that handle first")
        for attr in ("heads", "kv_heads"):
            h = getattr(module, attr, None)
            if not auto and isinstance(h, int) and h % ulysses:
                raise ValueError(f"{type(module).__name__}.{attr} = {h} is not divisible by ulysses={ulysses}")
    return pairs


def _joint_attention(model) -> bool:
    """The model has joint attention (Flux, Qwen-Image: an attention module
    with added query projections, which concatenates the text and image
    streams' shards into one sequence)."""
    return any(getattr(m, "add_q_proj", None) is not None for m in model.modules())


def _length_error(model: str, lengths: dict, size: int, joint: bool) -> str:
    """Why a forward whose split inputs have these lengths ({input name:
    tokens along its split dim}) cannot run on size ranks ("" when it can):
    an input shorter than the ranks leaves a rank an empty shard; joint
    attention concatenates each rank's text and image shards, which is
    fxattn.mpi.shard's split of the joint sequence only when the text's
    length (encoder_hidden_states) or the image's (hidden_states) is
    divisible by the rank count."""
    for name, n in lengths.items():
        if n < size:
            return (
                f"{model}'s {name} has {n} tokens, fewer than the {size} ranks: a rank's shard would be empty; "
                f"give it at least {size} tokens"
            )
    text, image = lengths.get("encoder_hidden_states"), lengths.get("hidden_states")
    if joint and text is not None and image is not None and text % size and image % size:
        return (
            f"{model}'s joint attention concatenates each rank's shard of the text (encoder_hidden_states, "
            f"{text} tokens) and of the image (hidden_states, {image} tokens), an even split of the joint "
            f"sequence over the {size} ranks only when one of the two lengths is divisible by {size}: pad the "
            f"text to a multiple of {size} tokens"
        )
    return ""


def _gather_data(comm, x, dim: int, grid: list, seconds: float):
    """All-gather the shards of x along dim (rank r holds shard grid[r] of
    fxattn.mpi.shard's split); a non-blocking Allgatherv under the deadline.
    Returns the whole tensor and (start, length) of this rank's shard in it."""
    import torch

    size = comm.Get_size()
    moved = x.detach().movedim(dim, 0).contiguous()  # a rank's tokens are one block
    lengths = _coll.allgather_int(comm, moved.shape[0], seconds, "fxattn.diffusers.parallelize's gather")
    seq = sum(lengths)
    shards = [_fm.shard(seq, grid[r], size) for r in range(size)]
    if lengths != [n for _, n in shards]:
        raise ValueError(f"the ranks' shard lengths {lengths} along dim {dim} are not fxattn.mpi.shard's split of {seq}")
    row = int(np.prod(moved.shape[1:])) * moved.element_size()
    send = moved.reshape(-1).view(torch.uint8).numpy() if moved.numel() else np.empty(0, np.uint8)
    recv = np.empty(seq * row, np.uint8)
    request = comm.Iallgatherv([send, MPI.BYTE], [recv, ([n * row for n in lengths], [s * row for s, _ in shards]), MPI.BYTE])
    _coll.wait(comm, request, seconds, "fxattn.diffusers.parallelize's gather")
    full = torch.from_numpy(recv).view(x.dtype).view(seq, *moved.shape[1:])
    return full.movedim(0, dim).contiguous(), shards[comm.Get_rank()]


def _gather_function():
    """The torch.autograd.Function of the gather (made on first use: torch
    is imported lazily)."""
    global _Gather
    if _Gather is None:
        import torch

        class Gather(torch.autograd.Function):
            """Forward: _gather_data. Backward: this rank's shard of the
            incoming gradient (every rank computes the same loss from the
            same gathered tensor, so the gradient is the same on every rank
            and each keeps its own part: no communication)."""

            @staticmethod
            def forward(ctx, x, comm, dim, grid, seconds):
                full, (start, n) = _gather_data(comm, x, dim, grid, seconds)
                ctx.dim, ctx.start, ctx.n = dim, start, n
                return full

            @staticmethod
            def backward(ctx, grad):
                return grad.narrow(ctx.dim, ctx.start, ctx.n), None, None, None, None

        _Gather = Gather
    return _Gather


_Gather = None


def _gather(comm, x, dim: int, grid: list, seconds: float):
    """All-gather the shards of x along dim, differentiably (_gather_function)."""
    return _gather_function().apply(x, comm, dim, grid, seconds)


def reduce_gradients(model, comm, seconds: float) -> int:
    """Sum every parameter's .grad of model over comm, in place (collective,
    non-blocking MPI_Iallreduce calls under the deadline). A parameter
    whose grad is None on some ranks and not on others is summed as zeros
    there (its .grad is set); None on every rank stays None. The ranks'
    models must have the same parameters (names, shapes, dtypes), else
    ValueError on every rank. Sums run in float32 (float64 for
    float64 grads) in buckets of _BUCKET elements; each bucket is one
    MPI_Iallreduce. Returns the number of gradients summed."""
    import torch

    what = "fxattn.diffusers.parallelize's gradient reduction"
    params = list(model.named_parameters())
    local = None
    for name, p in params:
        g = p.grad
        if g is not None and (g.is_sparse or not g.is_floating_point()):
            local = f"{name}'s grad is {'sparse' if g.is_sparse else g.dtype}: only dense floating grads are summed"
            break
    sig = [(n, tuple(p.shape), str(p.dtype), p.grad is not None) for n, p in params]  # torch: grad dtype = p's
    every = _coll.allgather_object(comm, (local, sig), seconds, what)
    # every decision below is made from `every`, the same on every rank
    for r, (err, _) in enumerate(every):
        if err:
            raise ValueError(f"{what}: rank {r}: {err}")
    sigs = [other for _, other in every]
    for r, other in enumerate(sigs):
        if len(other) != len(sigs[0]):
            raise ValueError(f"{what}: rank 0 has {len(sigs[0])} parameters, rank {r} {len(other)}")
        for first, theirs in zip(sigs[0], other):
            if first[:3] != theirs[:3]:
                raise ValueError(
                    f"{what}: rank 0 has {first[0]} {first[1:3]}, rank {r} {theirs[0]} {theirs[1:3]}: the ranks' models differ"
                )
    grads = []
    for i, (_, p) in enumerate(params):
        if not any(other[i][3] for other in sigs):
            continue
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        elif not p.grad.is_contiguous():
            p.grad = p.grad.contiguous()
        grads.append(p.grad)
    _allreduce_sum(comm, [g for g in grads if g.dtype == torch.float64], torch.float64, seconds, what)
    _allreduce_sum(comm, [g for g in grads if g.dtype != torch.float64], torch.float32, seconds, what)
    return len(grads)


_BUCKET = 1 << 22  # elements per MPI_Iallreduce (16 MiB in float32)


def _allreduce_sum(comm, grads: list, dtype, seconds: float, what: str) -> None:
    """Sum the tensors grads over comm in place, through a CPU staging
    buffer of dtype (float32 or float64) of at most _BUCKET elements."""
    import torch

    total = sum(g.numel() for g in grads)
    if not total:
        return
    stage = torch.empty(min(total, _BUCKET), dtype=dtype)
    mpi_type = MPI.DOUBLE if dtype == torch.float64 else MPI.FLOAT
    pending = []  # (flat grad, offset in it, offset in stage, count)
    fill = 0

    def flush():
        buf = stage[:fill].numpy()
        _coll.wait(comm, comm.Iallreduce(MPI.IN_PLACE, [buf, mpi_type], op=MPI.SUM), seconds, what)
        for flat, off, at, n in pending:
            flat[off : off + n].copy_(stage[at : at + n])
        pending.clear()

    for g in grads:
        flat = g.view(-1)
        off = 0
        while off < flat.numel():
            n = min(flat.numel() - off, stage.numel() - fill)
            stage[fill : fill + n].copy_(flat[off : off + n])
            pending.append((flat, off, fill, n))
            fill += n
            off += n
            if fill == stage.numel():
                flush()
                fill = 0
    if fill:
        flush()


class PlanParallelized:
    """The hooks and attention configs parallelize_plan() installed;
    remove() undoes them."""

    def __init__(self, model, comm, config: MPIAttentionConfig, pairs: list, placement: str, timeout):
        self.model = model
        self.comm = comm
        self._hooks = []
        self._configs = []
        self._seconds = seconds = _coll.timeout_seconds(timeout)
        self._gathered = False  # the current forward has gathered (a split after that is refused under autograd)
        size = comm.Get_size()
        grid = _handles.grid_ranks(comm, placement, timeout)
        me = grid[comm.Get_rank()]

        def split(x, cpi):
            if not hasattr(x, "ndim") or (cpi.expected_dims is not None and x.ndim != cpi.expected_dims):
                return x
            import torch

            if self._gathered and torch.is_grad_enabled():
                raise NotImplementedError(
                    f"fxattn.diffusers.parallelize: {type(model).__name__}'s plan splits again after a gather; "
                    "under autograd the layers between would count once per rank in the summed gradients; "
                    "call the model under torch.no_grad()"
                )
            start, n = _fm.shard(x.shape[cpi.split_dim], me, size)
            return x.narrow(cpi.split_dim, start, n)

        try:
            self._install(model, config, pairs, split, grid, seconds)
        except BaseException:
            self.remove()
            raise

    def _install(self, model, config, pairs, split, grid, seconds):
        from diffusers.models._modeling_parallel import ContextParallelOutput

        def reset(module, args):
            self._gathered = False

        self._hooks.append(model.register_forward_pre_hook(reset))
        check = self._length_hook(model, len(grid), seconds)
        if check is not None:
            self._hooks.append(model.register_forward_pre_hook(check, with_kwargs=True))
        for name, entry in type(model)._cp_plan.items():
            for m in _modules(model, name):
                if isinstance(entry, dict):
                    self._split_hooks(m, entry, split)
                else:
                    outs = [entry] if isinstance(entry, ContextParallelOutput) else list(entry)
                    self._hooks.append(m.register_forward_hook(self._gather_hook(outs, grid, seconds)))
        for _module, proc in pairs:
            own = "_parallel_config" in vars(proc)
            _wrap_dispatch(type(proc).__call__.__globals__)
            self._configs.append((proc, own, vars(proc).get("_parallel_config")))
            proc._parallel_config = config

    def _length_hook(self, model, size: int, seconds: float):
        """A forward pre-hook of the model, run before its inputs are split
        (None when there is nothing to check): every rank checks the lengths
        of the inputs the plan splits at the model and, with joint
        attention, of hidden_states and encoder_hidden_states
        (_length_error), and the ranks agree (one small collective per
        forward), so that a forward that cannot run raises ValueError on
        every rank before it starts."""
        params = list(inspect.signature(model.forward).parameters)
        entry = type(model)._cp_plan.get("")
        # {input: (split dim, expected dims)}: what the plan splits at the model and, for joint
        # attention, the two streams (split at the model, Flux, or at the first block, Qwen-Image)
        inputs = {k: (v.split_dim, v.expected_dims) for k, v in entry.items() if not v.split_output} if isinstance(entry, dict) else {}
        joint = _joint_attention(model)
        if joint:
            for k in ("hidden_states", "encoder_hidden_states"):
                if k in params:
                    inputs.setdefault(k, (1, 3))
        if not inputs:
            return None
        comm, name = self.comm, type(model).__name__

        def hook(module, args, kwargs):
            lengths = {}
            for k, (dim, dims) in inputs.items():
                at = params.index(k) if k in params else len(args)
                x = kwargs[k] if k in kwargs else (args[at] if at < len(args) else None)
                if hasattr(x, "ndim") and (dims is None or x.ndim == dims):
                    lengths[k] = int(x.shape[dim])
            mine = (_length_error(name, lengths, size, joint), lengths)
            every = _coll.allgather_object(comm, mine, seconds, "fxattn.diffusers.parallelize's length check")
            for r, (error, theirs) in enumerate(every):
                if error:
                    raise ValueError(f"fxattn.diffusers.parallelize: {error}")
                if theirs != every[0][1]:
                    raise ValueError(
                        f"fxattn.diffusers.parallelize: the ranks' inputs differ: rank 0 splits "
                        f"{every[0][1]} tokens, rank {r} {theirs}; every rank must run the same forward"
                    )

        return hook

    def _split_hooks(self, m, entry: dict, split):
        params = list(inspect.signature(m.forward).parameters)
        inputs = {k: v for k, v in entry.items() if not v.split_output}
        outputs = {k: v for k, v in entry.items() if v.split_output}
        for k in inputs:
            if k not in params:
                raise TypeError(f"_cp_plan: {type(m).__name__}.forward has no input {k!r}")

        def pre_hook(module, args, kwargs):
            args = list(args)
            for k, cpi in inputs.items():
                if k in kwargs:
                    if kwargs[k] is not None:
                        kwargs[k] = split(kwargs[k], cpi)
                elif params.index(k) < len(args) and args[params.index(k)] is not None:
                    args[params.index(k)] = split(args[params.index(k)], cpi)
            return tuple(args), kwargs

        def hook(module, args, output):
            single = not isinstance(output, (tuple, list))
            out = [output] if single else list(output)
            for i, cpi in outputs.items():
                out[i] = split(out[i], cpi)
            return out[0] if single else type(output)(out)

        if inputs:
            self._hooks.append(m.register_forward_pre_hook(pre_hook, with_kwargs=True))
        if outputs:
            self._hooks.append(m.register_forward_hook(hook))

    def _gather_hook(self, outs: list, grid: list, seconds: float):
        comm = self.comm

        def hook(module, args, output):
            single = not isinstance(output, (tuple, list))
            out = [output] if single else list(output)
            if len(out) != len(outs):
                raise ValueError(f"_cp_plan: {type(module).__name__} returned {len(out)} outputs, the plan has {len(outs)}")
            for i, cpo in enumerate(outs):
                if cpo is not None and (cpo.expected_dims is None or out[i].ndim == cpo.expected_dims):
                    out[i] = _gather(comm, out[i], cpo.gather_dim, grid, seconds)
                    self._gathered = True
            return out[0] if single else type(output)(out)

        return hook

    def reduce_gradients(self) -> int:
        """Sum every parameter's .grad of the model over the communicator
        (collective, under the handle's timeout), so that every rank holds
        the one-process gradient of the loss; call it after backward and
        before the optimizer step. After a backward under parallelism each
        rank's gradients are its tokens' part (the split keeps this rank's
        shard, the gather's backward returns this rank's shard of the
        gradient), and the parts sum to the whole when the loss depends on
        the parameters only through the plan's gathered outputs. A grad that
        is None on some ranks only is summed as zeros. Returns the number of
        gradients summed."""
        return reduce_gradients(self.model, self.comm, self._seconds)

    def remove(self) -> None:
        """Take the hooks off, restore the processors' parallel configs and
        diffusers' dispatch_attention_fn (local)."""
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        for proc, own, old in self._configs:
            if own:
                proc._parallel_config = old
            else:
                del proc._parallel_config
            _unwrap_dispatch(type(proc).__call__.__globals__)
        self._configs.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def parallelize_plan(model, comm, *, ulysses=1, ring=None, grid=None, threads=None, prefetch=1, timeout=None, placement="hosts", **options):
    """Sequence-parallel forward of a diffusers model with a `_cp_plan` over
    comm, split and gathered by that plan, self-attention through
    fxattn.mpi.attention (arguments as fxattn.diffusers.parallelize).
    Collective (the ranks agree on the grid check and the grid ranks).
    Returns a PlanParallelized handle."""
    auto = grid is not None
    if auto and (grid != "auto" or ulysses != 1 or ring is not None):
        raise ValueError("grid='auto' picks ulysses and ring: give grid='auto' alone, or ulysses and ring")
    error = None
    try:
        pairs = check_model(model, comm.Get_size(), ulysses, ring, auto)
    except (TypeError, ValueError) as e:
        error, pairs = e, None
    errors = _coll.allgather_object(
        comm,
        None if error is None else f"{type(error).__name__}: {error}",
        _coll.timeout_seconds(timeout),
        "fxattn.diffusers.parallelize's checks",
    )
    if error is not None:
        raise error
    bad = next((r for r, e in enumerate(errors) if e), None)
    if bad is not None:
        raise ValueError(f"rank {bad}: {errors[bad]}")
    config = MPIAttentionConfig(
        comm, ulysses=ulysses, ring=ring, grid=grid, threads=threads, prefetch=prefetch, timeout=timeout, placement=placement, **options
    )
    return PlanParallelized(model, comm, config, pairs, placement, timeout)
