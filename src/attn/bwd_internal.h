/* The backward plan behind fxa_attn_bwd_plan, and its workspace layout. */
#ifndef FXA_BWD_INTERNAL_H
#define FXA_BWD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "attn_internal.h"

struct fxa_attn_bwd_plan {
    fxa_attn_plan *fwd; /* the forward plan: validated desc, strides, extents */
    fxa_ctx *ctx;
    size_t dim;
    size_t block_q;  /* query rows per tile */
    size_t block_kv; /* keys per tile (a multiple of panel) */
    size_t panel;    /* the kernels' bwd_kt_panel */
    int64_t n_q_blocks;
    int64_t n_kv_blocks;
    size_t kv_pad;          /* n_kv_blocks * block_kv */
    int64_t chunk_kv_heads; /* kv heads whose K, V, Q, dO are in the workspace at once */
    /* Workspace, byte offsets. Per kv head of the chunk: K^T and V^T panels
     * [kv_pad][D] and K rows [kv_pad][D]; per query head of the chunk: Q and
     * dO rows [Sq][D], lse2 and delta [Sq], and the dQ accumulator [Sq][D] of
     * the one-pass schedule (bwd_run.c); then per thread: p and ds
     * [block_q][block_kv], two gradient blocks [max(block_q, block_kv)][D],
     * block_kv row pointers and, with a mask or causal, a tile's bias
     * [block_q][block_kv]. */
    size_t ws_kt;
    size_t ws_vt;
    size_t ws_k;
    size_t ws_q;
    size_t ws_do;
    size_t ws_lse2;
    size_t ws_delta;
    size_t ws_dq;
    size_t ws_threads;
    size_t thread_bytes;
    size_t ws_total;
};

/* Refuse outputs (dq, dk, dv, the workspace) that overlap an input (the
 * mask included) or each other, a missing or bad mask (fxa_mask_check),
 * then non-finite inputs (named with their position; lse may be -INFINITY
 * with a mask) and inputs whose norms' products (q.k, dout.v) pass 2^120;
 * row is scratch of D floats. bwd_check.c. */
fxa_status fxa_bwd_check_inputs(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a,
                                void *workspace, float *row);

#endif
