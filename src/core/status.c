/* Status codes: the string table behind fxa_status_str. */
#include "fxattn.h"

const char *fxa_status_str(fxa_status s)
{
    switch (s) {
    case FXA_OK: return "ok";
    case FXA_ERR_INVALID_ARG: return "invalid argument";
    case FXA_ERR_UNSUPPORTED: return "unsupported";
    case FXA_ERR_NO_MEMORY: return "out of memory";
    case FXA_ERR_MPI: return "MPI error";
    case FXA_ERR_INTERNAL: return "internal error";
    case FXA_ERR_IO: return "I/O error";
    case FXA_ERR_TIMEOUT: return "no progress from a peer";
    }
    return "unknown status";
}

const char *fxa_version(void)
{
    return FXA_VERSION_STRING;
}
