/* Kernel selection: the best kernel set this build has for this CPU, or the
 * one FXA_ISA names. */
#ifndef FXA_DISPATCH_H
#define FXA_DISPATCH_H

#include <stddef.h>

#include "../kernels/kernels.h"
#include "fxattn.h"

/*
 * Choose the kernel set. isa_env is the value of FXA_ISA (NULL or "" for the
 * automatic choice). Refuses an unknown name (FXA_ERR_INVALID_ARG) and an ISA
 * that the CPU or this build lacks (FXA_ERR_UNSUPPORTED), with a message.
 * *out points to a set built once per process, never freed.
 */
fxa_status fxa_kernels_select(const char *isa_env, const fxa_kernels **out, char *msg,
                              size_t msg_len);

#endif
