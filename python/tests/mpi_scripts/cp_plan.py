"""Run under mpirun -np P with args U R: fxattn.diffusers.parallelize, split
and gathered by the model's own `_cp_plan`, on tiny random Flux
(FluxTransformer2DModel: joint text + image attention, both streams split),
LTX-Video (LTXVideoTransformer3DModel: RoPE split at its output, the text
split too, so cross-attention runs distributed with Skv != Sq), Qwen-Image
(QwenImageTransformer2DModel: joint attention as Flux, RoPE split at
pos_embed's output) and Wan (WanTransformer3DModel through the plan path,
fxattn.integrations.diffusers.context_parallel), the same seeded weights and inputs on every rank. Prints
'OK rank R model M err E tol T bytes B'; MPI_Abort on a mismatch.

Reference: the same model and inputs in float64 on one process (torch SDPA
in float64). Tolerance: the parallel forward is an fp32 evaluation of the
same function; each op contributes O(eps_32 = 6e-8) relative error and the
attentions (fxattn's fixed-max kernels over R ring blocks) ~4 S eps max|v|
(S <= 13 tokens here); two to three blocks of residual adds, norms and
random-init linear layers (gains O(1)) carry that to the output: measured
<= ~5e-7 relative. rtol 1e-5 of max|ref64| leaves a 10x margin while a
wrong shard, a missing gather, a misplaced RoPE row or a local-only
attention gives O(max|ref|). The one-process fp32 forward (diffusers'
default processors) is held to the same bound, so the parallel one is as
close to the exact function as one process is.

bytes (reported, not asserted): whether the output equals, bit for bit,
the same plan run on one rank (MPI.COMM_SELF, 1 x 1: fxattn's attention on
the whole sequence). It does not in general, for Ulysses either: the
Ulysses attention is byte-equal, but torch's linear layers pick their
kernels by row count and can round a shard's rows differently from the
same rows of the whole sequence; the fp64 bound above is the check.
"""

import copy
import itertools
import sys
import traceback

import torch
from mpi4py import MPI

from fxattn.diffusers import parallelize
from fxattn.integrations.diffusers import context_parallel as _cp_plan
from fxattn.mpi import rank as grid_rank
from fxattn.mpi import shard

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()


def flux(text=4):
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=16,
        pooled_projection_dim=8,
        axes_dims_rope=(2, 2, 4),
    )
    g = torch.Generator().manual_seed(1)
    # 4 text tokens (divisible by 2 and 4: [text_r, image_r] stays shard()'s split), 9 image tokens (uneven)
    kw = dict(
        hidden_states=torch.randn(1, 9, 4, generator=g),
        encoder_hidden_states=torch.randn(1, text, 16, generator=g),
        pooled_projections=torch.randn(1, 8, generator=g),
        timestep=torch.tensor([0.5]),
        img_ids=torch.randn(9, 3, generator=g),
        txt_ids=torch.randn(text, 3, generator=g),
    )
    return model, kw, 9, "transformer_blocks.0.attn"


def qwen(text=4):
    from diffusers import QwenImageTransformer2DModel

    model = QwenImageTransformer2DModel(
        patch_size=1,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        joint_attention_dim=16,
        axes_dims_rope=(2, 2, 4),
    )
    g = torch.Generator().manual_seed(1)
    # [text_r, image_r] joint attention as Flux: 4 text tokens, 9 image tokens; RoPE split at pos_embed's output
    kw = dict(
        hidden_states=torch.randn(1, 9, 4, generator=g),
        encoder_hidden_states=torch.randn(1, text, 16, generator=g),
        timestep=torch.tensor([0.5]),
        img_shapes=[(1, 3, 3)],
    )
    return model, kw, 9, "transformer_blocks.0.attn"


def ltx():
    from diffusers import LTXVideoTransformer3DModel

    model = LTXVideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=4,
        attention_head_dim=8,
        cross_attention_dim=32,
        num_layers=2,
        caption_channels=16,
    )
    g = torch.Generator().manual_seed(1)
    kw = dict(
        hidden_states=torch.randn(1, 9, 4, generator=g),
        encoder_hidden_states=torch.randn(1, 5, 16, generator=g),
        timestep=torch.tensor([500]),
        encoder_attention_mask=None,
        num_frames=1,
        height=3,
        width=3,
    )
    return model, kw, 9, "transformer_blocks.0.attn1"


def wan():
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=4,
        attention_head_dim=12,
        in_channels=4,
        out_channels=4,
        text_dim=16,
        freq_dim=8,
        ffn_dim=32,
        num_layers=2,
        cross_attn_norm=True,
        qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32,
    )
    g = torch.Generator().manual_seed(1)
    kw = dict(
        hidden_states=torch.randn(1, 4, 3, 2, 6, generator=g),
        timestep=torch.tensor([500]),
        encoder_hidden_states=torch.randn(1, 5, 16, generator=g),
    )
    return model, kw, 9, "blocks.0.attn1"


def run(name, build, u, r):
    torch.manual_seed(0)
    model, kw, seq, attn_name = build()
    model = model.eval()
    kw["return_dict"] = False
    with torch.no_grad():
        ref64 = copy.deepcopy(model).double()(
            **{k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in kw.items()}
        )[0]
        one = model(**kw)[0]
        with _cp_plan.parallelize_plan(model, MPI.COMM_SELF, threads=1):
            one_fx = model(**kw)[0]
        seen = []  # the query tokens of each distributed attention call of block 0
        attn = model.get_submodule(attn_name)
        hook = attn.register_forward_pre_hook(lambda m, a, k: seen.append((a[0] if a else k["hidden_states"]).shape[1]), with_kwargs=True)
        par = parallelize if name != "wan" else _cp_plan.parallelize_plan
        handle = par(model, comm, ulysses=u, ring=r, threads=1)
        out = model(**kw)[0]
        out2 = model(**kw)[0]
        handle.remove()
        hook.remove()
        back = model(**kw)[0]
    assert out.shape == one.shape, (out.shape, one.shape)
    tol = 1e-5 * float(ref64.abs().max())
    err = float((out.double() - ref64).abs().max())
    err_one = float((one.double() - ref64).abs().max())
    assert err <= tol, f"{name} U={u} R={r} rank {rank}: max |parallel - fp64| {err:.3g} > {tol:.3g}"
    assert err_one <= tol, f"{name}: one process fp32 off fp64 by {err_one:.3g} > {tol:.3g}"
    assert torch.equal(out, out2), f"{name}: a second parallel forward gave other bytes"
    assert torch.equal(back, one), f"{name}: after remove() the model is not the original"
    outs = comm.allgather(out.numpy())
    assert all((o == outs[0]).all() for o in outs), f"{name}: ranks returned different outputs"
    # block 0's attention saw only this rank's shard of the (image or video) tokens
    want = shard(seq, grid_rank(comm), P)[1]
    assert seen[:1] == [want], f"{name}: block 0's attention saw {seen} tokens on rank {rank}, expected {want}"
    same = torch.equal(out, one_fx)
    print(f"OK rank {rank} model {name} err {err:.3g} tol {tol:.3g} bytes {int(same)}", flush=True)


def errors(u, r):
    """parallelize() refuses a model without a plan, a bad grid and heads not
    divisible by U when called, and a mask at the forward, with clear
    messages."""
    try:
        parallelize(torch.nn.Linear(2, 2), comm)
    except TypeError as e:
        print(f"error [no plan] {e}", flush=True)
    else:
        raise AssertionError("no error for a model without a plan")
    model, kw, _, _ = ltx()
    from diffusers import FluxTransformer2DModel

    three_heads = FluxTransformer2DModel(
        patch_size=1,
        in_channels=4,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=8,
        num_attention_heads=3,
        joint_attention_dim=16,
        pooled_projection_dim=8,
        axes_dims_rope=(2, 2, 4),
    )
    for what, call in (
        ("grid", lambda: parallelize(model, comm, ulysses=P, ring=2)),
        ("heads", lambda: parallelize(three_heads, comm, ulysses=2, ring=P // 2)),
        ("wan grid", lambda: parallelize(wan()[0], comm, ulysses=P, ring=2)),  # Wan's own path checks too
    ):
        try:
            call()
        except ValueError as e:
            print(f"error [{what}] {e}", flush=True)
        else:
            raise AssertionError(f"no error for {what}")
    mask = torch.ones(1, 5)
    with torch.no_grad(), parallelize(model.eval(), comm, ulysses=u, ring=r, threads=1):
        try:
            model(**dict(kw, encoder_attention_mask=mask, return_dict=False))
        except NotImplementedError as e:
            print(f"error [mask] {e}", flush=True)
        else:
            raise AssertionError("a mask under parallelism ran")
    # joint attention: 5 text and 9 image tokens (neither divisible by P = 2 or 4), 1 text token (empty shards):
    # ValueError on every rank before the forward, naming the text length and the rank count
    for (what, text), (name, build) in itertools.product((("text length", 5), ("empty shard", 1)), (("flux", flux), ("qwen", qwen))):
        joint, joint_kw, _, _ = build(text)
        with torch.no_grad(), parallelize(joint.eval(), comm, ulysses=u, ring=r, threads=1):
            try:
                joint(**dict(joint_kw, return_dict=False))
            except ValueError as e:
                print(f"error [{what}] {name} rank {rank} {e}", flush=True)
            else:
                raise AssertionError(f"no error for {name} {what}")
    with parallelize(model, comm, ulysses=u, ring=r, threads=1):
        try:
            parallelize(model, comm, ulysses=u, ring=r)
        except ValueError as e:
            print(f"error [twice] {e}", flush=True)
        else:
            raise AssertionError("a model parallelized twice")


def main(u, r):
    torch.set_num_threads(1)
    for name, build in (("flux", flux), ("qwen", qwen), ("ltx", ltx), ("wan", wan)):
        run(name, build, u, r)
    errors(u, r)


if __name__ == "__main__":
    try:
        main(int(sys.argv[1]), int(sys.argv[2]))
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        comm.Abort(1)
