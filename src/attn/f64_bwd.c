/*
 * The fp64 backward (f64.h): the inputs checked (finite; lse_f64 finite, or
 * -INFINITY on a row whose keys are all masked), then per row its softmax
 * shift m_i and sum l_i, recomputed by the forward tile online over every
 * key (so that P_ij = exp(z_ij - m_i) / l_i keeps its precision where a
 * mask value of fp64's magnitude absorbs the scores and the LSE: lse_f64
 * only has to agree with m_i + log(l_i)), and delta_i = dout_i . out_i;
 * then dQ by items of F64_BWD_ROWS query rows (each row's sum over every
 * key tile in order) and dK, dV by items of F64_BWD_KEYS keys of one kv
 * head (each key's sum over its query heads and rows in order): every
 * gradient element is summed by one item in a fixed order, so results do
 * not depend on the thread count, bit for bit.
 */
#include <math.h>
#include <string.h>

#include "../base/alloc.h"
#include "../base/clock.h"
#include "../base/spans.h"
#include "../base/struct_size.h"
#include "f64.h"
#include "steps.h"

#define F64_BWD_ROWS 16
#define F64_BWD_KEYS FXA_F64_KV_TILE

/* A row whose lse_f64 is not the one its scores give: the lowest item a
 * thread met. */
typedef struct bad_row {
    int64_t item; /* -1: none */
    int64_t b, h, i;
    double lse, want;
} bad_row;

/* How far lse_f64 may lie from the backward's m_i + log(l_i), relative to
 * 1 + |lse|: the forward's centred, fixed-shift sums round differently. */
#define F64_LSE_AGREE 0x1p-30

typedef struct bwd_job {
    const fxa_attn_plan *p;
    const fxa_attn_bwd_args *a;
    unsigned char *ws;
    int64_t n_row_blocks;
    int64_t n_key_blocks;
} bwd_job;

/* Per row: delta, m and l, [B Hq Sq] doubles each. */
static size_t rows_bytes(const fxa_attn_plan *p)
{
    return fxa_align_up((size_t)(p->d.batch * p->d.heads_q * p->d.seq_q) * sizeof(double));
}

/* One thread's buffers. */
typedef struct bwd_scratch {
    double *bias;    /* [F64_BWD_ROWS][F64_BWD_KEYS] */
    double *o;       /* [F64_BWD_ROWS][D]: the forward tile's output, unused */
    double *scores;  /* [F64_BWD_KEYS] */
    double *center;  /* [F64_BWD_ROWS]: 0 */
    uint8_t *online; /* [F64_BWD_ROWS]: 1 */
    bad_row *bad;
} bwd_scratch;

static size_t thread_bytes(const fxa_attn_plan *p)
{
    return fxa_align_up(F64_BWD_ROWS * F64_BWD_KEYS * sizeof(double)) +
           fxa_align_up(F64_BWD_ROWS * (size_t)p->d.head_dim * sizeof(double)) +
           fxa_align_up(F64_BWD_KEYS * sizeof(double)) +
           fxa_align_up(F64_BWD_ROWS * sizeof(double)) + fxa_align_up(F64_BWD_ROWS) +
           fxa_align_up(sizeof(bad_row));
}

size_t fxa_f64_bwd_workspace(const fxa_attn_plan *p, int n_threads)
{
    return 3 * rows_bytes(p) + (size_t)n_threads * thread_bytes(p);
}

static double *delta_of(const bwd_job *job)
{
    return (double *)(void *)job->ws;
}

static double *m_of(const bwd_job *job)
{
    return (double *)(void *)(job->ws + rows_bytes(job->p));
}

static double *l_of(const bwd_job *job)
{
    return (double *)(void *)(job->ws + 2 * rows_bytes(job->p));
}

static bwd_scratch scratch_of(const bwd_job *job, int t)
{
    const fxa_attn_plan *p = job->p;
    unsigned char *at = job->ws + 3 * rows_bytes(p) + (size_t)t * thread_bytes(p);
    bwd_scratch s;
    s.bias = (double *)(void *)at;
    at += fxa_align_up(F64_BWD_ROWS * F64_BWD_KEYS * sizeof(double));
    s.o = (double *)(void *)at;
    at += fxa_align_up(F64_BWD_ROWS * (size_t)p->d.head_dim * sizeof(double));
    s.scores = (double *)(void *)at;
    at += fxa_align_up(F64_BWD_KEYS * sizeof(double));
    s.center = (double *)(void *)at;
    at += fxa_align_up(F64_BWD_ROWS * sizeof(double));
    s.online = at;
    at += fxa_align_up(F64_BWD_ROWS);
    s.bad = (bad_row *)(void *)at;
    return s;
}

static int64_t lse_at(const fxa_attn_plan *p, int64_t b, int64_t h, int64_t i)
{
    return (b * p->d.heads_q + h) * p->d.seq_q + i;
}

/* The tile of rows [i0, i0 + n) of query head h (batch b) against keys
 * [j0, j0 + n_kv): its bias in bias (NULL when it has none), 0 when every
 * pair is masked. */
static int tile_of(const bwd_job *job, int64_t b, int64_t h, int64_t i0, size_t n, int64_t j0,
                   size_t n_kv, double *bias, fxa_attn_bwd_tile_f64 *t)
{
    const fxa_attn_plan *p = job->p;
    const fxa_attn_bwd_args *a = job->a;
    const int64_t g = h / p->group;
    t->bias = NULL;
    if (fxa_attn_masked(p)) {
        const fxa_tile_use use =
            fxa_f64_tile_bias(p, a->mask, b, h, i0, n, j0, n_kv, F64_BWD_KEYS, bias);
        if (use == FXA_TILE_SKIP)
            return 0;
        t->bias = use == FXA_TILE_BIAS ? bias : NULL;
    }
    t->n_q = n;
    t->n_kv = n_kv;
    t->d = (size_t)p->d.head_dim;
    t->tau = p->d.scale;
    t->q = (const double *)a->q + fxa_f64_row(&p->q_strides, b, h, i0);
    t->dout = (const double *)a->dout + fxa_f64_row(&p->o_strides, b, h, i0);
    t->ldq = p->q_strides.token;
    t->ld_dout = p->o_strides.token;
    t->k = (const double *)a->k + fxa_f64_row(&p->k_strides, b, g, j0);
    t->ldk = p->k_strides.token;
    t->v = (const double *)a->v + fxa_f64_row(&p->v_strides, b, g, j0);
    t->ldv = p->v_strides.token;
    t->m = m_of(job) + lse_at(p, b, h, i0);
    t->l = l_of(job) + lse_at(p, b, h, i0);
    t->delta = delta_of(job) + lse_at(p, b, h, i0);
    t->ld_bias = F64_BWD_KEYS;
    return 1;
}

/* Rows [i0, i0 + n) of an item of F64_BWD_ROWS rows: delta, and m and l
 * from the forward tile run online (center 0) over every key they attend;
 * a row whose lse_f64 disagrees is recorded in the thread's bad_row. */
static void rows_item(void *arg, int64_t item, int thread_id)
{
    const bwd_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const fxa_attn_bwd_args *a = job->a;
    const bwd_scratch s = scratch_of(job, thread_id);
    const int64_t blk = item % job->n_row_blocks, bh = item / job->n_row_blocks;
    const int64_t b = bh / p->d.heads_q, h = bh % p->d.heads_q, i0 = blk * F64_BWD_ROWS;
    const int64_t d = p->d.head_dim, row0 = lse_at(p, b, h, i0);
    const size_t n = (size_t)(p->d.seq_q - i0 < F64_BWD_ROWS ? p->d.seq_q - i0 : F64_BWD_ROWS);
    double *m = m_of(job) + row0, *l = l_of(job) + row0;
    for (size_t r = 0; r < n; r++) {
        const int64_t at = fxa_f64_row(&p->o_strides, b, h, i0 + (int64_t)r);
        const double *o = (const double *)a->out + at, *dout = (const double *)a->dout + at;
        double sum = 0.0;
        for (int64_t c = 0; c < d; c++)
            sum += dout[c] * o[c];
        delta_of(job)[row0 + (int64_t)r] = sum;
        m[r] = -INFINITY;
        l[r] = 0.0;
        s.center[r] = 0.0;
        s.online[r] = 1;
    }
    fxa_attn_tile_f64 t = {.n_q = n,
                           .d = (size_t)d,
                           .tau = p->d.scale,
                           .q = (const double *)a->q + fxa_f64_row(&p->q_strides, b, h, i0),
                           .ldq = (size_t)p->q_strides.token,
                           .ldk = p->k_strides.token,
                           .ldv = p->v_strides.token,
                           .center = s.center,
                           .online = s.online,
                           .m = m,
                           .l = l,
                           .o = s.o,
                           .ldo = (size_t)d,
                           .scores = s.scores,
                           .ld_bias = F64_BWD_KEYS};
    fxa_f64_rows_over_keys(p, a->k, a->v, a->mask, b, h, i0, n, &t, s.bias);
    for (size_t r = 0; r < n; r++) {
        const double want = l[r] > 0.0 ? m[r] + log(l[r]) : -INFINITY;
        const double got = a->lse_f64[row0 + (int64_t)r];
        const int agree =
            want == -INFINITY
                ? got == -INFINITY
                : got > -INFINITY && fabs(got - want) <= F64_LSE_AGREE * (1.0 + fabs(want));
        if (!agree && (s.bad->item < 0 || item < s.bad->item))
            *s.bad = (bad_row){item, b, h, i0 + (int64_t)r, got, want};
    }
}

static void dq_item(void *arg, int64_t item, int thread_id)
{
    const bwd_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const int64_t blk = item % job->n_row_blocks, bh = item / job->n_row_blocks;
    const int64_t b = bh / p->d.heads_q, h = bh % p->d.heads_q, i0 = blk * F64_BWD_ROWS;
    const size_t n = (size_t)(p->d.seq_q - i0 < F64_BWD_ROWS ? p->d.seq_q - i0 : F64_BWD_ROWS);
    double *dq = (double *)job->a->dq + fxa_f64_row(&p->q_strides, b, h, i0);
    for (size_t r = 0; r < n; r++)
        memset(dq + (int64_t)r * p->q_strides.token, 0, (size_t)p->d.head_dim * sizeof(double));
    fxa_attn_bwd_tile_f64 t = {0};
    const int64_t end = fxa_f64_keys_end(p, i0, n);
    for (int64_t j0 = 0; j0 < end; j0 += F64_BWD_KEYS) {
        const size_t n_kv =
            (size_t)(p->d.seq_kv - j0 < F64_BWD_KEYS ? p->d.seq_kv - j0 : F64_BWD_KEYS);
        if (!tile_of(job, b, h, i0, n, j0, n_kv, scratch_of(job, thread_id).bias, &t))
            continue;
        t.dq = dq;
        t.ld_dq = p->q_strides.token;
        p->ctx->kernels->attn_bwd_dq_f64(&t);
    }
}

static void dkdv_item(void *arg, int64_t item, int thread_id)
{
    const bwd_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const int64_t blk = item % job->n_key_blocks, bg = item / job->n_key_blocks;
    const int64_t b = bg / p->d.heads_kv, g = bg % p->d.heads_kv, j0 = blk * F64_BWD_KEYS;
    const size_t n_kv = (size_t)(p->d.seq_kv - j0 < F64_BWD_KEYS ? p->d.seq_kv - j0 : F64_BWD_KEYS);
    double *dk = (double *)job->a->dk + fxa_f64_row(&p->k_strides, b, g, j0);
    double *dv = (double *)job->a->dv + fxa_f64_row(&p->v_strides, b, g, j0);
    const size_t row_bytes = (size_t)p->d.head_dim * sizeof(double);
    for (size_t j = 0; j < n_kv; j++) {
        memset(dk + (int64_t)j * p->k_strides.token, 0, row_bytes);
        memset(dv + (int64_t)j * p->v_strides.token, 0, row_bytes);
    }
    fxa_attn_bwd_tile_f64 t = {0};
    for (int64_t h = g * p->group; h < (g + 1) * p->group; h++)
        for (int64_t i0 = 0; i0 < p->d.seq_q; i0 += F64_BWD_ROWS) {
            const size_t n =
                (size_t)(p->d.seq_q - i0 < F64_BWD_ROWS ? p->d.seq_q - i0 : F64_BWD_ROWS);
            if (j0 >= fxa_f64_keys_end(p, i0, n) ||
                !tile_of(job, b, h, i0, n, j0, n_kv, scratch_of(job, thread_id).bias, &t))
                continue;
            t.dk = dk;
            t.ld_dk = p->k_strides.token;
            t.dv = dv;
            t.ld_dv = p->v_strides.token;
            p->ctx->kernels->attn_bwd_dkdv_f64(&t);
        }
}

/* Outputs apart from the inputs and each other. */
static fxa_status check_spans(const fxa_attn_plan *p, const fxa_attn_bwd_args *a, void *ws,
                              size_t ws_bytes)
{
    const size_t rows = (size_t)(p->d.batch * p->d.heads_q * p->d.seq_q);
    const fxa_span in[7] = {
        {"q", a->q, (size_t)p->q_extent * 8},
        {"k", a->k, (size_t)p->kv_extent[0] * 8},
        {"v", a->v, (size_t)p->kv_extent[1] * 8},
        {"out", a->out, (size_t)p->o_extent * 8},
        {"dout", a->dout, (size_t)p->o_extent * 8},
        {"lse_f64", a->lse_f64, rows * 8},
        {"mask", p->mask_bytes ? a->mask : NULL, p->mask_bytes},
    };
    const fxa_span out[4] = {
        {"dq", a->dq, (size_t)p->q_extent * 8},
        {"dk", a->dk, (size_t)p->kv_extent[0] * 8},
        {"dv", a->dv, (size_t)p->kv_extent[1] * 8},
        {"workspace", ws, ws_bytes},
    };
    return fxa_spans_disjoint(p->ctx, out, 4, in, 7);
}

static fxa_status check_inputs(const fxa_attn_plan *p, const fxa_attn_bwd_args *a)
{
    if (a->lse || a->lse_parts)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "an fp64 plan's backward reads lse_f64 (lse and lse_parts must be "
                            "NULL)");
    if (!a->lse_f64)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "lse_f64 is missing: the fp64 backward needs the forward's "
                            "(fxa_attn_args.lse_f64)");
    if (a->grad_dtype != FXA_F64)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "an fp64 plan writes FXA_F64 gradients (grad_dtype is %d)",
                            (int)a->grad_dtype);
    fxa_status st;
    if ((st = fxa_mask_check(p, a->mask)) != FXA_OK ||
        (st = fxa_f64_check_finite(p, "q", a->q, &p->q_strides, p->d.heads_q, p->d.seq_q)) !=
            FXA_OK ||
        (st = fxa_f64_check_finite(p, "k", a->k, &p->k_strides, p->d.heads_kv, p->d.seq_kv)) !=
            FXA_OK ||
        (st = fxa_f64_check_finite(p, "v", a->v, &p->v_strides, p->d.heads_kv, p->d.seq_kv)) !=
            FXA_OK ||
        (st = fxa_f64_check_finite(p, "out", a->out, &p->o_strides, p->d.heads_q, p->d.seq_q)) !=
            FXA_OK ||
        (st = fxa_f64_check_finite(p, "dout", a->dout, &p->o_strides, p->d.heads_q, p->d.seq_q)) !=
            FXA_OK)
        return st;
    for (int64_t b = 0; b < p->d.batch; b++)
        for (int64_t h = 0; h < p->d.heads_q; h++)
            for (int64_t i = 0; i < p->d.seq_q; i++) {
                const double x = a->lse_f64[lse_at(p, b, h, i)];
                if (!isfinite(x) && !(x == -INFINITY && fxa_attn_masked(p)))
                    return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                                        "lse_f64 has a non-finite value (%g) at batch %lld, "
                                        "head %lld, token %lld",
                                        x, (long long)b, (long long)h, (long long)i);
            }
    return FXA_OK;
}

fxa_status fxa_f64_bwd_run(const fxa_attn_plan *p, const fxa_attn_bwd_args *a, unsigned char *ws,
                           size_t ws_bytes, fxa_attn_bwd_stats *stats)
{
    fxa_status st;
    if ((st = check_inputs(p, a)) != FXA_OK || (st = check_spans(p, a, ws, ws_bytes)) != FXA_OK)
        return st;
    const double t0 = fxa_now_seconds();
    fxa_pool *pool = &p->ctx->pool;
    bwd_job job = {p, a, ws, (p->d.seq_q + F64_BWD_ROWS - 1) / F64_BWD_ROWS,
                   (p->d.seq_kv + F64_BWD_KEYS - 1) / F64_BWD_KEYS};
    const int64_t n_row_items = p->d.batch * p->d.heads_q * job.n_row_blocks;
    for (int t = 0; t < pool->n_threads; t++)
        scratch_of(&job, t).bad->item = -1;
    fxa_pool_run(pool, rows_item, &job, n_row_items);
    const bad_row *bad = NULL;
    for (int t = 0; t < pool->n_threads; t++) {
        const bad_row *r = scratch_of(&job, t).bad;
        if (r->item >= 0 && (!bad || r->item < bad->item))
            bad = r;
    }
    if (bad)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "lse_f64 is not the forward's for these inputs: %.17g at batch "
                            "%lld, head %lld, token %lld, where the scores give %.17g; nothing "
                            "was written",
                            bad->lse, (long long)bad->b, (long long)bad->h, (long long)bad->i,
                            bad->want);
    fxa_pool_run(pool, dq_item, &job, n_row_items);
    fxa_pool_run(pool, dkdv_item, &job, p->d.batch * p->d.heads_kv * job.n_key_blocks);
    if (stats) {
        const fxa_attn_bwd_stats full = {.struct_size = sizeof full,
                                         .rows = p->d.batch * p->d.heads_q * p->d.seq_q,
                                         .keys = p->d.seq_kv,
                                         .seconds = fxa_now_seconds() - t0};
        fxa_struct_out(stats, &full, sizeof full);
    }
    return FXA_OK;
}
