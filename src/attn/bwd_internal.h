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
    int bf16;               /* bf16 compute (fxa_attn_bwd_tile_bf16) */
    size_t d16;             /* bf16 compute: bf16 values per Q, dO row (D rounded up to even) */
    /* Workspace, byte offsets. Per kv head of the chunk: K^T and V^T panels
     * [kv_pad][D] and K rows [kv_pad][D]; per query head of the chunk: Q and
     * dO rows [Sq][D], lse2, inv_sum, center, the mask's row offsets (mask.h;
 * with a mask or causal) and delta [Sq], and the dQ accumulator [Sq][D] of
     * the one-pass schedule (bwd_run.c); then per thread: p and ds
     * [block_q][block_kv], two gradient blocks [max(block_q, block_kv)][D],
     * block_kv row pointers, with a mask or causal a tile's bias
     * [block_q][block_kv], and its fxa_bwd_bad_p. With bf16 compute the K^T, V^T, K, Q and
     * dO areas hold bf16 in the layouts of fxa_attn_bwd_tile_bf16 (K as key
     * pairs, Q and dO as rows), the Q and dO row pairs follow in qp and dop,
     * and a thread's p area holds P and dS in row pairs, its ds area the dS
     * rows (bwd_bf16.c). */
    size_t ws_zero_vt; /* dropout: zero V^T panels of one key block */
    size_t ws_kt;
    size_t ws_vt;
    size_t ws_k;
    size_t ws_q;
    size_t ws_do;
    size_t ws_lse2;
    size_t ws_inv_sum;
    size_t ws_center;
    size_t ws_off;
    size_t ws_qp;
    size_t ws_dop;
    size_t ws_delta;
    size_t ws_dq;
    size_t ws_threads;
    size_t thread_bytes;
    size_t ws_total;
};

/* A thread's first recomputed P above FXA_BWD_P_LIMIT (bwd_run.c), kept in
 * its workspace area: where, and the value. */
typedef struct fxa_bwd_bad_p {
    int found;
    float p;
    int64_t batch;
    int64_t head;
    int64_t token;
} fxa_bwd_bad_p;

/* A recomputed P past this (or NaN) means an lse that is not the forward's:
 * the forward's gives P <= 1 up to rounding. */
#define FXA_BWD_P_LIMIT 2.0f

/* 1 when the one-pass schedule (one item per kv head, 10 units of work
 * each) beats the two passes (14 units spread evenly) for a chunk of
 * `chunk` kv heads on n_threads threads: 10 ceil(chunk / T) <= 14 chunk / T.
 * The schedules give the same bits, so the choice may follow the threads. */
/* The share of the weights dropout keeps, 1 - dropout_p (1 without
 * dropout): delta is scaled by it and the gradients' stores divide by it. */
static inline double fxa_bwd_keep(const fxa_attn_plan *p)
{
    return 1.0 - p->d.dropout_p;
}

static inline int fxa_bwd_one_pass(int64_t chunk, int64_t n_threads)
{
    const int64_t waves = (chunk + n_threads - 1) / n_threads;
    return 5 * n_threads * waves <= 7 * chunk;
}

/* Refuse outputs (dq, dk, dv, the workspace) that overlap an input (the
 * mask included) or each other, a missing or bad mask (fxa_mask_check),
 * then non-finite inputs (named with their position; lse may be -INFINITY
 * with a mask) and inputs whose norms' products (q.k, dout.v) pass 2^120,
 * the values checked on the context's threads; scratch: thread 0's 2 D
 * floats, thread k's stride k floats further. bwd_check.c. */
fxa_status fxa_bwd_check_inputs(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a,
                                void *workspace, float *scratch, size_t stride);

/* Where a prep writes its rows' P parameters (fxa_attn_bwd_tile): lse2,
 * inv_sum, center, and with a mask or causal the rows' bias offsets (NULL
 * without one). */
typedef struct fxa_bwd_rows_p {
    float *lse2;
    float *inv_sum;
    float *center;
    float *off;
} fxa_bwd_rows_p;

/* The P of n rows i0.. of query head h (batch b) as the tiles take it,
 * into out: from a->lse_parts when given (the forward's shift, sum and
 * centre: its P), else from a->lse (lse2 = lse log2(e) rounded, inv_sum 1,
 * center 0), and each row's bias offset (fxa_mask_row_max). A row with lse
 * -INFINITY gets lse2 +INFINITY and inv_sum 0 (p = 0). bwd_rows.c. */
void fxa_bwd_rows_shift(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a, int64_t b,
                        int64_t h, int64_t i0, size_t n, fxa_bwd_rows_p out);

/* The P parameters of chunk row row0 on in workspace ws (bwd_rows.c). */
fxa_bwd_rows_p fxa_bwd_rows_p_at(const fxa_attn_bwd_plan *bp, unsigned char *ws, size_t row0);

/* bf16 compute (bwd_bf16.c). Prep of key block kb of kv head kvh (batch b)
 * into chunk slot `slot`: K and V pair panels, K key pairs; scratch holds
 * block_kv rows of D floats, scratch16 as many bf16 rows, rows block_kv
 * pointers. */
void fxa_bwd_prep_kv_bf16(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a,
                          unsigned char *ws, int64_t b, int64_t kvh, int64_t slot, int64_t kb,
                          float *scratch, float *scratch16, const void **rows);
/* Prep of query block qb of query head h (chunk query head cq): Q and dO
 * rows and row pairs, lse2 and delta; scratch and scratch2 hold block_q
 * rows of D floats. */
void fxa_bwd_prep_q_bf16(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *a, unsigned char *ws,
                         int64_t b, int64_t h, int64_t cq, int64_t qb, float *scratch,
                         float *scratch2);
/* The bf16 tile of chunk query head cq's block qb against chunk slot
 * `slot`'s key block kb; p_area, ds_area: the thread's p and ds scratch. */
fxa_attn_bwd_tile_bf16 fxa_bwd_tile_bf16(const fxa_attn_bwd_plan *bp, unsigned char *ws, int64_t cq,
                                         int64_t qb, int64_t slot, int64_t kb, float *p_area,
                                         float *ds_area);

#endif
