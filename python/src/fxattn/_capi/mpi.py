"""libfxattn_mpi through ctypes: its structs (mirroring include/fxattn_mpi.h)
and function declarations, and mpi4py communicators as C MPI_Comm handles.

Importing this module imports mpi4py (which initialises MPI, by default with
MPI_THREAD_MULTIPLE, enough for the library's MPI_THREAD_FUNNELED need).
libfxattn_mpi is linked against the system's Open MPI; mpi4py must run on
that one too (checked here): its wheel picks Open MPI's libmpi.so.40 at run
time, and `pip install --no-binary mpi4py mpi4py` builds it against the
`mpicc` on PATH.

Open MPI is the one dependency the wheel does not bundle (mpirun, mpi4py
and the library must share it), and only this module needs it: without
libmpi.so.40 or mpi4py, importing it raises ImportError saying what to
install, and the rest of the package works as before.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_double, c_int, c_int64, c_size_t, c_void_p

from . import grid
from .libfxattn import AttnArgs, AttnBwdArgs, AttnDesc
from .loader import declare, load

_OPEN_MPI = (
    "fxattn.mpi needs Open MPI's runtime (libmpi.so.40), which this machine does not have: "
    "install it with `apt-get install openmpi-bin libopenmpi3` (Debian, Ubuntu) or point "
    "LD_LIBRARY_PATH at the folder holding libmpi.so.40; the rest of fxattn works without it"
)
try:
    # mode=RTLD_GLOBAL as mpi4py and Open MPI's plugins load it.
    ctypes.CDLL("libmpi.so.40", mode=ctypes.RTLD_GLOBAL)
except OSError as e:
    raise ImportError(f"{_OPEN_MPI} ({e})") from None
try:
    from mpi4py import MPI
except ImportError as e:
    raise ImportError(f"fxattn.mpi needs mpi4py on Open MPI: `pip install mpi4py` (or `pip install fxattn[mpi]`) ({e})") from None

if not MPI.Get_library_version().startswith("Open MPI"):
    raise ImportError(
        "fxattn.mpi: mpi4py runs on "
        + MPI.Get_library_version().splitlines()[0]
        + ", but libfxattn_mpi is built on Open MPI; install mpi4py for the system's Open MPI "
        "(pip install --no-binary mpi4py mpi4py, with Open MPI's mpicc on PATH)"
    )

# MPI_Comm is an int (MPICH) or a pointer (Open MPI): its C size says which.
MPI_Comm = c_int if MPI._sizeof(MPI.Comm) == ctypes.sizeof(c_int) else c_void_p


def comm_handle(comm) -> MPI_Comm:
    """The C MPI_Comm of an mpi4py communicator (the mpi4py ctypes idiom)."""
    if not isinstance(comm, MPI.Comm):
        raise TypeError(f"comm must be an mpi4py MPI.Comm, not {type(comm).__name__}")
    return MPI_Comm.from_address(MPI._addressof(comm))


class MpiParams(ctypes.Structure):
    _c_name_ = "fxa_mpi_params"
    _fields_ = [
        ("struct_size", c_size_t),
        ("ulysses", c_int),
        ("ring", c_int),
        ("prefetch", c_int),
        ("timeout_seconds", c_double),
        ("placement", c_int),
    ]


# fxa_mpi_placement
PLACE_HOSTS, PLACE_RANKS = 0, 1


class MpiStats(ctypes.Structure):
    _c_name_ = "fxa_mpi_stats"
    _fields_ = [
        ("struct_size", c_size_t),
        ("rows", c_int64),
        ("fallback_rows", c_int64),
        ("vmax", c_double),
        ("max_bound", c_double),
        ("seconds", c_double),
        ("a2a_seconds", c_double),
        ("ring_compute_seconds", c_double),
        ("ring_wait_seconds", c_double),
        ("ring_steps", c_int),
        ("compute", c_int),
    ]


try:
    mpi = load("fxattn_mpi")
except OSError as e:  # a libmpi.so.40 that is not Open MPI 4/5's, or a broken install
    raise ImportError(f"fxattn.mpi: {e}; {_OPEN_MPI}") from None
_d = declare
_d(mpi, "fxa_mpi_params_init", None, POINTER(MpiParams))
_d(mpi, "fxa_mpi_default_timeout", c_double)
_d(mpi, "fxa_mpi_create", c_int, MPI_Comm, c_void_p, POINTER(MpiParams), POINTER(c_void_p))
_d(mpi, "fxa_mpi_destroy", None, c_void_p)
_d(mpi, "fxa_mpi_create_error", c_char_p)
_d(mpi, "fxa_mpi_last_error", c_char_p, c_void_p)
_d(mpi, "fxa_mpi_rank", c_int, c_void_p)
_d(mpi, "fxa_mpi_size", c_int, c_void_p)
_d(mpi, "fxa_mpi_grid_rank", c_int, MPI_Comm, c_int, POINTER(c_int))
_d(mpi, "fxa_mpi_default_threads", c_int, MPI_Comm)
_d(mpi, "fxa_mpi_shard", None, c_int64, c_int, c_int, POINTER(c_int64), POINTER(c_int64))
_d(mpi, "fxa_mpi_agree", c_int, c_void_p, c_int, c_char_p)
_d(mpi, "fxa_mpi_attn_plan_create", c_int, c_void_p, POINTER(AttnDesc), POINTER(c_void_p))
_d(mpi, "fxa_mpi_attn_plan_destroy", None, c_void_p)
_d(mpi, "fxa_mpi_attn_run", c_int, c_void_p, POINTER(AttnArgs), POINTER(MpiStats))
_d(mpi, "fxa_mpi_grid_plan", c_int, c_void_p, POINTER(grid.GridModel), POINTER(grid.GridTime))
_d(mpi, "fxa_mpi_attn_bwd_plan_create", c_int, c_void_p, POINTER(AttnDesc), POINTER(c_void_p))
_d(mpi, "fxa_mpi_attn_bwd_plan_destroy", None, c_void_p)
_d(mpi, "fxa_mpi_attn_bwd_run", c_int, c_void_p, POINTER(AttnBwdArgs), POINTER(MpiStats))
