/*
 * The attention driver: bound pass, then threads over work items
 * (batch, head tile, query block). Each item owns its rows from start to end
 * (a row's whole key loop runs in one item, in a fixed tile order), so the
 * result does not depend on the thread count, heads_per_tile or block_q.
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
#include "load.h"
#include "scan.h"

typedef struct run_job {
    const fxa_attn_plan *p;
    const fxa_attn_args *a;
    unsigned char *ws;
    int bounds_only;
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
    s->k = (float *)at;
    at += fxa_align_up(p->kv_tile * dim * sizeof(float));
    s->v = (float *)at;
    at += fxa_align_up(p->kv_tile * dim * sizeof(float));
    s->scores = (float *)at;
    s->fallback_rows = 0;
    s->max_bound = 0.0;
}

/* Load one head's query rows and decide, per row, fixed shift or online. */
static void setup_rows(const run_job *job, fxa_thread_scratch *s, size_t slot, int64_t b,
                       int64_t h, int64_t i0, size_t n_rows)
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
    fxa_load_rows(job->a->q, p->d.dtype, q_off, p->q_strides.token, n_rows, dim, q, dim);
    for (size_t i = 0; i < n_rows; i++) {
        const float *qi = q + i * dim;
        const size_t r = slot * bq + i;
        double qq = 0.0;
        double qk = 0.0;
        for (size_t c = 0; c < dim; c++) {
            qq += (double)qi[c] * qi[c];
            qk += (double)qi[c] * kbar[c];
        }
        const double qn = p->lambda * sqrt(qq);
        const double ceil_u = ceil(qn * (hb->radius + hb->eps_radius));
        const int fixed = auto_mode &&
                          (ceil_u <= hb->gate_strict ||
                           (centred && qn * hb->eps_radius <= 1.0 && ceil_u <= hb->gate_centered));
        s->qk_center[r] = centred ? (float)qk : 0.0f;
        s->online[r] = (uint8_t)!fixed;
        s->m[r] = fixed ? (float)(ceil_u - hb->c) : -INFINITY;
        s->l[r] = 0.0f;
        memset(s->o + r * dim, 0, dim * sizeof(float));
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

/* K rows [off, off + n_kv) of one head into s->k as K transposed
 * [D][kv_tile], the layout the tile kernels read. */
static void load_keys_transposed(const run_job *job, int64_t off, size_t n_kv,
                                 fxa_thread_scratch *s)
{
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    float row[FXA_MAX_HEAD_DIM];
    for (size_t j = 0; j < n_kv; j++) {
        fxa_load_row(job->a->k, p->d.dtype, off + (int64_t)j * p->kv_strides.token, dim, row);
        for (size_t c = 0; c < dim; c++)
            s->k[c * p->kv_tile + j] = row[c];
    }
}

static void work_item(void *arg, int64_t item, int thread_id)
{
    const run_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const size_t dim = (size_t)p->d.head_dim;
    const size_t bq = (size_t)p->d.block_q;
    const int64_t hpt = p->d.heads_per_tile;
    const int64_t qb = item % p->n_q_blocks;
    const int64_t tile = (item / p->n_q_blocks) % p->n_head_tiles;
    const int64_t b = item / (p->n_q_blocks * p->n_head_tiles);
    const int64_t i0 = qb * p->d.block_q;
    const size_t n_rows = (size_t)(p->d.seq_q - i0 < p->d.block_q ? p->d.seq_q - i0 : p->d.block_q);
    fxa_thread_scratch *s = thread_scratch(job, thread_id);

    for (int64_t slot = 0; slot < hpt; slot++)
        setup_rows(job, s, (size_t)slot, b, tile * hpt + slot, i0, n_rows);
    if (job->bounds_only)
        return;
    for (int64_t j0 = 0; j0 < p->d.seq_kv; j0 += (int64_t)p->kv_tile) {
        const size_t n_kv = (size_t)(p->d.seq_kv - j0 < (int64_t)p->kv_tile ? p->d.seq_kv - j0
                                                                              : (int64_t)p->kv_tile);
        int64_t loaded_kvh = -1;
        for (int64_t slot = 0; slot < hpt; slot++) {
            const int64_t kvh = (tile * hpt + slot) / p->group;
            const size_t r = (size_t)slot * bq;
            if (kvh != loaded_kvh) {
                const int64_t off = b * p->kv_strides.batch + kvh * p->kv_strides.head +
                                    j0 * p->kv_strides.token;
                load_keys_transposed(job, off, n_kv, s);
                fxa_load_rows(job->a->v, p->d.dtype, off, p->kv_strides.token, n_kv, dim, s->v,
                              dim);
                loaded_kvh = kvh;
            }
            const fxa_attn_tile t = {
                .n_q = n_rows,
                .n_kv = n_kv,
                .d = dim,
                .lambda = (float)p->lambda,
                .q = s->q + r * dim,
                .ldq = dim,
                .kt = s->k,
                .ldkt = p->kv_tile,
                .v = s->v,
                .ldv = dim,
                .qk_center = s->qk_center + r,
                .online = s->online + r,
                .m = s->m + r,
                .l = s->l + r,
                .o = s->o + r * dim,
                .ldo = dim,
                .scores = s->scores,
            };
            p->ctx->kernels->attn_tile(&t);
        }
    }
    for (int64_t slot = 0; slot < hpt; slot++)
        finish_rows(job, s, (size_t)slot, b, tile * hpt + slot, i0, n_rows);
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
    run_job job = {plan, args, workspace, bounds_only};
    fxa_status st = fxa_scan_inputs(plan, args, workspace);
    if (st != FXA_OK)
        return st;
    for (int t = 0; t < ctx->pool.n_threads; t++)
        carve_scratch(plan, workspace, t);
    const int64_t n_items = plan->d.batch * plan->n_head_tiles * plan->n_q_blocks;
    fxa_pool_run(&ctx->pool, work_item, &job, n_items);
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
