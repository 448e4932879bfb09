/*
 * fxattn_wan_mpi.h (libfxattn_wan_mpi): the Wan2.2 self-attention layer of
 * fxattn_wan.h over MPI ranks, tensor parallel x context parallel.
 *
 * The P ranks of the caller's communicator form a T x C grid, C = U R
 * context-parallel coordinates by T tensor-parallel indices, tensor
 * parallel innermost:
 *
 *   rank = c T + t    (t in [0, T): a head slice; c in [0, C): a token shard)
 *
 * where rank is the grid rank of fxa_mpi_create's default placement by
 * hosts (fxattn_mpi.h, fxa_mpi_placement; comm's rank 0 stays rank 0), so
 * that TP groups and Ulysses rows stay inside hosts whatever the launcher's
 * rank order. fxa_wan_mpi_shard_of gives each rank its part.
 * so the T ranks of a TP group (the same tokens, all heads between them)
 * are adjacent, on one node where the node allows it: they exchange the
 * most (the RMSNorm sums of squares and the output projection's partial
 * sums). A CP group (the same heads, all tokens between them) is every T-th
 * rank in c order; libfxattn_mpi's U x R grid (Ulysses x ring) is laid out
 * inside it.
 *
 * Rank (t, c) holds tokens fxa_mpi_shard(S, C, c) and heads
 * fxa_mpi_shard(heads, T, t). It projects its tokens onto its heads' Q, K
 * and V (the RMSNorm across all heads joins the sums of squares over the TP
 * group, fxa_mpi_proj_run), runs attention over its CP group on those
 * heads (locally under pure tensor parallelism), and multiplies its
 * attention output by o.weight's columns of its heads; the TP group's
 * partial products are summed onto its t = 0 rank, which adds the bias
 * once. Each rank loads only its heads (fxa_wan_weights_load with the
 * shard's head range) and its tokens of x.
 *
 * Every call here is collective over the communicator. A failure on any
 * rank fails on every rank with the same status and message ("rank N:
 * ..."); a peer that stops making progress gives FXA_ERR_TIMEOUT within
 * the grid's timeout (then the communicator is unusable: end the job).
 */
#ifndef FXATTN_WAN_MPI_H
#define FXATTN_WAN_MPI_H

#include <mpi.h>

#include "fxattn_mpi.h"
#include "fxattn_wan.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fxa_wan_grid {
    size_t struct_size;     /* sizeof(fxa_wan_grid) (fxattn.h's struct_size policy) */
    int tp;                 /* T: tensor-parallel ranks (heads split); 0 or 1: none */
    int ulysses;            /* U; 0: 1 */
    int ring;               /* R; 0: P / (T U) */
    double timeout_seconds; /* no progress for this long fails (0: fxa_mpi_default_timeout()) */
} fxa_wan_grid;

/* Defaults: pure context parallelism as a ring over all ranks. */
FXA_API void fxa_wan_grid_init(fxa_wan_grid *g);

/* What this rank holds. */
typedef struct fxa_wan_mpi_shard {
    int tp_index, cp_index;           /* t, c */
    int64_t token_begin, token_count; /* tokens of x and y */
    int64_t head_begin, head_count;   /* heads of the weights */
    int holds_y; /* 1 on t = 0 ranks: y of its tokens is complete there after a run */
} fxa_wan_mpi_shard;

typedef struct fxa_wan_mpi_plan fxa_wan_mpi_plan;

/*
 * Settle the grid of the comm's ranks (T U R = P; without ring, R =
 * P / (T U); heads must split over T, tokens over C), split the
 * communicator into TP and CP groups and plan the attention; report this
 * rank's workspace bytes (Q, K, V and the attention output of its shard,
 * plus a local attention plan's workspace under pure tensor parallelism).
 * ctx must stay valid until the plan is destroyed. On failure
 * fxa_wan_mpi_create_error() holds the same message on every rank.
 */
FXA_API fxa_status fxa_wan_mpi_plan_create(MPI_Comm comm, fxa_ctx *ctx, const fxa_wan_desc *d,
                                           const fxa_wan_grid *g, fxa_wan_mpi_plan **plan_out,
                                           size_t *workspace_bytes);

/*
 * fxa_wan_mpi_plan_create on the ranks of the handle m (fxattn_mpi.h), as
 * every other MPI operator: the layer's grid ranks are m's (its placement),
 * its context m's (fxa_mpi_ctx), and a failure leaves the same status on
 * every rank and its message in fxa_mpi_last_error(m), for the plan's
 * creation and for its runs (also fxa_wan_mpi_last_error(plan)). m's own
 * Ulysses x ring grid is not used: g gives the layer's, whose groups wait
 * g->timeout_seconds. The plan keeps m: destroy the plan first. Added in
 * 0.3.
 */
FXA_API fxa_status fxa_wan_mpi_plan_create_on(fxa_mpi *m, const fxa_wan_desc *d,
                                              const fxa_wan_grid *g, fxa_wan_mpi_plan **plan_out,
                                              size_t *workspace_bytes);

/* Why the calling thread's last fxa_wan_mpi_plan_create failed ("" after a
 * success). */
FXA_API const char *fxa_wan_mpi_create_error(void);
FXA_API void fxa_wan_mpi_plan_destroy(fxa_wan_mpi_plan *plan);

/* This rank's tokens and heads. Local. */
FXA_API void fxa_wan_mpi_shard_of(const fxa_wan_mpi_plan *plan, fxa_wan_mpi_shard *s);

/* The grid settled: T, U, R. Local. */
FXA_API void fxa_wan_mpi_grid_of(const fxa_wan_mpi_plan *plan, int *tp, int *ulysses, int *ring);

/*
 * Collective: the layer on this rank's shard. args->weights: the shard's
 * heads (fxa_wan_weights_load with head_begin/head_count of the shard);
 * args->x: its tokens [token_count][hidden] in d->x_format; args->y:
 * [token_count][hidden], complete on holds_y ranks (scratch elsewhere).
 * stats (may be NULL; its struct_size set by the caller, written within it
 * only): the slowest rank's stage times, attention rows of all heads and
 * tokens. The plan's projections and attention are planned by
 * fxa_wan_mpi_plan_create; the run allocates nothing. Added in 0.3.
 */
FXA_API fxa_status fxa_wan_mpi_layer_run(fxa_wan_mpi_plan *plan, const fxa_wan_args *args,
                                         void *workspace, fxa_wan_stats *stats);

/* fxa_wan_mpi_layer_run with the tensors one by one (the 0.2 call; kept for
 * one release). */
FXA_API fxa_status fxa_wan_mpi_run(fxa_wan_mpi_plan *plan, const fxa_wan_weights *w, const void *x,
                                   float *y, void *workspace, fxa_wan_stats *stats);

/* Collective: y of every token [S][hidden] into y_all on rank 0 of the
 * communicator (other ranks: y_all unused, may be NULL), from the holds_y
 * ranks' y. */
FXA_API fxa_status fxa_wan_mpi_gather(fxa_wan_mpi_plan *plan, const float *y, float *y_all);

/* The message of the last failure (the same on every rank; "" when none). */
FXA_API const char *fxa_wan_mpi_last_error(const fxa_wan_mpi_plan *plan);

/*
 * Tensor-parallel QKV projection (fxattn_proj.h's fxa_proj_plan_create_tp
 * over MPI): every rank of m holds the same tokens and its own heads
 * (d->heads_q / heads_kv, with the matching rows of the weight, bias and
 * gamma); the RMSNorm across all heads joins the ranks' sums of squares, Q
 * and K together, in one MPI_Allreduce per run. heads_q_total /
 * heads_kv_total: the heads over all ranks. Collective plan creation:
 * different tokens, formats or options on different ranks, or a failure on
 * one rank, return the same error everywhere (fxa_mpi_last_error(m));
 * *workspace_bytes as fxa_proj_plan_create's. The plan keeps pointers to m
 * and its context: destroy it before them.
 */
typedef struct fxa_mpi_proj_plan fxa_mpi_proj_plan;
FXA_API fxa_status fxa_mpi_proj_plan_create(fxa_mpi *m, const fxa_proj_desc *d,
                                            int64_t heads_q_total, int64_t heads_kv_total,
                                            fxa_mpi_proj_plan **plan, size_t *workspace_bytes);
/* Collective: fxa_proj_run of the plan with the group's reduction; a failure
 * on any rank fails every rank with that rank's message
 * (fxa_mpi_last_error(m)). Allocates nothing. */
FXA_API fxa_status fxa_mpi_proj_run(fxa_mpi_proj_plan *plan, const fxa_proj_args *args,
                                    void *workspace);
/* fxa_mpi_proj_run, and what this rank's run did in *stats (NULL: none;
 * as fxa_proj_run_stats: its struct_size checked first, written only when
 * every rank succeeds). Added in 0.3. */
FXA_API fxa_status fxa_mpi_proj_run_stats(fxa_mpi_proj_plan *plan, const fxa_proj_args *args,
                                          void *workspace, fxa_proj_stats *stats);
/* Local. NULL is a no-op. */
FXA_API void fxa_mpi_proj_plan_destroy(fxa_mpi_proj_plan *plan);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_WAN_MPI_H */
