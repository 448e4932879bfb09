"""fxattn.wan: the Wan2.2 layer of libfxattn_wan through the binding.

Synthetic weights give exactly the bytes of the CLI's `fxattn layer` on the
same seed (the CLI is a thin caller of the same library, so any difference
is a binding bug: a struct field, a pointer, a grid). The layer also meets
an fp64 numpy reference, and diffusers' own WanAttention computation on the
same weights (checkpoint load and from_module), within fp32 rounding.

Tolerances. Every stage is fp32 with fp32 (or double, in the RMS) sums of
at most `hidden` (<= 128 here) or S (36) products; such sums are exact to a
few ulps of their largest term times a slowly growing factor, and the
stages chain 4 of them (QKV, RMSNorm+RoPE, attention, output projection),
so the layer's output is within ~1e-6 of max|y| (the runs here see
< 5e-7). TOL = 2^-13 max|y| (1.2e-4) leaves a 100x margin, while a wrong
permutation, RoPE band, norm gain or bias gives errors of order max|y|.
"""

import ctypes
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from diffusers.models.transformers.transformer_wan import WanAttention, WanAttnProcessor, WanRotaryPosEmbed
from safetensors.torch import save_file

import fxattn
import fxattn.wan as fw
from fxattn import _lib

TOL = 2.0**-13
GRID = (2, 3, 6)
HEADS, DIM = 4, 32
HIDDEN = HEADS * DIM
S = 36
SEED = 3


def cli() -> Path:
    """The fxattn CLI next to the libraries: the wheel's fxattn/bin/fxattn,
    a build tree's fxattn beside lib/, or $FXATTN_CLI."""
    if os.environ.get("FXATTN_CLI"):
        return Path(os.environ["FXATTN_CLI"])
    lib = _lib._lib_dir()
    for p in (lib.parent / "bin" / "fxattn", lib.parent / "fxattn"):
        if p.is_file():
            return p
    raise AssertionError(f"no fxattn CLI beside {lib}; set FXATTN_CLI")


def synth_x():
    return fw.synth(SEED, S * HIDDEN).reshape(S, HIDDEN)


def rel_err(y, ref):
    y, ref = (np.asarray(t, np.float64) for t in (y, ref))
    return np.max(np.abs(y - ref)) / np.max(np.abs(ref))


def test_synthetic_gives_the_cli_bytes(tmp_path):
    layer = fw.WanSelfAttention.synthetic(HIDDEN, HEADS, seed=SEED, threads=2)
    x = synth_x()
    y = layer(x, GRID)
    out = tmp_path / "y.npy"
    cmd = [str(cli()), "layer", "--grid", ",".join(map(str, GRID)), "--heads", str(HEADS), "--dim", str(DIM)]
    cmd += ["--seed", str(SEED), "--threads", "2", "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    y_cli = np.load(out)
    assert y_cli.dtype == np.float32 and y_cli.size == y.size
    assert y_cli.reshape(y.shape).tobytes() == y.tobytes()
    assert layer.last_stats.rows == HEADS * S
    assert layer.last_stats.fallback_rows >= 0
    assert layer.flops(GRID) == pytest.approx(8 * S * HIDDEN**2 + 4 * S * S * HIDDEN, rel=1e-12)


def _array(ptr, *shape):
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape).astype(np.float64)


def reference(layer, x, grid):
    """fp64 numpy of the layer from the weights it holds (rotate-half order)."""
    w = layer._w
    h, nh, d = layer.hidden, layer.heads, layer.head_dim
    qkv = _array(w.qkv.w, 3 * h, h)
    qkv_b = _array(w.qkv.bias, 3 * h)
    o, o_b = _array(w.o.w, h, h), _array(w.o.bias, h)
    gq, gk = _array(w.gamma_q, h), _array(w.gamma_k, h)
    x = np.asarray(x, np.float64)
    y = x @ qkv.T + qkv_b
    q, k, v = y[:, :h], y[:, h : 2 * h], y[:, 2 * h :]
    q = q / np.sqrt(np.mean(q * q, axis=1, keepdims=True) + 1e-6) * gq
    k = k / np.sqrt(np.mean(k * k, axis=1, keepdims=True) + 1e-6) * gk
    cs, sn = (t.astype(np.float64) for t in fw.rope_tables(grid, d))

    def rope(t):
        t = t.reshape(-1, nh, d)
        rot = np.concatenate([-t[..., d // 2 :], t[..., : d // 2]], axis=-1)
        return t * cs[:, None, :] + rot * sn[:, None, :]

    q, k, v = rope(q), rope(k), v.reshape(-1, nh, d)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    a = np.einsum("hqk,khd->qhd", p, v).reshape(-1, h)
    return a @ o.T + o_b


def test_synthetic_matches_fp64_reference_torch_and_3d():
    layer = fw.WanSelfAttention.synthetic(HIDDEN, HEADS, seed=SEED, threads=2)
    x = synth_x()
    ref = reference(layer, x, GRID)
    y = layer(x, GRID)
    assert rel_err(y, ref) < TOL
    # A torch [1, S, hidden] tensor gives a torch tensor of its shape, same bits.
    yt = layer(torch.from_numpy(x)[None], GRID)
    assert isinstance(yt, torch.Tensor) and yt.shape == (1, S, HIDDEN) and yt.dtype == torch.float32
    assert yt[0].numpy().tobytes() == y.tobytes()
    # Another grid of the same S is another plan (another RoPE): other values.
    y2 = layer(x, (1, 6, 6))
    assert rel_err(y2, reference(layer, x, (1, 6, 6))) < TOL
    assert rel_err(y2, ref) > 1e-3
    assert len(layer._plans) == 2


def diffusers_attention(seed=0, dim=HIDDEN, heads=HEADS):
    """A random diffusers WanAttention (self-attention, eps 1e-6), with
    non-trivial biases and gains."""
    torch.manual_seed(seed)
    attn = WanAttention(dim=dim, heads=heads, dim_head=dim // heads, eps=1e-6, processor=WanAttnProcessor()).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn_like(p) * (1.0 / dim**0.5 if p.dim() == 2 else 0.3))
        attn.norm_q.weight.add_(1.0)
        attn.norm_k.weight.add_(1.0)
    return attn


def diffusers_reference(attn, x, grid):
    rope = WanRotaryPosEmbed(attn.inner_dim // attn.heads, (1, 1, 1), 32)
    rotary_emb = rope(torch.empty(1, 1, *grid))
    with torch.no_grad():
        return attn(x[None], None, None, rotary_emb)[0]


def test_from_module_matches_diffusers():
    attn = diffusers_attention()
    x = torch.randn(S, HIDDEN)
    ref = diffusers_reference(attn, x, GRID)
    layer = fw.WanSelfAttention.from_module(attn, threads=2)
    assert (layer.hidden, layer.heads, layer.head_dim, layer.fp8) == (HIDDEN, HEADS, DIM, False)
    assert rel_err(layer(x, GRID), ref) < TOL
    # Without the RoPE permutation the layer computes something else.
    lin = (attn.to_q, attn.to_k, attn.to_v, attn.to_out[0])
    raw = fw.WanSelfAttention.from_tensors(*((m.weight, m.bias) for m in lin), attn.norm_q.weight, attn.norm_k.weight, HEADS, rope_half=True)
    assert rel_err(raw(x, GRID), ref) > 1e-3


def write_checkpoint(path, attn, block=0):
    """attn's tensors under diffusers' names of block `block`, fp32."""
    names = {"to_q": attn.to_q, "to_k": attn.to_k, "to_v": attn.to_v, "to_out.0": attn.to_out[0]}
    tensors = {}
    for name, m in names.items():
        tensors[f"blocks.{block}.attn1.{name}.weight"] = m.weight.detach().contiguous()
        tensors[f"blocks.{block}.attn1.{name}.bias"] = m.bias.detach().contiguous()
    tensors[f"blocks.{block}.attn1.norm_q.weight"] = attn.norm_q.weight.detach().contiguous()
    tensors[f"blocks.{block}.attn1.norm_k.weight"] = attn.norm_k.weight.detach().contiguous()
    save_file(tensors, str(path))


def test_checkpoint_loads_and_runs(tmp_path):
    attn = diffusers_attention(seed=1)
    path = tmp_path / "wan.safetensors"
    write_checkpoint(path, attn, block=2)
    layer = fw.WanSelfAttention.load(path, block=2, heads=HEADS, threads=2)
    assert (layer.hidden, layer.heads, layer.head_dim) == (HIDDEN, HEADS, DIM)
    x = torch.randn(S, HIDDEN)
    y = layer(x, GRID)
    assert rel_err(y, diffusers_reference(attn, x, GRID)) < TOL
    # The C loader's permutation is from_module's: the same weights, the same bits.
    assert fw.WanSelfAttention.from_module(attn, threads=2)(x, GRID).numpy().tobytes() == y.numpy().tobytes()
    # The folder holding it loads too; FP8 weights run, within E4M3's error (2^-4
    # relative per weight, averaged over hidden products: well below 10%).
    y_dir = fw.WanSelfAttention.load(tmp_path, block=2, heads=HEADS, threads=2)(x, GRID)
    assert y_dir.numpy().tobytes() == y.numpy().tobytes()
    fp8 = fw.WanSelfAttention.load(path, block=2, heads=HEADS, fp8=True, threads=2)
    assert fp8.fp8
    assert 0 < rel_err(fp8(x, GRID), y) < 0.1


def test_errors_carry_the_library_message(tmp_path):
    missing = tmp_path / "missing.safetensors"
    with pytest.raises(fxattn.FxattnIOError, match="missing.safetensors"):
        fw.WanSelfAttention.load(missing, heads=HEADS)
    attn = diffusers_attention()
    path = tmp_path / "wan.safetensors"
    write_checkpoint(path, attn)
    with pytest.raises(fxattn.InvalidArgumentError, match="heads do not divide the hidden size"):
        fw.WanSelfAttention.load(path, heads=3)
    with pytest.raises(fxattn.InvalidArgumentError, match=r"blocks\.7"):
        fw.WanSelfAttention.load(path, block=7, heads=HEADS)
    layer = fw.WanSelfAttention.load(path, heads=HEADS, threads=2)
    x = synth_x()
    with pytest.raises(fxattn.InvalidArgumentError, match=r"x has shape \[35, 128\]"):
        layer(x[:35], GRID)
    with pytest.raises(fxattn.InvalidArgumentError, match="float32"):
        layer(x.astype(np.float64), GRID)
    with pytest.raises(fxattn.InvalidArgumentError, match="grid"):
        layer(np.zeros((0, HIDDEN), np.float32), (0, 3, 6))
    bad = x.copy()
    bad[3, 4] = np.nan
    with pytest.raises(fxattn.InvalidArgumentError, match="non-finite value at token 3, feature 4"):
        layer(bad, GRID)
    # The failed run left the layer usable.
    assert np.all(np.isfinite(layer(x, GRID)))
