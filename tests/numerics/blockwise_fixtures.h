/*
 * Blockwise attention over a test case's keys split into blocks
 * (test_attn_blockwise, test_attn_reproducible): the blocks sliced out of
 * the case, summarised, added in a given order and finished.
 */
#ifndef FXT_BLOCKWISE_FIXTURES_H
#define FXT_BLOCKWISE_FIXTURES_H

#include <stdlib.h>
#include <string.h>

#include "testutil.h"

/* Copy keys [j0, j0 + n) of K and V (the case's dtype) into block arrays
 * laid out like the case with seq_kv = n. */
static inline void slice_kv(const tcase *t, int64_t j0, int64_t n, void *k_out, void *v_out)
{
    const fxa_attn_desc *d = &t->d;
    const int wide = d->dtype != FXA_F32;
    const size_t es = wide ? 2 : 4;
    const size_t row = (size_t)d->head_dim * es;
    for (int64_t b = 0; b < d->batch; b++) {
        for (int64_t h = 0; h < d->heads_kv; h++) {
            for (int64_t j = 0; j < n; j++) {
                const int64_t src = tcase_kv_off(t, b, h, j0 + j);
                const int64_t dst = d->layout == FXA_LAYOUT_BSHD
                                        ? ((b * n + j) * d->heads_kv + h) * d->head_dim
                                        : ((b * d->heads_kv + h) * n + j) * d->head_dim;
                memcpy((char *)k_out + (size_t)dst * es,
                       wide ? (const void *)(t->k16 + src) : (const void *)(t->k + src), row);
                memcpy((char *)v_out + (size_t)dst * es,
                       wide ? (const void *)(t->v16 + src) : (const void *)(t->v + src), row);
            }
        }
    }
}

typedef struct run_out {
    float *out;
    float *lse;
    uint8_t *fb;
    float *bound;
    fxa_attn_stats st;
} run_out;

static inline void run_out_init(run_out *o, const tcase *t)
{
    const size_t rows = (size_t)(t->d.batch * t->d.heads_q * t->d.seq_q);
    o->out = calloc((size_t)t->nq, sizeof(float));
    o->lse = calloc(rows, sizeof(float));
    o->fb = calloc(rows, 1);
    o->bound = calloc(rows, sizeof(float));
}

static inline void run_out_free(run_out *o)
{
    free(o->out);
    free(o->lse);
    free(o->fb);
    free(o->bound);
}

/* t's attention with its keys split into n_blocks blocks of sizes[b] (in key
 * order, summarised in that order), added in order[], into o. */
static inline fxa_status run_blocks(fxa_ctx *ctx, const tcase *t, const int64_t *sizes,
                                    int n_blocks, const int *order, run_out *o)
{
    fxa_attn_desc d = t->d;
    int64_t max_n = 1;
    for (int b = 0; b < n_blocks; b++)
        max_n = sizes[b] > max_n ? sizes[b] : max_n;
    d.seq_kv = max_n;
    fxa_attn_plan *plan = NULL;
    size_t ws = 0;
    fxa_status st = fxa_attn_plan_create(ctx, &d, &plan, &ws);
    if (st != FXA_OK)
        return st;
    const size_t es = d.dtype == FXA_F32 ? 4 : 2;
    const size_t len = fxa_kv_summary_len(plan);
    const size_t blk_elems = (size_t)(d.batch * d.heads_kv * max_n * d.head_dim);
    double *sums = calloc((size_t)n_blocks * len, sizeof(double));
    char *kb = malloc((size_t)n_blocks * blk_elems * es);
    char *vb = malloc((size_t)n_blocks * blk_elems * es);
    int64_t j0 = 0;
    for (int b = 0; b < n_blocks && st == FXA_OK; b++) {
        slice_kv(t, j0, sizes[b], kb + (size_t)b * blk_elems * es, vb + (size_t)b * blk_elems * es);
        st = fxa_kv_summarize(plan, kb + (size_t)b * blk_elems * es,
                              vb + (size_t)b * blk_elems * es, sizes[b], sums + (size_t)b * len);
        j0 += sizes[b];
    }
    fxa_attn_acc *acc = NULL;
    if (st == FXA_OK)
        st = fxa_attn_acc_create(plan, &acc);
    if (st == FXA_OK)
        st = fxa_attn_acc_begin(acc, d.dtype == FXA_F32 ? (const void *)t->q : (const void *)t->q16,
                                sums, n_blocks);
    for (int i = 0; i < n_blocks && st == FXA_OK; i++) {
        const int b = order[i];
        st = fxa_attn_acc_add(acc, kb + (size_t)b * blk_elems * es, vb + (size_t)b * blk_elems * es,
                              sizes[b]);
    }
    if (st == FXA_OK) {
        const fxa_attn_args a = {.struct_size = sizeof a,
                                 .out = o->out,
                                 .lse = o->lse,
                                 .row_fallback = o->fb,
                                 .row_bound = o->bound};
        o->st.struct_size = sizeof o->st;
        st = fxa_attn_acc_finish(acc, &a, &o->st);
    }
    fxa_attn_acc_destroy(acc);
    fxa_attn_plan_destroy(plan);
    free(sums);
    free(kb);
    free(vb);
    return st;
}

#endif
