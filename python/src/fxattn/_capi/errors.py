"""The package's exceptions, one per fxa_status (include/fxattn.h), and
raise_status, which raises a failed call's with the library's message."""

from __future__ import annotations


class FxattnError(RuntimeError):
    """A failed fxattn call; .status is the library's fxa_status code."""

    def __init__(self, message: str, status: int = 5):
        super().__init__(message)
        self.status = status


class InvalidArgumentError(FxattnError, ValueError):
    """Bad shapes, options or input values (FXA_ERR_INVALID_ARG)."""


class UnsupportedError(FxattnError, NotImplementedError):
    """A valid request this build or CPU cannot do (FXA_ERR_UNSUPPORTED)."""


class OutOfMemoryError(FxattnError, MemoryError):
    """FXA_ERR_NO_MEMORY: the plan's workspace exceeds the memory available."""


class FxattnIOError(FxattnError, OSError):
    """FXA_ERR_IO: a file could not be read."""


class MPIError(FxattnError):
    """FXA_ERR_MPI: an MPI call failed."""


class PeerTimeoutError(FxattnError, TimeoutError):
    """FXA_ERR_TIMEOUT: a peer made no progress within the deadline."""


OK, INVALID_ARG, UNSUPPORTED, NO_MEMORY, ERR_MPI, INTERNAL, ERR_IO, TIMEOUT = range(8)
_ERRORS = {
    INVALID_ARG: InvalidArgumentError,
    UNSUPPORTED: UnsupportedError,
    NO_MEMORY: OutOfMemoryError,
    ERR_MPI: MPIError,
    ERR_IO: FxattnIOError,
    TIMEOUT: PeerTimeoutError,
}


def raise_status(status: int, message: str) -> None:
    """Raise the exception class of a non-zero status with the library's message."""
    if status == OK:
        return
    if not message:
        from .libfxattn import core

        message = core.fxa_status_str(status).decode()
    raise _ERRORS.get(status, FxattnError)(message, status)
