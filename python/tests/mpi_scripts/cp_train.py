"""Run under mpirun -np P with args U R: training through
fxattn.diffusers.parallelize, its Wan path (fxattn.integrations.diffusers.wan_parallel) and the plan
path (fxattn.integrations.diffusers.context_parallel, Wan's _cp_plan), on a tiny fp32
WanTransformer3DModel (python/tests/wan_configs.py T2V, 9 video tokens,
uneven over the ranks; one timestep, and a timestep per token as Wan2.2
TI2V; and LoRA adapters on the frozen model, through the Wan path): forward, loss, backward, handle.reduce_gradients()
and one SGD step, against the same seeded model and inputs run on one
process with diffusers' default attention. Prints
'OK rank R path P grads N err E loss L'; MPI_Abort on a mismatch.

Loss: mean squared error against a fixed random target (every output
element enters). Tolerances:
- loss: 1e-5 relative. The parallel forward is an fp32 evaluation of the
  same function as the one-process forward; mpi_scripts/cp_plan.py bounds
  both within 1e-5 max|out| of fp64 (measured <= ~5e-7).
- every parameter's gradient: 1e-4 of max|one-process gradient| of that
  tensor. Both are fp32 evaluations of the same gradient; they differ in
  summation order (a parameter's gradient is a sum over tokens, taken here
  per rank's shard and then summed by MPI; the ring sums R parts of the
  attention's dQ, dK, dV) and in the attention backward (fxattn's
  fixed-max kernels vs torch's math): each sum rounds at eps = 6e-8 of
  magnitudes within a few times max|grad|, through two blocks of linear
  layers with O(1) gains, measured ~1e-6 relative here; 1e-4 leaves a
  margin of ~100x, while a gradient counted once per rank (2x), missing a
  rank's part (a shard's tokens), or a gather that drops the gradient (0)
  is off by O(max|grad|).
- weights after one SGD step (lr 0.1): the gradient bound times lr, plus 2
  ulp of max|w| for the rounding of the update.
Also: every rank holds the same bytes after reduce_gradients (MPI's
allreduce delivers one sum); a grad None on one rank only is summed as
zeros; float64 and bfloat16 gradients cut across buckets of 7 elements
sum exactly (small integers); ranks whose models differ raise ValueError on every
rank; a plan that splits again after a gather raises NotImplementedError
under autograd.
"""

import copy
import sys
import traceback
from pathlib import Path

import torch
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # python/tests: wan_configs

from wan_configs import T2V  # noqa: E402

from fxattn.integrations.diffusers import context_parallel as _cp_plan  # noqa: E402

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()
LR = 0.1


def step(model, kw, target, handle=None):
    """loss, gradients by name, weights after one SGD step."""
    out = model(**kw)[0]
    loss = ((out - target) ** 2).mean()
    loss.backward()
    n = handle.reduce_gradients() if handle is not None else None
    grads = {k: None if p.grad is None else p.grad.clone() for k, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return float(loss.detach()), grads, {k: p.detach().clone() for k, p in model.named_parameters()}, n


def train(u, r, path, per_token, lora=False):
    """path "plan": context_parallel.parallelize_plan (Wan's _cp_plan);
    "wan": fxattn.diffusers.parallelize (its Wan path, wan_parallel).
    per_token: a timestep per token (Wan2.2 TI2V), else one per sample.
    lora: the base weights frozen, peft LoRA adapters (rank 4) on every
    attention projection, their B matrices random (peft's zeros would make
    A's gradient 0)."""
    from diffusers import WanTransformer3DModel

    from fxattn.diffusers import parallelize

    torch.manual_seed(0)
    model = WanTransformer3DModel(**T2V)
    if lora:
        from peft import LoraConfig

        model.requires_grad_(False)
        model.add_adapter(LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.1)
    g = torch.Generator().manual_seed(1)
    timestep = torch.randint(0, 1000, (1, 9), generator=g) if per_token else torch.tensor([500])
    kw = dict(
        hidden_states=torch.randn(1, 4, 3, 2, 6, generator=g),
        timestep=timestep,
        encoder_hidden_states=torch.randn(1, 5, 16, generator=g),
        return_dict=False,
    )
    target = torch.randn(1, 4, 3, 2, 6, generator=g)
    one = copy.deepcopy(model)
    loss1, grads1, weights1, _ = step(one, kw, target)
    par = _cp_plan.parallelize_plan if path == "plan" else parallelize
    handle = par(model, comm, ulysses=u, ring=r, threads=1)
    loss, grads, weights, n = step(model, kw, target, handle)
    handle.remove()
    assert abs(loss - loss1) <= 1e-5 * abs(loss1), f"U={u} R={r}: loss {loss} vs one process {loss1}"
    worst = 0.0
    for k, g1 in grads1.items():
        g = grads[k]
        assert (g is None) == (g1 is None), f"{k}: grad {g is None} vs one process {g1 is None}"
        if g1 is None:
            continue
        scale = float(g1.abs().max())
        err = float((g - g1).abs().max())
        assert err <= 1e-4 * scale, f"U={u} R={r} rank {rank}: {k} grad off by {err:.3g}, max|grad| {scale:.3g}"
        worst = max(worst, err / scale if scale else 0.0)
        w, w1 = weights[k], weights1[k]
        werr = float((w - w1).abs().max())
        wtol = LR * 1e-4 * scale + 2 * 2.0**-23 * float(w1.abs().max())
        assert werr <= wtol, f"{k}: weights after one step off by {werr:.3g} > {wtol:.3g}"
    assert n == sum(g is not None for g in grads1.values()), (n, len(grads1))
    assert not lora or all(("lora_" in k) == (g is not None) for k, g in grads.items()), "LoRA: grads of the adapters"
    flat = torch.cat([g.reshape(-1) for g in grads.values() if g is not None]).numpy()
    assert all((f == flat).all() for f in comm.allgather(flat)), "the ranks' reduced gradients differ"
    path += ("-ti2v" if per_token else "") + ("-lora" if lora else "")
    print(f"OK rank {rank} path {path} grads {n} err {worst:.3g} loss {loss:.6g}", flush=True)


def regather(u, r):
    """A plan that gathers every block's output and splits again at the next
    block (as Helios's does): under autograd the split after the gather
    raises NotImplementedError (the layers between would count once per
    rank); under no_grad the forward runs."""
    from diffusers import WanTransformer3DModel
    from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

    split = ContextParallelInput(split_dim=1, expected_dims=3, split_output=False)

    class Regathered(WanTransformer3DModel):
        _cp_plan = {
            "rope": WanTransformer3DModel._cp_plan["rope"],
            "blocks.0": {"hidden_states": split},
            "blocks.1": {"hidden_states": split},
            "blocks.*": ContextParallelOutput(gather_dim=1, expected_dims=3),
        }

    torch.manual_seed(0)
    model = Regathered(**T2V)
    g = torch.Generator().manual_seed(1)
    kw = dict(
        hidden_states=torch.randn(1, 4, 3, 2, 6, generator=g),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, 5, 16, generator=g),
        return_dict=False,
    )
    with torch.no_grad():
        ref = model(**kw)[0]
    with _cp_plan.parallelize_plan(model, comm, ulysses=u, ring=r, threads=1):
        with torch.no_grad():
            out = model(**kw)[0]
        try:
            model(**kw)
        except NotImplementedError as e:
            print(f"error [split after gather] {e}", flush=True)
        else:
            raise AssertionError("a split after a gather ran under autograd")
    err = float((out - ref).abs().max())
    assert err <= 1e-4 * float(ref.abs().max()), f"regathered forward off by {err:.3g}"  # as mpi_scripts/wan.py


def edge_cases():
    """A grad None on one rank only, gradients cut across buckets, ranks
    whose models differ."""
    lin = torch.nn.Linear(3, 2)
    for p in lin.parameters():
        p.grad = torch.full_like(p, 1.0) if rank == 0 else None
    n = _cp_plan.reduce_gradients(lin, comm, 30.0)
    assert n == 2 and all(torch.equal(p.grad, torch.ones_like(p)) for p in lin.parameters()), "None on one rank"
    print(f"OK rank {rank} none-on-one-rank", flush=True)
    # gradients cut across buckets of 7 elements, float64 (summed in float64) and bfloat16 (in float32):
    # the sums of rank-dependent small integers, exact in both
    for dtype in (torch.float64, torch.bfloat16):
        wide = torch.nn.Linear(3, 5).to(dtype)
        for i, p in enumerate(wide.parameters()):
            p.grad = torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape) * (rank + 1) + i
        bucket, _cp_plan._BUCKET = _cp_plan._BUCKET, 7
        try:
            _cp_plan.reduce_gradients(wide, comm, 30.0)
        finally:
            _cp_plan._BUCKET = bucket
        for i, p in enumerate(wide.parameters()):
            want = torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape) * (P * (P + 1) // 2) + P * i
            assert torch.equal(p.grad, want), f"bucketed {dtype} sum of {tuple(p.shape)}: {p.grad} vs {want}"
    print(f"OK rank {rank} buckets", flush=True)
    other = torch.nn.Linear(3, 2 + rank)  # a parameter's shape differs
    other.weight.grad = torch.ones_like(other.weight)
    try:
        _cp_plan.reduce_gradients(other, comm, 30.0)
    except ValueError as e:
        print(f"error [models differ] {e}", flush=True)
    else:
        raise AssertionError("ranks with different models reduced")


if __name__ == "__main__":
    try:
        torch.set_num_threads(1)
        for path in ("plan", "wan"):
            for per_token in (False, True):
                train(int(sys.argv[1]), int(sys.argv[2]), path, per_token)
        train(int(sys.argv[1]), int(sys.argv[2]), "wan", False, lora=True)
        regather(int(sys.argv[1]), int(sys.argv[2]))
        edge_cases()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        comm.Abort(1)
