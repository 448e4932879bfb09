"""libfxattn through ctypes: the enums and structs of include/fxattn.h
and the declarations of its functions (`core`, the loaded library).

The structs mirror include/fxattn.h field for field; each names its C type
in _c_name_, and tests/test_abi.py checks every such struct of the package
against the C compiler's sizeof and offsetof. Every versioned struct
carries struct_size = ctypes.sizeof(...), so a library of another version
refuses or defaults what it does not know. ctypes releases the GIL for the
length of every call.
"""

from __future__ import annotations

import ctypes
from ctypes import (
    POINTER,
    c_char_p,
    c_double,
    c_int,
    c_int64,
    c_size_t,
    c_uint16,
    c_uint64,
    c_void_p,
)

from .loader import declare, load

# ---- enums (fxattn.h; explicit values, append-only) ---------------------------

F32, BF16, F16, F64 = 0, 1, 2, 3
LAYOUT_BSHD, LAYOUT_BHSD = 0, 1
MODE_AUTO, MODE_ONLINE = 0, 1
COMPUTE_FP32, COMPUTE_BF16, COMPUTE_AUTO, COMPUTE_FP64 = 0, 1, 2, 3
MASK_NONE, MASK_BOOL, MASK_ADD, MASK_ADD_F64 = 0, 1, 2, 3
CAUSAL_UPPER_LEFT, CAUSAL_LOWER_RIGHT = 1, 2

# ---- structs ------------------------------------------------------------------


class CtxParams(ctypes.Structure):
    _c_name_ = "fxa_ctx_params"
    _fields_ = [("struct_size", c_size_t), ("n_threads", c_int)]


class AttnStrides(ctypes.Structure):
    _c_name_ = "fxa_attn_strides"
    _fields_ = [("batch", c_int64), ("token", c_int64), ("head", c_int64)]


class MaskStrides(ctypes.Structure):
    _c_name_ = "fxa_mask_strides"
    _fields_ = [("batch", c_int64), ("head", c_int64), ("query", c_int64), ("key", c_int64)]


class AttnDesc(ctypes.Structure):
    _c_name_ = "fxa_attn_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("batch", c_int64),
        ("heads_q", c_int64),
        ("heads_kv", c_int64),
        ("seq_q", c_int64),
        ("seq_kv", c_int64),
        ("head_dim", c_int64),
        ("layout", c_int),
        ("dtype", c_int),
        ("scale", c_double),
        ("mode", c_int),
        ("center", c_int),
        ("compute", c_int),
        ("heads_per_tile", c_int),
        ("block_q", c_int),
        ("q_strides", AttnStrides),
        ("k_strides", AttnStrides),
        ("v_strides", AttnStrides),
        ("o_strides", AttnStrides),
        ("out_dtype", c_int),
        ("causal", c_int),
        ("mask_kind", c_int),
        ("mask_strides", MaskStrides),
        ("dropout_p", c_double),
        ("reproducible", c_int),
    ]


class AttnStats(ctypes.Structure):
    _c_name_ = "fxa_attn_stats"
    _fields_ = [
        ("struct_size", c_size_t),
        ("rows", c_int64),
        ("fallback_rows", c_int64),
        ("c_min", c_int),
        ("gate_strict", c_int),
        ("gate_centered", c_int),
        ("vmax", c_double),
        ("max_bound", c_double),
        ("seconds", c_double),
        ("keys", c_int64),
        ("compute", c_int),
    ]


class ComputeChoice(ctypes.Structure):
    _c_name_ = "fxa_compute_choice"
    _fields_ = [("struct_size", c_size_t), ("compute", c_int), ("fp32_gflops", c_double), ("bf16_gflops", c_double)]


class AttnArgs(ctypes.Structure):
    _c_name_ = "fxa_attn_args"
    _fields_ = [("struct_size", c_size_t)]
    _fields_ += [(name, c_void_p) for name in ("q", "k", "v", "out", "lse", "row_fallback", "row_bound", "mask")]
    _fields_ += [("lse_parts", c_void_p), ("lse_f64", c_void_p)]
    _fields_ += [("dropout_seed", c_uint64), ("dropout_offset", c_uint64), ("dropout_keep", c_void_p)]


class AttnBwdArgs(ctypes.Structure):
    _c_name_ = "fxa_attn_bwd_args"
    _fields_ = [("struct_size", c_size_t)]
    _fields_ += [(name, c_void_p) for name in ("q", "k", "v", "out", "dout", "lse", "dq", "dk", "dv", "mask")]
    _fields_ += [("grad_dtype", c_int), ("lse_parts", c_void_p), ("lse_f64", c_void_p)]
    _fields_ += [("dropout_seed", c_uint64), ("dropout_offset", c_uint64), ("dropout_keep", c_void_p)]


class AttnBwdStats(ctypes.Structure):
    _c_name_ = "fxa_attn_bwd_stats"
    _fields_ = [("struct_size", c_size_t), ("rows", c_int64), ("keys", c_int64), ("seconds", c_double)]


class CheckHead(ctypes.Structure):
    _c_name_ = "fxa_check_head"
    _fields_ = [("struct_size", c_size_t)]
    _fields_ += [
        (name, c_double)
        for name in (
            "q_norm_min",
            "q_norm_median",
            "q_norm_max",
            "k_norm_max",
            "k_radius_centered",
            "vmax",
            "bound_median",
            "bound_max",
            "bound_raw_median",
            "bound_raw_max",
            "fallback_share_centered",
            "fallback_share_raw",
            "overshoot_median",
            "overshoot_max",
            "overshoot_raw_median",
            "overshoot_raw_max",
        )
    ]
    _fields_ += [(n, c_int64) for n in ("rows", "fallback_rows_centered", "fallback_rows_raw", "sampled_rows")]
    _fields_ += [(n, c_int) for n in ("c", "gate", "gate_centered")]


class CheckDesc(ctypes.Structure):
    _c_name_ = "fxa_check_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("attn", POINTER(AttnDesc)),
        ("sample_rows", c_int),
        ("has_v", c_int),
    ]


def new(struct_type, **fields):
    """A struct of struct_type with struct_size set and the given fields."""
    s = struct_type(**fields)
    s.struct_size = ctypes.sizeof(struct_type)
    return s


core = load("fxattn")
_d = declare
_d(core, "fxa_version", c_char_p)
_d(core, "fxa_status_str", c_char_p, c_int)
_d(core, "fxa_available_cpus", c_int)
_d(core, "fxa_available_memory", c_uint64)
_d(core, "fxa_ctx_create", c_int, POINTER(CtxParams), POINTER(c_void_p))
_d(core, "fxa_ctx_destroy", None, c_void_p)
_d(core, "fxa_ctx_create_error", c_char_p)
_d(core, "fxa_ctx_threads", c_int, c_void_p)
_d(core, "fxa_ctx_isa", c_char_p, c_void_p)
_d(core, "fxa_ctx_kernel_info", c_char_p, c_void_p)
_d(core, "fxa_ctx_last_error", c_char_p, c_void_p)
_d(core, "fxa_ctx_compute_choice", c_int, c_void_p, c_int, c_int64, POINTER(ComputeChoice))
_d(core, "fxa_attn_desc_init", None, POINTER(AttnDesc))
_d(core, "fxa_attn_plan_create", c_int, c_void_p, POINTER(AttnDesc), POINTER(c_void_p), POINTER(c_size_t))
_d(core, "fxa_attn_plan_destroy", None, c_void_p)
_d(core, "fxa_attn_run", c_int, c_void_p, POINTER(AttnArgs), c_void_p, POINTER(AttnStats))
_d(core, "fxa_attn_bounds", c_int, c_void_p, POINTER(AttnArgs), c_void_p, POINTER(AttnStats))
_d(core, "fxa_attn_flops", c_double, POINTER(AttnDesc))
_d(core, "fxa_canonical_shard", None, c_int64, c_int, c_int, POINTER(c_int64), POINTER(c_int64))
_d(core, "fxa_dropout_kept", c_int, c_uint64, c_uint64, c_double, c_uint64)
_d(core, "fxa_attn_bwd_plan_create", c_int, c_void_p, POINTER(AttnDesc), POINTER(c_void_p), POINTER(c_size_t))
_d(core, "fxa_attn_bwd_plan_destroy", None, c_void_p)
_d(core, "fxa_attn_bwd_run", c_int, c_void_p, POINTER(AttnBwdArgs), c_void_p, POINTER(AttnBwdStats))
_d(core, "fxa_attn_bwd_flops", c_double, POINTER(AttnDesc))
_d(core, "fxa_check_plan_create", c_int, c_void_p, POINTER(CheckDesc), POINTER(c_void_p), POINTER(c_size_t))
_d(core, "fxa_check_run", c_int, c_void_p, POINTER(AttnArgs), c_void_p, POINTER(CheckHead), c_size_t)
_d(core, "fxa_check_plan_destroy", None, c_void_p)
_d(core, "fxa_f32_to_bf16", c_uint16, ctypes.c_float)
_d(core, "fxa_bf16_to_f32", ctypes.c_float, c_uint16)
