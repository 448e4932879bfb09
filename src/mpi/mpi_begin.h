/* What the distributed forward and backward share: the start of their
 * plans (fxa_mpi_attn_plan_create, fxa_mpi_attn_bwd_plan_create) and the
 * frame of their runs (fxa_mpi_attn_run, fxa_mpi_attn_bwd_run), one
 * implementation each (mpi_begin.c). */
#ifndef FXA_MPI_BEGIN_H
#define FXA_MPI_BEGIN_H

#include "mpi_internal.h"

/* Hash of d's fields that every rank must share, for a forward or a
 * backward plan (backward 1: another seed, so that the two kinds never
 * name their runs alike). Field by field: padding bytes do not enter. */
uint64_t fxa_mpi_desc_hash(const fxa_attn_desc *d, int backward);

/* Collective, the start of a plan_create on m: FXA_ERR_INVALID_ARG for
 * m NULL and FXA_ERR_TIMEOUT for a broken m, without communicating. Else
 * (m's last error cleared) copy the caller's descriptor d into *full (the
 * struct_size policy; has_out 0: the caller passed no output pointer),
 * refuse masks, causal, strides and outputs other than fp32, check that
 * m's context plans the single-process forward (backward 0) or backward
 * (1) of *full, agree on the outcome and on fxa_mpi_desc_hash(full,
 * backward) across the ranks. FXA_OK on every rank or the same failure on
 * every rank. */
fxa_status fxa_mpi_plan_begin(fxa_mpi *m, const fxa_attn_desc *d, int has_out, int backward,
                              fxa_attn_desc *full);

/* Local: the fields every distributed plan starts from, for the agreed
 * descriptor d on m: its handle, descriptor, the name of its runs (never
 * 0), the bytes per input element and this rank's query and key shards. */
void fxa_mpi_plan_init(fxa_mpi *m, const fxa_attn_desc *d, int backward, fxa_mpi **pm,
                       fxa_attn_desc *pd, uint64_t *call, size_t *es, int64_t *q_len,
                       int64_t *kv_len);

/* One run's state (fxa_mpi_call_run): the caller's arguments copied in
 * over defaults (the forward's or the backward's), the statistics it
 * gathers (stats: &local when the caller passed a struct, else NULL) and
 * the message of a local failure. */
typedef struct fxa_mpi_call {
    union {
        fxa_attn_args fwd;
        fxa_attn_bwd_args bwd;
    } args;
    fxa_mpi_stats local;
    fxa_mpi_stats *stats;
    char msg[512];
} fxa_mpi_call;

/* Copy-in of the caller's arguments (user_args) of one run kind into
 * c->args, and their checks before any communication, on plan (local;
 * c->msg says why): fxa_mpi_take_args or fxa_bwd_take_args. */
typedef fxa_status (*fxa_mpi_take)(const void *plan, const void *user_args, struct fxa_mpi_call *c);

/* The work of one run kind on plan once every rank agreed on its
 * arguments (collective; its statistics into c->stats where not NULL). */
typedef fxa_status (*fxa_mpi_body)(void *plan, struct fxa_mpi_call *c);

/* Collective: one run of plan (fxa_mpi_attn_run, fxa_mpi_attn_bwd_run) on
 * m, its plan's handle (NULL: no plan). With m NULL or broken,
 * FXA_ERR_INVALID_ARG or FXA_ERR_TIMEOUT at once, without communicating.
 * Else m's last error cleared, the caller's stats struct (NULL: none)
 * checked by the struct_size policy, take(plan, user_args), every rank's
 * outcome agreed on in one call named `call` (the plan's,
 * fxa_mpi_agree_call), then body; the statistics (the seconds since the
 * start included) written to user_stats when it was valid. */
fxa_status fxa_mpi_call_run(fxa_mpi *m, uint64_t call, void *plan, const void *user_args,
                            fxa_mpi_stats *user_stats, fxa_mpi_take take, fxa_mpi_body body);

#endif
