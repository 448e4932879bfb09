"""Hostile inputs to the Python package: byte order, argument types and
ranges, mixed array kinds, outputs that do not fit their dtype. Every entry
point either computes what it would on well-formed input or raises the
package's exception type with a message naming the problem."""

import ml_dtypes
import numpy as np
import pytest

import fxattn
import fxattn.wan as fw


def data(seed=0, shape=(1, 24, 2, 16)):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


def swapped(a):
    """a in the other byte order, with the same values."""
    return a.astype(a.dtype.newbyteorder("S"))


# ---- byte order --------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16], ids=["f4", "f2", "bf16"])
def test_other_byte_order_gives_the_same_bits(dtype):
    q, k, v = (t.astype(dtype) for t in data())
    qs, ks, vs = (swapped(t) for t in (q, k, v))
    assert not qs.dtype.isnative and np.array_equal(qs.astype(np.float32), q.astype(np.float32))
    want, want_lse = fxattn.attention(q, k, v, return_lse=True, out_dtype="float32", threads=1, layout="bshd")
    got, got_lse = fxattn.attention(qs, ks, vs, return_lse=True, out_dtype="float32", threads=1, layout="bshd")
    assert got.tobytes() == want.tobytes() and got_lse.tobytes() == want_lse.tobytes()
    # one operand swapped, the others native
    assert fxattn.attention(q, ks, v, out_dtype="float32", threads=1, layout="bshd").tobytes() == want.tobytes()


def test_check_reads_other_byte_order():
    q, k, v = data(1)
    want = fxattn.check(q, k, v, threads=1).to_dict()
    got = fxattn.check(swapped(q), swapped(k), swapped(v), threads=1).to_dict()
    assert got == want


def test_non_native_out_dtype_is_refused():
    q, k, v = data()
    with pytest.raises(fxattn.InvalidArgumentError, match="out_dtype"):
        fxattn.attention(q, k, v, out_dtype=np.dtype(np.float32).newbyteorder("S"), layout="bshd")


def test_wan_layer_and_weights_read_other_byte_order():
    hidden, heads, grid = 32, 2, (1, 2, 3)
    layer = fw.WanSelfAttention.synthetic(hidden, heads, seed=1, threads=1)
    x = fw.synth(2, 6 * hidden).reshape(6, hidden)
    assert layer(swapped(x), grid).tobytes() == layer(x, grid).tobytes()
    rng = np.random.default_rng(0)
    ts = [(rng.standard_normal((hidden, hidden)).astype(np.float32), rng.standard_normal(hidden).astype(np.float32)) for _ in range(4)]
    gq, gk = (1 + 0.1 * rng.standard_normal(hidden).astype(np.float32) for _ in range(2))
    for dtype in ("fp32", "bf16"):
        a = fw.WanSelfAttention.from_tensors(*ts, gq, gk, heads, threads=1, dtype=dtype)
        bf = [(w.astype(ml_dtypes.bfloat16), b) for w, b in ts] if dtype == "bf16" else ts
        sw = [(swapped(w), swapped(b)) for w, b in bf]
        b_ = fw.WanSelfAttention.from_tensors(*sw, swapped(gq), swapped(gk), heads, threads=1, dtype=dtype)
        assert a(x, grid).tobytes() == b_(x, grid).tobytes()


# ---- arguments: types and ranges, before anything reaches ctypes -----------


def test_center_takes_a_bool_not_a_string():
    q, k, v = data()
    for bad in ("off", "False", None, 2, 0.0):
        with pytest.raises(fxattn.InvalidArgumentError, match="center must be True or False"):
            fxattn.attention(q, k, v, center=bad, layout="bshd")
    off = fxattn.attention(q, k, v, center=np.bool_(False), threads=1, layout="bshd")
    assert off.tobytes() == fxattn.attention(q, k, v, center=False, threads=1, layout="bshd").tobytes()


def test_integers_out_of_range_are_refused_not_wrapped():
    q, k, v = data()
    for bad in (2**32 + 5, 0, -1, 5.0, "5", True):
        with pytest.raises(fxattn.InvalidArgumentError, match="sample_rows"):
            fxattn.check(q, k, v, sample_rows=bad)
    assert fxattn.check(q, k, v, sample_rows=np.int64(5), threads=1).heads[0]["sampled_rows"] >= 1
    for bad in (2**64 + 3, 2**63, 0, -2, 1.5):
        with pytest.raises(fxattn.InvalidArgumentError, match="heads"):
            fw.WanSelfAttention.synthetic(32, bad)
    with pytest.raises(fxattn.InvalidArgumentError, match="heads"):
        fw.WanSelfAttention.load("/nonexistent.safetensors", heads=2**64 + 3)
    with pytest.raises(fxattn.InvalidArgumentError, match="block"):
        fw.WanSelfAttention.load("/nonexistent.safetensors", block=-1)
    for bad in (-1, 2**64, 1.0):
        with pytest.raises(fxattn.InvalidArgumentError, match="seed"):
            fw.WanSelfAttention.synthetic(32, 2, seed=bad)
        with pytest.raises(fxattn.InvalidArgumentError, match="seed"):
            fw.synth(bad, 4)
    for bad in (2**31, 0, -1, 1.5, "2", True):
        with pytest.raises(fxattn.InvalidArgumentError, match="threads"):
            fxattn.attention(q, k, v, threads=bad, layout="bshd")
    for flag in ("fp8", "rope_half"):
        with pytest.raises(fxattn.InvalidArgumentError, match=flag):
            fw.WanSelfAttention.load("/nonexistent.safetensors", **{flag: "no"})


def test_grids_are_three_positive_integers():
    layer = fw.WanSelfAttention.synthetic(32, 2, seed=1, threads=1)
    x = fw.synth(2, 6 * 32).reshape(6, 32)
    for bad in ((1.9, 2, 3), "123", (1, 2), (1, 2, 3, 1), (0, 2, 3), (1, -2, -3), (1, 2, 2**64 + 3), None):
        with pytest.raises(fxattn.InvalidArgumentError, match="grid"):
            layer(x, bad)
        with pytest.raises(fxattn.InvalidArgumentError, match="grid"):
            fw.rope_tables(bad, 8)
    good = layer(x, (1, 2, 3))
    assert layer(x, [np.int64(1), 2, np.int32(3)]).tobytes() == good.tobytes()


def test_complex_and_non_numeric_weights_are_refused():
    hidden, heads = 8, 2
    rng = np.random.default_rng(0)
    w = rng.standard_normal((hidden, hidden)).astype(np.float32)
    b = np.zeros(hidden, np.float32)
    g = np.ones(hidden, np.float32)
    pairs = [(w, b)] * 4
    for bad in (w + 1j, w > 0, w.astype(str)):
        with pytest.raises(fxattn.InvalidArgumentError, match="q.weight has dtype"):
            fw.WanSelfAttention.from_tensors((bad, b), *pairs[1:], g, g, heads)
    assert fw.WanSelfAttention.from_tensors(*pairs, g, g, heads, threads=1).hidden == hidden


def test_scale_takes_numpy_and_0d_reals():
    q, k, v = data()
    want = fxattn.attention(q, k, v, scale=0.5, threads=1, layout="bshd")
    for s in (np.float32(0.5), np.float64(0.5), np.array(0.5), np.array(0.5, np.float16)):
        assert fxattn.attention(q, k, v, scale=s, threads=1, layout="bshd").tobytes() == want.tobytes()
    for bad in (float("inf"), -float("inf"), float("nan"), "0.5", np.array([0.5]), True, 1 + 0j):
        with pytest.raises(fxattn.InvalidArgumentError, match="scale must be a finite number"):
            fxattn.attention(q, k, v, scale=bad, layout="bshd")


def test_choices_refuse_unhashable_values():
    q, k, v = data()
    with pytest.raises(fxattn.InvalidArgumentError, match="layout"):
        fxattn.attention(q, k, v, layout=["bshd"])


def test_closed_layer_says_it_is_closed():
    layer = fw.WanSelfAttention.synthetic(32, 2, seed=1, threads=1)
    x = fw.synth(2, 6 * 32).reshape(6, 32)
    layer(x, (1, 2, 3))
    layer.close()
    with pytest.raises(fxattn.InvalidArgumentError, match="closed"):
        layer(x, (1, 2, 3))
    with pytest.raises(fxattn.InvalidArgumentError, match="closed"):
        layer.flops((1, 2, 3))


# ---- outputs that do not fit their dtype --------------------------------------


def test_float16_output_overflow_is_refused():
    q, k, v = data()
    v = v * np.float32(1e5)  # outputs up to ~1e5, beyond float16's 65504
    with pytest.raises(fxattn.InvalidArgumentError, match="65504"):
        fxattn.attention(q, k, v, out_dtype="float16", threads=1, layout="bshd")
    small = fxattn.attention(q, k, v / np.float32(1e3), out_dtype="float16", threads=1, layout="bshd")
    assert small.dtype == np.float16 and np.isfinite(small).all()


def test_torch_float16_overflow_and_mixed_kinds():
    import torch

    q, k, v = (torch.from_numpy(t) for t in data())
    with pytest.raises(fxattn.InvalidArgumentError, match="65504"):
        fxattn.attention(q, k, v * 1e5, out_dtype=torch.float16, threads=1, layout="bshd")
    with pytest.raises(fxattn.InvalidArgumentError, match="65504"):
        fxattn.attention(q, k, v * 1e5, out_dtype="float16", threads=1, layout="bshd")
    assert fxattn.attention(q, k, v, out_dtype="float16", threads=1, layout="bshd").dtype == torch.float16
    for mixed in ((q, k.numpy(), v), (q.numpy(), k, v.numpy())):
        with pytest.raises(fxattn.InvalidArgumentError, match="all torch tensors or all numpy arrays"):
            fxattn.attention(*mixed, layout="bshd")
        with pytest.raises(fxattn.InvalidArgumentError, match="all torch tensors or all numpy arrays"):
            fxattn.check(*mixed)
