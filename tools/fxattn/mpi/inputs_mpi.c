/* Rank 0 reads the inputs and sends the shards (inputs_mpi.h). */
#include "inputs_mpi.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fxattn_mpi.h"

#define PIECE_BYTES (1 << 30) /* bytes per message: MPI counts are ints */

/* Where a shard of `len` tokens from `start` lies in a tensor of seq
 * tokens: `outer` runs of len * inner elements, run o at
 * (o seq + start) inner. */
typedef struct shard_runs {
    int64_t outer, inner;
} shard_runs;

static shard_runs runs_of(const fxa_attn_desc *d, int64_t heads)
{
    if (d->layout == FXA_LAYOUT_BSHD)
        return (shard_runs){d->batch, heads * d->head_dim};
    return (shard_runs){d->batch * heads, d->head_dim};
}

/* Copy the shard [start, start + len) of src (seq tokens) into dst. */
static void pack(const char *src, shard_runs r, int64_t seq, int64_t start, int64_t len, size_t es,
                 char *dst)
{
    const size_t run = (size_t)(len * r.inner) * es;
    for (int64_t o = 0; o < r.outer; o++)
        memcpy(dst + (size_t)o * run, src + (size_t)((o * seq + start) * r.inner) * es, run);
}

/* Send (rank 0) or receive n bytes at buf to / from peer, in pieces. */
static void move_bytes(fxt_world *w, int send, char *buf, size_t n, int peer)
{
    for (size_t at = 0; at < n; at += PIECE_BYTES) {
        const int c = (int)(n - at < PIECE_BYTES ? n - at : PIECE_BYTES);
        MPI_Request r;
        if (send)
            MPI_Isend(buf + at, c, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &r);
        else
            MPI_Irecv(buf + at, c, MPI_BYTE, peer, 0, MPI_COMM_WORLD, &r);
        fxt_world_wait(w, &r, send ? "sending the input shards" : "receiving the input shards");
    }
}

int fxt_inputs_scatter(fxt_world *w, const int *grid_of, const char *q_path, const char *k_path,
                       const char *v_path, fxa_layout layout, const char *dtype_opt, int canonical,
                       fxt_inputs *in)
{
    fxt_inputs whole;
    memset(&whole, 0, sizeof whole);
    memset(in, 0, sizeof *in);
    int code =
        w->rank == 0 ? fxt_inputs_load(q_path, k_path, v_path, layout, dtype_opt, &whole) : 0;
    if ((code = fxt_world_agree(w, code)))
        return code;
    /* The global descriptor (shapes, layout, dtype) from rank 0. */
    MPI_Request r;
    in->d = whole.d;
    MPI_Ibcast(&in->d, (int)sizeof in->d, MPI_BYTE, 0, MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, "the inputs' shapes");
    in->d.reproducible = canonical; /* the split; the options come later */
    const fxa_attn_desc *d = &in->d;
    const size_t es = d->dtype == FXA_F32 ? 4 : 2;
    const shard_runs rq = runs_of(d, d->heads_q), rkv = runs_of(d, d->heads_kv);
    fxt_shard(d, d->seq_q, w->size, grid_of[w->rank], &in->q_start, &in->q_len);
    fxt_shard(d, d->seq_kv, w->size, grid_of[w->rank], &in->kv_start, &in->kv_len);
    in->nq = rq.outer * rq.inner * in->q_len;
    in->nkv = rkv.outer * rkv.inner * in->kv_len;
    in->q = malloc((size_t)in->nq * es + 1);
    in->k = malloc((size_t)in->nkv * es + 1);
    in->v = malloc((size_t)in->nkv * es + 1);
    /* Rank 0 packs one shard at a time into a buffer of the largest. */
    size_t most = 0;
    for (int p = 0; w->rank == 0 && p < w->size; p++) {
        int64_t start, len;
        fxt_shard(d, d->seq_q, w->size, p, &start, &len);
        most =
            (size_t)(rq.outer * rq.inner * len) > most ? (size_t)(rq.outer * rq.inner * len) : most;
        fxt_shard(d, d->seq_kv, w->size, p, &start, &len);
        most = (size_t)(rkv.outer * rkv.inner * len) > most ? (size_t)(rkv.outer * rkv.inner * len)
                                                            : most;
    }
    char *stage = w->rank == 0 ? malloc(most * es + 1) : NULL;
    if (!in->q || !in->k || !in->v || (w->rank == 0 && !stage))
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for this rank's input shards");
    if ((code = fxt_world_agree(w, code))) {
        free(stage);
        fxt_inputs_free(&whole);
        fxt_inputs_free(in);
        return code;
    }
    char *mine[3] = {in->q, in->k, in->v};
    for (int t = 0; t < 3; t++) {
        const int is_q = t == 0;
        const shard_runs runs = is_q ? rq : rkv;
        const int64_t seq = is_q ? d->seq_q : d->seq_kv;
        if (w->rank != 0) {
            move_bytes(w, 0, mine[t], (size_t)(is_q ? in->nq : in->nkv) * es, 0);
            continue;
        }
        const char *src = t == 0 ? whole.q : t == 1 ? whole.k : whole.v;
        for (int p = 0; p < w->size; p++) {
            int64_t start, len;
            fxt_shard(d, seq, w->size, grid_of[p], &start, &len);
            pack(src, runs, seq, start, len, es, p == 0 ? mine[t] : stage);
            if (p > 0)
                move_bytes(w, 1, stage, (size_t)(runs.outer * runs.inner * len) * es, p);
        }
    }
    free(stage);
    fxt_inputs_free(&whole);
    return 0;
}
