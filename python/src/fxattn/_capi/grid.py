"""The cost model of context-parallel attention in libfxattn through ctypes
(include/fxattn_grid.h): its structs and function declarations."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_double, c_int, c_int64, c_size_t, c_uint, c_void_p

from .libfxattn import core
from .loader import declare

MAX_STEP_RATES = 64

# fxa_grid_model.measure bits
MEASURE_INTER, MEASURE_INTER_CPU, MEASURE_INTRA, MEASURE_INTRA_CPU = 1, 2, 4, 8
MEASURE_COMPUTE, MEASURE_CALL, MEASURE_ALL, UNEVEN_HOSTS = 16, 32, 63, 64


class GridLink(ctypes.Structure):
    _c_name_ = "fxa_grid_link"
    _fields_ = [
        ("latency_seconds", c_double),
        ("bytes_per_second", c_double),
        ("cpu_seconds_per_byte", c_double),
    ]


class GridModel(ctypes.Structure):
    _c_name_ = "fxa_grid_model"
    _fields_ = [
        ("struct_size", c_size_t),
        ("seq", c_int64),
        ("heads", c_int64),
        ("head_dim", c_int64),
        ("dtype", c_int),
        ("ranks", c_int),
        ("hosts", c_int),
        ("rank_flops", c_double),
        ("inter", GridLink),
        ("intra", GridLink),
        ("ulysses_groups", c_int),
        ("call_seconds", c_double),
        ("measure", c_uint),
        ("n_step_rates", c_int),
        ("step_ring", c_int * MAX_STEP_RATES),
        ("step_flops", c_double * MAX_STEP_RATES),
    ]


class GridTime(ctypes.Structure):
    _c_name_ = "fxa_grid_time"
    _fields_ = [
        ("struct_size", c_size_t),
        ("ulysses", c_int),
        ("ring", c_int),
        ("seconds", c_double),
        ("compute_seconds", c_double),
        ("comm_seconds", c_double),
        ("flops", c_double),
    ]


declare(core, "fxa_grid_model_init", None, POINTER(GridModel))
declare(core, "fxa_grid_cost", c_int, POINTER(GridModel), c_int, c_int, POINTER(GridTime), c_char_p, c_size_t)
declare(core, "fxa_grid_best", c_int, POINTER(GridModel), POINTER(GridTime), c_char_p, c_size_t)
declare(core, "fxa_grid_measure", c_int, c_void_p, POINTER(GridModel))
