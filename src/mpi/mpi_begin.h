/* The common start of the distributed plans (fxa_mpi_attn_plan_create,
 * fxa_mpi_attn_bwd_plan_create) and of their runs (fxa_mpi_attn_run,
 * fxa_mpi_attn_bwd_run): one implementation each (mpi_begin.c). */
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

/* One run's bookkeeping: its handle (NULL: the run stops at once), the
 * caller's arguments copied in over defaults (the forward's or the
 * backward's), its start time, the statistics it gathers (stats: &local
 * when the caller passed a struct, else NULL), whether the caller's struct
 * is written at the end, and the message of a local failure. */
typedef struct fxa_mpi_call {
    fxa_mpi *m;
    union {
        fxa_attn_args fwd;
        fxa_attn_bwd_args bwd;
    } args;
    double t0;
    fxa_mpi_stats local;
    fxa_mpi_stats *stats;
    int stats_ok;
    char msg[512];
} fxa_mpi_call;

/* Copy-in of the caller's arguments (user_args) of one run kind into
 * c->args, and their checks before any communication, on plan (local;
 * c->msg says why): fxa_mpi_take_args or fxa_bwd_take_args. */
typedef fxa_status (*fxa_mpi_take)(const void *plan, const void *user_args, struct fxa_mpi_call *c);

/* Collective, the start of a run on m (a plan's handle; NULL: no plan):
 * with m NULL or broken, c->m NULL and FXA_ERR_INVALID_ARG or
 * FXA_ERR_TIMEOUT, which the caller returns without communicating. Else
 * m's last error cleared, *c set up, the caller's stats struct (NULL:
 * none) checked by the struct_size policy, then take(plan, user_args,
 * c), and every rank's outcome agreed on in one call named `call` (the
 * plan's, fxa_mpi_agree_call). */
fxa_status fxa_mpi_call_begin(fxa_mpi *m, uint64_t call, const fxa_mpi_stats *user_stats,
                              fxa_mpi_take take, const void *plan, const void *user_args,
                              fxa_mpi_call *c);

/* Local, the end of a run: the seconds since the start into the
 * statistics, written to user_stats when it was valid. */
void fxa_mpi_call_end(fxa_mpi_call *c, fxa_mpi_stats *user_stats);

#endif
