"""fxattn.attention on numpy arrays: against an fp64 reference, options,
strides, dtypes and errors.

Tolerances. fp32 compute is exact to fp32 rounding: each output is a
normalised sum of Skv products, so its error is a few ulps of max|v| times
a slowly growing factor of Skv (the C suite's bound); at the sizes here
(Skv <= 300) the errors seen are below 1e-6 max|v|, and FP32_TOL = 2^-16
max|v| leaves a 10x margin while catching any wrong shift, scale, head
mapping or stride (those give errors of order max|v|). A bf16 or fp16
output adds one rounding of the output: 2^-8 (bf16) or 2^-11 (fp16)
relative to |out| (half an ulp, with margin).
"""

import threading

import ml_dtypes
import numpy as np
import pytest

import fxattn
from fxattn._common import arrays as _arrays

FP32_TOL = 2.0**-16


def reference(q, k, v, scale=None, layout="bshd", lse=False):
    """fp64 softmax(scale q k^T) v with GQA, in q's layout, and the LSE [B, H, S]."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    if layout == "bshd":
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
    hq, hkv = q.shape[1], k.shape[1]
    k = np.repeat(k, hq // hkv, axis=1)
    v = np.repeat(v, hq // hkv, axis=1)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ k.transpose(0, 1, 3, 2)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - m)
    out = (p @ v) / p.sum(axis=-1, keepdims=True)
    lse_v = (m + np.log(p.sum(axis=-1, keepdims=True)))[..., 0]
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    return (out, lse_v) if lse else out


def make(shape_q, shape_kv, seed=0, dtype=np.float32, spread=1.0):
    rng = np.random.default_rng(seed)
    q = (spread * rng.standard_normal(shape_q)).astype(dtype)
    k = (spread * rng.standard_normal(shape_kv)).astype(dtype)
    v = rng.standard_normal(shape_kv).astype(dtype)
    return q, k, v


def max_err(out, ref, v):
    return float(np.abs(np.asarray(out, np.float64) - ref).max() / np.abs(np.asarray(v, np.float64)).max())


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("hq,hkv", [(4, 4), (4, 2), (6, 1)])
def test_fp32_matches_fp64(layout, hq, hkv):
    if layout == "bshd":
        q, k, v = make((2, 70, hq, 32), (2, 300, hkv, 32), seed=hq + hkv)
    else:
        q, k, v = make((2, hq, 70, 32), (2, hkv, 300, 32), seed=hq + hkv)
    out = fxattn.attention(q, k, v, layout=layout)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == q.shape
    assert max_err(out, reference(q, k, v, layout=layout), v) < FP32_TOL


def test_lse_and_scale():
    q, k, v = make((1, 50, 3, 16), (1, 90, 3, 16), seed=3)
    out, lse = fxattn.attention(q, k, v, scale=0.3, return_lse=True, layout="bshd")
    ref, ref_lse = reference(q, k, v, scale=0.3, lse=True)
    assert lse.dtype == np.float32 and lse.shape == (1, 3, 50)
    assert max_err(out, ref, v) < FP32_TOL
    # The LSE is a log of a sum of Skv terms: fp32 rounding of values ~ |lse|.
    assert np.abs(lse - ref_lse).max() < FP32_TOL * max(1.0, np.abs(ref_lse).max())


@pytest.mark.parametrize("mode,center", [("auto", True), ("auto", False), ("online", True)])
def test_modes_agree_with_reference(mode, center):
    # Large norms: some rows fail the gate and run online softmax in "auto".
    q, k, v = make((1, 64, 2, 64), (1, 128, 2, 64), seed=5, spread=6.0)
    out = fxattn.attention(q, k, v, mode=mode, center=center, layout="bshd")
    assert max_err(out, reference(q, k, v), v) < FP32_TOL


def test_threads_bit_identical():
    q, k, v = make((1, 600, 2, 32), (1, 600, 2, 32), seed=7)
    a = fxattn.attention(q, k, v, threads=1, layout="bshd")
    b = fxattn.attention(q, k, v, threads=2, layout="bshd")
    assert a.tobytes() == b.tobytes()


def test_strided_views_run_without_copy_and_same_bits():
    q, k, v = make((1, 40, 8, 32), (1, 60, 8, 32), seed=9)
    # Every second head: a strided view (head stride 64 elements), no copy.
    qs, ks, vs = q[:, :, ::2], k[:, :, ::2], v[:, :, ::2]
    op = _arrays.operand(qs, "q")
    assert op.ptr == qs.ctypes.data and op.strides == (0, 8 * 32, 64, 1)  # batch 1: stride unused
    strided = fxattn.attention(qs, ks, vs, layout="bshd")
    dense = fxattn.attention(*(np.ascontiguousarray(t) for t in (qs, ks, vs)), layout="bshd")
    assert strided.tobytes() == dense.tobytes()
    # A BHSD view of BSHD memory (transpose, no copy) gives the same bits too.
    bhsd = fxattn.attention(*(t.transpose(0, 2, 1, 3) for t in (qs, ks, vs)), layout="bhsd")
    assert bhsd.transpose(0, 2, 1, 3).tobytes() == dense.tobytes()


def test_non_unit_last_stride_is_copied_and_right():
    q, k, v = make((1, 20, 2, 64), (1, 30, 2, 64), seed=11)
    qs, ks, vs = q[..., ::2], k[..., ::2], v[..., ::2]
    assert _arrays.operand(qs, "q").ptr != qs.ctypes.data  # a copy: the C API needs dim stride 1
    out = fxattn.attention(qs, ks, vs, layout="bshd")
    assert max_err(out, reference(qs, ks, vs), vs) < FP32_TOL


def test_broadcast_row_is_not_taken_for_a_preset():
    q, k, v = make((1, 1, 1, 16), (1, 1, 1, 16), seed=12)
    qb = np.broadcast_to(q, (1, 5, 3, 16))  # all strides 0
    kb, vb = np.broadcast_to(k, (1, 7, 3, 16)), np.broadcast_to(v, (1, 7, 3, 16))
    out = fxattn.attention(qb, kb, vb, layout="bshd")
    assert max_err(out, reference(qb, kb, vb), vb) < FP32_TOL


def test_float16_inputs_and_output():
    q, k, v = make((1, 33, 2, 16), (1, 65, 2, 16), seed=13, dtype=np.float16)
    out = fxattn.attention(q, k, v, layout="bshd")
    assert out.dtype == np.float16
    ref = reference(q, k, v)  # of the fp16 values, widened exactly
    assert np.all(np.abs(out - ref) <= 2.0**-11 * np.abs(ref) + FP32_TOL * np.abs(v.astype(float)).max())
    out32 = fxattn.attention(q, k, v, out_dtype=np.float32, layout="bshd")
    assert out32.dtype == np.float32 and max_err(out32, ref, v) < FP32_TOL


def test_bfloat16_numpy():
    bf16 = ml_dtypes.bfloat16
    q, k, v = (t.astype(bf16) for t in make((1, 40, 2, 32), (1, 50, 2, 32), seed=14))
    out = fxattn.attention(q, k, v, layout="bshd", compute="fp32")
    assert out.dtype == bf16
    ref = reference(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    out32 = fxattn.attention(q, k, v, out_dtype="float32", layout="bshd", compute="fp32")
    assert max_err(out32, ref, v.astype(np.float32)) < FP32_TOL
    # The bf16 output is the fp32 output rounded once to nearest even.
    assert out.tobytes() == out32.astype(bf16).tobytes()


def test_bf16_compute_error_budget():
    q, k, v = (t.astype(ml_dtypes.bfloat16) for t in make((1, 64, 2, 64), (1, 256, 2, 64), seed=15))
    out = fxattn.attention(q, k, v, compute="bf16", out_dtype="float32", layout="bshd")
    ref = reference(*(t.astype(np.float32) for t in (q, k, v)))
    # bf16 products and P rounded to bf16: at most about 2^-7 max|v| (docs/numerics.md).
    assert max_err(out, ref, v.astype(np.float32)) < 2.0**-7


def test_concurrent_calls_from_threads():
    q, k, v = make((1, 300, 2, 32), (1, 300, 2, 32), seed=16)
    want = fxattn.attention(q, k, v, layout="bshd")
    results = [None] * 4

    def work(i):
        results[i] = fxattn.attention(q, k, v, layout="bshd")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.tobytes() == want.tobytes() for r in results)


def test_gil_released_during_the_call():
    q, k, v = make((1, 2048, 8, 64), (1, 2048, 8, 64), seed=17)
    fxattn.attention(q, k, v, threads=1, layout="bshd")  # plan cached; the timed call only runs
    ticks = [0]
    running = [True]

    def spin():
        while running[0]:
            ticks[0] += 1

    t = threading.Thread(target=spin)
    t.start()
    fxattn.attention(q, k, v, threads=1, layout="bshd")
    running[0] = False
    t.join()
    # With the GIL held for the whole C call the spinning thread would stall
    # (a few switch intervals at most); released, it counts freely.
    assert ticks[0] > 10000


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda q, k, v: fxattn.attention(q * np.nan, k, v, layout="bshd"), "non-finite"),
        (lambda q, k, v: fxattn.attention(q[0], k, v, layout="bshd"), "4-D"),
        (lambda q, k, v: fxattn.attention(q, k, v[:, :-1], layout="bshd"), "must match"),
        (lambda q, k, v: fxattn.attention(q.astype(np.float16), k, v, layout="bshd"), "dtypes"),
        (lambda q, k, v: fxattn.attention(q.astype(np.float64), k, v, layout="bshd"), "float64"),
        (lambda q, k, v: fxattn.attention(q[:, :, :3], k, v, layout="bshd"), "multiple"),
        (lambda q, k, v: fxattn.attention(q, k, v, layout="sbhd"), "layout"),
        (lambda q, k, v: fxattn.attention(q, k, v, mode="fast", layout="bshd"), "mode"),
        (lambda q, k, v: fxattn.attention(q, k, v, scale=float("nan"), layout="bshd"), "scale"),
        (lambda q, k, v: fxattn.attention(q, k, v, threads=0, layout="bshd"), "threads"),
        (lambda q, k, v: fxattn.attention(q, k, v, compute="bf16", layout="bshd"), "bf16"),
        (lambda q, k, v: fxattn.attention(q, k, v, out_dtype="int8", layout="bshd"), "out_dtype"),
    ],
)
def test_bad_input_raises_value_error_with_message(call, message):
    q, k, v = make((1, 8, 4, 16), (1, 8, 2, 16), seed=18)
    with pytest.raises(ValueError) as e:
        call(q, k, v)
    assert isinstance(e.value, fxattn.InvalidArgumentError) and e.value.status == 1
    assert message in str(e.value), str(e.value)


def test_layout_is_required():
    q, k, v = make((1, 8, 4, 16), (1, 8, 4, 16), seed=19)
    with pytest.raises(TypeError, match="layout"):
        fxattn.attention(q, k, v)


def test_library_version_matches_package():
    assert fxattn.library_version == fxattn.__version__
    assert fxattn.available_cpus() >= 1
    assert fxattn.kernel_info()


def test_compute_auto_is_the_machines_choice():
    """compute="auto" (the default) runs what fxattn.compute_choice names: fp32 for float32 and
    float16, for bfloat16 the compute whose tile the library measured faster (bf16 from 1.25x
    the fp32 tile's rate), bit for bit that compute's output."""
    for dt in ("float32", "float16", np.float32):
        c = fxattn.compute_choice(dt, 32)
        assert c.compute == "fp32" and c.fp32_gflops == c.bf16_gflops == 0.0
    c = fxattn.compute_choice("bfloat16", 32)
    assert c == fxattn.compute_choice(ml_dtypes.bfloat16, 32)  # kept, not measured again
    if c.bf16_gflops > 0.0:
        assert (c.compute == "bf16") == (c.bf16_gflops >= 1.25 * c.fp32_gflops)
    q, k, v = (t.astype(ml_dtypes.bfloat16) for t in make((1, 40, 2, 32), (1, 50, 2, 32), seed=16))
    auto = fxattn.attention(q, k, v, layout="bshd", out_dtype="float32")
    named = fxattn.attention(q, k, v, layout="bshd", out_dtype="float32", compute=c.compute)
    assert auto.tobytes() == named.tobytes()
    with pytest.raises(fxattn.InvalidArgumentError, match="dtype int8 is not float32"):
        fxattn.compute_choice("int8", 32)
    with pytest.raises(fxattn.InvalidArgumentError, match="head_dim 300 is outside"):
        fxattn.compute_choice("bfloat16", 300)


def test_reproducible_is_the_same_bytes_at_any_thread_count_and_kind():
    """reproducible=True: threads 1 and 3, numpy and torch give the same bytes (200 query rows,
    which a default plan splits into key ranges), within fp32 of the default; gradients run;
    a non-boolean is refused."""
    import torch

    q, k, v = make((1, 200, 4, 32), (1, 700, 2, 32), seed=17)
    one = fxattn.attention(q, k, v, layout="bshd", threads=1, reproducible=True)
    three = fxattn.attention(q, k, v, layout="bshd", threads=3, reproducible=True)
    tq, tk, tv = (torch.from_numpy(t).requires_grad_() for t in (q, k, v))
    tout = fxattn.attention(tq, tk, tv, layout="bshd", threads=2, reproducible=True)
    assert one.tobytes() == three.tobytes() == tout.detach().numpy().tobytes()
    default = fxattn.attention(q, k, v, layout="bshd")
    assert np.abs(one - default).max() <= 2.0**-20 * np.abs(v).max()
    tout.sum().backward()
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (tq, tk, tv))
    with pytest.raises(fxattn.InvalidArgumentError, match="reproducible"):
        fxattn.attention(q, k, v, layout="bshd", reproducible="yes")
