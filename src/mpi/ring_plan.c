/* The ring's buffers (ring.h), sized from the plan: an accumulator per
 * segment (its block table reserved for the R blocks of a pass), 2
 * (prefetch + 1) slots of the largest K/V block, the requests of
 * every slot's messages and the summaries' buffers. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "ring.h"
#include "base/alloc.h"

/* Elements per message: INT_MAX (MPI counts are ints). Test only:
 * FXA_MPI_TEST_MAX_ELEMENTS (a positive count below that, read by
 * fxa_mpi_create) forces small pieces, so that tests of the pieces need no
 * 8 GB blocks. */
static int64_t piece_elems(const fxa_mpi *m)
{
    const int64_t cap = m->test_max_elements;
    return cap > 0 && cap < INT_MAX ? cap : INT_MAX;
}

/* The sizes of r from the plan. */
static void size_ring(const fxa_mpi_attn_plan *p, fxa_ring_bufs *r, size_t *most_summary)
{
    const fxa_mpi *m = p->m;
    r->depth = m->prefetch + 1;
    r->per_key = p->d.batch * fxa_mpi_loc_hkv(p) * p->d.head_dim;
    r->type = p->es == 4 ? MPI_FLOAT : MPI_UINT16_T;
    r->piece = piece_elems(m);
    const int64_t most = r->per_key * p->max_blk_skv;
    r->pieces = (int)(most > r->piece ? (most + r->piece - 1) / r->piece : 1);
    r->n_req = 4 * r->depth * r->pieces;
    r->slot_bytes = (size_t)most * p->es;
    r->sum_len = 1;
    *most_summary = 0;
    for (int i = 0; i < p->n_seg; i++) {
        const size_t len = fxa_kv_summary_len(p->seg[i].plan);
        r->sum_len += fxa_ring_seg_len(p, i);
        *most_summary = len > *most_summary ? len : *most_summary;
    }
}

fxa_status fxa_ring_plan(fxa_mpi_attn_plan *p, char *msg, size_t cap)
{
    const fxa_mpi *m = p->m;
    fxa_ring_bufs *r = calloc(1, sizeof *r);
    p->ring_bufs = r;
    if (!r) {
        snprintf(msg, cap, "out of memory for the ring's buffers");
        return FXA_ERR_NO_MEMORY;
    }
    if (p->n_seg == 0)
        return FXA_OK; /* no heads in this column: nothing to compute or send */
    size_t most_summary;
    size_ring(p, r, &most_summary);
    const size_t ring = (size_t)m->ring;
    /* The slots and the accumulators' row state (their workspaces are the
     * segment plans', each within the memory available). */
    const double rows = (double)p->d.batch * (double)fxa_mpi_loc_hq(p) * (double)p->loc_sq;
    const fxa_status sm = fxa_mpi_plan_take(
        p, 2.0 * r->depth * (double)r->slot_bytes + rows * (double)(p->d.head_dim + 5) * 4.0,
        "the ring's K/V slots and accumulators", msg, cap);
    if (sm != FXA_OK)
        return sm;
    r->accs = calloc((size_t)p->n_seg, sizeof *r->accs);
    r->slots = malloc(2 * (size_t)r->depth * r->slot_bytes + 1);
    r->req = malloc((size_t)r->n_req * sizeof *r->req);
    r->mine = calloc(r->sum_len, sizeof(double));
    r->all = calloc(r->sum_len * ring, sizeof(double));
    r->sums = calloc(r->sum_len * ring + 1, sizeof(double)); /* also the query norms' room */
    if (!r->accs || !r->slots || !r->req || !r->mine || !r->all || !r->sums) {
        snprintf(msg, cap, "out of memory for the ring's buffers (%zu bytes of K/V slots)",
                 2 * (size_t)r->depth * r->slot_bytes);
        return FXA_ERR_NO_MEMORY;
    }
    for (int i = 0; i < p->n_seg; i++) {
        fxa_status st = fxa_attn_acc_create(p->seg[i].plan, &r->accs[i]);
        if (st == FXA_OK)
            st = fxa_attn_acc_reserve(r->accs[i], m->ring); /* a pass adds R blocks */
        if (st != FXA_OK) {
            snprintf(msg, cap, "%s", fxa_ctx_last_error(m->ctx));
            return st;
        }
    }
    return FXA_OK;
}

void fxa_ring_plan_free(fxa_mpi_attn_plan *p)
{
    fxa_ring_bufs *r = p->ring_bufs;
    if (!r)
        return;
    for (int i = 0; r->accs && i < p->n_seg; i++)
        fxa_attn_acc_destroy(r->accs[i]);
    FXA_FREE_EACH(r->accs, r->slots, r->req, r->mine, r->all, r->sums, r);
    p->ring_bufs = NULL;
}
