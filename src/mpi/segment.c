/* The local attention problems after the Ulysses exchange (segments): their
 * plans and their runs on the core library. */
#include "mpi_internal.h"

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        const int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

fxa_status fxa_mpi_local_plan(const fxa_mpi_attn_plan *p, int64_t batch, int64_t nq, int64_t nk,
                              fxa_layout l, fxa_attn_plan **out, size_t *ws_bytes)
{
    fxa_attn_desc ld = p->d;
    ld.batch = batch;
    ld.heads_q = nq;
    ld.heads_kv = nk;
    ld.seq_q = p->loc_sq > 0 ? p->loc_sq : 1; /* no queries: never run */
    ld.seq_kv = p->max_blk_skv > 0 ? p->max_blk_skv : 1;
    ld.layout = l;
    ld.heads_per_tile = (int)gcd64(p->d.heads_per_tile > 0 ? p->d.heads_per_tile : 1, nq);
    return fxa_attn_plan_create(p->m->ctx, &ld, out, ws_bytes);
}

void fxa_mpi_add_stats(fxa_attn_stats *sum, const fxa_attn_stats *one)
{
    sum->fallback_rows += one->fallback_rows;
    sum->vmax = one->vmax > sum->vmax ? one->vmax : sum->vmax;
    sum->max_bound = one->max_bound > sum->max_bound ? one->max_bound : sum->max_bound;
}

fxa_status fxa_mpi_run_segment(fxa_mpi_attn_plan *p, const fxa_mpi_local *loc,
                               const fxa_mpi_segment *s, void *ws, fxa_attn_stats *sum)
{
    const int64_t row = fxa_mpi_seg_row(p, s);
    const int64_t kv = fxa_mpi_seg_kv(p, s, p->blk_skv[0]);
    const fxa_attn_args a = {
        .struct_size = sizeof a,
        .q = loc->q + row * p->d.head_dim * (int64_t)p->es,
        .k = loc->k + kv * (int64_t)p->es,
        .v = loc->v + kv * (int64_t)p->es,
        .out = loc->out + row * p->d.head_dim,
        .lse = loc->lse ? loc->lse + row : NULL,
        .lse_parts = loc->parts ? loc->parts + 3 * row : NULL,
        .row_fallback = loc->fb ? loc->fb + row : NULL,
        .row_bound = loc->bound ? loc->bound + row : NULL,
    };
    fxa_attn_stats one = {.struct_size = sizeof one};
    const fxa_status st = fxa_attn_run(s->plan, &a, ws, &one);
    if (st != FXA_OK)
        return fxa_mpi_fail(p->m, st, "%s", fxa_ctx_last_error(p->m->ctx));
    fxa_mpi_add_stats(sum, &one);
    return FXA_OK;
}
