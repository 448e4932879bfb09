/*
 * Blockwise attention across ranks, as libfxattn_mpi's reproducible ring
 * uses it (declared internal API, FXA_INTERNAL: exported from libfxattn.so,
 * not public): each rank's largest query norms, and a pass begun with the
 * largest over every rank's queries, so that the bound's prescaling is the
 * one a single process over all the queries chooses.
 */
#ifndef FXA_ACC_API_H
#define FXA_ACC_API_H

#include "../base/internal_api.h"

#include "fxattn.h"

/* qmax[b Hkv + kv head] = the largest ||q_i|| over the rows of q (the
 * accumulator's plan's Q) that attend that kv head, each norm computed as
 * the single-process bound pass computes it (rows with a non-finite value
 * count 0: fxa_attn_acc_begin_global refuses them). */
FXA_INTERNAL fxa_status fxa_attn_acc_q_norm(fxa_attn_acc *acc, const void *q, double *qmax);

/* fxa_attn_acc_begin with the prescaling's largest query norms given per
 * (batch, kv head) instead of taken from q alone: qmax must be finite and
 * at least q's own (fxa_attn_acc_q_norm), e.g. their maximum over ranks. */
FXA_INTERNAL fxa_status fxa_attn_acc_begin_global(fxa_attn_acc *acc, const void *q,
                                                  const double *summaries, int64_t n_blocks,
                                                  const double *qmax);

#endif
