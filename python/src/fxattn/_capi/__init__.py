"""The C libraries through ctypes: one module per public header, each a
field-for-field mirror of its structs and enums and the declarations of
its functions; nothing else of the package calls a C function except
through them.

    libfxattn  include/fxattn.h      (libfxattn: `core`, its enums and structs; re-exported here)
    grid       include/fxattn_grid.h   (the context-parallel cost model)
    mpi        include/fxattn_mpi.h    (libfxattn_mpi; imports mpi4py)
    wan        include/fxattn_wan.h    (libfxattn_wan)
    errors     the exceptions, one per fxa_status
    loader     where the shared libraries are and how they are opened
"""

from .errors import (
    ERR_IO,
    ERR_MPI,
    INTERNAL,
    INVALID_ARG,
    NO_MEMORY,
    OK,
    TIMEOUT,
    UNSUPPORTED,
    FxattnError,
    FxattnIOError,
    InvalidArgumentError,
    MPIError,
    OutOfMemoryError,
    PeerTimeoutError,
    UnsupportedError,
    raise_status,
)
from .libfxattn import (
    BF16,
    CAUSAL_LOWER_RIGHT,
    CAUSAL_UPPER_LEFT,
    COMPUTE_AUTO,
    COMPUTE_BF16,
    COMPUTE_FP32,
    COMPUTE_FP64,
    F16,
    F32,
    F64,
    LAYOUT_BHSD,
    LAYOUT_BSHD,
    MASK_ADD,
    MASK_ADD_F64,
    MASK_BOOL,
    MASK_NONE,
    MODE_AUTO,
    MODE_ONLINE,
    AttnArgs,
    AttnBwdArgs,
    AttnBwdStats,
    AttnDesc,
    AttnStats,
    AttnStrides,
    CheckDesc,
    CheckHead,
    ComputeChoice,
    CtxParams,
    MaskStrides,
    core,
    new,
)
