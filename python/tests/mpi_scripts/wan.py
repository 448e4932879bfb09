"""Run under mpirun -np P with args U R (or "auto auto": grid="auto"): fxattn.diffusers.parallelize on a
tiny random WanTransformer3DModel (the same seeded weights and inputs on
every rank) against one process's forward with diffusers' default processor
(torch SDPA). Prints 'OK rank R err E tol T'; MPI_Abort on a mismatch.

Tolerance: both forwards are fp32 evaluations of the same function; they
differ only in self-attention (fxattn's fixed-max kernels, over R ring
blocks, vs SDPA's own summation order), by at most ~4 S eps max|v| per
attention (S = 9 tokens, eps = 2^-24, |v| = O(1) here: ~2e-6). The two
blocks' residual adds, LayerNorms and linear layers (random init, gains
O(1)) carry that to the output with a gain of a few units; measured ~1e-6.
rtol 1e-4 of max|ref| leaves a 10x margin over that worst case while a
wrong shard, a missing gather or a misplaced RoPE row gives O(max|ref|).
"""

import sys
import traceback

import torch
from mpi4py import MPI

try:
    from fxattn.diffusers import parallelize
except ImportError:  # diffusers.py not written yet
    from fxattn.integrations.diffusers.wan_parallel import parallelize
from diffusers import WanTransformer3DModel

comm = MPI.COMM_WORLD
rank, P = comm.Get_rank(), comm.Get_size()


def main(u, r):
    grid = dict(grid="auto") if u == "auto" else dict(ulysses=int(u), ring=int(r))
    torch.manual_seed(0)
    torch.set_num_threads(1)
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
    ).eval()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 4, 3, 2, 6, generator=g)  # 3 x 1 x 3 = 9 tokens: 9 % 2, 9 % 4 != 0
    ctx = torch.randn(1, 5, 16, generator=g)
    t = torch.tensor([500])
    with torch.no_grad():
        ref = model(x, t, ctx, return_dict=False)[0]
        handle = parallelize(model, comm, threads=1, **grid)
        out = model(x, t, ctx, return_dict=False)[0]
        out2 = model(x, t, ctx, return_dict=False)[0]  # cached plans, same bytes
        handle.remove()
        back = model(x, t, ctx, return_dict=False)[0]
    assert out.shape == ref.shape, (out.shape, ref.shape)
    err = float((out - ref).abs().max())
    tol = 1e-4 * float(ref.abs().max())
    assert err <= tol, f"U={u} R={r} rank {rank}: max |parallel - one process| {err:.3g} > {tol:.3g}"
    assert torch.equal(out, out2), "a second parallel forward gave other bytes"
    assert torch.equal(back, ref), "after remove() the model is not the original"
    # every rank returns the same whole output
    outs = comm.allgather(out.numpy())
    assert all((o == outs[0]).all() for o in outs), "ranks returned different outputs"
    # the attention really ran distributed: a rank's attn1 saw only its shard
    seen = []
    hook = model.blocks[0].attn1.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
    with parallelize(model, comm, threads=1, **grid), torch.no_grad():
        model(x, t, ctx, return_dict=False)
    hook.remove()
    from fxattn.mpi import rank as grid_rank
    from fxattn.mpi import shard

    assert seen == [shard(9, grid_rank(comm), P)[1]], f"attn1 saw {seen} tokens on rank {rank}"
    print(f"OK rank {rank} err {err:.3g} tol {tol:.3g}", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1], sys.argv[2])
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        comm.Abort(1)
