/* The distributed backward (fxa_mpi_attn_bwd_*): its plan (bwd_plan.c)
 * and its run (bwd_run.c): Ulysses exchanges (bwd_exchange.c) inside each
 * row (the shards go to head sharding over the row's tokens, the
 * gradients come back to token sharding, a replicated kv head's dK/dV
 * parts summed in member order) around either the local backward (R ==
 * 1, pipelined by groups of heads: group g + 1's inputs and group g - 1's
 * gradients travel while group g computes) or the ring along each column
 * (bwd_ring.c: K/V blocks and their dK/dV accumulators travel, dQ
 * stays). */
#ifndef FXA_MPI_BWD_H
#define FXA_MPI_BWD_H

#include "mpi_internal.h"

/* Most bytes in one message (MPI counts are int), unless the test hook
 * FXA_TEST_ULYSSES_PIECE (fxa_mpi.test_ulysses_piece, bytes here) sets
 * fewer. */
#define FXA_BWD_PIECE ((int64_t)1 << 30)

/* Groups of heads of pure Ulysses (R == 1; at most the most kv heads of a
 * member), unless the test hook FXA_TEST_ULYSSES_GROUPS sets another
 * count. */
#define FXA_BWD_GROUPS 4

struct fxa_mpi_attn_bwd_plan {
    fxa_mpi *m;
    fxa_attn_desc d; /* global */
    uint64_t call;   /* names its runs in the first agreement (never 0) */
    size_t es;       /* bytes per Q, K, V element */
    int64_t piece;   /* most bytes in one message */
    int64_t q_len;   /* this rank's query and key shards */
    int64_t kv_len;
    /* Grid rank v (of P) holds query tokens [tq[v], tq[v + 1]) and key
     * tokens [tk[v], tk[v + 1]); member v of a row q heads [hq[v], hq[v +
     * 1]) and kv heads [hkv_lo[v], hkv_hi[v]); ring block j has blk[j] keys
     * (those of row j). With heads_kv >= U the kv heads are split and each
     * member takes the q heads of its kv heads; with heads_kv < U
     * (replicated) the members are split over the kv heads (consecutive
     * members per kv head), each holds one kv head and a share of its q
     * heads (none where a kv head has fewer q heads than members). */
    int64_t *hq, *hkv_lo, *hkv_hi, *tq, *tk, *blk;
    int replicated;  /* heads_kv < U: dK, dV of a kv head summed over its members */
    int base;        /* grid rank of this row's member 0 */
    int64_t row_sq;  /* the row's query tokens (its ring block) */
    int64_t row_skv; /* and key tokens */
    void *tables;    /* owns the six arrays above */
    /* U > 1: every member's heads split into G groups by kv head (each q
     * head with its kv head; G == 1 with replicated kv heads or R > 1),
     * group g of every member travelling as one step. Byte offsets of
     * (group g, member v)'s section in the staging, way in and back
     * ([G * U + 1] each, at g * U + v), and the first request of each
     * group's receives of the way in ([G + 1]; the sends of both ways and
     * the receives of the way back follow, n_req in all). */
    int groups;
    int64_t *in_send_at, *in_recv_at, *back_send_at, *back_recv_at;
    int *in_req_at;
    void *offsets;             /* owns the five arrays above */
    fxa_attn_bwd_plan *local;  /* U == 1, R == 1: this rank's shards */
    fxa_attn_bwd_plan **gplan; /* U > 1, R == 1: group g's heads, whole sequence (BHSD) */
    void *ws;                  /* their workspace (64-byte aligned) */
    size_t ws_bytes;
    /* U > 1: the head-sharded tensors (whole sequence; group-major: group
     * g's heads as one BHSD tensor after group g - 1's) and the staging of
     * each way. */
    char *q, *k, *v;
    float *out, *dout, *lse, *dq, *dk, *dv;
    char *send, *recv, *send_back, *recv_back;
    float *parts;   /* [rows][3]: the forward's lse_parts, where the run has them */
    void *bufs;     /* owns q .. parts */
    int with_parts; /* this run's ranks passed lse_parts (agreed; U > 1) */
    MPI_Request *req;
    int n_req;
    int n_posted; /* requests posted in this run */
    /* R > 1: the problem the ring runs (ring_d: its heads, layout and
     * queries in seq_q; U == 1 the caller's shards, else the head-sharded
     * tensors), its plans, one per ring block j (its queries against block
     * j's keys; NULL where either is empty), whose workspace is ws, and its
     * buffers (ring_bufs), in ring_d's layout: two slots of a block's K
     * then V, the dK then dV accumulator received and the one sent, one
     * block's part of dK then dV, dQ's part and sum. */
    fxa_attn_desc ring_d;
    fxa_attn_bwd_plan **blk_plan;
    void *ring_bufs;
    char *kv_slot[2];
    float *acc_in, *acc_out, *kv_part, *dq_part, *dq_acc;
    MPI_Request *kv_req, *acc_req; /* n_kv_req and n_acc_req each */
    int n_kv_req, n_acc_req;
};

/* Copy-in of the caller's args into *a (the struct_size policy), then the
 * checks a rank makes before any communication: pointers, and a
 * non-finite input named in global coordinates in msg. Local: the caller
 * agrees (bwd_args.c). */
fxa_status fxa_bwd_take_args(const fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *user,
                             fxa_attn_bwd_args *a, char *msg, size_t cap);

/* The ring's plans and buffers (R > 1; ring_d set), raising ws_bytes to
 * its largest local run; msg says why on failure. */
fxa_status fxa_bwd_ring_plan(fxa_mpi_attn_bwd_plan *p, char *msg, size_t cap);
void fxa_bwd_ring_free(fxa_mpi_attn_bwd_plan *p);
/* The ring's run on the tensors of ring_d's problem in a (q, k, v, out,
 * dout, lse): this rank's own status (its message in m->last_error), then
 * agreed by the caller. On success the gradients are in dq_acc and acc_in
 * until fxa_bwd_ring_write. */
fxa_status fxa_bwd_ring_run(fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a,
                            fxa_mpi_stats *stats);
/* Local: write a's dq, dk, dv (ring_d's problem). */
void fxa_bwd_ring_write(const fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a);

/* The Ulysses exchanges (bwd_exchange.c). */
/* A [B, heads, seq] grid of rows in layout l at base. */
typedef struct fxa_bwd_grid {
    char *base;
    fxa_layout l;
    int64_t heads;
    int64_t seq;
} fxa_bwd_grid;

/* One tensor of an exchange: the side that holds the tokens (`tok`: the
 * caller's shard, every head) and the side that holds the heads (`head`:
 * the plan's BHSD tensor, the whole sequence), with rows of rb bytes. */
typedef struct fxa_bwd_side {
    fxa_bwd_grid tok;
    fxa_bwd_grid head;
    size_t rb;
    int is_kv; /* heads and tokens of K/V (else of Q) */
} fxa_bwd_side;

/* The tensors of each way (the caller's and the plan's sides), in message
 * order: s holds 6 (the way in) or 3 (back); returns the count. */
int fxa_bwd_sides_in(const fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a, fxa_bwd_side *s);
int fxa_bwd_sides_back(const fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *a, fxa_bwd_side *s);

/* Collective over the row, in group order: group g's all-to-all one way.
 * Post every receive (the way in's at p->in_req_at[g], the way back's with
 * the sends after them), pack and send every member's section (this
 * rank's own is packed only). Nothing is waited for: the received sections
 * land in recv (recv_back) and this rank's own stays in send (send_back). */
fxa_status fxa_bwd_post_group(fxa_mpi_attn_bwd_plan *p, const fxa_bwd_side *s, int n_sides,
                              int way_in, int g);

/* Wait for group g's receives of the way in (its sends stay pending, so
 * that no rank waits for a slower peer to take its rows), then unpack
 * every member's section into group g's block of the head-sharded
 * tensors. */
fxa_status fxa_bwd_take_group(fxa_mpi_attn_bwd_plan *p, const fxa_bwd_side *s, int n_sides, int g);

/* Wait for every pending request: the sends of both ways and the receives
 * of the way back. */
fxa_status fxa_bwd_wait_pending(fxa_mpi_attn_bwd_plan *p);

/* Local, after every rank agreed: unpack every group's way back (member
 * v's section of this rank's tokens; this rank's own from send_back) into
 * the caller's dq, dk, dv. */
void fxa_bwd_unpack_back(const fxa_mpi_attn_bwd_plan *p, const fxa_bwd_side *s, int n_sides);

/* Member v's q heads and kv heads. */
static inline int64_t fxa_bwd_nq(const fxa_mpi_attn_bwd_plan *p, int v)
{
    return p->hq[v + 1] - p->hq[v];
}

static inline int64_t fxa_bwd_nk(const fxa_mpi_attn_bwd_plan *p, int v)
{
    return p->hkv_hi[v] - p->hkv_lo[v];
}

/* Local q heads [*q0, *q0 + *nq) and kv heads [*k0, *k0 + *nk) of member
 * v's group g (counted from v's first; empty groups have nk == nq == 0). */
void fxa_bwd_group(const fxa_mpi_attn_bwd_plan *p, int v, int g, int64_t *q0, int64_t *nq,
                   int64_t *k0, int64_t *nk);

/* Messages of at most p->piece bytes that carry `bytes`. */
static inline int64_t fxa_bwd_pieces(const fxa_mpi_attn_bwd_plan *p, int64_t bytes)
{
    return (bytes + p->piece - 1) / p->piece;
}

/* Row (b, h, t) of a [B, heads, seq] grid of rows in layout l, counted in
 * rows from the start. */
static inline int64_t fxa_bwd_row(fxa_layout l, int64_t b, int64_t h, int64_t t, int64_t heads,
                                  int64_t seq)
{
    return l == FXA_LAYOUT_BSHD ? (b * seq + t) * heads + h : (b * heads + h) * seq + t;
}

#endif
