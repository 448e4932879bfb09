"""NaN and Inf through the "fxattn" attention backend of diffusers'
dispatcher: torch's own result by default (as diffusers' native backend),
InvalidArgumentError naming the element with fxattn.diffusers.nonfinite("raise")
(a block or a setting of the calling context) or FXATTN_NONFINITE=raise,
on the backend's unmasked path (fxattn.attention) and its masked path
(fxattn.scaled_dot_product_attention), and in a tiny Wan model."""

import contextvars
import threading

import pytest
import torch
from diffusers import WanTransformer3DModel
from diffusers.models.attention_dispatch import AttentionBackendName, dispatch_attention_fn
from wan_configs import T2V

import fxattn
import fxattn.diffusers
from fxattn.diffusers import nonfinite

FXATTN = AttentionBackendName("fxattn")
NATIVE = AttentionBackendName.NATIVE
# The backend's two paths: no mask (fxattn.attention) and a key mask or
# is_causal (fxattn.scaled_dot_product_attention).
PATHS = {
    "plain": {},
    "key_mask": {"attn_mask": torch.arange(11).expand(2, 11) < torch.tensor([[8], [11]])},
    "causal": {"is_causal": True},
}


@pytest.fixture(autouse=True)
def no_environment(monkeypatch):
    monkeypatch.delenv("FXATTN_NONFINITE", raising=False)


def same(a, b):
    """Equal, NaN where NaN, Inf where Inf of the same sign."""
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(a.isnan(), b.isnan())
        and torch.equal(a.nan_to_num(0.0, 7.0, -7.0), b.nan_to_num(0.0, 7.0, -7.0))
    )


def nan_qkv():
    """[B, S, H, D] query, key and value, a NaN in one query element."""
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 9, 4, 16, generator=g), torch.randn(2, 11, 4, 16, generator=g), torch.randn(2, 11, 4, 16, generator=g)
    q[1, 3, 2, 5] = float("nan")
    return q, k, v


def native(q, k, v, kw):
    """diffusers' native backend, which reads a 2-D mask as [B, 1, 1, Skv] only when told: passed so."""
    mask = kw.get("attn_mask")
    return dispatch_attention_fn(q, k, v, backend=NATIVE, **dict(kw, attn_mask=None if mask is None else mask[:, None, None, :]))


def run(kw):
    q, k, v = nan_qkv()
    return dispatch_attention_fn(q, k, v, backend=FXATTN, **kw)


def refuses(kw):
    with pytest.raises(fxattn.InvalidArgumentError, match="Q has a non-finite value") as e:
        run(kw)
    return isinstance(e.value, ValueError)


@pytest.mark.parametrize("path", sorted(PATHS))
def test_propagate_by_default_raise_in_a_block(path):
    """By default the native backend's result (torch's ATen SDPA, bit for
    bit, NaN where it puts NaN); inside nonfinite("raise")
    InvalidArgumentError (a ValueError) naming the element; after the
    block the default again; a nested "propagate" block propagates."""
    kw = PATHS[path]
    want = native(*nan_qkv(), kw)
    assert same(run(kw), want)
    with nonfinite("raise") as mode:
        assert mode.mode == "raise"
        assert refuses(kw)
        with nonfinite("propagate"):
            assert same(run(kw), want)
        assert refuses(kw)
    assert same(run(kw), want)


def test_called_it_sets_the_mode_of_the_calling_context():
    """nonfinite("raise") called as a function sets the mode from then on,
    in the calling context (run here in a copy, so that nothing leaks to
    the other tests); the context outside keeps propagating."""

    def body():
        nonfinite("raise")
        assert refuses({})
        assert refuses(PATHS["causal"])
        nonfinite("propagate")
        assert same(run({}), native(*nan_qkv(), {}))
        nonfinite("raise")
        assert refuses({})

    contextvars.copy_context().run(body)
    assert same(run({}), native(*nan_qkv(), {}))


def test_a_block_in_one_thread_leaves_the_others_alone():
    """A thread inside nonfinite("raise") refuses while the main thread,
    at the same time, propagates."""
    inside, done = threading.Event(), threading.Event()
    seen = []

    def worker():
        with nonfinite("raise"):
            inside.set()
            try:
                run({})
            except fxattn.InvalidArgumentError as e:
                seen.append(str(e))
            done.wait(60)

    t = threading.Thread(target=worker)
    t.start()
    try:
        assert inside.wait(60)
        assert same(run({}), native(*nan_qkv(), {}))
    finally:
        done.set()
        t.join(60)
    assert len(seen) == 1 and "non-finite" in seen[0]


@pytest.mark.parametrize("path", ["plain", "causal"])
def test_environment_variable(monkeypatch, path):
    """FXATTN_NONFINITE, read at each call: raise (any case) refuses,
    propagate and empty propagate, a nonfinite(...) setting wins over it,
    and another value raises InvalidArgumentError naming the variable."""
    kw = PATHS[path]
    want = native(*nan_qkv(), kw)
    monkeypatch.setenv("FXATTN_NONFINITE", "raise")
    assert refuses(kw)
    with nonfinite("propagate"):
        assert same(run(kw), want)
    monkeypatch.setenv("FXATTN_NONFINITE", " RAISE ")
    assert refuses(kw)
    for value in ("propagate", ""):
        monkeypatch.setenv("FXATTN_NONFINITE", value)
        assert same(run(kw), want)
    monkeypatch.setenv("FXATTN_NONFINITE", "ignore")
    with pytest.raises(fxattn.InvalidArgumentError, match="FXATTN_NONFINITE='ignore': expected 'propagate' or 'raise'"):
        run(kw)
    with nonfinite("raise"):
        assert refuses(kw)


def test_a_bad_mode_is_refused_and_changes_nothing():
    with pytest.raises(fxattn.InvalidArgumentError, match="nonfinite='ignore': expected one of 'propagate', 'raise'"):
        nonfinite("ignore")
    with pytest.raises(fxattn.InvalidArgumentError, match="nonfinite"):
        nonfinite(True)
    assert same(run({}), native(*nan_qkv(), {}))


def test_tiny_wan_model():
    """A tiny WanTransformer3DModel on the "fxattn" backend with a NaN in
    its latents: the native backend's output (NaN where it has NaN) by
    default; InvalidArgumentError naming the non-finite element inside
    nonfinite("raise"). fxattn's WanAttnProcessor refuses NaN in either
    mode."""
    torch.manual_seed(0)
    model = WanTransformer3DModel(**T2V).eval()
    g = torch.Generator().manual_seed(1)
    x, ctx = torch.randn(1, 4, 3, 8, 10, generator=g), torch.randn(1, 512, 16, generator=g)
    x[0, 1, 2, 3, 4] = float("nan")

    def forward(backend):
        model.set_attention_backend(backend)
        try:
            with torch.no_grad():
                return model(x, torch.tensor([500]), ctx, return_dict=False)[0]
        finally:
            model.reset_attention_backend()

    want = forward("native")
    assert want.isnan().any()
    assert same(forward("fxattn"), want)
    with nonfinite("raise"):
        with pytest.raises(fxattn.InvalidArgumentError, match="non-finite value"):
            forward("fxattn")
    assert same(forward("fxattn"), want)
    model.set_attn_processor(fxattn.diffusers.WanAttnProcessor())
    with nonfinite("propagate"), pytest.raises(fxattn.InvalidArgumentError, match="non-finite value"):
        with torch.no_grad():
            model(x, torch.tensor([500]), ctx, return_dict=False)
