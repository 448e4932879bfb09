/* Kernel selection: the best kernel set this build has for this CPU, or the
 * one FXA_ISA names. The context (core/ctx.c) asks through this header only;
 * the sets themselves (kernels.h) stay with the kernels and their drivers. */
#ifndef FXA_DISPATCH_H
#define FXA_DISPATCH_H

#include <stddef.h>

#include "fxattn.h"

struct fxa_kernels;

/*
 * Choose the kernel set. isa_env is the value of FXA_ISA (NULL or "" for the
 * automatic choice). Refuses an unknown name (FXA_ERR_INVALID_ARG) and an ISA
 * that the CPU or this build lacks (FXA_ERR_UNSUPPORTED), with a message.
 * *out points to a set built once per process, never freed.
 */
fxa_status fxa_kernels_select(const char *isa_env, const struct fxa_kernels **out, char *msg,
                              size_t msg_len);

/* The set's ISA name ("ref", "avx2", "avx512", "amx"). */
const char *fxa_kernels_isa(const struct fxa_kernels *k);

/* Which tile kernels the set runs, for logs and `fxattn info`. */
const char *fxa_kernels_info(const struct fxa_kernels *k);

/* The set's K^T packing (fxa_pack_kt_fn in kernels.h). */
void fxa_kernels_pack_kt(const struct fxa_kernels *k, const void *const *rows, size_t n, size_t d,
                         size_t panel, void *kt);

#endif
