/*
 * The attention backward driver (FlashAttention-2's recurrence,
 * docs/numerics.md "Backward"). After the inputs are checked, chunk by
 * chunk of kv heads:
 *   1. prep: K rows (fp32), K^T and V^T in the kernels' panels, per kv head;
 *      Q and dO rows (fp32), the row's shift lse2 and 1 / sum inv_sum (from
 *      the forward's lse parts, else from lse log2(e)) and delta = dO . O (in
 *      double, rounded once), per query head;
 * then one of two schedules, which give the same bits:
 *   two passes (when one item per kv head would leave threads idle):
 *   2. dK, dV: one work item per (kv head, key block) owns its keys' dK and
 *      dV and sums over the kv head's query heads and every query block in
 *      a fixed order;
 *   3. dQ: one work item per (query head, query block) owns its rows' dQ and
 *      sums over every key block in order (recomputing P and dS);
 *   one pass (enough kv heads for the threads): one work item per kv head
 *      runs the key blocks in order, each over the query heads and blocks in
 *      the same order, and adds each tile's dS K into the head's dQ
 *      accumulator right after its dK, dV (P and dS computed once).
 * Either way every gradient element is the same chain of additions in the
 * same order (dK, dV over (query head, query block, row); dQ over (key
 * block, key)) of the same tile values, so results do not depend on the
 * thread count (no atomics). P and dS never outlive a tile. With bf16
 * compute the prep and the tiles are bwd_bf16.c's (bf16 pair layouts); the
 * schedules and orders are the same.
 * Masks and causal (tile_mask, either compute): a tile whose keys every row
 * masks adds only zeros and is skipped, in both schedules alike; causal
 * tiles stop at the last key their last row sees; the others take the
 * mask's bias in P.
 */
#include <math.h>
#include <string.h>

#include "../base/alloc.h"
#include "../base/convert_inline.h"
#include "../base/struct_size.h"
#include "base/clock.h"
#include "bwd_internal.h"
#include "dropout.h"
#include "f64.h"
#include "load.h"
#include "mask.h"

typedef struct bwd_job {
    const fxa_attn_bwd_plan *bp;
    const fxa_attn_bwd_args *a;
    unsigned char *ws;
    int64_t batch;
    int64_t chunk_kv0; /* the chunk's first kv head */
} bwd_job;

/* Thread t's scratch: p, ds [block_q][block_kv], gradient blocks ga, gb
 * [max(block_q, block_kv)][D], row pointers [block_kv], with a mask or
 * causal a tile's bias [block_q][block_kv], and its first P past the limit. */
typedef struct bwd_scratch {
    float *p;
    float *ds;
    float *ga;
    float *gb;
    const void **rows;
    float *bias;
    /* Dropout only (NULL otherwise): a pass's bias [block_q][block_kv], and
     * where the dropped weights' pass writes its dV (discarded) [block_kv][D]. */
    float *drop_bias;
    float *drop_dv;
    fxa_bwd_bad_p *bad;
} bwd_scratch;

static bwd_scratch scratch_of(const bwd_job *job, int t)
{
    const fxa_attn_bwd_plan *bp = job->bp;
    const size_t grad_rows = bp->block_q > bp->block_kv ? bp->block_q : bp->block_kv;
    unsigned char *at = job->ws + bp->ws_threads + (size_t)t * bp->thread_bytes;
    bwd_scratch s;
    s.p = (float *)at;
    at += fxa_align_up(bp->block_q * bp->block_kv * sizeof(float));
    s.ds = (float *)at;
    at += fxa_align_up(bp->block_q * bp->block_kv * sizeof(float));
    s.ga = (float *)at;
    at += fxa_align_up(grad_rows * bp->dim * sizeof(float));
    s.gb = (float *)at;
    at += fxa_align_up(grad_rows * bp->dim * sizeof(float));
    s.rows = (const void **)at;
    at += fxa_align_up(bp->block_kv * sizeof(void *));
    s.bias = fxa_attn_masked(bp->fwd) ? (float *)at : NULL;
    at += fxa_attn_masked(bp->fwd) ? fxa_align_up(bp->block_q * bp->block_kv * sizeof(float)) : 0;
    const int drop = fxa_attn_dropout(bp->fwd);
    s.drop_bias = drop ? (float *)at : NULL;
    at += drop ? fxa_align_up(bp->block_q * bp->block_kv * sizeof(float)) : 0;
    s.drop_dv = drop ? (float *)at : NULL;
    at += drop ? fxa_align_up(bp->block_kv * bp->dim * sizeof(float)) : 0;
    s.bad = (fxa_bwd_bad_p *)at;
    return s;
}

static float *ws_floats(const bwd_job *job, size_t off)
{
    return (float *)(job->ws + off);
}

static size_t rows_in(int64_t total, int64_t start, size_t block)
{
    return (size_t)(total - start < (int64_t)block ? total - start : (int64_t)block);
}

/* Element offset of row (b, h, token i) of a tensor with strides s. */
static int64_t row_at(const fxa_strides *s, int64_t b, int64_t h, int64_t i)
{
    return b * s->batch + h * s->head + i * s->token;
}

/* Prep of key block kb of chunk slot `slot`: K rows, K^T and V^T panels
 * (the last block's pad keys zeroed). */
static void prep_kv(const bwd_job *job, int64_t slot, int64_t kb, const bwd_scratch *s)
{
    const fxa_attn_bwd_plan *bp = job->bp;
    const fxa_attn_plan *p = bp->fwd;
    const fxa_kernels *kern = bp->ctx->kernels;
    const int64_t kvh = job->chunk_kv0 + slot;
    const int64_t j0 = kb * (int64_t)bp->block_kv;
    const size_t n = rows_in(p->d.seq_kv, j0, bp->block_kv);
    const size_t at = ((size_t)slot * bp->kv_pad + (size_t)j0) * bp->dim;
    float *krows = ws_floats(job, bp->ws_k) + at;
    float *kt = ws_floats(job, bp->ws_kt) + at;
    float *vt = ws_floats(job, bp->ws_vt) + at;
    const int64_t k_off = row_at(&p->k_strides, job->batch, kvh, j0);
    const int64_t v_off = row_at(&p->v_strides, job->batch, kvh, j0);
    fxa_load_rows(kern, job->a->k, p->d.dtype, k_off, p->k_strides.token, n, bp->dim, krows,
                  bp->dim);
    fxa_load_rows(kern, job->a->v, p->d.dtype, v_off, p->v_strides.token, n, bp->dim, s->ga,
                  bp->dim);
    if (n < bp->block_kv) {
        memset(kt, 0, bp->block_kv * bp->dim * sizeof(float));
        memset(vt, 0, bp->block_kv * bp->dim * sizeof(float));
    }
    for (size_t j = 0; j < n; j++)
        s->rows[j] = krows + j * bp->dim;
    kern->pack_kt(s->rows, n, bp->dim, bp->panel, kt);
    for (size_t j = 0; j < n; j++)
        s->rows[j] = s->ga + j * bp->dim;
    kern->pack_kt(s->rows, n, bp->dim, bp->panel, vt);
}

/* Prep of query block qb of chunk query head cq: Q and dO rows, lse2,
 * inv_sum, the mask's row offsets and delta. */
static void prep_q(const bwd_job *job, int64_t cq, int64_t qb, const bwd_scratch *s)
{
    const fxa_attn_bwd_plan *bp = job->bp;
    const fxa_attn_plan *p = bp->fwd;
    const fxa_kernels *kern = bp->ctx->kernels;
    const int64_t h = job->chunk_kv0 * p->group + cq;
    const int64_t i0 = qb * (int64_t)bp->block_q;
    const size_t n = rows_in(p->d.seq_q, i0, bp->block_q);
    const size_t row0 = (size_t)(cq * p->d.seq_q + i0);
    float *q = ws_floats(job, bp->ws_q) + row0 * bp->dim;
    float *dout = ws_floats(job, bp->ws_do) + row0 * bp->dim;
    float *delta = ws_floats(job, bp->ws_delta) + row0;
    const int64_t q_off = row_at(&p->q_strides, job->batch, h, i0);
    const int64_t o_off = row_at(&p->o_strides, job->batch, h, i0);
    fxa_load_rows(kern, job->a->q, p->d.dtype, q_off, p->q_strides.token, n, bp->dim, q, bp->dim);
    fxa_load_rows(kern, job->a->dout, p->d.out_dtype, o_off, p->o_strides.token, n, bp->dim, dout,
                  bp->dim);
    fxa_load_rows(kern, job->a->out, p->d.out_dtype, o_off, p->o_strides.token, n, bp->dim, s->ga,
                  bp->dim);
    for (size_t i = 0; i < n; i++) {
        double dot = 0.0;
        for (size_t c = 0; c < bp->dim; c++)
            dot += (double)dout[i * bp->dim + c] * (double)s->ga[i * bp->dim + c];
        delta[i] = (float)(dot * fxa_bwd_keep(p));
    }
    fxa_bwd_rows_shift(bp, job->a, job->batch, h, i0, n, fxa_bwd_rows_p_at(bp, job->ws, row0));
}

static void prep_item(void *arg, int64_t item, int thread_id)
{
    const bwd_job *job = arg;
    const fxa_attn_bwd_plan *bp = job->bp;
    const bwd_scratch s = scratch_of(job, thread_id);
    const int64_t kv_items = bp->chunk_kv_heads * bp->n_kv_blocks;
    const int64_t slot = item / bp->n_kv_blocks, kb = item % bp->n_kv_blocks;
    const int64_t cq = (item - kv_items) / bp->n_q_blocks, qb = (item - kv_items) % bp->n_q_blocks;
    if (bp->bf16 && item < kv_items)
        fxa_bwd_prep_kv_bf16(bp, job->a, job->ws, job->batch, job->chunk_kv0 + slot, slot, kb, s.ga,
                             s.gb, s.rows);
    else if (bp->bf16)
        fxa_bwd_prep_q_bf16(bp, job->a, job->ws, job->batch, job->chunk_kv0 * bp->fwd->group + cq,
                            cq, qb, s.ga, s.gb);
    else if (item < kv_items)
        prep_kv(job, slot, kb, &s);
    else
        prep_q(job, cq, qb, &s);
}

/* The tile of chunk query head cq's query block qb against chunk slot
 * `slot`'s key block kb. */
static fxa_attn_bwd_tile tile_of(const bwd_job *job, const bwd_scratch *s, int64_t cq, int64_t qb,
                                 int64_t slot, int64_t kb)
{
    const fxa_attn_bwd_plan *bp = job->bp;
    const fxa_attn_plan *p = bp->fwd;
    const int64_t i0 = qb * (int64_t)bp->block_q;
    const int64_t j0 = kb * (int64_t)bp->block_kv;
    const size_t row0 = (size_t)(cq * p->d.seq_q + i0);
    const size_t at = ((size_t)slot * bp->kv_pad + (size_t)j0) * bp->dim;
    return (fxa_attn_bwd_tile){
        .n_q = rows_in(p->d.seq_q, i0, bp->block_q),
        .n_kv = rows_in(p->d.seq_kv, j0, bp->block_kv),
        .d = bp->dim,
        .lambda = (float)p->lambda,
        .q = ws_floats(job, bp->ws_q) + row0 * bp->dim,
        .dout = ws_floats(job, bp->ws_do) + row0 * bp->dim,
        .ldq = bp->dim,
        .lse2 = ws_floats(job, bp->ws_lse2) + row0,
        .inv_sum = ws_floats(job, bp->ws_inv_sum) + row0,
        .center = ws_floats(job, bp->ws_center) + row0,
        .delta = ws_floats(job, bp->ws_delta) + row0,
        .kt = ws_floats(job, bp->ws_kt) + at,
        .vt = ws_floats(job, bp->ws_vt) + at,
        .kt_panel = bp->panel,
        .k = ws_floats(job, bp->ws_k) + at,
        .ldk = bp->dim,
        .p = s->p,
        .ds = s->ds,
        .ld_p = bp->block_kv,
        .ldg = bp->dim,
    };
}

/* How the tile of chunk query head cq's block qb (n_q rows) against key
 * block kb (*n_kv keys) meets the mask or causal: FXA_TILE_SKIP when every
 * row masks every key; else *n_kv cut after the last key the block's last
 * row sees (causal), and *bias set (s->bias [block_q][block_kv], pad keys
 * of the last panel -INFINITY) unless no key is masked or biased. */
static fxa_tile_use tile_mask(const bwd_job *job, const bwd_scratch *s, int64_t cq, int64_t qb,
                              int64_t kb, size_t n_q, size_t *n_kv, const float **bias)
{
    const fxa_attn_bwd_plan *bp = job->bp;
    const fxa_attn_plan *p = bp->fwd;
    if (!fxa_attn_masked(p))
        return FXA_TILE_PLAIN;
    const int64_t i0 = qb * (int64_t)bp->block_q;
    const int64_t j0 = kb * (int64_t)bp->block_kv;
    const size_t ld = bp->block_kv;
    if (p->d.causal) {
        const int64_t ic = i0 + fxa_causal_shift(p); /* the first row from the diagonal */
        const int64_t i_last = ic + (int64_t)n_q - 1;
        if (j0 > i_last)
            return FXA_TILE_SKIP;
        if (j0 + (int64_t)*n_kv - 1 > i_last)
            *n_kv = (size_t)(i_last + 1 - j0);
        if (j0 + (int64_t)*n_kv - 1 <= ic)
            return FXA_TILE_PLAIN;
        fxa_causal_bias(ic, n_q, j0, *n_kv, ld, s->bias);
    } else {
        const int64_t h = job->chunk_kv0 * p->group + cq;
        const float *off = ws_floats(job, bp->ws_off) + (size_t)(cq * p->d.seq_q + i0);
        const fxa_tile_use use =
            fxa_mask_tile(p, job->a->mask, job->batch, h, i0, n_q, off, j0, *n_kv, ld, s->bias);
        if (use != FXA_TILE_BIAS)
            return use;
    }
    const size_t end = (*n_kv + bp->panel - 1) / bp->panel * bp->panel;
    for (size_t r = 0; r < n_q; r++)
        for (size_t j = *n_kv; j < end; j++)
            s->bias[r * ld + j] = -INFINITY;
    *bias = s->bias;
    return FXA_TILE_BIAS;
}

/* Row r's P at key j of a tile's P scratch area: fp32 rows ld_p apart, or
 * (bf16) bf16 row pairs, (r, j) at 2 ((r / 2) ld_p + j) + r % 2, widened. */
static float p_at(const float *area, int bf16, size_t ld_p, size_t r, size_t j)
{
    if (!bf16)
        return area[r * ld_p + j];
    const uint16_t bits = ((const uint16_t *)area)[2 * ((r / 2) * ld_p + j) + r % 2];
    return fxa_bf16_bits_to_f32(bits);
}

/* 1 when the tile's n_q x n_kv P are all at most FXA_BWD_P_LIMIT. P is a
 * product of exp2 and a row's 1 / l, never negative, so it is compared by
 * its bits: a non-negative float is at most the limit exactly when its
 * bits are, and NaN's bits are above (so is a sign bit). A max over the
 * bits, which the compiler vectorises: the tile's P costs a few percent of
 * the backward as a branch per element. bf16 P are row pairs (p_at): the
 * full pairs' 2 n_kv halves are contiguous; an odd last row is read alone. */
static int p_within_limit(const float *area, int bf16, size_t ld_p, size_t n_q, size_t n_kv)
{
    const float limit = FXA_BWD_P_LIMIT;
    if (!bf16) {
        uint32_t lim;
        memcpy(&lim, &limit, sizeof lim);
        uint32_t most = 0;
        for (size_t r = 0; r < n_q; r++) {
            const uint32_t *row = (const uint32_t *)(const void *)(area + r * ld_p);
            for (size_t j = 0; j < n_kv; j++)
                most = row[j] > most ? row[j] : most;
        }
        return most <= lim;
    }
    const uint16_t lim = fxa_f32_to_bf16(limit);
    const uint16_t *bits = (const uint16_t *)(const void *)area;
    uint16_t most = 0;
    for (size_t r = 0; r + 1 < n_q; r += 2) {
        const uint16_t *pair = bits + 2 * (r / 2) * ld_p;
        for (size_t j = 0; j < 2 * n_kv; j++)
            most = pair[j] > most ? pair[j] : most;
    }
    if (n_q % 2)
        for (size_t j = 0; j < n_kv; j++) {
            const uint16_t x = bits[2 * ((n_q - 1) / 2 * ld_p + j)];
            most = x > most ? x : most;
        }
    return most <= lim;
}

/* Record in s->bad the tile's first P past FXA_BWD_P_LIMIT (or NaN), if the
 * thread has none yet: n_q rows of chunk query head cq's block qb, n_kv
 * keys. */
static void check_p(const bwd_job *job, const bwd_scratch *s, int64_t cq, int64_t qb, size_t n_q,
                    size_t n_kv)
{
    const fxa_attn_bwd_plan *bp = job->bp;
    if (s->bad->found || p_within_limit(s->p, bp->bf16, bp->block_kv, n_q, n_kv))
        return;
    for (size_t r = 0; r < n_q; r++) {
        for (size_t j = 0; j < n_kv; j++) {
            const float x = p_at(s->p, bp->bf16, bp->block_kv, r, j);
            if (!(x <= FXA_BWD_P_LIMIT)) {
                *s->bad = (fxa_bwd_bad_p){1, x, job->batch, job->chunk_kv0 * bp->fwd->group + cq,
                                          qb * (int64_t)bp->block_q + (int64_t)r};
                return;
            }
        }
    }
}

/* Tile t's kernels (either compute), its bias set: with dk (and dv) dK,
 * dV += (P checked, check_p) and then, with dq, dQ += from the same P and
 * dS; without dk, dQ += alone. */
#define RUN_KERNELS(t, dkdv_fn, dq_fn, dk_, dv_, dq_)                                              \
    do {                                                                                           \
        (t).dk = (dk_);                                                                            \
        (t).dv = (dv_);                                                                            \
        (t).dq = (dq_);                                                                            \
        (t).p_ds_given = 0;                                                                        \
        if ((t).dk) {                                                                              \
            dkdv_fn(&(t));                                                                         \
            check_p(job, s, cq, qb, (t).n_q, (t).n_kv);                                            \
        }                                                                                          \
        (t).p_ds_given = (t).dk != NULL;                                                           \
        if ((t).dq)                                                                                \
            dq_fn(&(t));                                                                           \
    } while (0)

/* Tile t (either compute) under the mask or causal (tile_mask), then its
 * kernels (RUN_KERNELS). */
#define RUN_TILE(t, dkdv_fn, dq_fn)                                                                \
    do {                                                                                           \
        if (tile_mask(job, s, cq, qb, kb, (t).n_q, &(t).n_kv, &(t).bias) == FXA_TILE_SKIP)         \
            return;                                                                                \
        RUN_KERNELS(t, dkdv_fn, dq_fn, dk, dv, dq);                                                \
    } while (0)

/* A dropout pass's bias over the tile (fxa_dropout_bias on the mask's or
 * causal bias `from`, NULL: none), pad keys of the last panel -INFINITY:
 * FXA_TILE_SKIP when it removes every weight. */
static fxa_tile_use drop_bias(const bwd_job *job, const bwd_scratch *s, int64_t cq, int64_t qb,
                              int64_t kb, size_t n_q, size_t n_kv, const float *from,
                              fxa_drop_pass pass)
{
    const fxa_drop_stream stream = {job->a->dropout_seed, job->a->dropout_offset,
                                    job->a->dropout_keep};
    const fxa_attn_bwd_plan *bp = job->bp;
    const fxa_attn_plan *p = bp->fwd;
    const size_t ld = bp->block_kv, end = (n_kv + bp->panel - 1) / bp->panel * bp->panel;
    const fxa_tile_use use = fxa_dropout_bias(
        p, &stream, job->batch, job->chunk_kv0 * p->group + cq, qb * (int64_t)bp->block_q, n_q,
        kb * (int64_t)bp->block_kv, n_kv, ld, from, s->drop_bias, pass);
    for (size_t r = 0; r < n_q; r++)
        for (size_t j = n_kv; j < end; j++)
            s->drop_bias[r * ld + j] = -INFINITY;
    return use;
}

/* Dropout (docs/numerics.md "Dropout"): tile t twice, on the mask's or
 * causal bias: the kept weights (dropped ones -INFINITY), then the dropped
 * ones (kept ones -INFINITY) against zero V^T panels with their dV
 * discarded, so that they add only -P delta to dS. With delta (1 - p) dO.O
 * every sum is (1 - p) times the gradient's, which the stores divide out. */
#define RUN_DROPOUT_TILE(t, dkdv_fn, dq_fn, zero_vt)                                               \
    do {                                                                                           \
        if (tile_mask(job, s, cq, qb, kb, (t).n_q, &(t).n_kv, &(t).bias) == FXA_TILE_SKIP)         \
            return;                                                                                \
        const float *from = (t).bias;                                                              \
        for (int pass = FXA_DROP_KEEP; pass <= FXA_DROP_DROPPED; pass++) {                         \
            if (drop_bias(job, s, cq, qb, kb, (t).n_q, (t).n_kv, from, (fxa_drop_pass)pass) ==     \
                FXA_TILE_SKIP)                                                                     \
                continue;                                                                          \
            (t).bias = s->drop_bias;                                                               \
            if (pass == FXA_DROP_DROPPED)                                                          \
                (t).vt = (zero_vt);                                                                \
            RUN_KERNELS(t, dkdv_fn, dq_fn, dk, pass == FXA_DROP_DROPPED && dv ? s->drop_dv : dv,   \
                        dq);                                                                       \
        }                                                                                          \
    } while (0)

/* The tile of chunk query head cq's block qb against chunk slot `slot`'s
 * key block kb, in the plan's compute (RUN_TILE; with dropout
 * RUN_DROPOUT_TILE). */
static void run_tile(const bwd_job *job, const bwd_scratch *s, int64_t cq, int64_t qb, int64_t slot,
                     int64_t kb, float *dk, float *dv, float *dq)
{
    const fxa_kernels *kern = job->bp->ctx->kernels;
    if (fxa_attn_dropout(job->bp->fwd)) {
        const unsigned char *zero_vt = job->ws + job->bp->ws_zero_vt;
        if (job->bp->bf16) {
            fxa_attn_bwd_tile_bf16 t =
                fxa_bwd_tile_bf16(job->bp, job->ws, cq, qb, slot, kb, s->p, s->ds);
            RUN_DROPOUT_TILE(t, kern->attn_bwd_dkdv_bf16, kern->attn_bwd_dq_bf16,
                             (const uint16_t *)(const void *)zero_vt);
        } else {
            fxa_attn_bwd_tile t = tile_of(job, s, cq, qb, slot, kb);
            RUN_DROPOUT_TILE(t, kern->attn_bwd_dkdv, kern->attn_bwd_dq,
                             (const float *)(const void *)zero_vt);
        }
        return;
    }
    if (job->bp->bf16) {
        fxa_attn_bwd_tile_bf16 t =
            fxa_bwd_tile_bf16(job->bp, job->ws, cq, qb, slot, kb, s->p, s->ds);
        RUN_TILE(t, kern->attn_bwd_dkdv_bf16, kern->attn_bwd_dq_bf16);
    } else {
        fxa_attn_bwd_tile t = tile_of(job, s, cq, qb, slot, kb);
        RUN_TILE(t, kern->attn_bwd_dkdv, kern->attn_bwd_dq);
    }
}

#undef RUN_KERNELS
#undef RUN_TILE
#undef RUN_DROPOUT_TILE

/* Store n rows of a gradient block g [n][D] times scale at element off of
 * dst (dtype: the args' grad_dtype, each value rounded once from fp32),
 * rows `token` elements apart. */
static void store_rows(const float *g, size_t n, size_t dim, float scale, fxa_dtype dtype,
                       void *dst, int64_t off, int64_t token)
{
    for (size_t r = 0; r < n; r++) {
        const float *src = g + r * dim;
        const int64_t at = off + (int64_t)r * token;
        if (dtype == FXA_F32) {
            float *row = (float *)dst + at;
            for (size_t c = 0; c < dim; c++)
                row[c] = scale * src[c];
        } else if (dtype == FXA_BF16) {
            uint16_t *row = (uint16_t *)dst + at;
            for (size_t c = 0; c < dim; c++)
                row[c] = fxa_f32_to_bf16_bits(scale * src[c]);
        } else {
            uint16_t *row = (uint16_t *)dst + at;
            for (size_t c = 0; c < dim; c++)
                row[c] = fxa_f32_to_f16(scale * src[c]);
        }
    }
}

/* Store the thread's dK (times the scale) and dV accumulators of kv head
 * kvh's n keys from key j0 into the caller's dk and dv. */
static void store_kv_grads(const bwd_job *job, const bwd_scratch *s, int64_t kvh, int64_t j0,
                           size_t n)
{
    const fxa_attn_plan *p = job->bp->fwd;
    const size_t dim = job->bp->dim;
    store_rows(s->ga, n, dim, (float)(p->d.scale / fxa_bwd_keep(p)), job->a->grad_dtype, job->a->dk,
               row_at(&p->k_strides, job->batch, kvh, j0), p->k_strides.token);
    store_rows(s->gb, n, dim, (float)(1.0 / fxa_bwd_keep(p)), job->a->grad_dtype, job->a->dv,
               row_at(&p->v_strides, job->batch, kvh, j0), p->v_strides.token);
}

/* dK and dV of chunk slot `slot`'s key block kb over all its query heads
 * and blocks, in that order; with dq (the slot's first query head's dQ
 * accumulator, heads seq_q D floats apart) also dQ += dS K from the same P
 * and dS. */
static void kv_block(const bwd_job *job, const bwd_scratch *s, int64_t slot, int64_t kb, float *dq)
{
    const fxa_attn_bwd_plan *bp = job->bp;
    const fxa_attn_plan *p = bp->fwd;
    const size_t head_rows = (size_t)p->d.seq_q * bp->dim;
    const int64_t j0 = kb * (int64_t)bp->block_kv;
    const size_t n = rows_in(p->d.seq_kv, j0, bp->block_kv);
    memset(s->ga, 0, n * bp->dim * sizeof(float));
    memset(s->gb, 0, n * bp->dim * sizeof(float));
    for (int64_t g = 0; g < p->group; g++) {
        for (int64_t qb = 0; qb < bp->n_q_blocks; qb++) {
            run_tile(job, s, slot * p->group + g, qb, slot, kb, s->ga, s->gb,
                     dq ? dq + (size_t)g * head_rows + (size_t)qb * bp->block_q * bp->dim : NULL);
        }
    }
    store_kv_grads(job, s, job->chunk_kv0 + slot, j0, n);
}

/* dK, dV of chunk slot `slot`'s key block kb; causal items go by key
 * block from the first (the most query rows). */
static void dkdv_item(void *arg, int64_t item, int thread_id)
{
    const bwd_job *job = arg;
    const fxa_attn_bwd_plan *bp = job->bp;
    const bwd_scratch s = scratch_of(job, thread_id);
    if (bp->fwd->d.causal)
        kv_block(job, &s, item % bp->chunk_kv_heads, item / bp->chunk_kv_heads, NULL);
    else
        kv_block(job, &s, item / bp->n_kv_blocks, item % bp->n_kv_blocks, NULL);
}

/* Every gradient of chunk slot `slot`'s kv head in one item: P and dS once
 * per tile, dQ summed over the key blocks in order in the head's
 * accumulator. */
static void head_item(void *arg, int64_t slot, int thread_id)
{
    const bwd_job *job = arg;
    const fxa_attn_bwd_plan *bp = job->bp;
    const fxa_attn_plan *p = bp->fwd;
    const bwd_scratch s = scratch_of(job, thread_id);
    const int64_t kvh = job->chunk_kv0 + slot;
    const size_t head_rows = (size_t)p->d.seq_q * bp->dim;
    float *dq = ws_floats(job, bp->ws_dq) + (size_t)(slot * p->group) * head_rows;
    memset(dq, 0, (size_t)p->group * head_rows * sizeof(float));
    for (int64_t kb = 0; kb < bp->n_kv_blocks; kb++)
        kv_block(job, &s, slot, kb, dq);
    for (int64_t g = 0; g < p->group; g++) {
        const int64_t h = kvh * p->group + g;
        store_rows(dq + (size_t)g * head_rows, (size_t)p->d.seq_q, bp->dim,
                   (float)(p->d.scale / fxa_bwd_keep(p)), job->a->grad_dtype, job->a->dq,
                   row_at(&p->q_strides, job->batch, h, 0), p->q_strides.token);
    }
}

/* dQ of chunk query head cq's query block qb; causal items go by query
 * block from the last (the most keys), so that the threads end on light
 * items. */
static void dq_item(void *arg, int64_t item, int thread_id)
{
    const bwd_job *job = arg;
    const fxa_attn_bwd_plan *bp = job->bp;
    const fxa_attn_plan *p = bp->fwd;
    const bwd_scratch s = scratch_of(job, thread_id);
    const int64_t chunk_q = bp->chunk_kv_heads * p->group;
    const int64_t cq = p->d.causal ? item % chunk_q : item / bp->n_q_blocks;
    const int64_t qb = p->d.causal ? bp->n_q_blocks - 1 - item / chunk_q : item % bp->n_q_blocks;
    const int64_t h = job->chunk_kv0 * p->group + cq;
    const int64_t i0 = qb * (int64_t)bp->block_q;
    const size_t n = rows_in(p->d.seq_q, i0, bp->block_q);
    memset(s.ga, 0, n * bp->dim * sizeof(float));
    for (int64_t kb = 0; kb < bp->n_kv_blocks; kb++)
        run_tile(job, &s, cq, qb, cq / p->group, kb, NULL, NULL, s.ga);
    store_rows(s.ga, n, bp->dim, (float)(p->d.scale / fxa_bwd_keep(p)), job->a->grad_dtype,
               job->a->dq, row_at(&p->q_strides, job->batch, h, i0), p->q_strides.token);
}

/* FXA_ERR_INVALID_ARG naming the first P past FXA_BWD_P_LIMIT that a thread
 * met (the lowest thread's), else FXA_OK. */
static fxa_status bad_p_status(const bwd_job *job)
{
    for (int t = 0; t < job->bp->ctx->pool.n_threads; t++) {
        const fxa_bwd_bad_p *bad = scratch_of(job, t).bad;
        if (bad->found)
            return fxa_ctx_fail(job->bp->ctx, FXA_ERR_INVALID_ARG,
                                "lse is not the forward's for these inputs: the recomputed "
                                "softmax weight P is %g (above %g; the forward's lse gives at "
                                "most 1) at batch %lld, head %lld, token %lld; dq, dk and dv "
                                "are not valid",
                                (double)bad->p, (double)FXA_BWD_P_LIMIT, (long long)bad->batch,
                                (long long)bad->head, (long long)bad->token);
    }
    return FXA_OK;
}

static fxa_status bwd_run(const fxa_attn_bwd_plan *bp, const fxa_attn_bwd_args *args,
                          void *workspace, fxa_attn_bwd_stats *stats_out)
{
    fxa_ctx *ctx = bp->ctx;
    const fxa_attn_plan *p = bp->fwd;
    fxa_attn_bwd_args a = {0};
    fxa_status st =
        fxa_args_in(ctx, &a, sizeof a, args, FXA_ATTN_BWD_ARGS_SIZE_0_3, "fxa_attn_bwd_args");
    if (st != FXA_OK)
        return st;
    if ((st = fxa_struct_out_check(stats_out, FXA_ATTN_BWD_STATS_SIZE_0_3,
                                   sizeof(fxa_attn_bwd_stats), "fxa_attn_bwd_stats",
                                   ctx->last_error, sizeof ctx->last_error)) != FXA_OK)
        return st;
    if (!a.q || !a.k || !a.v || !a.out || !a.dout)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "q, k, v, out and dout must not be NULL (backward)");
    if (!a.dq || !a.dk || !a.dv)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "dq, dk and dv must not be NULL");
    if (!workspace)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "workspace of %zu bytes is missing",
                            bp->ws_total);
    if (((uintptr_t)workspace % FXA_ALIGN) != 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "workspace must be 64-byte aligned");
    if (p->d.dtype == FXA_F64)
        return fxa_f64_bwd_run(p, &a, workspace, bp->ws_total, stats_out);
    if (a.lse_f64)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "lse_f64 is for fp64 plans (dtype FXA_F64); this backward reads lse");
    if (!a.lse)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "lse is missing: the backward needs the forward's lse "
                            "(fxa_attn_args.lse)");
    if (a.grad_dtype != FXA_F32 && a.grad_dtype != FXA_BF16 && a.grad_dtype != FXA_F16)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "grad_dtype %d is not FXA_F32, FXA_BF16 or FXA_F16 (FXA_F64: fp64 "
                            "plans)",
                            (int)a.grad_dtype);
    const double t0 = fxa_now_seconds();
    bwd_job job = {bp, &a, workspace, 0, 0};
    if ((st = fxa_bwd_check_inputs(bp, &a, workspace, scratch_of(&job, 0).ga,
                                   bp->thread_bytes / sizeof(float))) != FXA_OK)
        return st;
    fxa_pool *pool = &ctx->pool;
    for (int t = 0; t < pool->n_threads; t++)
        scratch_of(&job, t).bad->found = 0;
    if (fxa_attn_dropout(p))
        memset((unsigned char *)workspace + bp->ws_zero_vt, 0,
               bp->block_kv * bp->d16 * sizeof(float));
    const int64_t chunk_q = bp->chunk_kv_heads * p->group;
    const int one_pass = fxa_bwd_one_pass(bp->chunk_kv_heads, pool->n_threads);
    for (job.batch = 0; job.batch < p->d.batch; job.batch++) {
        for (job.chunk_kv0 = 0; job.chunk_kv0 < p->d.heads_kv;
             job.chunk_kv0 += bp->chunk_kv_heads) {
            fxa_pool_run(pool, prep_item, &job,
                         bp->chunk_kv_heads * bp->n_kv_blocks + chunk_q * bp->n_q_blocks);
            if (one_pass) {
                fxa_pool_run(pool, head_item, &job, bp->chunk_kv_heads);
                continue;
            }
            fxa_pool_run(pool, dkdv_item, &job, bp->chunk_kv_heads * bp->n_kv_blocks);
            fxa_pool_run(pool, dq_item, &job, chunk_q * bp->n_q_blocks);
        }
    }
    if ((st = bad_p_status(&job)) != FXA_OK)
        return st;
    if (stats_out) {
        const fxa_attn_bwd_stats full = {
            .struct_size = sizeof full,
            .rows = p->d.batch * p->d.heads_q * p->d.seq_q,
            .keys = p->d.seq_kv,
            .seconds = fxa_now_seconds() - t0,
        };
        fxa_struct_out(stats_out, &full, sizeof full);
    }
    return FXA_OK;
}

fxa_status fxa_attn_bwd_run(const fxa_attn_bwd_plan *plan, const fxa_attn_bwd_args *args,
                            void *workspace, fxa_attn_bwd_stats *stats_out)
{
    if (!plan)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(plan->ctx);
    return fxa_ctx_end_with(plan->ctx, bwd_run(plan, args, workspace, stats_out));
}
