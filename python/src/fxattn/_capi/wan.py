"""libfxattn_wan through ctypes: the structs of include/fxattn_wan.h, field
for field, and the functions fxattn.wan calls."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_int64, c_size_t, c_uint64, c_void_p

from .loader import declare, load

PROJ_X_F32, PROJ_X_BF16, PROJ_X_E4M3_ROWS = 0, 1, 2
PROJ_W_F32, PROJ_W_BF16, PROJ_W_E4M3 = 0, 1, 2
#: fxa_dtype of fxa_wan_desc.dtype and fxa_wan_load_params.dtype.
F32, BF16 = 0, 1
SYNTH_X = 0
#: FXA_WAN_EPS: the RMSNorm epsilon of the fused layer.
EPS = 1e-6
#: FXA_WAN_ROPE_THETA.
ROPE_THETA = 1e4


class WanLinear(ctypes.Structure):
    _c_name_ = "fxa_wan_linear"
    _fields_ = [
        ("format", c_int),
        ("rows", c_int64),
        ("cols", c_int64),
        ("w", c_void_p),
        ("scales", POINTER(c_float)),
        ("bias", POINTER(c_float)),
    ]


class WanWeights(ctypes.Structure):
    _c_name_ = "fxa_wan_weights"
    _fields_ = [
        ("hidden", c_int64),
        ("heads", c_int64),
        ("head_dim", c_int64),
        ("head_begin", c_int64),
        ("head_count", c_int64),
        ("qkv", WanLinear),
        ("o", WanLinear),
        ("gamma_q", POINTER(c_float)),
        ("gamma_k", POINTER(c_float)),
    ]


class WanLoadParams(ctypes.Structure):
    _c_name_ = "fxa_wan_load_params"
    _fields_ = [
        ("struct_size", c_size_t),
        ("block", c_int64),
        ("heads", c_int64),
        ("head_begin", c_int64),
        ("head_count", c_int64),
        ("rope_half", c_int),
        ("fp8", c_int),
        ("seed", c_uint64),
        ("hidden", c_int64),
        ("dtype", c_int),
    ]


class WanDesc(ctypes.Structure):
    _c_name_ = "fxa_wan_desc"
    _fields_ = [
        ("struct_size", c_size_t),
        ("frames", c_int64),
        ("height", c_int64),
        ("width", c_int64),
        ("heads", c_int64),
        ("head_dim", c_int64),
        ("x_format", c_int),
        ("dtype", c_int),
    ]


class WanStats(ctypes.Structure):
    _c_name_ = "fxa_wan_stats"
    _fields_ = [
        ("struct_size", c_size_t),
        ("qkv_seconds", c_double),
        ("attention_seconds", c_double),
        ("out_seconds", c_double),
        ("rows", c_int64),
        ("fallback_rows", c_int64),
        ("compute", c_int),
        ("qkv_gemm", c_int),
        ("out_gemm", c_int),
    ]


class WanArgs(ctypes.Structure):
    _c_name_ = "fxa_wan_args"
    _fields_ = [("struct_size", c_size_t), ("weights", POINTER(WanWeights)), ("x", c_void_p), ("y", c_void_p)]


wan = load("fxattn_wan")
_d = declare
_d(wan, "fxa_wan_load_params_init", None, POINTER(WanLoadParams))
_d(wan, "fxa_wan_weights_load", c_int, c_char_p, POINTER(WanLoadParams), POINTER(WanWeights), c_char_p, c_size_t)
_d(wan, "fxa_wan_weights_free", None, POINTER(WanWeights))
_d(wan, "fxa_wan_synth", c_float, c_uint64, c_uint64, c_uint64)
_d(wan, "fxa_wan_checkpoint_hidden", c_int, c_char_p, c_int64, POINTER(c_int64), c_char_p, c_size_t)
_d(wan, "fxa_wan_desc_init", None, POINTER(WanDesc))
_d(wan, "fxa_wan_plan_create", c_int, c_void_p, POINTER(WanDesc), POINTER(c_void_p), POINTER(c_size_t))
_d(wan, "fxa_wan_plan_destroy", None, c_void_p)
_d(wan, "fxa_wan_layer_run", c_int, c_void_p, POINTER(WanArgs), c_void_p, POINTER(WanStats))
_d(wan, "fxa_wan_flops", c_double, POINTER(WanDesc))
_d(wan, "fxa_wan_rope", c_int, POINTER(WanDesc), c_void_p, c_void_p)

proj = load("fxattn_proj")
_d(proj, "fxa_proj_gemm_name", c_char_p, c_int)
_d(proj, "fxa_wan_rope_tables", c_int, c_int64, c_int64, c_int64, c_int64, c_double, c_void_p, c_void_p)
