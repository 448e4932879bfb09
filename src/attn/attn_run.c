/*
 * The attention driver: the bound pass, then, chunk by chunk of kv heads,
 * K and V are packed once (fp32, K transposed in tiles) and threads take work
 * items (head tile, query block) of the chunk. Each item owns its rows from
 * start to end (a row's whole key loop runs in one item, in a fixed tile
 * order), so the result does not depend on the thread count, heads_per_tile
 * or block_q.
 *
 * Per row i (docs/numerics.md): U_i = lambda ||q_i|| (radius + eps_radius), where
 * radius is max_j ||k_j - kbar|| (or max ||k_j|| without centring) and
 * eps_radius covers the fp32 rounding of the computed scores (the score
 * error is at most gamma_D ||q|| ||k_j|| plus one rounding of q.kbar, and
 * (D + 2) 2^-23 kmax exceeds both), so U_i bounds the scores the kernel
 * actually computes, not just exact ones. The row runs fixed-max with shift
 * ceil(U_i) - C when ceil(U_i) passes the strict gate, or the centred gate
 * (bound.c) for a centred row whose rounding allowance is <= 1; otherwise
 * it runs online softmax.
 */
#include <math.h>
#include <string.h>
#include <time.h>

#include "fxattn_diag.h"
#include "../base/alloc.h"
#include "../base/struct_size.h"
#include "attn_internal.h"
#include "../kernels/ref/exp2_ref.h"
#include "dropout.h"
#include "f64.h"
#include "mask.h"
#include "scan.h"
#include "steps.h"
#include "base/clock.h"

typedef struct run_job {
    const fxa_attn_plan *p;
    const fxa_attn_args *a;
    unsigned char *ws;
    int bounds_only;
    int64_t batch;     /* the chunk being computed */
    int64_t chunk_kv0; /* its first kv head */
    int64_t item0;     /* the first work item of this pool run */
} run_job;

static fxa_thread_scratch *thread_scratch(const run_job *job, int thread_id)
{
    return (fxa_thread_scratch *)(job->ws + job->p->ws_threads) + thread_id;
}

/* The rows of `rows` from its row r on (a NULL array stays NULL). */
static fxa_rows rows_from(const fxa_attn_plan *p, const fxa_rows *rows, size_t r)
{
    return (fxa_rows){
        .q = rows->q ? rows->q + r * (size_t)p->d.head_dim : NULL,
        .q16 = rows->q16 ? rows->q16 + r * fxa_q16_stride(p) : NULL,
        .m = rows->m + r,
        .l = rows->l + r,
        .o = rows->o + r * (size_t)p->d.head_dim,
        .qk_center = rows->qk_center + r,
        .online = rows->online + r,
        .bias_max = rows->bias_max ? rows->bias_max + r : NULL,
        .bias_off = rows->bias_off ? rows->bias_off + r : NULL,
    };
}

/* The rows of head slot `slot` in the thread's scratch. */
static fxa_rows scratch_rows(const fxa_attn_plan *p, const fxa_thread_scratch *s, size_t slot)
{
    const fxa_rows all = {
        .q = s->q,
        .q16 = s->q16,
        .m = s->m,
        .l = s->l,
        .o = s->o,
        .qk_center = s->qk_center,
        .online = s->online,
        .bias_max = s->bias_max,
        .bias_off = s->bias_off,
    };
    return rows_from(p, &all, slot * (size_t)p->d.block_q);
}

/* Dropout: the rows of head slot `slot` with the state over the kept
 * weights in place of the softmax's. */
static fxa_rows kept_rows(const fxa_attn_plan *p, const fxa_thread_scratch *s, size_t slot)
{
    fxa_rows rows = scratch_rows(p, s, slot);
    const size_t r = slot * (size_t)p->d.block_q;
    rows.m = s->m_kept + r;
    rows.l = s->l_kept + r;
    rows.o = s->o_kept + r * (size_t)p->d.head_dim;
    return rows;
}

/* Load one head's query rows and decide, per row, fixed shift or online;
 * with report, count and store the per-row diagnostics. */
static void setup_rows(const run_job *job, fxa_thread_scratch *s, size_t slot, int64_t b, int64_t h,
                       int64_t i0, size_t n_rows, int report)
{
    const fxa_attn_plan *p = job->p;
    const int64_t kv_item = b * p->d.heads_kv + h / p->group;
    const fxa_head_bound *hb = (const fxa_head_bound *)(job->ws + p->ws_bounds) + kv_item;
    const float *kbar =
        (const float *)(job->ws + p->ws_kbar) + (size_t)kv_item * (size_t)p->d.head_dim;
    const int64_t q_off = b * p->q_strides.batch + h * p->q_strides.head + i0 * p->q_strides.token;
    const fxa_rows rows = scratch_rows(p, s, slot);
    float *bound = s->bound + slot * (size_t)p->d.block_q;
    fxa_load_q(p, job->a->q, q_off, p->q_strides.token, n_rows, (float *)rows.q,
               (uint16_t *)rows.q16);
    if (rows.bias_max)
        fxa_mask_row_max(p, job->a->mask, b, h, i0, n_rows, (float *)rows.bias_max,
                         (float *)rows.bias_off);
    const int64_t n_online = fxa_rows_decide(p, hb, kbar, &rows, n_rows, bound);
    if (fxa_attn_dropout(p)) { /* the kept weights' state starts as the softmax's */
        const fxa_rows kept = kept_rows(p, s, slot);
        memcpy((float *)kept.m, rows.m, n_rows * sizeof(float));
        memset((float *)kept.l, 0, n_rows * sizeof(float));
        memset((float *)kept.o, 0, n_rows * (size_t)p->d.head_dim * sizeof(float));
    }
    if (!report)
        return;
    s->fallback_rows += n_online;
    const int64_t diag = (b * p->d.heads_q + h) * p->d.seq_q + i0;
    for (size_t i = 0; i < n_rows; i++) {
        s->max_bound = bound[i] > s->max_bound ? bound[i] : s->max_bound;
        if (job->a->row_bound)
            job->a->row_bound[diag + (int64_t)i] = bound[i];
        if (job->a->row_fallback)
            job->a->row_fallback[diag + (int64_t)i] = rows.online[i] == FXA_ROW_ONLINE;
    }
}

/* Dropout: o = o_kept 2^(m_kept - m) / (1 - dropout_p), the kept weights'
 * sum at the softmax's shift and scaled (shifts are integers: the power of
 * two is exact; a row with every weight dropped gets 0). */
static void kept_into_rows(const fxa_attn_plan *p, const fxa_thread_scratch *s, size_t slot,
                           size_t n_rows)
{
    const fxa_rows rows = scratch_rows(p, s, slot), kept = kept_rows(p, s, slot);
    const size_t dim = (size_t)p->d.head_dim;
    const double keep_scale = 1.0 / (1.0 - p->d.dropout_p);
    for (size_t r = 0; r < n_rows; r++) {
        const float f =
            kept.l[r] == 0.0f ? 0.0f : (float)ldexp(keep_scale, (int)(kept.m[r] - rows.m[r]));
        float *o = (float *)rows.o + r * dim;
        const float *ok = kept.o + r * dim;
        for (size_t c = 0; c < dim; c++)
            o[c] = f * ok[c];
    }
}

/* Normalise once and store: out = o / max(l, FLT_MIN); lse in natural log. */
static void finish_rows(const run_job *job, const fxa_thread_scratch *s, size_t slot, int64_t b,
                        int64_t h, int64_t i0, size_t n_rows)
{
    const fxa_attn_plan *p = job->p;
    if (fxa_attn_dropout(p))
        kept_into_rows(p, s, slot, n_rows);
    const int64_t o_off = b * p->o_strides.batch + h * p->o_strides.head + i0 * p->o_strides.token;
    const fxa_rows rows = scratch_rows(p, s, slot);
    const fxa_head_bound *hb =
        (const fxa_head_bound *)(job->ws + p->ws_bounds) + b * p->d.heads_kv + h / p->group;
    const int64_t row = (b * p->d.heads_q + h) * p->d.seq_q + i0;
    float *lse = job->a->lse ? job->a->lse + row : NULL;
    float *parts = job->a->lse_parts ? job->a->lse_parts + 3 * row : NULL;
    fxa_rows_finish(p, hb, &rows, n_rows, job->a->out, o_off, p->o_strides.token, lse, parts);
}

/* Where kv tile `tile` of chunk slot `slot` is packed, in floats from the
 * start of the packed K (or V) area. */
static size_t packed_offset(const fxa_attn_plan *p, size_t slot, size_t tile)
{
    return slot * p->packed_head_floats + tile * p->kv_tile * p->packed_ld;
}

/* Pack item (kv head of the chunk, kv tile) at the head's slot. */
static void pack_item(void *arg, int64_t item, int thread_id)
{
    const run_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const int64_t slot = item / p->n_kv_tiles;
    const int64_t tile = item % p->n_kv_tiles;
    const int64_t j0 = tile * (int64_t)p->kv_tile;
    const size_t n_kv =
        (size_t)(p->d.seq_kv - j0 < (int64_t)p->kv_tile ? p->d.seq_kv - j0 : (int64_t)p->kv_tile);
    const int64_t kv_head = job->chunk_kv0 + slot;
    const fxa_row_at k_at = {job->batch * p->k_strides.batch + kv_head * p->k_strides.head +
                                 j0 * p->k_strides.token,
                             p->k_strides.token};
    const fxa_row_at v_at = {job->batch * p->v_strides.batch + kv_head * p->v_strides.head +
                                 j0 * p->v_strides.token,
                             p->v_strides.token};
    const size_t at = packed_offset(p, (size_t)slot, (size_t)tile);
    const fxa_head_bound *hb =
        (const fxa_head_bound *)(job->ws + p->ws_bounds) + job->batch * p->d.heads_kv + kv_head;
    (void)thread_id;
    fxa_pack_kv_tile(p, job->a->k, k_at, job->a->v, v_at, n_kv, hb->kshift,
                     (float *)(job->ws + p->ws_packed_k) + at,
                     (float *)(job->ws + p->ws_packed_v) + at);
}

/* The partial (m, l, o) of chunk row `row` (head index within the chunk
 * times Sq plus token) for split `split`. */
static float *partial_at(const run_job *job, int64_t split, int64_t row)
{
    const fxa_attn_plan *p = job->p;
    const int64_t chunk_rows = p->chunk_kv_heads * p->group * p->d.seq_q;
    return (float *)(job->ws + p->ws_partials) +
           (size_t)(split * chunk_rows + row) * ((size_t)p->d.head_dim + 2);
}

/* Rows per step of a causal diagonal tile: each step runs only the keys its
 * last row sees, so the masked corner costs about CAUSAL_STEP / 2 keys a row. */
#define CAUSAL_STEP 48

/* Causal (row i sees keys j <= i, i counted from the diagonal: i0 is the
 * first row's query index plus fxa_causal_shift): kv tile [j0, j0 + n_kv)
 * into rows [i0, i0 + n). Rows before j0 see none of the keys (their terms would be
 * exact zeros) and are left alone; rows that see every key run without a
 * bias; the rows in between run in steps of CAUSAL_STEP, each on the keys up
 * to its last row with the bias of those keys. Dropping a row's trailing
 * masked keys drops exact zero terms, and the tiles' rows are independent,
 * so every row gets the bits of the whole tile with the whole bias. */
static void run_causal_tile(const fxa_attn_plan *p, const fxa_head_bound *hb, const fxa_rows *rows,
                            int64_t i0, size_t n, int64_t j0, size_t n_kv, const float *kt,
                            const float *vp, fxa_thread_scratch *s)
{
    const int64_t first = j0 - i0;                    /* first row that sees key j0 */
    const int64_t full = j0 + (int64_t)n_kv - 1 - i0; /* first row that sees every key */
    size_t r = first > 0 ? (size_t)first : 0;
    const size_t r_full = full <= 0 ? 0 : full < (int64_t)n ? (size_t)full : n;
    while (r < r_full) {
        const size_t m = r_full - r < CAUSAL_STEP ? r_full - r : CAUSAL_STEP;
        const size_t n_use = (size_t)(i0 + (int64_t)(r + m) - j0);
        const fxa_rows step = rows_from(p, rows, r);
        fxa_causal_bias(i0 + (int64_t)r, m, j0, n_use, p->kv_tile, s->bias);
        fxa_rows_run_tile(p, hb, &step, m, kt, vp, n_use, s->scores, s->p16, s->bias);
        r += m;
    }
    if (r < n) {
        const fxa_rows rest = rows_from(p, rows, r);
        fxa_rows_run_tile(p, hb, &rest, n - r, kt, vp, n_kv, s->scores, s->p16, NULL);
    }
}

/* Causal over a whole kv tile (dropout runs whole tiles): the bias of rows
 * [i0, i0 + n) (i0 counted from the diagonal, as run_causal_tile's) x keys
 * [j0, j0 + n_kv) and its use. */
static fxa_tile_use causal_tile(int64_t i0, size_t n, int64_t j0, size_t n_kv, size_t ld,
                                float *bias)
{
    if (j0 > i0 + (int64_t)n - 1)
        return FXA_TILE_SKIP;
    if (j0 + (int64_t)n_kv - 1 <= i0)
        return FXA_TILE_PLAIN;
    fxa_causal_bias(i0, n, j0, n_kv, ld, bias);
    return FXA_TILE_BIAS;
}

/* Dropout: kv tile [j0, j0 + n_kv) into the rows of head h (slot `slot`)
 * twice, with the mask's or causal bias: into the softmax's state over
 * every key, then, with the dropped weights' bias at -INFINITY, into the
 * kept weights' state. */
static void run_dropout_tile(const run_job *job, fxa_thread_scratch *s, size_t slot, int64_t h,
                             int64_t i0, size_t n_rows, int64_t j0, size_t n_kv,
                             const fxa_head_bound *hb, const float *kt, const float *vp)
{
    const fxa_attn_plan *p = job->p;
    const fxa_rows rows = scratch_rows(p, s, slot);
    fxa_tile_use use = FXA_TILE_PLAIN;
    if (p->d.causal)
        use = causal_tile(i0 + fxa_causal_shift(p), n_rows, j0, n_kv, p->kv_tile, s->bias);
    else if (p->d.mask_kind != FXA_MASK_NONE)
        use = fxa_mask_tile(p, job->a->mask, job->batch, h, i0, n_rows, rows.bias_off, j0, n_kv,
                            p->kv_tile, s->bias);
    if (use == FXA_TILE_SKIP)
        return;
    const float *bias = use == FXA_TILE_BIAS ? s->bias : NULL;
    fxa_rows_run_tile(p, hb, &rows, n_rows, kt, vp, n_kv, s->scores, s->p16, bias);
    const fxa_drop_stream stream = {job->a->dropout_seed, job->a->dropout_offset,
                                    job->a->dropout_keep};
    if (fxa_dropout_bias(p, &stream, job->batch, h, i0, n_rows, j0, n_kv, p->kv_tile, bias, s->bias,
                         FXA_DROP_KEEP) == FXA_TILE_SKIP)
        return;
    const fxa_rows kept = kept_rows(p, s, slot);
    fxa_rows_run_tile(p, hb, &kept, n_rows, kt, vp, n_kv, s->scores, s->p16, s->bias);
}

/* Work item (head tile of the chunk, query block, key split), item0 on;
 * causal items go by query block from the last, the ones with most keys, so
 * that the dynamic schedule ends on light items. */
static void work_item(void *arg, int64_t item, int thread_id)
{
    const run_job *job = arg;
    item += job->item0;
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    const size_t bq = (size_t)p->d.block_q;
    const int64_t hpt = p->d.heads_per_tile;
    const int64_t b = job->batch;
    const int64_t split = item % p->n_splits;
    int64_t qb = item / p->n_splits % p->n_q_blocks;
    int64_t tile_of = item / (p->n_splits * p->n_q_blocks); /* head tile within the chunk */
    if (p->d.causal) { /* the costliest (last) query blocks first, every head tile in turn */
        const int64_t n_tiles = p->chunk_kv_heads * p->group / hpt;
        qb = p->n_q_blocks - 1 - item / (p->n_splits * n_tiles);
        tile_of = item / p->n_splits % n_tiles;
    }
    const int64_t h0 = job->chunk_kv0 * p->group + tile_of * hpt;
    const int64_t i0 = qb * p->d.block_q;
    const size_t n_rows = (size_t)(p->d.seq_q - i0 < p->d.block_q ? p->d.seq_q - i0 : p->d.block_q);
    const int64_t tile_end =
        (split + 1) * p->split_tiles < p->n_kv_tiles ? (split + 1) * p->split_tiles : p->n_kv_tiles;
    fxa_thread_scratch *s = thread_scratch(job, thread_id);

    for (int64_t slot = 0; slot < hpt; slot++)
        setup_rows(job, s, (size_t)slot, b, h0 + slot, i0, n_rows, split == 0);
    if (job->bounds_only)
        return;
    for (int64_t tile = split * p->split_tiles; tile < tile_end; tile++) {
        const int64_t j0 = tile * (int64_t)p->kv_tile;
        const size_t n_kv = (size_t)(p->d.seq_kv - j0 < (int64_t)p->kv_tile ? p->d.seq_kv - j0
                                                                            : (int64_t)p->kv_tile);
        for (int64_t slot = 0; slot < hpt; slot++) {
            const size_t kv_slot = (size_t)((h0 + slot) / p->group - job->chunk_kv0);
            const size_t at = packed_offset(p, kv_slot, (size_t)tile);
            const fxa_rows rows = scratch_rows(p, s, (size_t)slot);
            const fxa_head_bound *hb = (const fxa_head_bound *)(job->ws + p->ws_bounds) +
                                       b * p->d.heads_kv + (h0 + slot) / p->group;
            const float *kt = (const float *)(job->ws + p->ws_packed_k) + at;
            const float *vp = (const float *)(job->ws + p->ws_packed_v) + at;
            if (fxa_attn_dropout(p)) {
                run_dropout_tile(job, s, (size_t)slot, h0 + slot, i0, n_rows, j0, n_kv, hb, kt, vp);
                continue;
            }
            if (p->d.causal) {
                run_causal_tile(p, hb, &rows, i0 + fxa_causal_shift(p), n_rows, j0, n_kv, kt, vp,
                                s);
                continue;
            }
            const fxa_tile_use use =
                fxa_attn_masked(p) ? fxa_mask_tile(p, job->a->mask, b, h0 + slot, i0, n_rows,
                                                   rows.bias_off, j0, n_kv, p->kv_tile, s->bias)
                                   : FXA_TILE_PLAIN;
            if (use == FXA_TILE_SKIP) /* every term would be an exact 0 */
                continue;
            fxa_rows_run_tile(p, hb, &rows, n_rows, kt, vp, n_kv, s->scores, s->p16,
                              use == FXA_TILE_BIAS ? s->bias : NULL);
        }
    }
    for (int64_t slot = 0; slot < hpt; slot++) {
        if (p->n_splits == 1) {
            finish_rows(job, s, (size_t)slot, b, h0 + slot, i0, n_rows);
            continue;
        }
        const int64_t chunk_head = h0 + slot - job->chunk_kv0 * p->group;
        for (size_t i = 0; i < n_rows; i++) {
            const size_t r = (size_t)slot * bq + i;
            float *part = partial_at(job, split, chunk_head * p->d.seq_q + i0 + (int64_t)i);
            part[0] = s->m[r];
            part[1] = s->l[r];
            memcpy(part + 2, s->o + r * dim, dim * sizeof(float));
        }
    }
}

/* Merge item (head tile of the chunk, query block): add the splits'
 * partials in split order. Shifts are integers, so each rescale
 * 2^(m_s - m) is an exact power of two; for fixed-max rows every m_s is the
 * same shift and the merge is a plain sum. Then normalise once. */
static void merge_item(void *arg, int64_t item, int thread_id)
{
    const run_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    const size_t bq = (size_t)p->d.block_q;
    const int64_t hpt = p->d.heads_per_tile;
    const int64_t qb = item % p->n_q_blocks;
    const int64_t h0 = job->chunk_kv0 * p->group + item / p->n_q_blocks * hpt;
    const int64_t i0 = qb * p->d.block_q;
    const size_t n_rows = (size_t)(p->d.seq_q - i0 < p->d.block_q ? p->d.seq_q - i0 : p->d.block_q);
    fxa_thread_scratch *s = thread_scratch(job, thread_id);
    for (int64_t slot = 0; slot < hpt; slot++) {
        const int64_t chunk_head = h0 + slot - job->chunk_kv0 * p->group;
        setup_rows(job, s, (size_t)slot, job->batch, h0 + slot, i0, n_rows, 0);
        for (size_t i = 0; i < n_rows; i++) {
            const size_t r = (size_t)slot * bq + i;
            const int64_t row = chunk_head * p->d.seq_q + i0 + (int64_t)i;
            float m = -INFINITY;
            for (int64_t sp = 0; sp < p->n_splits; sp++)
                m = fmaxf(m, partial_at(job, sp, row)[0]);
            float l = 0.0f;
            float *o = s->o + r * dim;
            for (int64_t sp = 0; sp < p->n_splits; sp++) {
                const float *part = partial_at(job, sp, row);
                if (part[1] == 0.0f) /* every key of the split masked: nothing to add */
                    continue;
                const float scale = fxa_exp2_shifted_ref(part[0], m);
                l += scale * part[1];
                for (size_t c = 0; c < dim; c++)
                    o[c] += scale * part[2 + c];
            }
            s->m[r] = m;
            s->l[r] = l;
        }
        finish_rows(job, s, (size_t)slot, job->batch, h0 + slot, i0, n_rows);
    }
}

static void progress(const fxa_attn_plan *p)
{
    if (p->progress)
        p->progress(p->progress_arg);
}

/* The work items of a chunk; with a progress hook, in waves of a few items
 * per thread with progress calls between them. */
static void run_work(const fxa_attn_plan *p, run_job *job, int64_t n_items)
{
    const int64_t wave = p->progress ? 2 * (int64_t)p->ctx->pool.n_threads : n_items;
    for (job->item0 = 0; job->item0 < n_items; job->item0 += wave) {
        const int64_t n = n_items - job->item0 < wave ? n_items - job->item0 : wave;
        fxa_pool_run(&p->ctx->pool, work_item, job, n);
        progress(p);
    }
    job->item0 = 0;
}

static void fill_stats(const run_job *job, fxa_attn_stats *st)
{
    const fxa_attn_plan *p = job->p;
    const fxa_head_bound *hb = (const fxa_head_bound *)(job->ws + p->ws_bounds);
    const int64_t n_heads = p->d.batch * p->d.heads_kv;
    int c_min = hb[0].c;
    double vmax = 0.0;
    for (int64_t i = 0; i < n_heads; i++) {
        c_min = hb[i].c < c_min ? hb[i].c : c_min;
        vmax = hb[i].vmax > vmax ? hb[i].vmax : vmax;
    }
    st->struct_size = sizeof *st;
    st->rows = p->d.batch * p->d.heads_q * p->d.seq_q;
    st->keys = p->d.seq_kv;
    st->compute = p->d.compute;
    st->c_min = c_min;
    st->gate_strict = fxa_fixed_m_gate_strict(c_min);
    st->gate_centered = p->d.center ? fxa_fixed_m_gate_centered(c_min, p->d.seq_kv) : 0;
    st->vmax = vmax;
    st->fallback_rows = 0;
    st->max_bound = 0.0;
    for (int t = 0; t < p->ctx->pool.n_threads; t++) {
        const fxa_thread_scratch *s = thread_scratch(job, t);
        st->fallback_rows += s->fallback_rows;
        st->max_bound = s->max_bound > st->max_bound ? s->max_bound : st->max_bound;
    }
}

/* Refuse outputs (out and lse unless bounds_only, the row diagnostics,
 * the workspace) that overlap Q, K, V or each other. */
static fxa_status check_spans(const fxa_attn_plan *p, const fxa_attn_args *a, void *workspace,
                              int bounds_only)
{
    const size_t rows = (size_t)(p->d.batch * p->d.heads_q * p->d.seq_q);
    const fxa_span in[5] = {
        {"Q", a->q, (size_t)p->q_extent * p->in_elem},
        {"K", a->k, (size_t)p->kv_extent[0] * p->in_elem},
        {"V", a->v, (size_t)p->kv_extent[1] * p->in_elem},
        {"mask", p->mask_bytes ? a->mask : NULL, p->mask_bytes},
        {"dropout_keep", fxa_attn_dropout(p) ? a->dropout_keep : NULL, fxa_dropout_keep_bytes(p)},
    };
    const fxa_span out[7] = {
        {"row_fallback", a->row_fallback, rows},
        {"row_bound", a->row_bound, rows * sizeof(float)},
        {"workspace", workspace, p->ws_total},
        {"out", bounds_only ? NULL : a->out, (size_t)p->o_extent * p->out_elem},
        {"lse", bounds_only ? NULL : a->lse, rows * sizeof(float)},
        {"lse_parts", bounds_only ? NULL : a->lse_parts, 3 * rows * sizeof(float)},
        {"lse_f64", bounds_only ? NULL : a->lse_f64, rows * sizeof(double)},
    };
    return fxa_spans_disjoint(p->ctx, out, 7, in, 5);
}

static fxa_status run_common(const fxa_attn_plan *plan, const fxa_attn_args *args, void *workspace,
                             fxa_attn_stats *stats_out, int bounds_only)
{
    fxa_ctx *ctx = plan->ctx;
    fxa_attn_args a_full = {0};
    fxa_status st =
        fxa_args_in(ctx, &a_full, sizeof a_full, args, FXA_ATTN_ARGS_SIZE_0_1, "fxa_attn_args");
    if (st != FXA_OK)
        return st;
    args = &a_full;
    if ((st = fxa_struct_out_check(stats_out, FXA_ATTN_STATS_SIZE_0_1, sizeof(fxa_attn_stats),
                                   "fxa_attn_stats", ctx->last_error, sizeof ctx->last_error)) !=
        FXA_OK)
        return st;
    if (!args->q || !args->k || !args->v || (!bounds_only && !args->out))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "q, k, v and out must not be NULL");
    if (!workspace && plan->ws_total > 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "workspace of %zu bytes is missing",
                            plan->ws_total);
    if ((st = fxa_mask_check(plan, args->mask)) != FXA_OK ||
        (st = check_spans(plan, args, workspace, bounds_only)) != FXA_OK)
        return st;
    if (((uintptr_t)workspace % FXA_ALIGN) != 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "workspace must be 64-byte aligned");
    if (plan->d.dtype == FXA_F64)
        return bounds_only ? fxa_ctx_fail(ctx, FXA_ERR_UNSUPPORTED,
                                          "the bound pass alone is for fp32 and bf16 plans; an "
                                          "fp64 plan's rows are reported by fxa_attn_run")
                           : fxa_f64_run(plan, args, workspace, stats_out);
    if (args->lse_f64)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "lse_f64 is for fp64 plans (dtype FXA_F64); this plan writes lse");
    const double t0 = fxa_now_seconds();
    run_job job = {plan, args, workspace, bounds_only, 0, 0, 0};
    st = fxa_scan_inputs(plan, args, workspace);
    progress(plan);
    if (st == FXA_OK && !bounds_only && args->lse)
        st = fxa_lse_check(plan,
                           (const fxa_head_bound *)((unsigned char *)workspace + plan->ws_bounds),
                           plan->d.batch * plan->d.heads_kv, plan->d.seq_kv);
    if (st == FXA_OK && !bounds_only)
        st = fxa_out_range_check(
            plan, (const fxa_head_bound *)((unsigned char *)workspace + plan->ws_bounds),
            plan->d.batch * plan->d.heads_kv);
    if (st != FXA_OK)
        return st;
    for (int t = 0; t < ctx->pool.n_threads; t++)
        fxa_thread_scratch_carve(plan, workspace, t);
    const int64_t chunk_q_heads = plan->chunk_kv_heads * plan->group;
    const int64_t n_blocks = chunk_q_heads / plan->d.heads_per_tile * plan->n_q_blocks;
    const int64_t n_splits = plan->n_splits;
    for (job.batch = 0; job.batch < plan->d.batch; job.batch++) {
        for (job.chunk_kv0 = 0; job.chunk_kv0 < plan->d.heads_kv;
             job.chunk_kv0 += plan->chunk_kv_heads) {
            if (!bounds_only) {
                fxa_pool_run(&ctx->pool, pack_item, &job, plan->chunk_kv_heads * plan->n_kv_tiles);
                progress(plan);
            }
            run_work(plan, &job, n_blocks * n_splits);
            if (n_splits > 1 && !bounds_only) {
                fxa_pool_run(&ctx->pool, merge_item, &job, n_blocks);
                progress(plan);
            }
        }
    }
    if (stats_out) {
        fxa_attn_stats full;
        fill_stats(&job, &full);
        full.seconds = fxa_now_seconds() - t0;
        fxa_struct_out(stats_out, &full, sizeof full);
    }
    return FXA_OK;
}

/* One call at a time per context (fxa_ctx_begin). */
static fxa_status run_call(const fxa_attn_plan *plan, const fxa_attn_args *args, void *workspace,
                           fxa_attn_stats *stats_out, int bounds_only)
{
    if (!plan)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(plan->ctx);
    return fxa_ctx_end_with(plan->ctx, run_common(plan, args, workspace, stats_out, bounds_only));
}

fxa_status fxa_attn_run(const fxa_attn_plan *plan, const fxa_attn_args *args, void *workspace,
                        fxa_attn_stats *stats_out)
{
    return run_call(plan, args, workspace, stats_out, 0);
}

fxa_status fxa_attn_bounds(const fxa_attn_plan *plan, const fxa_attn_args *args, void *workspace,
                           fxa_attn_stats *stats_out)
{
    return run_call(plan, args, workspace, stats_out, 1);
}
