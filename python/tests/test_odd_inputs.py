"""Odd objects handed to the Python package: torch tensors whose memory
does not hold their values (lazy negation) or that are not dense, tensors
on mixed devices, numpy masked arrays, numbers beyond the double range,
paths with a NUL byte, a layer closed or reloaded while another thread
runs it, and diffusers modules whose forward is not the plain
Linear / RMSNorm / Dropout that the fused layer computes. Each either gives
what the plain input gives (bit for bit: the same library call on the same
values) or raises the package's exception with a message naming the
problem."""

import copy
import pickle
import threading
import time

import numpy as np
import pytest
import torch
from diffusers.models.transformers.transformer_wan import WanAttnProcessor as DefaultProcessor
from test_diffusers import FP32_TOL, rel, self_attention_call

import fxattn
import fxattn.diffusers as fd
import fxattn.wan as fw
from fxattn._capi import wan as W

GRID = (1, 2, 3)
HIDDEN, HEADS = 32, 2


def data(seed=0, shape=(1, 24, 2, 16)):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g) for _ in range(3))


def neg_view(t):
    """A tensor equal to t whose memory holds -t (its neg bit set)."""
    n = torch._neg_view(-t)
    assert n.is_neg() and torch.equal(n, t)
    return n


def layer_and_x():
    layer = fw.WanSelfAttention.synthetic(HIDDEN, HEADS, seed=1, threads=1)
    return layer, fw.synth(2, 6 * HIDDEN).reshape(6, HIDDEN)


# ---- torch tensors ---------------------------------------------------------------


def test_lazily_negated_tensors_are_read_by_value():
    q, k, v = data()
    want = fxattn.attention(q, k, v, threads=1, layout="bshd")
    assert torch.equal(fxattn.attention(neg_view(q), k, neg_view(v), threads=1, layout="bshd"), want)
    assert fxattn.check(neg_view(q), k, v, threads=1).to_dict() == fxattn.check(q, k, v, threads=1).to_dict()
    layer, x = layer_and_x()
    x = torch.from_numpy(x)
    assert torch.equal(layer(neg_view(x), GRID), layer(x, GRID))


def test_tensors_on_mixed_devices_are_refused():
    """A meta tensor next to CPU ones used to run the operator's fake
    kernel: an uninitialised CPU output."""
    q, k, v = data()
    for args in ((q, k.to("meta"), v), (q, k, v.to("meta")), (q.to("meta"), k, v)):
        with pytest.raises(fxattn.InvalidArgumentError, match="one device"):
            fxattn.attention(*args, layout="bshd")
    # all on meta: shapes only, as torch's own operators do
    out = fxattn.attention(q.to("meta"), k.to("meta"), v.to("meta"), layout="bshd")
    assert out.device.type == "meta" and out.shape == q.shape


def test_tensors_that_are_not_dense_are_refused():
    q, k, v = data()
    odd = {
        "sparse": q.to_sparse(),
        "quantized": torch.quantize_per_tensor(q, 0.1, 0, torch.qint8),
        "mkldnn": q.to_mkldnn(),
    }
    for t in odd.values():
        with pytest.raises(fxattn.InvalidArgumentError, match="dense"):
            fxattn.attention(t, k, v, layout="bshd")
    with pytest.raises(fxattn.InvalidArgumentError, match="dense"):
        fxattn.check(q.to_sparse(), k)
    layer, x = layer_and_x()
    with pytest.raises(fxattn.InvalidArgumentError, match="dense"):
        layer(torch.from_numpy(x).to_sparse(), GRID)


def test_operator_called_directly_checks_its_options():
    q, k, v = data()
    op = torch.ops.fxattn.attention
    with pytest.raises(fxattn.InvalidArgumentError, match="layout"):
        op(q, k, v, 0.0, "bsdh", "auto", True, "fp32", False, "", 1)
    with pytest.raises(fxattn.InvalidArgumentError, match="out_dtype"):
        op(q, k, v, 0.0, "bshd", "auto", True, "fp32", False, "float64", 1)
    with pytest.raises(fxattn.InvalidArgumentError, match="scale"):
        op(q, k, v, float("nan"), "bshd", "auto", True, "fp32", False, "", 1)
    out, _, _ = op(q, k, v, 0.0, "bshd", "auto", True, "fp32", False, "", 1)
    assert torch.equal(out, fxattn.attention(q, k, v, threads=1, layout="bshd"))


# ---- numpy arrays and Python numbers ---------------------------------------------


def test_masked_entries_are_refused_not_read():
    q, k, v = (t.numpy() for t in data())
    masked = np.ma.masked_array(q, mask=np.zeros(q.shape, bool))
    # nothing masked: the values are the data
    assert np.array_equal(fxattn.attention(masked, k, v, threads=1, layout="bshd"), fxattn.attention(q, k, v, threads=1, layout="bshd"))
    masked[0, 3, 1, 2] = np.ma.masked
    with pytest.raises(fxattn.InvalidArgumentError, match="masked"):
        fxattn.attention(masked, k, v, layout="bshd")
    with pytest.raises(fxattn.InvalidArgumentError, match="masked"):
        fxattn.check(q, k, masked)
    layer, x = layer_and_x()
    with pytest.raises(fxattn.InvalidArgumentError, match="masked"):
        layer(np.ma.masked_array(x, mask=x > 1), GRID)


def test_return_lse_takes_a_bool():
    q, k, v = data()
    with pytest.raises(fxattn.InvalidArgumentError, match="return_lse"):
        fxattn.attention(q, k, v, return_lse="no", layout="bshd")
    out, lse = fxattn.attention(q, k, v, return_lse=np.bool_(True), threads=1, layout="bshd")
    assert lse.shape == (1, 2, 24)


def test_numbers_beyond_double_range_get_the_package_error():
    q, k, v = data()
    for scale in (10**400, -(10**400)):
        with pytest.raises(fxattn.InvalidArgumentError, match="scale must be a finite number"):
            fxattn.attention(q, k, v, scale=scale, layout="bshd")
    # an int too long for repr (over 4300 digits) still gets a message
    with pytest.raises(fxattn.InvalidArgumentError, match="threads = <int too large to print> is out of range"):
        fxattn.attention(q, k, v, threads=10**5000, layout="bshd")
    with pytest.raises(fxattn.InvalidArgumentError, match="heads = "):
        fw.WanSelfAttention.synthetic(HIDDEN, 10**5000)
    with pytest.raises(fxattn.InvalidArgumentError, match="exceed the addressable size"):
        fw.rope_tables((2**30, 2**30, 2**30), 8)


# ---- fxattn.wan --------------------------------------------------------------------


def test_load_refuses_nul_bytes_and_no_path(tmp_path):
    layer, x = layer_and_x()
    good = tmp_path / "w.safetensors"
    with pytest.raises(fxattn.InvalidArgumentError, match="NUL byte"):
        fw.WanSelfAttention.load(str(good) + "\0.txt", heads=HEADS)
    with pytest.raises(fxattn.InvalidArgumentError, match="NUL byte"):
        fw.WanSelfAttention.load(bytes(good) + b"\0", heads=HEADS)
    with pytest.raises(fxattn.InvalidArgumentError, match="needs a checkpoint path"):
        fw.WanSelfAttention.load(None, heads=HEADS)


def weights(seed=0):
    rng = np.random.default_rng(seed)
    pairs = [
        (rng.standard_normal((HIDDEN, HIDDEN)).astype(np.float32) / 6, rng.standard_normal(HIDDEN).astype(np.float32)) for _ in range(4)
    ]
    return pairs, [1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32) for _ in range(2)]


def test_weights_without_values_or_of_the_wrong_rank_are_refused():
    pairs, gains = weights()
    meta = [(torch.from_numpy(w).to("meta"), torch.from_numpy(b)) for w, b in pairs]
    for dtype in ("fp32", "bf16"):
        with pytest.raises(fxattn.InvalidArgumentError, match="meta device"):
            fw.WanSelfAttention.from_tensors(*meta, *gains, heads=HEADS, dtype=dtype)
    with pytest.raises(fxattn.InvalidArgumentError, match=r"q.weight has shape \[1, 32, 32\]"):
        fw.WanSelfAttention.from_tensors((pairs[0][0][None], pairs[0][1]), *pairs[1:], *gains, heads=HEADS)
    big = (np.full((HIDDEN, HIDDEN), 1e39), pairs[0][1])  # finite in float64, not in float32
    with pytest.raises(fxattn.InvalidArgumentError, match="beyond the float32 range"):
        fw.WanSelfAttention.from_tensors(big, *pairs[1:], *gains, heads=HEADS)


def test_plot_cli_names_the_output_it_cannot_write(tmp_path):
    import json
    import subprocess
    import sys

    q, k, v = data()
    report = tmp_path / "r.json"
    report.write_text(json.dumps(fxattn.check(q, k, v, threads=1).to_dict()))
    for out, message in (
        ("", "-o '': not a file path"),
        (str(tmp_path / "no" / "p.png"), "No such file or directory"),
        (str(tmp_path), "Is a directory"),
    ):
        run = subprocess.run([sys.executable, "-m", "fxattn.plot", str(report), "-o", out], capture_output=True, text=True)
        assert run.returncode == 2 and message in run.stderr and "r.json" not in run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]


def slow_runs(monkeypatch, seconds=0.3):
    """Make every fxa_wan_layer_run sleep first (the GIL released), so that another
    thread acts while a run is in progress; returns (started, events)."""
    real = W.wan.fxa_wan_layer_run
    started = threading.Event()
    events = []

    def run(*args):
        started.set()
        time.sleep(seconds)
        status = real(*args)
        events.append("run")
        return status

    monkeypatch.setattr(W.wan, "fxa_wan_layer_run", run)
    return started, events


def in_thread(fn):
    out = {}

    def body():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the test
            out["error"] = e

    t = threading.Thread(target=body)
    t.start()
    return t, out


def test_close_waits_for_a_run_on_another_thread(monkeypatch):
    """close() used to free the weights and plans under a running call."""
    layer, x = layer_and_x()
    want = layer(x, GRID).tobytes()
    started, events = slow_runs(monkeypatch)
    t, out = in_thread(lambda: layer(x, GRID))
    assert started.wait(10)
    layer.close()
    events.append("close")
    t.join(30)
    assert events == ["run", "close"]
    assert out["value"].tobytes() == want
    with pytest.raises(fxattn.InvalidArgumentError, match="closed"):
        layer(x, GRID)


def test_layers_refuse_copies_and_pickles():
    """A copy would share the C weights and plans of the original (its
    collection freed them under the copy)."""
    layer, x = layer_and_x()
    for make in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="cannot be copied"):
            make(layer)
    assert np.all(np.isfinite(layer(x, GRID)))


# ---- fxattn.diffusers ----------------------------------------------------------------


def test_processor_reload_waits_for_a_run_on_another_thread(monkeypatch):
    """A second call on the same module, with changed weights, used to
    overwrite the fused layer's weight copies under the first call's run."""
    attn, hs, rope = self_attention_call()
    p = fd.WanAttnProcessor(fused=True, threads=1)
    with torch.no_grad():
        before = p(attn, hs, None, None, rope)
        started, events = slow_runs(monkeypatch)
        t, out = in_thread(lambda: torch.no_grad()(p)(attn, hs, None, None, rope))  # grad mode is per thread
        assert started.wait(10)
        attn.to_v.weight.mul_(2.0)
        after = p(attn, hs, None, None, rope)
        t.join(30)
        ref = DefaultProcessor()(attn, hs, None, None, rope)
    assert torch.equal(out["value"], before)
    assert rel(after, ref) < FP32_TOL and rel(before, ref) > 0.1


class ScaledRMSNorm(torch.nn.RMSNorm):
    def forward(self, x):
        return 2 * super().forward(x)


class ShiftedLinear(torch.nn.Linear):
    def forward(self, x):
        return super().forward(x) + 1


def replace(module, cls, *args):
    new = cls(*args)
    new.load_state_dict(module.state_dict())
    return new


def odd_modules():
    """Ways a WanAttention's submodules compute something other than their
    parameters through Linear / RMSNorm / Dropout."""

    def norm(attn):
        attn.norm_q = replace(attn.norm_q, ScaledRMSNorm, 24, 1e-6)

    def linear(attn):
        attn.to_k = replace(attn.to_k, ShiftedLinear, 24, 24)

    def hook(attn):
        attn.to_v.register_forward_hook(lambda m, i, o: o + 1)

    def forward(attn):
        plain = attn.to_out[0].forward
        attn.to_out[0].forward = lambda x: plain(x) * 3

    def dropout(attn):
        attn.to_out[1] = torch.nn.Tanh()

    def fused_qkv(attn):
        attn.fuse_projections()
        with torch.no_grad():
            attn.to_qkv.weight[48:] *= 2  # diffusers runs to_qkv, not to_v

    return dict(norm=norm, linear=linear, hook=hook, forward=forward, dropout=dropout, fused_qkv=fused_qkv)


@pytest.mark.parametrize("name", list(odd_modules()))
def test_fused_layer_only_where_modules_are_plain(name):
    attn, hs, rope = self_attention_call()
    odd_modules()[name](attn)
    p = fd.WanAttnProcessor(threads=1)
    with torch.no_grad():
        ref = DefaultProcessor()(attn, hs, None, None, rope)
        y = p(attn, hs, None, None, rope)
    assert rel(y, ref) < FP32_TOL
    assert p.fused_calls == (1 if name == "fused_qkv" else 0)


def test_a_model_with_the_processor_deep_copies():
    """diffusers users copy models (EMA, a second pipeline); the processor
    copies as its settings, with fresh caches."""
    attn, hs, rope = self_attention_call()
    p = fd.WanAttnProcessor(fused=True, threads=1)
    attn.set_processor(p)
    with torch.no_grad():
        y = attn(hs, rotary_emb=rope)
        twin = copy.deepcopy(attn)
        assert twin.processor is not p and (twin.processor.fused, twin.processor.threads) == (True, 1)
        assert torch.equal(twin(hs, rotary_emb=rope), y)
    assert pickle.loads(pickle.dumps(p)).fused is True
