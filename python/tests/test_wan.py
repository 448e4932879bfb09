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

The bf16 layer (dtype="bf16") rounds six things to bf16 (unit roundoff
u = 2^-9, |rounded - v| <= u |v|): x, Q, K and V (after the fp32
epilogue), the probabilities P for P.V and the attention output A; every
product is exact and every sum fp32 (docs/numerics.md, "The bf16 layer").
Against an fp64 reference on the layer's own (bf16) weights and the
unrounded x, to first order: x and A move y by ~u of its scale each (at
most u sum |x||w|: random signs make it ~u, not n u); V by u max|v|; P by
at most 2^-7 max|v| (4u), typically ~u; Q and K move a score tau q.k by at
most 2u tau |q||k| and typically u tau (sum q_i^2 k_i^2)^(1/2) ~ u g^2 for
RMS-normalised rows with gains g, which moves the softmax weights by about
as much. Summed, a few u typically, growing with g^2 (the runs here see
4.5e-3-5.6e-3 = 2.3-2.9 u with gains ~1, up to 1.1e-2 = 5.5 u with gains
~3), and 2^-7 (4 u) in the worst aligned case of the attention terms
alone; TOL_BF16 = 2^-5 max|y| (16 u, the C tests' cap for the bf16 layer)
leaves 3x over the largest measured error, while the fp32 layer's error
(5e-7) is far below BF16_FLOOR = 2^-12: the dtype really took effect.
Independently of that bound, the bf16 layer must err no more than
diffusers' own WanAttention run in bf16 on the same bf16 inputs and
weights (test_bf16_no_less_accurate_than_diffusers_bf16).
"""

import ctypes
import json
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
from fxattn._capi import loader
from fxattn._capi import wan as W

TOL = 2.0**-13
TOL_BF16 = 2.0**-5
BF16_FLOOR = 2.0**-12
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
    lib = loader.library_dir()
    for p in (lib.parent / "bin" / "fxattn", lib.parent / "fxattn"):
        if p.is_file():
            return p
    raise AssertionError(f"no fxattn CLI beside {lib}; set FXATTN_CLI")


def synth_x():
    return fw.synth(SEED, S * HIDDEN).reshape(S, HIDDEN)


def rel_err(y, ref):
    y, ref = (np.asarray(t, np.float64) for t in (y, ref))
    return np.max(np.abs(y - ref)) / np.max(np.abs(ref))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_synthetic_gives_the_cli_bytes(tmp_path, dtype):
    layer = fw.WanSelfAttention.synthetic(HIDDEN, HEADS, seed=SEED, threads=2, dtype=dtype)
    assert layer.dtype == dtype
    x = synth_x()
    y = layer(x, GRID)
    out = tmp_path / "y.npy"
    cmd = [str(cli()), "layer", "--grid", ",".join(map(str, GRID)), "--heads", str(HEADS), "--dim", str(DIM)]
    cmd += ["--seed", str(SEED), "--threads", "2", "-o", str(out), "--stats"] + (["--dtype", "bf16"] if dtype == "bf16" else [])
    run = subprocess.run(cmd, check=True, capture_output=True, text=True)
    y_cli = np.load(out)
    assert y_cli.dtype == np.float32 and y_cli.size == y.size
    assert y_cli.reshape(y.shape).tobytes() == y.tobytes()
    assert layer.last_stats.rows == HEADS * S
    assert layer.last_stats.fallback_rows >= 0
    # The same choices as the CLI's run: the attention's compute and each projection's GEMM.
    cli_stats = json.loads(run.stdout.strip().splitlines()[-1])
    assert layer.last_stats.compute == cli_stats["attention_compute"]
    assert layer.last_stats.qkv_gemm == cli_stats["qkv_gemm"] != ""
    assert layer.last_stats.out_gemm == cli_stats["out_gemm"] != ""
    assert layer.flops(GRID) == pytest.approx(8 * S * HIDDEN**2 + 4 * S * S * HIDDEN, rel=1e-12)


def _array(ptr, *shape, fmt=W.PROJ_W_F32):
    """fp64 copy of C memory: fp32 values or (fmt PROJ_W_BF16) bf16 bits."""
    if fmt == W.PROJ_W_BF16:
        bits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint16)), shape)
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert fmt == W.PROJ_W_F32
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape).astype(np.float64)


def weight_bytes(layer):
    """The bytes of every weight, bias and gain the layer holds."""
    w, h = layer._w, layer.hidden
    item = {W.PROJ_W_F32: ctypes.c_float, W.PROJ_W_BF16: ctypes.c_uint16}
    out = []
    for lin, rows in ((w.qkv, 3 * h), (w.o, h)):
        out.append(ctypes.string_at(lin.w, rows * h * ctypes.sizeof(item[lin.format])))
        out.append(ctypes.string_at(lin.bias, rows * 4))
    out += [ctypes.string_at(g, h * 4) for g in (w.gamma_q, w.gamma_k)]
    return out


def reference(layer, x, grid):
    """fp64 numpy of the layer from the weights it holds (rotate-half order;
    fp32 or bf16 weights)."""
    w = layer._w
    h, nh, d = layer.hidden, layer.heads, layer.head_dim
    qkv = _array(w.qkv.w, 3 * h, h, fmt=w.qkv.format)
    qkv_b = _array(w.qkv.bias, 3 * h)
    o, o_b = _array(w.o.w, h, h, fmt=w.o.format), _array(w.o.bias, h)
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
    raw = fw.WanSelfAttention.from_tensors(
        *((m.weight, m.bias) for m in lin), attn.norm_q.weight, attn.norm_k.weight, HEADS, rope_half=True
    )
    assert rel_err(raw(x, GRID), ref) > 1e-3


def write_checkpoint(path, attn, block=0):
    """attn's tensors under diffusers' names of block `block`, in attn's dtype."""
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


# ---- the bf16 layer ---------------------------------------------------------


def round_bf16(a):
    """fp32 -> bf16 bits, round to nearest even (finite values)."""
    b = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def test_bf16_layer_matches_fp64_reference():
    l32 = fw.WanSelfAttention.synthetic(HIDDEN, HEADS, seed=SEED, threads=2)
    lb = fw.WanSelfAttention.synthetic(HIDDEN, HEADS, seed=SEED, threads=2, dtype="bf16")
    assert (lb.dtype, l32.dtype) == ("bf16", "fp32")
    assert lb._w.qkv.format == lb._w.o.format == W.PROJ_W_BF16
    # The loader's bf16 weights are its fp32 ones rounded once; biases and gains stay fp32.
    wb, w32 = weight_bytes(lb), weight_bytes(l32)
    for i in (0, 2):
        assert wb[i] == round_bf16(np.frombuffer(w32[i], np.float32)).tobytes()
    assert wb[1::2] == w32[1::2] and wb[4:] == w32[4:]
    x = synth_x()
    y = lb(x, GRID)
    assert isinstance(y, np.ndarray) and y.dtype == np.float32 and y.shape == x.shape
    assert BF16_FLOOR < rel_err(y, reference(lb, x, GRID)) < TOL_BF16
    assert rel_err(l32(x, GRID), reference(l32, x, GRID)) < TOL
    # The caller's bf16 x (torch, or numpy through ml_dtypes) gives the bytes of
    # the layer's own rounding of x; y comes back in x's dtype, rounded once.
    yt = lb(torch.from_numpy(x).bfloat16()[None], GRID)
    assert yt.dtype == torch.bfloat16 and yt.shape == (1, S, HIDDEN)
    assert yt[0].view(torch.int16).numpy().tobytes() == round_bf16(y).tobytes()
    ml_dtypes = pytest.importorskip("ml_dtypes")
    yn = lb(x.astype(ml_dtypes.bfloat16), GRID)
    assert yn.dtype == ml_dtypes.bfloat16 and yn.view(np.uint16).tobytes() == round_bf16(y).tobytes()
    # A bf16 x on the fp32 layer is widened exactly: the fp32 layer's y of
    # the widened x, rounded once to bf16.
    xb = torch.from_numpy(x).bfloat16()
    y32 = l32(xb, GRID)
    assert y32.dtype == torch.bfloat16
    assert torch.equal(y32.view(torch.int16), l32(xb.float(), GRID).bfloat16().view(torch.int16))


def bf16_error_cases():
    """(heads, head_dim, grid, norm gain, seed): Wan-like shapes (head_dim 16 to
    64, S 36 to 256), gains 1 to 3 (sharper softmax, larger scores: Q/K
    rounding weighs more), 3 seeds each."""
    shapes = [
        (4, 32, (2, 3, 6), 1.0),
        (2, 64, (3, 4, 5), 1.0),
        (8, 16, (2, 8, 8), 1.0),
        (4, 32, (2, 4, 8), 2.0),
        (4, 64, (4, 8, 8), 1.0),
        (4, 32, (2, 3, 6), 3.0),
    ]
    return [(*shape, seed) for shape in shapes for seed in range(3)]


def errors(y, ref):
    """(max|y - ref| / max|ref|, rms(y - ref) / rms(ref)) in fp64."""
    y, ref = (torch.as_tensor(t).double() for t in (y, ref))
    dy = y - ref
    return (dy.abs().max() / ref.abs().max()).item(), (dy.pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()


def test_bf16_no_less_accurate_than_diffusers_bf16():
    """Both run the same bf16 module (weights) on the same bf16 x; the
    reference is diffusers' WanAttention in fp64 on those bf16 values, with
    fp64 RoPE tables. diffusers in bf16 rounds after every op (projections,
    norms, RoPE, SDPA's output) with fp32 RoPE tables, as
    from_pretrained(torch_dtype=torch.bfloat16) keeps its rope module. Per
    case the bf16 layer's RMS error must not exceed diffusers' (measured
    0.68-0.94x), its max-norm error not exceed diffusers' by more than a
    quarter (one element's extreme, noisier: measured 0.53-1.03x), and over
    all cases the mean max-norm error must not exceed diffusers' mean
    (measured 0.76x)."""
    ours, theirs = [], []
    for heads, d, grid, gain, seed in bf16_error_cases():
        attn = diffusers_attention(seed, heads * d, heads)
        with torch.no_grad():
            attn.norm_q.weight.add_(gain - 1.0)
            attn.norm_k.weight.add_(gain - 1.0)
        s = grid[0] * grid[1] * grid[2]
        x = torch.randn(s, heads * d, generator=torch.Generator().manual_seed(100 + seed)).bfloat16()
        emb64 = WanRotaryPosEmbed(d, (1, 1, 1), 32)(torch.empty(1, 1, *grid))
        attn = attn.to(torch.bfloat16)
        layer = fw.WanSelfAttention.from_module(attn, threads=2, dtype="bf16")
        y_fx = layer(x, grid)
        assert y_fx.dtype == torch.bfloat16
        with torch.no_grad():
            y_diffusers = attn(x[None], None, None, tuple(t.float() for t in emb64))[0]
            y64 = attn.double()(x[None].double(), None, None, emb64)[0]
        e_fx, e_d = errors(y_fx, y64), errors(y_diffusers, y64)
        case = f"heads {heads} x {d}, grid {grid}, gain {gain}, seed {seed}: fxattn {e_fx}, diffusers {e_d}"
        assert e_fx[0] < TOL_BF16, case
        assert e_fx[1] <= e_d[1], case
        assert e_fx[0] <= 1.25 * e_d[0], case
        ours.append(e_fx[0])
        theirs.append(e_d[0])
    assert np.mean(ours) <= np.mean(theirs), (ours, theirs)


def test_bf16_weights_load_the_same_bits(tmp_path):
    attn = diffusers_attention(seed=1)
    x = torch.randn(S, HIDDEN, generator=torch.Generator().manual_seed(5))
    ref = fw.WanSelfAttention.from_module(attn, threads=2, dtype="bf16")
    assert ref.dtype == "bf16" and ref._w.qkv.format == W.PROJ_W_BF16
    y = ref(x, GRID)
    # An F32 checkpoint with dtype bf16: rounded once, as torch rounds the module.
    p32 = tmp_path / "f32" / "wan.safetensors"
    p32.parent.mkdir()
    write_checkpoint(p32, attn, block=1)
    loaded = fw.WanSelfAttention.load(p32, block=1, heads=HEADS, threads=2, dtype="bf16")
    assert weight_bytes(loaded) == weight_bytes(ref)
    assert loaded(x, GRID).numpy().tobytes() == y.numpy().tobytes()
    # A BF16 module and checkpoint: the bits as they are, the same layer. Its
    # weights are the fp32 ones rounded by torch: the bits above (its biases
    # and gains, rounded to bf16 too, differ).
    ab = diffusers_attention(seed=1).to(torch.bfloat16)
    pb = tmp_path / "bf16" / "wan.safetensors"
    pb.parent.mkdir()
    write_checkpoint(pb, ab, block=1)
    ref_b = fw.WanSelfAttention.from_module(ab, threads=2, dtype="bf16")
    assert weight_bytes(ref_b)[0::2][:2] == weight_bytes(ref)[0::2][:2]
    y_b = ref_b(x, GRID)
    for layer in (
        fw.WanSelfAttention.load(pb, block=1, heads=HEADS, threads=2, dtype="bf16"),
        fw.WanSelfAttention.load(pb.parent, block=1, heads=HEADS, threads=2, dtype=torch.bfloat16),
    ):
        assert layer.dtype == "bf16"
        assert weight_bytes(layer) == weight_bytes(ref_b)
        assert layer(x, GRID).numpy().tobytes() == y_b.numpy().tobytes()
    # The BF16 checkpoint in fp32 is widened exactly: the fp32 layer of the bf16 module.
    wide = fw.WanSelfAttention.load(pb, block=1, heads=HEADS, threads=2)
    assert wide.dtype == "fp32"
    assert weight_bytes(wide) == weight_bytes(fw.WanSelfAttention.from_module(ab, threads=2))
    # from_tensors on bf16 tensors (already rotate-half) keeps their bits: the
    # synthetic bf16 layer rebuilt from its own weights gives its bytes.
    syn = fw.WanSelfAttention.synthetic(HIDDEN, HEADS, seed=SEED, threads=2, dtype="bf16")
    w = syn._w

    def bf16_tensor(ptr, *shape):
        bits = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_uint16)), shape).copy()
        return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)

    def f32(ptr, n):
        return torch.from_numpy(np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), (n,)).copy())

    qkv, qkv_b = bf16_tensor(w.qkv.w, 3 * HIDDEN, HIDDEN), f32(w.qkv.bias, 3 * HIDDEN)
    pairs = [(qkv[i * HIDDEN : (i + 1) * HIDDEN], qkv_b[i * HIDDEN : (i + 1) * HIDDEN]) for i in range(3)]
    pairs.append((bf16_tensor(w.o.w, HIDDEN, HIDDEN), f32(w.o.bias, HIDDEN)))
    rebuilt = fw.WanSelfAttention.from_tensors(
        *pairs, f32(w.gamma_q, HIDDEN), f32(w.gamma_k, HIDDEN), HEADS, rope_half=True, threads=2, dtype="bf16"
    )
    assert weight_bytes(rebuilt) == weight_bytes(syn)
    xs = synth_x()
    assert rebuilt(xs, GRID).tobytes() == syn(xs, GRID).tobytes()


def test_bad_dtype_raises(tmp_path):
    attn = diffusers_attention()
    path = tmp_path / "wan.safetensors"
    write_checkpoint(path, attn)
    lin = (attn.to_q, attn.to_k, attn.to_v, attn.to_out[0])
    tensors = [(m.weight, m.bias) for m in lin]
    message = r"dtype must be 'fp32' or 'bf16'"
    for make in (
        lambda: fw.WanSelfAttention.synthetic(HIDDEN, HEADS, dtype="fp16"),
        lambda: fw.WanSelfAttention.load(path, heads=HEADS, dtype="float16"),
        lambda: fw.WanSelfAttention.from_tensors(*tensors, attn.norm_q.weight, attn.norm_k.weight, HEADS, dtype=torch.float16),
        lambda: fw.WanSelfAttention.from_module(attn, dtype="bf8"),
        lambda: fw.WanSelfAttention.from_module(attn, dtype=None),
    ):
        with pytest.raises(ValueError, match=message):
            make()
    layer = fw.WanSelfAttention.from_module(attn, threads=2, dtype="bf16")
    with pytest.raises(ValueError, match=r"torch.float32 or torch.bfloat16"):
        layer(torch.randn(S, HIDDEN).half(), GRID)
    with pytest.raises(ValueError, match=r"float64; the layer takes float32 or bfloat16"):
        layer(np.zeros((S, HIDDEN)), GRID)
    # A bf16 weight holding a NaN is refused before any copy reaches the library.
    bad = attn.to_q.weight.detach().bfloat16().clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="q.weight holds a NaN"):
        fw.WanSelfAttention.from_tensors((bad, attn.to_q.bias), *tensors[1:], attn.norm_q.weight, attn.norm_k.weight, HEADS, dtype="bf16")
