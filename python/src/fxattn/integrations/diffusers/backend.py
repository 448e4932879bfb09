"""The "fxattn" attention backend of diffusers' attention dispatcher.

register() adds the name "fxattn" to diffusers' AttentionBackendName and
its function to _AttentionBackendRegistry, so that every model whose
attention processors call dispatch_attention_fn runs its attention in
fxattn with any of diffusers' ways of choosing a backend:

    model.set_attention_backend("fxattn")
    with attention_backend("fxattn"): ...
    DIFFUSERS_ATTN_BACKEND=fxattn   (fxattn.diffusers imported before any
                                     diffusers model module)

diffusers reads DIFFUSERS_ATTN_BACKEND once, when
diffusers.models.attention_dispatch is first imported, and turns it into an
AttentionBackendName there: a name it does not know fails that import.
register() therefore imports the dispatcher itself, with the variable
read as "native", then makes "fxattn" the active backend. Tested with
diffusers 0.35.2, 0.38.0 and 0.42.1 (TESTED_VERSIONS); a dispatcher of
another shape raises ImportError naming the installed version.

NaN and Inf in query, key or value give torch's own result by default (as
diffusers' native backend); nonfinite("raise") (a block or a setting) or
FXATTN_NONFINITE=raise makes the backend refuse them instead.
"""

from __future__ import annotations

import contextvars
import inspect
import os
import sys

import torch

from ..._capi import InvalidArgumentError
from ..._common import validate
from ...attn import attention, scaled_dot_product_attention, sdpa

#: The backend's name in diffusers' AttentionBackendName.
NAME = "fxattn"
#: The diffusers versions this registration was tested with.
TESTED_VERSIONS = ("0.35.2", "0.38.0", "0.42.1")

_DISPATCH = "diffusers.models.attention_dispatch"
_ENV = "DIFFUSERS_ATTN_BACKEND"
_REGISTRY_ATTRS = ("_backends", "_constraints", "_supported_arg_names", "_active_backend", "register")

#: The environment variable the backend reads at each call when no
#: nonfinite(...) setting is in force: "propagate" or "raise".
NONFINITE_ENV = "FXATTN_NONFINITE"
_NONFINITE_MODES = {"propagate": "propagate", "raise": "raise"}
# The mode set by nonfinite(...) in this context (None: not set).
_nonfinite_mode: contextvars.ContextVar[str | None] = contextvars.ContextVar("fxattn_diffusers_nonfinite", default=None)


class nonfinite:
    """What the "fxattn" attention backend does with NaN or Inf in query,
    key or value: "propagate" (the default) gives torch's own result for
    them, as diffusers' native backend computes it (torch's ATen
    scaled_dot_product_attention); "raise" refuses them with
    fxattn.InvalidArgumentError naming the first non-finite element (a
    ValueError, raised through the model and the pipeline).

    As a block, in the thread (context) it runs in, restored on exit
    (nested blocks stack; other threads keep their own mode):

        with fxattn.diffusers.nonfinite("raise"):
            video = pipe(prompt).frames

    Called as a function it sets the mode from then on, in the calling
    thread (context), where diffusers calls the backend while a pipeline
    or model runs, like torch.set_grad_enabled:

        fxattn.diffusers.nonfinite("raise")

    Without a setting in the calling context the backend reads the
    environment variable FXATTN_NONFINITE (propagate or raise, case
    insensitive; unset or empty: propagate) at each call, which every
    thread and child process sees; another value raises
    fxattn.InvalidArgumentError naming the variable. A mode other than
    "propagate" or "raise" raises InvalidArgumentError here.

    torch.compile'd code always refuses non-finite inputs (the traced
    operator never leaves fxattn). diffusers' WanAttnProcessor replacement,
    fxattn.diffusers.WanAttnProcessor, refuses them in either mode.
    """

    def __init__(self, mode: str):
        self.mode = validate.choice("nonfinite", mode, _NONFINITE_MODES)
        self._previous = _nonfinite_mode.get()
        _nonfinite_mode.set(self.mode)

    def __enter__(self) -> nonfinite:
        return self

    def __exit__(self, *exc) -> None:
        _nonfinite_mode.set(self._previous)

    def __repr__(self) -> str:
        return f"fxattn.diffusers.nonfinite({self.mode!r})"


def nonfinite_mode() -> str:
    """The mode the backend runs in now: nonfinite(...)'s setting in this
    context, else FXATTN_NONFINITE, else "propagate"."""
    mode = _nonfinite_mode.get()
    if mode is not None:
        return mode
    value = os.environ.get(NONFINITE_ENV, "")
    if not value.strip():
        return "propagate"
    mode = _NONFINITE_MODES.get(value.strip().lower())
    if mode is None:
        raise validate.bad(f"{NONFINITE_ENV}={validate.show(value)}: expected 'propagate' or 'raise' (or unset: propagate)")
    return mode


def _error(what: str) -> ImportError:
    import diffusers

    return ImportError(
        f"fxattn.diffusers: diffusers {diffusers.__version__}'s attention dispatcher ({_DISPATCH}) {what}; "
        f"the fxattn backend is registered on diffusers {', '.join(TESTED_VERSIONS)}'s dispatcher"
    )


def _import_dispatch():
    """diffusers' attention_dispatch module, imported with
    DIFFUSERS_ATTN_BACKEND read as "native" when it names fxattn. Returns
    (module, whether the variable names fxattn)."""
    from diffusers.utils import constants

    wants = str(getattr(constants, _ENV, "native")).lower() == NAME
    if _DISPATCH in sys.modules or not wants:
        try:
            import diffusers.models.attention_dispatch as dispatch
        except ImportError as e:
            raise _error(f"cannot be imported ({e})") from e
        return dispatch, wants
    value = getattr(constants, _ENV)
    setattr(constants, _ENV, "native")
    try:
        import diffusers.models.attention_dispatch as dispatch
    except ImportError as e:
        raise _error(f"cannot be imported ({e})") from e
    finally:
        setattr(constants, _ENV, value)
    return dispatch, wants


def _enum_member(names):
    """AttentionBackendName's member "fxattn" (value "fxattn", name
    "FXATTN"), added to the enum when absent, so that
    AttentionBackendName("fxattn"), __members__ and iteration know it."""
    member = names._value2member_map_.get(NAME)
    if member is not None:
        return member
    name = NAME.upper()
    member = str.__new__(names, NAME)
    member._name_ = name
    member._value_ = NAME
    member.__objclass__ = names
    member._sort_order_ = len(names._member_names_)
    member.__init__(NAME)
    setattr(names, name, member)  # EnumType refuses only rebinding a member
    names._member_names_.append(name)
    names._member_map_[name] = member
    names._value2member_map_[NAME] = member
    return member


def register():
    """Register the fxattn backend in diffusers' dispatcher and make it the
    active backend when DIFFUSERS_ATTN_BACKEND=fxattn (once: a later call
    changes nothing). Returns AttentionBackendName.FXATTN.
    Raises ImportError naming the diffusers version when the dispatcher is
    not of the tested shape."""
    dispatch, wants = _import_dispatch()
    names = getattr(dispatch, "AttentionBackendName", None)
    registry = getattr(dispatch, "_AttentionBackendRegistry", None)
    if names is None or registry is None:
        raise _error("has no AttentionBackendName or _AttentionBackendRegistry")
    if not (isinstance(names, type) and issubclass(names, str) and hasattr(names, "_value2member_map_")):
        raise _error("has an AttentionBackendName that is not a str Enum")
    if not all(hasattr(registry, a) for a in _REGISTRY_ATTRS) or not isinstance(registry._backends, dict):
        raise _error("has an _AttentionBackendRegistry of another shape")
    if not hasattr(dispatch, "dispatch_attention_fn") or not hasattr(dispatch, "attention_backend"):
        raise _error("has no dispatch_attention_fn or attention_backend")
    member = _enum_member(names)
    if registry._backends.get(member) is fxattn_attention:
        return member
    # supports_context_parallel: diffusers >= 0.36
    cp = {"supports_context_parallel": False} if "supports_context_parallel" in inspect.signature(registry.register).parameters else {}
    registry.register(member, constraints=[], **cp)(fxattn_attention)
    if wants:
        registry._active_backend = member
    return member


def _bshd_mask(attn_mask, query, key):
    """The mask as diffusers' native backend reads it: a 2-D [B, Skv] mask
    is a key mask, [B, 1, 1, Skv]; any other broadcasts against
    [B, H, Sq, Skv] as in torch's SDPA."""
    if attn_mask is not None and attn_mask.ndim == 2 and attn_mask.shape[0] == query.shape[0] and attn_mask.shape[1] == key.shape[1]:
        return attn_mask[:, None, None, :]
    return attn_mask


def fxattn_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    _parallel_config=None,
):
    """diffusers' attention backend contract on fxattn: query [B, Sq, Hq, D],
    key and value [B, Skv, Hkv, D] (CPU tensors, any strides fxattn takes
    without a copy), output [B, Sq, Hq, D] in query's dtype, and with
    return_lse (out, lse), lse [B, Sq, Hq] fp32 (fp64 for fp64 inputs), the natural-log
    log-sum-exp of the scaled scores (the layout of diffusers' backends
    that return one). bf16 inputs run the compute fxattn finds faster on
    this machine (fxattn.compute_choice), fp32 and fp16 inputs fp32
    compute, fp64 inputs fp64 compute. attn_mask (bool or additive, as torch's SDPA takes
    it, or a 2-D [B, Skv] key mask) and is_causal run through
    fxattn.scaled_dot_product_attention. Hq != Hkv needs enable_gqa or
    Hkv = 1 (broadcast), as in torch. NaN or Inf in query, key or value
    give torch's own result, as the native backend's, or with
    nonfinite("raise") or FXATTN_NONFINITE=raise InvalidArgumentError
    naming the element (see nonfinite; always refused under
    torch.compile). dropout_p > 0 runs fxattn.scaled_dot_product_attention's
    dropout (dropout_rng "philox": seed and offset drawn from torch's
    default CPU generator; fp64 inputs refuse it). Raises ValueError for
    context parallelism, or an lse asked with a mask, is_causal or dropout."""
    if _parallel_config is not None:
        raise ValueError("fxattn attention backend: context parallelism (a model's parallel_config) is not supported")
    if query.shape[2] != key.shape[2] and key.shape[2] != 1 and not enable_gqa:
        raise ValueError(
            f"fxattn attention backend: query has {query.shape[2]} heads and key {key.shape[2]}; "
            "different head counts need enable_gqa=True (or one key head)"
        )
    # Under torch.compile the traced operator refuses non-finite inputs
    # whatever the mode (and the context variable is never read there).
    mode = "raise" if torch.compiler.is_compiling() else nonfinite_mode()
    if attn_mask is not None or is_causal or dropout_p:
        if return_lse:
            raise ValueError("fxattn attention backend: return_lse with attn_mask, is_causal or dropout_p is not supported")
        out = scaled_dot_product_attention(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            attn_mask=_bshd_mask(attn_mask, query, key),
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
            nonfinite=mode,
        )
        return out.transpose(1, 2)
    try:
        res = attention(query, key, value, layout="bshd", scale=scale, return_lse=return_lse)
    except InvalidArgumentError:
        if mode == "raise" or not sdpa.not_finite(query, key, value):
            raise
        return _torch_result(query, key, value, scale, enable_gqa, return_lse)
    if return_lse:
        out, lse = res
        return out, lse.transpose(1, 2).contiguous()
    return res


def _torch_result(query, key, value, scale, enable_gqa: bool, return_lse: bool):
    """torch's own result in the backend's layout for inputs holding NaN or
    Inf (the native backend's), with return_lse its lse from the fp32
    scores."""
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out = sdpa.torch_sdpa(q, k, v, None, False, scale, enable_gqa or k.shape[1] == 1).transpose(1, 2)
    if not return_lse:
        return out
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    s = q.to(wide) @ k.to(wide).transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    return out, torch.logsumexp(s, -1).transpose(1, 2).contiguous()
