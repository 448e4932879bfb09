/* Distributed plans: agree on the descriptor, split sequences and heads,
 * plan each rank's local attention problems (segments), and allocate
 * everything the runs use: the ring's (ring_plan.c), the Ulysses
 * exchange's (ulysses_plan.c) and the local runs' workspace. */
#include <stdio.h>
#include <stdlib.h>

#include "mpi_begin.h"
#include "mpi_internal.h"
#include "ring.h"
#include "ulysses.h"

void fxa_mpi_attn_step_times(const fxa_mpi_attn_plan *p, int *n_steps, const double **compute,
                             const double **wait)
{
    *n_steps = p && p->m->ring > 1 ? p->m->ring : 0;
    *compute = p ? p->step_compute : NULL;
    *wait = p ? p->step_wait : NULL;
}

void fxa_mpi_attn_plan_destroy(fxa_mpi_attn_plan *p)
{
    if (!p)
        return;
    fxa_ulysses_plan_free(p);
    fxa_ring_plan_free(p);
    free(p->ws);
    for (int i = 0; i < p->n_seg; i++)
        fxa_attn_plan_destroy(p->seg[i].plan);
    free(p->seg);
    free(p->tables);
    free(p);
}

static fxa_status make_plan(fxa_mpi *m, const fxa_attn_desc *d, fxa_mpi_attn_plan **out);

fxa_status fxa_mpi_attn_plan_create(fxa_mpi *m, const fxa_attn_desc *d, fxa_mpi_attn_plan **out)
{
    fxa_attn_desc full;
    const fxa_status st = fxa_mpi_plan_begin(m, d, out != NULL, 0, &full);
    if (out)
        *out = NULL;
    return st == FXA_OK ? make_plan(m, &full, out) : st;
}

/* Ulysses head split. With Hkv >= U whole kv heads (and their query heads)
 * go to each rank; otherwise query heads are split and each rank receives
 * (replicates) the kv heads its query heads use. */
static void split_heads(fxa_mpi_attn_plan *p)
{
    const fxa_attn_desc *d = &p->d;
    const int n = p->m->ulysses;
    const int64_t group = d->heads_q / d->heads_kv;
    for (int u = 0; u < n; u++) {
        if (d->heads_kv >= n) {
            fxa_mpi_split(d->heads_kv, n, u, &p->hkv_lo[u], &p->hkv_hi[u]);
            p->hq_lo[u] = p->hkv_lo[u] * group;
            p->hq_hi[u] = p->hkv_hi[u] * group;
        } else {
            fxa_mpi_split(d->heads_q, n, u, &p->hq_lo[u], &p->hq_hi[u]);
            p->hkv_lo[u] = p->hq_lo[u] / group;
            p->hkv_hi[u] = p->hq_hi[u] > p->hq_lo[u] ? (p->hq_hi[u] - 1) / group + 1 : p->hkv_lo[u];
        }
    }
}

/* Tokens of ring block c: the shards of ranks c*U .. c*U + U - 1. */
static int64_t block_tokens(const fxa_attn_desc *d, int64_t seq, const fxa_mpi *m, int c)
{
    int64_t lo;
    int64_t len;
    int64_t hi;
    fxa_mpi_shard_of(d, seq, m->size, c * m->ulysses, &lo, &len);
    fxa_mpi_shard_of(d, seq, m->size, c * m->ulysses + m->ulysses - 1, &hi, &len);
    return hi + len - lo;
}

/* Everything the runs use besides the caller's tensors: the Ulysses
 * exchange's buffers (U > 1: with R == 1 its pipeline's plans and their
 * workspace), the ring's (R > 1), and with U == R == 1 the workspace of the
 * largest segment. */
static fxa_status plan_buffers(fxa_mpi_attn_plan *p, char *msg, size_t cap)
{
    const fxa_mpi *m = p->m;
    fxa_status st = FXA_OK;
    p->mem_avail = fxa_available_memory();
    if (m->ulysses > 1)
        st = fxa_ulysses_plan(p, msg, cap);
    if (st == FXA_OK && m->ring > 1)
        st = fxa_ring_plan(p, msg, cap);
    for (int i = 0; m->ulysses == 1 && m->ring == 1 && i < p->n_seg; i++)
        p->ws_bytes = p->seg[i].ws_bytes > p->ws_bytes ? p->seg[i].ws_bytes : p->ws_bytes;
    if (st == FXA_OK && p->ws_bytes)
        st = fxa_mpi_plan_take(p, (double)p->ws_bytes, "the local workspace", msg, cap);
    if (st == FXA_OK && p->ws_bytes) {
        p->ws = aligned_alloc(64, (p->ws_bytes + 63) / 64 * 64);
        if (!p->ws) {
            snprintf(msg, cap, "out of memory for the local workspace (%zu bytes)", p->ws_bytes);
            st = FXA_ERR_NO_MEMORY;
        }
    }
    return st;
}

/* The local problems: one for the whole local head range, or with
 * replicated kv heads one per (batch, kv head). */
static fxa_status make_segments(fxa_mpi_attn_plan *p, char *msg, size_t cap)
{
    const fxa_mpi *m = p->m;
    const fxa_attn_desc *d = &p->d;
    const int64_t group = d->heads_q / d->heads_kv;
    const int64_t qa = p->hq_lo[m->u];
    const int64_t qb = p->hq_hi[m->u];
    const int64_t ka = p->hkv_lo[m->u];
    const int64_t kb = p->hkv_hi[m->u];
    if (qb == qa)
        return FXA_OK; /* no heads here (Hq < U) */
    const int aligned = qa == ka * group && qb == kb * group;
    const int64_t n = aligned ? 1 : d->batch * (kb - ka);
    p->seg = calloc((size_t)n, sizeof *p->seg);
    if (!p->seg) {
        snprintf(msg, cap, "out of memory");
        return FXA_ERR_NO_MEMORY;
    }
    for (int64_t i = 0; i < n; i++) {
        fxa_mpi_segment *s = &p->seg[i];
        if (aligned) {
            *s = (fxa_mpi_segment){0, d->batch, 0, qb - qa, 0, kb - ka, NULL, 0};
        } else {
            const int64_t kv = ka + i % (kb - ka);
            const int64_t h0 = kv * group > qa ? kv * group : qa;
            const int64_t h1 = (kv + 1) * group < qb ? (kv + 1) * group : qb;
            *s = (fxa_mpi_segment){i / (kb - ka), 1, h0 - qa, h1 - h0, kv - ka, 1, NULL, 0};
        }
        size_t ws;
        fxa_status st =
            fxa_mpi_local_plan(p, s->n_batch, s->n_q, s->n_kv, p->loc_layout, &s->plan, &ws);
        s->ws_bytes = ws;
        p->n_seg = (int)i + 1;
        if (st != FXA_OK) {
            snprintf(msg, cap, "%s", fxa_ctx_last_error(m->ctx));
            return st;
        }
    }
    return FXA_OK;
}

/* The rest of fxa_mpi_attn_plan_create, on the agreed descriptor d. */
static fxa_status make_plan(fxa_mpi *m, const fxa_attn_desc *d, fxa_mpi_attn_plan **out)
{
    char msg[512] = "";
    fxa_status st = FXA_OK;
    fxa_mpi_attn_plan *p = calloc(1, sizeof *p);
    const size_t nu = (size_t)m->ulysses, nr = (size_t)m->ring;
    /* The small tables in one block of 8-byte words: four of U int64 (the
     * head ranges), R int64 (the ring blocks) and 2 R doubles (step times). */
    if (p && (p->tables = calloc(4 * nu + 3 * nr, 8)) != NULL) {
        int64_t *t = p->tables;
        p->hq_lo = t;
        p->hq_hi = t + nu;
        p->hkv_lo = t + 2 * nu;
        p->hkv_hi = t + 3 * nu;
        p->blk_skv = t + 4 * nu;
        p->step_compute = (double *)(t + 4 * nu + nr);
        p->step_wait = p->step_compute + nr;
    }
    if (!p || !p->tables) {
        st = FXA_ERR_NO_MEMORY;
        snprintf(msg, sizeof msg, "out of memory for the distributed plan");
    } else {
        fxa_mpi_plan_init(m, d, 0, &p->m, &p->d, &p->call, &p->es, &p->q_len, &p->kv_len);
        split_heads(p);
        p->loc_sq = block_tokens(d, d->seq_q, m, m->c);
        for (int c = 0; c < m->ring; c++) {
            p->blk_skv[c] = block_tokens(d, d->seq_kv, m, c);
            p->max_blk_skv = p->blk_skv[c] > p->max_blk_skv ? p->blk_skv[c] : p->max_blk_skv;
        }
        p->loc_layout = m->ulysses == 1 ? d->layout : FXA_LAYOUT_BHSD;
        /* No size limit from MPI's int counts: the ring and the Ulysses
         * exchange send in pieces of at most INT_MAX elements. */
        st = make_segments(p, msg, sizeof msg);
        if (st == FXA_OK)
            st = plan_buffers(p, msg, sizeof msg);
    }
    st = fxa_mpi_agree(m, st, msg);
    if (st == FXA_OK)
        *out = p;
    else
        fxa_mpi_attn_plan_destroy(p);
    return st;
}
