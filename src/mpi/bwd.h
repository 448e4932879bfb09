/* The distributed backward (fxa_mpi_attn_bwd_*): its plan (bwd_plan.c)
 * and its run (bwd_run.c). Pure Ulysses: the shards go to head sharding,
 * the local backward runs on this rank's heads over the whole sequence,
 * and the gradients come back to token sharding. */
#ifndef FXA_MPI_BWD_H
#define FXA_MPI_BWD_H

#include "mpi_internal.h"

/* Most bytes in one message (MPI counts are int). */
#define FXA_BWD_PIECE ((int64_t)1 << 30)

struct fxa_mpi_attn_bwd_plan {
    fxa_mpi *m;
    fxa_attn_desc d; /* global */
    uint64_t call;   /* names its runs in the first agreement (never 0) */
    size_t es;       /* bytes per Q, K, V element */
    int64_t q_len;   /* this rank's query and key shards */
    int64_t kv_len;
    /* Member v of the row (U == P ranks) holds q heads [hq[v], hq[v + 1])
     * and kv heads [hkv[v], hkv[v + 1]), query tokens [tq[v], tq[v + 1])
     * and key tokens [tk[v], tk[v + 1]). */
    int64_t *hq, *hkv, *tq, *tk;
    /* Byte offsets of each member's section in the staging, way in and
     * back ([U + 1] each). */
    int64_t *in_send_at, *in_recv_at, *back_send_at, *back_recv_at;
    void *tables;             /* owns the eight arrays above */
    fxa_attn_bwd_plan *local; /* this rank's heads, whole sequence (U > 1: BHSD) */
    void *ws;                 /* its workspace (64-byte aligned) */
    size_t ws_bytes;
    /* U > 1: the head-sharded tensors (BHSD, whole sequence) and staging. */
    char *q, *k, *v;
    float *out, *dout, *lse, *dq, *dk, *dv;
    char *send, *recv;
    void *bufs; /* owns q .. recv */
    MPI_Request *req;
    int n_req;
};

/* Row (b, h, t) of a [B, heads, seq] grid of rows in layout l, counted in
 * rows from the start. */
static inline int64_t fxa_bwd_row(fxa_layout l, int64_t b, int64_t h, int64_t t, int64_t heads,
                                  int64_t seq)
{
    return l == FXA_LAYOUT_BSHD ? (b * seq + t) * heads + h : (b * heads + h) * seq + t;
}

#endif
