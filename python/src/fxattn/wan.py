"""fxattn.wan: the Wan2.2 self-attention layer of libfxattn_wan (fxattn_wan.h).

    layer = fxattn.wan.WanSelfAttention.load("Wan2.2-T2V-A14B/high_noise_model", block=0, heads=40)
    y = layer(x, (frames, height, width))      # x [S, 5120] fp32, S = F H W
    bf16 = fxattn.wan.WanSelfAttention.load(path, heads=40, dtype="bf16")   # the bf16 layer

One call runs, in C, the fused QKV projection + bias, RMSNorm across heads
(eps FXA_WAN_EPS = 1e-6), Wan's 3-D RoPE (rotate-half, theta 1e4),
fixed-max attention and the output projection + bias. Weights come from a
checkpoint (fxa_wan_weights_load: a .safetensors file, a sharded index or a
folder, Wan2.2 or diffusers names), from the loader's synthetic generator,
or from tensors / a diffusers WanAttention (copies owned by the object,
Q/K rows permuted from interleaved RoPE pairs to rotate-half as the C
loader does). Plans are cached per latent grid and x dtype; the workspace
is the context's 64-byte aligned numpy buffer. Errors raise
fxattn.FxattnError subclasses with the library's message.

dtype (every constructor; default "fp32"): "fp32" keeps fp32 weights and
runs every stage in fp32 (fxa_wan_desc.dtype FXA_F32). "bf16" keeps the
weights as bf16 bits (FXA_PROJ_W_BF16: bf16 tensors as they are, fp32 ones
rounded once to nearest even; biases and gains fp32) and runs the bf16
layer (FXA_BF16): an fp32 x rounded once to bf16, Q, K, V rounded to bf16
after the fused bias/RMSNorm/RoPE epilogue, attention in bf16 (vdpbf16ps
where the CPU has AVX512-BF16) writing bf16, the output projection on that
with fp32 accumulation; y fp32 (docs/numerics.md, "The bf16 layer").
"""

from __future__ import annotations

import ctypes
import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from . import _capi
from ._capi import wan as W
from ._common import arrays, validate
from ._common.context import context

__all__ = ["WanSelfAttention", "WanLayerStats", "rope_tables", "synth"]

_ERRLEN = 1024
_PLAN_CACHE = 8
_DTYPES = {"fp32": W.F32, "f32": W.F32, "float32": W.F32, "bf16": W.BF16, "bfloat16": W.BF16}
_DTYPE_NAMES = {W.F32: "fp32", W.BF16: "bf16"}


def _bad(message: str):
    return _capi.InvalidArgumentError(message, _capi.INVALID_ARG)


def _dtype_code(dtype) -> int:
    """FXA_F32 or FXA_BF16 of a layer dtype: "fp32" / "bf16" (also "f32",
    "float32", "bfloat16"), torch.float32 / torch.bfloat16 or a numpy
    float32 / bfloat16 dtype. Anything else raises InvalidArgumentError (a
    ValueError)."""
    name = dtype
    torch = arrays.torch_module()
    if torch is not None and isinstance(dtype, torch.dtype):
        name = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(dtype)
    elif not isinstance(dtype, str):
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = None
    code = _DTYPES.get(name) if isinstance(name, str) else None
    if code is None:
        raise _bad(f"dtype must be 'fp32' or 'bf16' (or torch.float32 / torch.bfloat16), not {dtype!r}")
    return code


@dataclass(frozen=True)
class WanLayerStats:
    """fxa_wan_stats of one run: seconds per stage, attention rows
    (heads * S), the rows computed by online softmax, the attention's
    compute ("fp32" or "bf16") and the GEMM each projection ran on
    ("openblas", "onednn_f32", "onednn_bf16" or "amx")."""

    qkv_seconds: float
    attention_seconds: float
    out_seconds: float
    rows: int
    fallback_rows: int
    compute: str = "fp32"
    qkv_gemm: str = ""
    out_gemm: str = ""

    @classmethod
    def _of(cls, s: W.WanStats) -> "WanLayerStats":
        def gemm(g: int) -> str:
            return W.proj.fxa_proj_gemm_name(g).decode()

        compute = "bf16" if s.compute == _capi.COMPUTE_BF16 else "fp32"
        return cls(s.qkv_seconds, s.attention_seconds, s.out_seconds, s.rows, s.fallback_rows, compute, gemm(s.qkv_gemm), gemm(s.out_gemm))


def synth(seed: int, count: int, stream: int = W.SYNTH_X) -> np.ndarray:
    """Values 0..count-1 of the loader's generator stream (fxa_wan_synth;
    stream 0 is the CLI's synthetic x, element token * hidden + channel), fp32."""
    seed = validate.integer("seed", seed, 0, validate.UINT64_MAX)
    stream = validate.integer("stream", stream, 0, validate.UINT64_MAX)
    count = validate.integer("count", count, 0, validate.INT64_MAX)
    f = W.wan.fxa_wan_synth
    return np.fromiter((f(seed, stream, i) for i in range(count)), np.float32, count)


def rope_tables(grid, head_dim: int):
    """Wan's rotate-half RoPE tables of grid (frames, height, width): cos, sin
    [S, head_dim] fp32 numpy arrays (fxa_wan_rope_tables, theta 1e4)."""
    f, h, w = validate.grid("grid", grid)
    head_dim = validate.integer("head_dim", head_dim, 1, validate.INT64_MAX)
    if f * h * w * head_dim > validate.INT64_MAX // 4:
        raise _bad(f"RoPE tables of grid {f} x {h} x {w} and head_dim {head_dim} exceed the addressable size")
    cs = np.empty((f * h * w, head_dim), np.float32)
    sn = np.empty_like(cs)
    st = W.proj.fxa_wan_rope_tables(f, h, w, head_dim, W.ROPE_THETA, cs.ctypes.data, sn.ctypes.data)
    _capi.raise_status(st, f"no Wan RoPE tables for grid {f} x {h} x {w} and head_dim {head_dim}")
    return cs, sn


def _rotate_half_rows(heads: int, head_dim: int) -> np.ndarray:
    """Row order of the rotate-half layout: lane i of each head takes the
    interleaved lane 2i (i < d/2) or 2(i - d/2) + 1 (fxa_rope_interleaved_to_half)."""
    lanes = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    return (np.arange(heads)[:, None] * head_dim + lanes[None, :]).reshape(-1)


def _torch_cpu(t, name: str):
    """A weight tensor's values on the CPU; a meta tensor (no values, as
    made under accelerate's init_empty_weights) is refused."""
    if t.device.type == "meta":
        raise _bad(f"{name} is on the meta device: it has no values to copy")
    return arrays.torch_values(t.detach(), name).to("cpu")


def _f32(t, name: str, copy: bool = True) -> np.ndarray:
    """A torch tensor or array of real numbers as a contiguous fp32 numpy
    copy (copy=False: an fp32 input's own memory when it is contiguous)."""
    if arrays.is_torch(t):
        if t.is_complex() or t.dtype == arrays.torch_module().bool:
            raise _bad(f"{name} has dtype {t.dtype}; it must hold real numbers (a float or integer dtype)")
        t = _torch_cpu(t, name).float().numpy()
    t = arrays.native_array(t, name)
    validate.real_array_dtype(name, t.dtype)
    with np.errstate(over="ignore"):
        a = np.array(t, dtype=np.float32, order="C") if copy else np.asarray(t, dtype=np.float32, order="C")
    if not np.all(np.isfinite(a)):
        raise _bad(f"{name} holds a NaN, an infinity or a value beyond the float32 range")
    return a


def _round_bf16(a: np.ndarray) -> np.ndarray:
    """fp32 values rounded once to nearest even bf16: uint16 bits (fxa_f32_to_bf16
    on finite values)."""
    b = np.ascontiguousarray(a, np.float32).view(np.uint32)
    return ((b + (np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)).astype(np.uint16)


def _bf16(t, name: str, copy: bool = True) -> np.ndarray:
    """A torch tensor or array as contiguous uint16 bfloat16 bits, owned
    (copy=False: a bf16 input's own memory when it is contiguous): bf16
    values keep their bits, any other float dtype goes through fp32 (exact
    for fp32, fp16 and bf16) and is rounded once to nearest even."""
    own = np.array if copy else np.asarray
    if arrays.is_torch(t) and t.dtype == arrays.torch_module().bfloat16:
        torch = arrays.torch_module()
        t = _torch_cpu(t, name).contiguous()
        a = own(t.view(torch.int16).numpy().view(np.uint16), order="C")
    elif not arrays.is_torch(t) and np.asarray(t).dtype.name == "bfloat16":  # ml_dtypes
        a = own(arrays.native_array(t, name).view(np.uint16), order="C")
    else:
        return _round_bf16(_f32(t, name))
    if np.any((a & 0x7F80) == 0x7F80):
        raise _bad(f"{name} holds a NaN or an infinity")
    return a


def _fptr(a):
    return a.ctypes.data_as(ctypes.POINTER(ctypes.c_float)) if a is not None else None


def _linear_pairs(pairs, code):
    """(weight, bias) numpy pairs of q, k, v, o: weights fp32 or bf16 bits
    (code), possibly the inputs' own memory, biases fp32 copies."""
    wconv = _bf16 if code == W.BF16 else _f32
    return [(wconv(a, n + ".weight", copy=False), _f32(b, n + ".bias")) for n, (a, b) in zip("qkvo", pairs)]


def _tensor_weights(pairs, norm_q, norm_k, heads, rope_half: bool, code: int, into=None):
    """An fxa_wan_weights pointing into owned copies of PyTorch-layout
    tensors (see WanSelfAttention.from_tensors), and those copies. into:
    the copies of an earlier call, whose weight matrices are overwritten
    when their shapes and dtype fit (no new allocation)."""
    (qw, qb), (kw, kb), (vw, vb), (ow, ob) = _linear_pairs(pairs, code)
    gq, gk = _f32(norm_q, "norm_q"), _f32(norm_k, "norm_k")
    if qw.ndim != 2 or qw.shape[0] != qw.shape[1]:
        raise _bad(f"q.weight has shape {list(qw.shape)}; expected [hidden, hidden]")
    hidden = qw.shape[1]
    heads = validate.integer("heads", heads, 1, validate.INT64_MAX)
    if hidden < 1 or hidden % heads:
        raise _bad(f"{heads} heads do not divide the hidden size {hidden}")
    shapes = {"q.weight": qw, "k.weight": kw, "v.weight": vw, "o.weight": ow}
    for name, a in shapes.items():
        if a.shape != (hidden, hidden):
            raise _bad(f"{name} has shape {list(a.shape)}, expected [{hidden}, {hidden}]")
    for name, a in {"q.bias": qb, "k.bias": kb, "v.bias": vb, "o.bias": ob, "norm_q": gq, "norm_k": gk}.items():
        if a.shape != (hidden,):
            raise _bad(f"{name} has shape {list(a.shape)}, expected [{hidden}]")
    head_dim = hidden // heads
    rows = np.arange(hidden)
    if not rope_half:
        if head_dim % 2:
            raise _bad(f"head_dim {head_dim} is odd: no RoPE pairs")
        rows = _rotate_half_rows(heads, head_dim)
    # Each weight is copied once, straight into the layer's memory.
    fits = into is not None and into[0].shape == (3 * hidden, hidden) and into[0].dtype == qw.dtype
    qkv, o_w = (into[0], into[2]) if fits else (np.empty((3 * hidden, hidden), qw.dtype), np.empty_like(ow))
    half = head_dim // 2
    for i, src in enumerate((qw, kw)):
        dst = qkv[i * hidden : (i + 1) * hidden]
        if rope_half:
            np.copyto(dst, src)
        else:  # each head's rows 2p + j go to j d/2 + p (_rotate_half_rows), whole rows at a time
            np.copyto(dst.reshape(heads, 2, half, hidden), src.reshape(heads, half, 2, hidden).transpose(0, 2, 1, 3))
    np.copyto(qkv[2 * hidden :], vw)
    np.copyto(o_w, ow)
    ow = o_w
    qkv_b = np.concatenate([qb[rows], kb[rows], vb])
    gq, gk = np.ascontiguousarray(gq[rows]), np.ascontiguousarray(gk[rows])
    fmt = W.PROJ_W_BF16 if code == W.BF16 else W.PROJ_W_F32
    w = W.WanWeights(hidden=hidden, heads=heads, head_dim=head_dim, head_begin=0, head_count=heads)
    w.qkv = W.WanLinear(format=fmt, rows=3 * hidden, cols=hidden, w=qkv.ctypes.data, scales=None, bias=_fptr(qkv_b))
    w.o = W.WanLinear(format=fmt, rows=hidden, cols=hidden, w=ow.ctypes.data, scales=None, bias=_fptr(ob))
    w.gamma_q, w.gamma_k = _fptr(gq), _fptr(gk)
    return w, (qkv, qkv_b, ow, ob, gq, gk)


def _module_tensors(attn):
    """The (weight, bias) pairs of a WanAttention's to_q, to_k, to_v (the
    thirds of to_qkv when its projections are fused, as diffusers then
    computes them), to_out[0], and its norm gains, after checking it is a
    self-attention with RMSNorms of eps FXA_WAN_EPS."""
    if getattr(attn, "add_k_proj", None) is not None or getattr(attn, "is_cross_attention", False):
        raise _bad("from_module takes a self-attention WanAttention (attn1), not a cross-attention one")
    for name in ("norm_q", "norm_k"):
        norm = getattr(attn, name)
        eps = getattr(norm, "eps", None)
        if eps is None or abs(eps - W.EPS) > 1e-12 or getattr(norm, "weight", None) is None:
            raise _bad(f"{name} is not an RMSNorm with eps {W.EPS} and a gain (eps {eps})")
    if getattr(attn, "fused_projections", False):  # diffusers' processor runs to_qkv then
        qkv = attn.to_qkv
        biases = (None,) * 3 if qkv.bias is None else qkv.bias.chunk(3)
        pairs = tuple(zip(qkv.weight.chunk(3), biases))
    else:
        pairs = tuple((m.weight, m.bias) for m in (attn.to_q, attn.to_k, attn.to_v))
    out = attn.to_out[0]
    return pairs + ((out.weight, out.bias),), attn.norm_q.weight, attn.norm_k.weight


def _c_path(path) -> bytes:
    """path (str, bytes or os.PathLike) as the bytes the C loader opens.
    A NUL byte is refused: C would stop reading the path there and open
    another file."""
    cpath = os.fsencode(os.fspath(path))
    if b"\0" in cpath:
        raise _bad(f"path {validate.show(path)} holds a NUL byte")
    return cpath


class WanSelfAttention:
    """One Wan self-attention layer (all heads) on the CPU.

    Build with load(), synthetic(), from_tensors() or from_module(), each
    with dtype="fp32" (default) or "bf16" (module docstring); call
    layer(x, grid). Attributes: hidden, heads, head_dim, dtype ("fp32" or
    "bf16"), fp8 (E4M3 QKV weights), threads, last_stats (WanLayerStats of
    the last run, or None). One run at a time per context (calls hold the
    context's lock).
    """

    def __init__(self, weights: W.WanWeights, owned, loaded: bool, threads, dtype: int = W.F32):
        # Private: use the constructors below.
        self._w = weights
        self._owned = owned  # numpy arrays the struct points into
        self._loaded = loaded  # weights allocated by fxa_wan_weights_load
        self._dtype = dtype  # fxa_wan_desc.dtype of every run
        self._threads = threads
        self._ctx = context(threads)
        self._plans: OrderedDict[tuple, tuple] = OrderedDict()
        self.last_stats: WanLayerStats | None = None

    # ---- constructors --------------------------------------------------

    @classmethod
    def _from_loader(cls, path, heads, block, fp8, rope_half, seed, hidden, threads, dtype):
        code = _dtype_code(dtype)
        p = W.WanLoadParams()
        W.wan.fxa_wan_load_params_init(ctypes.byref(p))
        p.block = validate.integer("block", block, 0, validate.INT64_MAX)
        p.heads = validate.integer("heads", heads, 1, validate.INT64_MAX)
        p.rope_half = int(validate.boolean("rope_half", rope_half))
        p.fp8 = int(validate.boolean("fp8", fp8))
        p.seed = validate.integer("seed", seed, 0, validate.UINT64_MAX)
        p.hidden = validate.integer("hidden", hidden, 0 if path is not None else 1, validate.INT64_MAX)
        p.dtype = code
        w = W.WanWeights()
        err = ctypes.create_string_buffer(_ERRLEN)
        cpath = None if path is None else _c_path(path)
        st = W.wan.fxa_wan_weights_load(cpath, ctypes.byref(p), ctypes.byref(w), err, _ERRLEN)
        _capi.raise_status(st, err.value.decode(errors="replace"))
        return cls(w, None, True, threads, code)

    @classmethod
    def load(cls, path, block: int = 0, heads: int = 40, fp8: bool = False, rope_half: bool = False, threads=None, dtype="fp32"):
        """The self-attention of transformer block `block` of checkpoint
        `path` (a .safetensors file, an index .json or a folder; Wan2.2
        names blocks.N.self_attn.* or diffusers names blocks.N.attn1.*),
        `heads` heads. fp8: QKV weights quantised to E4M3 (F8_E4M3
        checkpoints stay as they are). rope_half: Q/K rows already in
        rotate-half order (default: interleaved pairs, permuted at load).
        threads: worker threads (None: the CPUs available). dtype: "fp32"
        (BF16 and F16 tensors widened exactly) or "bf16" (BF16 tensors keep
        their bits, F32 and F16 ones are rounded once; the bf16 layer).
        Raises FxattnIOError (unreadable file) or InvalidArgumentError
        (missing or malformed tensor, bad heads, bad dtype) with the
        library's message."""
        if path is None:
            raise _bad("load needs a checkpoint path (synthetic() makes weights without one)")
        return cls._from_loader(path, heads, block, fp8, rope_half, 0, 0, threads, dtype)

    @classmethod
    def synthetic(cls, hidden: int, heads: int, seed: int = 0, fp8: bool = False, threads=None, dtype="fp32"):
        """The loader's deterministic synthetic weights (the CLI's `fxattn
        layer --seed [--dtype bf16]`): W ~ N(0,1)/sqrt(hidden), biases ~ 0.1
        N(0,1), gammas ~ 1 + 0.2 N(0,1), already in rotate-half order;
        dtype "bf16": the same weights rounded once to bf16."""
        return cls._from_loader(None, heads, 0, fp8, False, seed, hidden, threads, dtype)

    @classmethod
    def from_tensors(cls, q, k, v, o, norm_q, norm_k, heads: int, rope_half: bool = False, threads=None, dtype="fp32"):
        """A layer from PyTorch-layout tensors (torch or numpy, any real
        float dtype): q, k, v, o are (weight [hidden, hidden], bias
        [hidden]) pairs, norm_q / norm_k the RMSNorm gains [hidden]. The
        object owns copies: dtype "fp32", fp32 weights (4 hidden^2 floats);
        "bf16", bf16 weights (4 hidden^2 uint16: bf16 tensors' bits as they
        are, others rounded once to nearest even). Biases and gains are fp32
        either way (6 hidden floats). Q/K rows and gains are permuted from
        interleaved RoPE pairs to rotate-half unless rope_half."""
        code = _dtype_code(dtype)
        w, owned = _tensor_weights((q, k, v, o), norm_q, norm_k, heads, validate.boolean("rope_half", rope_half), code)
        return cls(w, owned, False, threads, code)

    @classmethod
    def from_module(cls, attn, threads=None, dtype="fp32"):
        """A layer from a diffusers WanAttention self-attention module
        (to_q, to_k, to_v, to_out[0], norm_q, norm_k; interleaved RoPE
        pairs as diffusers uses them): copies of its weights, fp32 or, with
        dtype "bf16", bf16 (a bf16 module's bits as they are). The layer's
        RMSNorm eps is FXA_WAN_EPS (1e-6); a module whose norm_q eps
        differs raises InvalidArgumentError."""
        pairs, gq, gk = _module_tensors(attn)
        return cls.from_tensors(*pairs, gq, gk, attn.heads, False, threads, dtype)

    def _load_module(self, attn) -> None:
        """Copy attn's current weights into the layer (as from_module
        makes them, in the layer's dtype), into the buffers of the
        layer's copies when the shapes fit. The plans stay: they depend on
        the grid, heads and head_dim only, which must not change."""
        pairs, gq, gk = _module_tensors(attn)
        q_shape = tuple(pairs[0][0].shape)
        hidden = q_shape[-1] if q_shape else None
        if (hidden, attn.heads) != (self.hidden, self.heads):
            raise _bad(f"the module has hidden {hidden} and {attn.heads} heads; the layer was made for {self.hidden} and {self.heads}")
        with self._context().lock:  # a run on another thread reads the buffers written here
            self._require_open()
            self._w, self._owned = _tensor_weights(pairs, gq, gk, attn.heads, False, self._dtype, into=self._owned)

    # ---- properties ------------------------------------------------------

    @property
    def hidden(self) -> int:
        return self._w.hidden

    @property
    def heads(self) -> int:
        return self._w.heads

    @property
    def head_dim(self) -> int:
        return self._w.head_dim

    @property
    def fp8(self) -> bool:
        return self._w.qkv.format == W.PROJ_W_E4M3

    @property
    def dtype(self) -> str:
        """ "fp32" or "bf16": the layer's weights and activations."""
        return _DTYPE_NAMES[self._dtype]

    @property
    def threads(self) -> int:
        return self._context().threads

    def _context(self):
        """The layer's context, made anew (and the plans forgotten, not
        destroyed) in a child process forked after the layer was made:
        the parent's context has no worker threads there."""
        if self._ctx.pid != os.getpid():
            self._plans = OrderedDict()
            self._ctx = context(self._threads)
        return self._ctx

    def _require_open(self) -> None:
        if getattr(self, "_closed", False):
            raise _bad("the layer is closed (close() freed its weights and plans); make a new one")

    def _desc(self, grid, x_format: int = W.PROJ_X_F32) -> W.WanDesc:
        self._require_open()
        f, h, w = validate.grid("grid", grid)
        d = W.WanDesc()
        W.wan.fxa_wan_desc_init(ctypes.byref(d))
        d.frames, d.height, d.width = f, h, w
        d.heads, d.head_dim = self.heads, self.head_dim
        d.x_format, d.dtype = x_format, self._dtype
        return d

    def flops(self, grid) -> float:
        """FLOPs of one run on grid: 8 S hidden^2 + the attention's 4 S^2 hidden."""
        return W.wan.fxa_wan_flops(ctypes.byref(self._desc(grid)))

    def _plan(self, d: W.WanDesc):
        """The cached plan of d's grid and x format (caller holds the context's lock)."""
        key = (d.frames, d.height, d.width, d.x_format)
        hit = self._plans.get(key)
        if hit is not None:
            self._plans.move_to_end(key)
            return hit
        handle, ws = ctypes.c_void_p(), ctypes.c_size_t()
        st = W.wan.fxa_wan_plan_create(self._ctx.handle, ctypes.byref(d), ctypes.byref(handle), ctypes.byref(ws))
        _capi.raise_status(st, self._ctx.last_error())
        hit = self._plans[key] = (handle, ws.value)
        if len(self._plans) > _PLAN_CACHE:
            W.wan.fxa_wan_plan_destroy(self._plans.popitem(last=False)[1][0])
        return hit

    # ---- running -----------------------------------------------------------

    def __call__(self, x, grid):
        """y = the layer on x: [S, hidden] or [1, S, hidden] float32 or
        bfloat16 (a numpy array, bfloat16 through ml_dtypes, or a CPU torch
        tensor; copied only when not contiguous), S = frames * height *
        width of grid (tokens in (f, h, w) raster order). Either dtype runs
        on either layer: the fp32 layer widens a bf16 x exactly (its
        products are the same), the bf16 layer rounds an fp32 x once to
        bf16 (a bf16 x is taken as it is). Returns y of x's shape, kind and
        dtype (the library's fp32 y, rounded once to nearest even for a
        bf16 x); sets last_stats. Raises InvalidArgumentError for a bad
        shape, dtype or grid, or a NaN/Inf in x (the library's message)."""
        self._require_open()
        torch = arrays.torch_module() if arrays.is_torch(x) else None
        if torch is not None:
            if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.bfloat16):
                raise _bad(f"x is {x.dtype} on {x.device}; the layer takes torch.float32 or torch.bfloat16 on the CPU")
            x = arrays.torch_values(x.detach(), "x")
            bf16_x = x.dtype == torch.bfloat16
        else:
            x = arrays.native_array(x, "x")
            if x.dtype != np.float32 and x.dtype.name != "bfloat16":
                raise _bad(f"x has dtype {x.dtype}; the layer takes float32 or bfloat16")
            bf16_x = x.dtype.name == "bfloat16"
        d = self._desc(grid, W.PROJ_X_BF16 if bf16_x else W.PROJ_X_F32)
        s = d.frames * d.height * d.width
        shape = tuple(x.shape)
        ok_shape = len(shape) in (2, 3) and shape[-1] == self.hidden and shape[-2] == s and (len(shape) == 2 or shape[0] == 1)
        if not ok_shape:
            raise _bad(
                f"x has shape {list(shape)}; the layer takes [S, {self.hidden}] or [1, S, {self.hidden}] "
                f"with S = {d.frames} x {d.height} x {d.width} = {s}"
            )
        if torch is not None:
            x = x.contiguous()
            y = torch.empty(shape, dtype=torch.float32)
            xp, yp = x.data_ptr(), y.data_ptr()
        else:
            x = np.ascontiguousarray(x)
            y = np.empty(shape, np.float32)
            xp, yp = x.ctypes.data, y.ctypes.data
        stats = _capi.new(W.WanStats)
        ctx = self._context()
        with ctx.lock:  # close() and a weight reload wait for the run, which holds self._w's memory
            self._require_open()
            plan, nbytes = self._plan(d)
            ws = ctx.workspace(nbytes)
            args = _capi.new(W.WanArgs, weights=ctypes.pointer(self._w), x=xp, y=yp)
            st = W.wan.fxa_wan_layer_run(plan, ctypes.byref(args), ws, ctypes.byref(stats))
            if st != _capi.OK:
                _capi.raise_status(st, ctx.last_error())
        self.last_stats = WanLayerStats._of(stats)
        if bf16_x:
            y = y.to(x.dtype) if torch is not None else _round_bf16(y).view(x.dtype)
        return y

    run = __call__

    def close(self) -> None:
        """Free the plans and the loader's weights (also done when
        collected). A run in progress on another thread finishes first."""
        ctx = getattr(self, "_ctx", None)
        if ctx is not None and ctx.pid == os.getpid():
            with ctx.lock:
                self._free()
        else:
            self._free()

    def _free(self) -> None:
        """close() without the context's lock: for close() and for the
        collector, which runs only when no call holds the layer."""
        ctx = getattr(self, "_ctx", None)
        if ctx is not None and ctx.pid != os.getpid():
            self._plans = OrderedDict()  # the parent's plans: not this process's to free
        for handle, _ in getattr(self, "_plans", {}).values():
            W.wan.fxa_wan_plan_destroy(handle)
        if ctx is not None:
            self._plans.clear()
        if getattr(self, "_loaded", False):
            W.wan.fxa_wan_weights_free(ctypes.byref(self._w))
            self._loaded = False
        self._w = W.WanWeights()
        self._owned = None
        self._closed = True

    def __del__(self):
        try:
            self._free()
        except Exception:  # interpreter shutdown
            pass

    def __reduce_ex__(self, protocol):
        """Refused (copy.copy, copy.deepcopy, pickle): a copy would share
        the C weights and plans that either object frees."""
        raise TypeError(
            "a WanSelfAttention holds C memory and cannot be copied or pickled; build another with "
            "load(), synthetic(), from_tensors() or from_module()"
        )

    def __repr__(self) -> str:
        return f"WanSelfAttention(hidden={self.hidden}, heads={self.heads}, head_dim={self.head_dim}, dtype={self.dtype!r}, fp8={self.fp8})"
