/*
 * The attention driver: the bound pass, then, chunk by chunk of kv heads,
 * K and V are packed once (fp32, K transposed in tiles) and threads take work
 * items (head tile, query block) of the chunk. Each item owns its rows from
 * start to end (a row's whole key loop runs in one item, in a fixed tile
 * order), so the result does not depend on the thread count, heads_per_tile
 * or block_q.
 *
 * Per row i (FIXED_M.md): U_i = lambda ||q_i|| (radius + eps_radius), where
 * radius is max_j ||k_j - kbar|| (or max ||k_j|| without centring) and
 * eps_radius covers the fp32 rounding of the computed scores (the score
 * error is at most gamma_D ||q|| ||k_j|| plus one rounding of q.kbar, and
 * (D + 2) 2^-23 kmax exceeds both), so U_i bounds the scores the kernel
 * actually computes, not just exact ones. The row runs fixed-max with shift
 * ceil(U_i) - C when ceil(U_i) passes the strict gate, or the centred gate
 * (bound.c) for a centred row whose rounding allowance is <= 1; otherwise
 * it runs online softmax.
 */
#include <float.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include "../core/alloc.h"
#include "attn_internal.h"
#include "../kernels/ref/exp2_ref.h"
#include "load.h"
#include "scan.h"

typedef struct run_job {
    const fxa_attn_plan *p;
    const fxa_attn_args *a;
    unsigned char *ws;
    int bounds_only;
    int64_t batch;     /* the chunk being computed */
    int64_t chunk_kv0; /* its first kv head */
} run_job;

static fxa_thread_scratch *thread_scratch(const run_job *job, int thread_id)
{
    return (fxa_thread_scratch *)(job->ws + job->p->ws_threads) + thread_id;
}

/* Carve thread t's buffers from the workspace. */
static void carve_scratch(const fxa_attn_plan *p, unsigned char *ws, int t)
{
    const size_t dim = (size_t)p->d.head_dim;
    const size_t rows = (size_t)p->d.heads_per_tile * (size_t)p->d.block_q;
    fxa_thread_scratch *s = (fxa_thread_scratch *)(ws + p->ws_threads) + t;
    unsigned char *at = ws + p->ws_scratch + (size_t)t * p->thread_bytes;
    s->q = (float *)at;
    at += fxa_align_up(rows * dim * sizeof(float));
    s->o = (float *)at;
    at += fxa_align_up(rows * dim * sizeof(float));
    s->m = (float *)at;
    at += fxa_align_up(rows * sizeof(float));
    s->l = (float *)at;
    at += fxa_align_up(rows * sizeof(float));
    s->qk_center = (float *)at;
    at += fxa_align_up(rows * sizeof(float));
    s->online = at;
    at += fxa_align_up(rows);
    s->scores = (float *)at;
    at += fxa_align_up((size_t)p->d.block_q * p->kv_tile * sizeof(float));
    s->q16 = (uint16_t *)at;
    at += fxa_align_up(rows * (dim + 1) * sizeof(uint16_t));
    s->p16 = (uint16_t *)at;
    s->fallback_rows = 0;
    s->max_bound = 0.0;
}

/* Row stride of the bf16 query copy: the dimension padded to pairs. */
static size_t q16_stride(const fxa_attn_plan *p)
{
    return ((size_t)p->d.head_dim + 1) / 2 * 2;
}

/* The bf16 bits of n query rows (bf16 inputs) with the odd tail zeroed. */
static void load_q16_rows(const fxa_attn_plan *p, const uint16_t *q, int64_t off, size_t n_rows,
                          uint16_t *out)
{
    const size_t dim = (size_t)p->d.head_dim;
    const size_t stride = q16_stride(p);
    for (size_t r = 0; r < n_rows; r++) {
        memcpy(out + r * stride, q + off + (int64_t)r * p->q_strides.token, dim * sizeof *out);
        if (dim % 2)
            out[r * stride + dim] = 0;
    }
}

/* ||q||^2 and q.kbar in double, four interleaved partial sums (a fixed
 * order that compilers can vectorise). */
static void norm_and_center(const float *q, const float *kbar, size_t dim, double *qq_out,
                            double *qk_out)
{
    double qq[4] = {0.0, 0.0, 0.0, 0.0};
    double qk[4] = {0.0, 0.0, 0.0, 0.0};
    size_t c = 0;
    for (; c + 4 <= dim; c += 4) {
        for (size_t k = 0; k < 4; k++) {
            qq[k] += (double)q[c + k] * q[c + k];
            qk[k] += (double)q[c + k] * kbar[c + k];
        }
    }
    for (size_t k = 0; c < dim; c++, k++) {
        qq[k] += (double)q[c] * q[c];
        qk[k] += (double)q[c] * kbar[c];
    }
    *qq_out = (qq[0] + qq[1]) + (qq[2] + qq[3]);
    *qk_out = (qk[0] + qk[1]) + (qk[2] + qk[3]);
}

/* Load one head's query rows and decide, per row, fixed shift or online. */
static void setup_rows(const run_job *job, fxa_thread_scratch *s, size_t slot, int64_t b,
                       int64_t h, int64_t i0, size_t n_rows, int report)
{
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    const size_t bq = (size_t)p->d.block_q;
    const int64_t kv_item = b * p->d.heads_kv + h / p->group;
    const fxa_head_bound *hb = (const fxa_head_bound *)(job->ws + p->ws_bounds) + kv_item;
    const float *kbar = (const float *)(job->ws + p->ws_kbar) + (size_t)kv_item * dim;
    const int auto_mode = p->d.mode == FXA_MODE_AUTO;
    const int centred = auto_mode && p->d.center;
    const int64_t q_off = b * p->q_strides.batch + h * p->q_strides.head + i0 * p->q_strides.token;
    float *q = s->q + slot * bq * dim;
    fxa_load_rows(p->ctx->kernels, job->a->q, p->d.dtype, q_off, p->q_strides.token, n_rows, dim, q, dim);
    if (p->d.compute == FXA_COMPUTE_BF16)
        load_q16_rows(p, job->a->q, q_off, n_rows, s->q16 + slot * bq * q16_stride(p));
    for (size_t i = 0; i < n_rows; i++) {
        const float *qi = q + i * dim;
        const size_t r = slot * bq + i;
        double qq;
        double qk;
        norm_and_center(qi, kbar, dim, &qq, &qk);
        const double qn = p->lambda * sqrt(qq);
        const double ceil_u = ceil(qn * (hb->radius + hb->eps_radius));
        const int fixed = auto_mode &&
                          (ceil_u <= hb->gate_strict ||
                           (centred && qn * hb->eps_radius <= 1.0 && ceil_u <= hb->gate_centered));
        /* Centring serves the bound; a row that falls back is the classic
         * online softmax on raw scores (one rounding fewer per score). */
        s->qk_center[r] = centred && fixed ? (float)qk : 0.0f;
        s->online[r] = (uint8_t)!fixed;
        s->m[r] = fixed ? (float)(ceil_u - hb->c) : -INFINITY;
        s->l[r] = 0.0f;
        memset(s->o + r * dim, 0, dim * sizeof(float));
        if (!report)
            continue;
        s->fallback_rows += !fixed;
        s->max_bound = ceil_u > s->max_bound ? ceil_u : s->max_bound;
        const int64_t diag = (b * p->d.heads_q + h) * p->d.seq_q + i0 + (int64_t)i;
        if (job->a->row_bound)
            job->a->row_bound[diag] = (float)ceil_u;
        if (job->a->row_fallback)
            job->a->row_fallback[diag] = (uint8_t)!fixed;
    }
}

/* Normalise once and store: out = o / max(l, FLT_MIN); lse in natural log. */
static void finish_rows(const run_job *job, const fxa_thread_scratch *s, size_t slot, int64_t b,
                        int64_t h, int64_t i0, size_t n_rows)
{
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    const size_t bq = (size_t)p->d.block_q;
    const int64_t o_off = b * p->q_strides.batch + h * p->q_strides.head + i0 * p->q_strides.token;
    for (size_t i = 0; i < n_rows; i++) {
        const size_t r = slot * bq + i;
        const float l = fmaxf(s->l[r], FLT_MIN);
        const float *o = s->o + r * dim;
        float *out = job->a->out + o_off + (int64_t)i * p->q_strides.token;
        for (size_t c = 0; c < dim; c++)
            out[c] = o[c] / l;
        if (job->a->lse) {
            const double log2_sum = (double)s->m[r] + log2((double)l);
            job->a->lse[(b * p->d.heads_q + h) * p->d.seq_q + i0 + (int64_t)i] =
                (float)(log2_sum * 0.6931471805599453 + p->d.scale * (double)s->qk_center[r]);
        }
    }
}

/* Where kv tile `tile` of chunk slot `slot` is packed, in floats from the
 * start of the packed K (or V) area. */
static size_t packed_offset(const fxa_attn_plan *p, size_t slot, size_t tile)
{
    return slot * p->packed_head_floats + tile * p->kv_tile * (size_t)p->d.head_dim;
}

/* fp32 compute: K transposed into [D][kv_tile], V rows into [kv_tile][D]. */
static void pack_f32(const run_job *job, int64_t off, size_t n_kv, float *kt, float *v)
{
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    float row[FXA_MAX_HEAD_DIM];
    for (size_t j = 0; j < n_kv; j++) {
        fxa_load_row(p->ctx->kernels, job->a->k, p->d.dtype, off + (int64_t)j * p->kv_strides.token, dim, row);
        for (size_t c = 0; c < dim; c++)
            kt[c * p->kv_tile + j] = row[c];
    }
    fxa_load_rows(p->ctx->kernels, job->a->v, p->d.dtype, off, p->kv_strides.token, n_kv, dim, v, dim);
}

/* bf16 compute: the pair layouts of fxa_attn_tile_bf16, every pad zeroed.
 * Inputs are bf16 (the plan checks), so reading their bits is exact. */
static void pack_bf16(const run_job *job, int64_t off, size_t n_kv, uint16_t *kp, uint16_t *vp)
{
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    const size_t pairs = (dim + 1) / 2;
    const uint16_t *k = job->a->k;
    const uint16_t *v = job->a->v;
    memset(kp, 0, pairs * p->kv_tile * 2 * sizeof *kp);
    memset(vp, 0, p->kv_tile * dim * sizeof *vp);
    for (size_t j = 0; j < n_kv; j++) {
        const uint16_t *kj = k + off + (int64_t)j * p->kv_strides.token;
        const uint16_t *vj = v + off + (int64_t)j * p->kv_strides.token;
        for (size_t c = 0; c < dim; c++) {
            kp[2 * ((c / 2) * p->kv_tile + j) + c % 2] = kj[c];
            vp[2 * ((j / 2) * dim + c) + j % 2] = vj[c];
        }
    }
}

/* Pack item (kv head of the chunk, kv tile) at the head's slot. */
static void pack_item(void *arg, int64_t item, int thread_id)
{
    const run_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const int64_t slot = item / p->n_kv_tiles;
    const int64_t tile = item % p->n_kv_tiles;
    const int64_t j0 = tile * (int64_t)p->kv_tile;
    const size_t n_kv = (size_t)(p->d.seq_kv - j0 < (int64_t)p->kv_tile ? p->d.seq_kv - j0
                                                                          : (int64_t)p->kv_tile);
    const int64_t off = job->batch * p->kv_strides.batch +
                        (job->chunk_kv0 + slot) * p->kv_strides.head + j0 * p->kv_strides.token;
    const size_t at = packed_offset(p, (size_t)slot, (size_t)tile);
    float *k = (float *)(job->ws + p->ws_packed_k) + at;
    float *v = (float *)(job->ws + p->ws_packed_v) + at;
    (void)thread_id;
    if (p->d.compute == FXA_COMPUTE_BF16)
        pack_bf16(job, off, n_kv, (uint16_t *)k, (uint16_t *)v);
    else
        pack_f32(job, off, n_kv, k, v);
}

/* Run one kv tile for the rows of one head slot. */
static void run_tile(const run_job *job, fxa_thread_scratch *s, size_t r, size_t n_rows,
                     size_t packed, size_t n_kv)
{
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    const float *k = (const float *)(job->ws + p->ws_packed_k) + packed;
    const float *v = (const float *)(job->ws + p->ws_packed_v) + packed;
    if (p->d.compute == FXA_COMPUTE_BF16) {
        const fxa_attn_tile_bf16 t = {
            .n_q = n_rows,
            .n_kv = n_kv,
            .d = dim,
            .lambda = (float)p->lambda,
            .q = s->q16 + r * q16_stride(p),
            .ldq = q16_stride(p),
            .kp = (const uint16_t *)k,
            .ldkp = p->kv_tile,
            .vp = (const uint16_t *)v,
            .ldvp = dim,
            .qk_center = s->qk_center + r,
            .online = s->online + r,
            .m = s->m + r,
            .l = s->l + r,
            .o = s->o + r * dim,
            .ldo = dim,
            .scores = s->scores,
            .ld_scores = p->kv_tile,
            .p16 = s->p16,
        };
        p->ctx->kernels->attn_tile_bf16(&t);
        return;
    }
    const fxa_attn_tile t = {
        .n_q = n_rows,
        .n_kv = n_kv,
        .d = dim,
        .lambda = (float)p->lambda,
        .q = s->q + r * dim,
        .ldq = dim,
        .kt = k,
        .ldkt = p->kv_tile,
        .v = v,
        .ldv = dim,
        .qk_center = s->qk_center + r,
        .online = s->online + r,
        .m = s->m + r,
        .l = s->l + r,
        .o = s->o + r * dim,
        .ldo = dim,
        .scores = s->scores,
        .ld_scores = p->kv_tile,
    };
    p->ctx->kernels->attn_tile(&t);
}

/* Work item (head tile of the chunk, query block). */
/* The partial (m, l, o) of chunk row `row` (head index within the chunk
 * times Sq plus token) for split `split`. */
static float *partial_at(const run_job *job, int64_t split, int64_t row)
{
    const fxa_attn_plan *p = job->p;
    const int64_t chunk_rows = p->chunk_kv_heads * p->group * p->d.seq_q;
    return (float *)(job->ws + p->ws_partials) +
           (size_t)(split * chunk_rows + row) * ((size_t)p->d.head_dim + 2);
}

/* Work item (head tile of the chunk, query block, key split). */
static void work_item(void *arg, int64_t item, int thread_id)
{
    const run_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    const size_t bq = (size_t)p->d.block_q;
    const int64_t hpt = p->d.heads_per_tile;
    const int64_t b = job->batch;
    const int64_t split = item % p->n_splits;
    const int64_t qb = item / p->n_splits % p->n_q_blocks;
    const int64_t h0 = job->chunk_kv0 * p->group + item / (p->n_splits * p->n_q_blocks) * hpt;
    const int64_t i0 = qb * p->d.block_q;
    const size_t n_rows = (size_t)(p->d.seq_q - i0 < p->d.block_q ? p->d.seq_q - i0 : p->d.block_q);
    const int64_t tile_end = (split + 1) * p->split_tiles < p->n_kv_tiles
                                 ? (split + 1) * p->split_tiles
                                 : p->n_kv_tiles;
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
            run_tile(job, s, (size_t)slot * bq, n_rows, packed_offset(p, kv_slot, (size_t)tile),
                     n_kv);
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

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

static fxa_status run_common(const fxa_attn_plan *plan, const fxa_attn_args *args,
                             void *workspace, fxa_attn_stats *stats_out, int bounds_only)
{
    if (!plan)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx *ctx = plan->ctx;
    fxa_ctx_clear_error(ctx);
    if (!args || args->struct_size < sizeof(fxa_attn_args))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "attention args missing or too old");
    if (!args->q || !args->k || !args->v || (!bounds_only && !args->out))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "q, k, v and out must not be NULL");
    if (!workspace && plan->ws_total > 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "workspace of %zu bytes is missing",
                            plan->ws_total);
    if (((uintptr_t)workspace % FXA_ALIGN) != 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "workspace must be 64-byte aligned");
    const double t0 = now_seconds();
    run_job job = {plan, args, workspace, bounds_only, 0, 0};
    fxa_status st = fxa_scan_inputs(plan, args, workspace);
    if (st != FXA_OK)
        return st;
    for (int t = 0; t < ctx->pool.n_threads; t++)
        carve_scratch(plan, workspace, t);
    const int64_t chunk_q_heads = plan->chunk_kv_heads * plan->group;
    const int64_t n_blocks = chunk_q_heads / plan->d.heads_per_tile * plan->n_q_blocks;
    const int64_t n_splits = plan->n_splits;
    for (job.batch = 0; job.batch < plan->d.batch; job.batch++) {
        for (job.chunk_kv0 = 0; job.chunk_kv0 < plan->d.heads_kv;
             job.chunk_kv0 += plan->chunk_kv_heads) {
            if (!bounds_only)
                fxa_pool_run(&ctx->pool, pack_item, &job,
                             plan->chunk_kv_heads * plan->n_kv_tiles);
            fxa_pool_run(&ctx->pool, work_item, &job, n_blocks * n_splits);
            if (n_splits > 1 && !bounds_only)
                fxa_pool_run(&ctx->pool, merge_item, &job, n_blocks);
        }
    }
    if (stats_out) {
        fill_stats(&job, stats_out);
        stats_out->seconds = now_seconds() - t0;
    }
    return FXA_OK;
}

fxa_status fxa_attn_run(const fxa_attn_plan *plan, const fxa_attn_args *args, void *workspace,
                        fxa_attn_stats *stats_out)
{
    return run_common(plan, args, workspace, stats_out, 0);
}

fxa_status fxa_attn_bounds(const fxa_attn_plan *plan, const fxa_attn_args *args, void *workspace,
                           fxa_attn_stats *stats_out)
{
    return run_common(plan, args, workspace, stats_out, 1);
}
