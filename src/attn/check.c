/*
 * fxa_attn_check (fxattn_diag.h): the per-head report of `fxattn check`.
 * The bounds and fallback flags come from the library's own bound pass
 * (fxa_attn_bounds, centring on and off); norms, key means and radii and
 * the true row max of sampled rows are fp64 over the values the kernels see
 * (rows read with the plan's strides and widened by fxa_row_f32). Work is
 * split by (batch, kv head), then by query head, over the context's pool;
 * every item's arithmetic runs in a fixed order, so the report does not
 * depend on the thread count.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_diag.h"
#include "../core/alloc.h"
#include "../core/struct_size.h"
#include "attn_internal.h"
#include "load.h"

/* Key statistics of one (batch, kv head). */
typedef struct check_keys {
    double kmax;   /* max ||k_j|| */
    double radius; /* max ||k_j - kbar|| */
    double vmax;   /* max |v| */
} check_keys;

typedef struct check_job {
    const fxa_attn_plan *p; /* strides, lambda, kernels (the centred plan) */
    const void *q;
    const void *k;
    const void *v; /* NULL: no V */
    const float *bound_c, *bound_r;
    const uint8_t *fb_c, *fb_r;
    double *kbar;     /* [B Hkv][D] fp64 key means */
    check_keys *keys; /* [B Hkv] */
    double *scratch;  /* per thread: scratch_len doubles */
    size_t scratch_len;
    float *rows; /* per thread: 2 D floats (a q row and a k/v row) */
    int64_t samples;
    fxa_check_head *out; /* [Hq] */
} check_job;

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x;
    const double b = *(const double *)y;
    return (a > b) - (a < b);
}

/* The upper median (element n/2 once sorted); sorts x. 0 when n is 0. */
static double median(double *x, size_t n)
{
    if (!n)
        return 0.0;
    qsort(x, n, sizeof *x, cmp_double);
    return x[n / 2];
}

static const float *row_of(const fxa_attn_plan *p, const void *base, fxa_strides s, int64_t b,
                           int64_t h, int64_t j, float *buf)
{
    const int64_t off = b * s.batch + h * s.head + j * s.token;
    return fxa_row_f32(p->ctx->kernels, base, p->d.dtype, off, (size_t)p->d.head_dim, buf);
}

/* Item (batch, kv head): key mean, max norm, centred radius, Vmax. */
static void keys_item(void *arg, int64_t item, int thread_id)
{
    const check_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const int64_t dim = p->d.head_dim;
    const int64_t b = item / p->d.heads_kv;
    const int64_t kvh = item % p->d.heads_kv;
    float *buf = job->rows + (size_t)thread_id * 2 * (size_t)dim;
    double *kbar = job->kbar + (size_t)item * (size_t)dim;
    check_keys *ks = &job->keys[item];
    ks->kmax = ks->radius = ks->vmax = 0.0;
    for (int64_t c = 0; c < dim; c++)
        kbar[c] = 0.0;
    for (int64_t j = 0; j < p->d.seq_kv; j++) {
        const float *kj = row_of(p, job->k, p->k_strides, b, kvh, j, buf);
        double nn = 0.0;
        for (int64_t c = 0; c < dim; c++) {
            kbar[c] += kj[c] / (double)p->d.seq_kv;
            nn += (double)kj[c] * kj[c];
        }
        ks->kmax = fmax(ks->kmax, sqrt(nn));
        if (job->v) {
            const float *vj = row_of(p, job->v, p->v_strides, b, kvh, j, buf + dim);
            for (int64_t c = 0; c < dim; c++)
                ks->vmax = fmax(ks->vmax, fabs((double)vj[c]));
        }
    }
    for (int64_t j = 0; j < p->d.seq_kv; j++) {
        const float *kj = row_of(p, job->k, p->k_strides, b, kvh, j, buf);
        double nn = 0.0;
        for (int64_t c = 0; c < dim; c++)
            nn += pow(kj[c] - kbar[c], 2.0);
        ks->radius = fmax(ks->radius, sqrt(nn));
    }
}

/* The true max over keys of the base-2 scores of row (b, h, i), raw and
 * centred on the key mean kbar. */
static void true_max(const check_job *job, const float *qi, const double *kbar, int64_t b,
                     int64_t kvh, float *buf, double *raw, double *centred)
{
    const fxa_attn_plan *p = job->p;
    const int64_t dim = p->d.head_dim;
    double qk_bar = 0.0;
    double best = -INFINITY;
    for (int64_t c = 0; c < dim; c++)
        qk_bar += qi[c] * kbar[c];
    for (int64_t j = 0; j < p->d.seq_kv; j++) {
        const float *kj = row_of(p, job->k, p->k_strides, b, kvh, j, buf);
        double s = 0.0;
        for (int64_t c = 0; c < dim; c++)
            s += (double)qi[c] * kj[c];
        best = fmax(best, s);
    }
    *raw = p->lambda * best;
    *centred = p->lambda * (best - qk_bar);
}

/* Item (query head h): its report. */
static void head_item(void *arg, int64_t h, int thread_id)
{
    const check_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const fxa_attn_desc *d = &p->d;
    const int64_t n = d->batch * d->seq_q;
    const int64_t kvh = h / p->group;
    float *qbuf = job->rows + (size_t)thread_id * 2 * (size_t)d->head_dim;
    float *kbuf = qbuf + d->head_dim;
    double *scratch = job->scratch + (size_t)thread_id * job->scratch_len;
    double *over = scratch + 3 * n;
    double *over_raw = over + job->samples * d->batch;
    int64_t n_over = 0;
    int64_t fb_count_c = 0;
    int64_t fb_count_r = 0;
    fxa_check_head r;
    memset(&r, 0, sizeof r);
    r.struct_size = sizeof r;
    for (int64_t b = 0; b < d->batch; b++) {
        const int64_t kv_item = b * d->heads_kv + kvh;
        const check_keys *ks = &job->keys[kv_item];
        const double *kbar = job->kbar + (size_t)kv_item * (size_t)d->head_dim;
        r.k_norm_max = fmax(r.k_norm_max, ks->kmax);
        r.k_radius_centered = fmax(r.k_radius_centered, ks->radius);
        r.vmax = fmax(r.vmax, ks->vmax);
        for (int64_t i = 0; i < d->seq_q; i++) {
            const int64_t row = (b * d->heads_q + h) * d->seq_q + i;
            const float *qi = row_of(p, job->q, p->q_strides, b, h, i, qbuf);
            double nn = 0.0;
            for (int64_t c = 0; c < d->head_dim; c++)
                nn += (double)qi[c] * qi[c];
            scratch[b * d->seq_q + i] = sqrt(nn);
            scratch[n + b * d->seq_q + i] = job->bound_c[row];
            scratch[2 * n + b * d->seq_q + i] = job->bound_r[row];
            fb_count_c += job->fb_c[row];
            fb_count_r += job->fb_r[row];
        }
        for (int64_t s = 0; s < job->samples; s++) {
            const int64_t i = job->samples > 1 ? s * (d->seq_q - 1) / (job->samples - 1) : 0;
            const int64_t row = (b * d->heads_q + h) * d->seq_q + i;
            const float *qi = row_of(p, job->q, p->q_strides, b, h, i, qbuf);
            double raw;
            double centred;
            true_max(job, qi, kbar, b, kvh, kbuf, &raw, &centred);
            over[n_over] = job->bound_c[row] - centred;
            over_raw[n_over++] = job->bound_r[row] - raw;
        }
    }
    if (!job->v)
        r.vmax = 1.0; /* V taken as zeros: C as for Vmax 1 */
    r.c = fxa_fixed_m_c(d->seq_kv, r.vmax);
    r.gate = fxa_fixed_m_gate_strict(r.c);
    r.gate_centered = fxa_fixed_m_gate_centered(r.c, d->seq_kv);
    r.rows = n;
    r.fallback_rows_centered = fb_count_c;
    r.fallback_rows_raw = fb_count_r;
    r.sampled_rows = n_over;
    r.fallback_share_centered = (double)fb_count_c / (double)n;
    r.fallback_share_raw = (double)fb_count_r / (double)n;
    r.q_norm_min = INFINITY;
    for (int64_t i = 0; i < n; i++) {
        r.q_norm_max = fmax(r.q_norm_max, scratch[i]);
        r.q_norm_min = fmin(r.q_norm_min, scratch[i]);
        r.bound_max = fmax(r.bound_max, scratch[n + i]);
        r.bound_raw_max = fmax(r.bound_raw_max, scratch[2 * n + i]);
    }
    r.q_norm_median = median(scratch, (size_t)n);
    r.bound_median = median(scratch + n, (size_t)n);
    r.bound_raw_median = median(scratch + 2 * n, (size_t)n);
    for (int64_t i = 0; i < n_over; i++) {
        r.overshoot_max = fmax(r.overshoot_max, over[i]);
        r.overshoot_raw_max = fmax(r.overshoot_raw_max, over_raw[i]);
    }
    r.overshoot_median = median(over, (size_t)n_over);
    r.overshoot_raw_median = median(over_raw, (size_t)n_over);
    job->out[h] = r;
}

/* The bound pass of plan: row bounds and flags into bound and fb. */
static fxa_status bound_pass(const fxa_attn_plan *plan, const void *q, const void *k, const void *v,
                             void *ws, float *bound, uint8_t *fb)
{
    const fxa_attn_args a = {
        .struct_size = sizeof a, .q = q, .k = k, .v = v, .row_bound = bound, .row_fallback = fb};
    return fxa_attn_bounds(plan, &a, ws, NULL);
}

/* a * b, or SIZE_MAX when that overflows size_t. */
static size_t mul_sat(size_t a, size_t b)
{
    return b && a > SIZE_MAX / b ? SIZE_MAX : a * b;
}

/* a + b, or SIZE_MAX when that overflows size_t. */
static size_t add_sat(size_t a, size_t b)
{
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

static fxa_status check(fxa_ctx *ctx, const fxa_attn_desc *d, const void *q, const void *k,
                        const void *v, int sample_rows, fxa_check_head *heads_out,
                        size_t head_struct_size)
{
    if (!d || !q || !k || !heads_out)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "fxa_attn_check: d, q, k and heads_out must not be NULL");
    fxa_status st =
        fxa_struct_size_check(head_struct_size, FXA_CHECK_HEAD_SIZE_0_2, sizeof(fxa_check_head),
                              "fxa_check_head", ctx->last_error, sizeof ctx->last_error);
    if (st != FXA_OK)
        return st;
    if (sample_rows < 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "sample_rows is %d: it must be >= 0 (0 means %d)", sample_rows,
                            FXA_CHECK_SAMPLE_ROWS);
    fxa_attn_desc full;
    fxa_attn_desc_init(&full);
    st = fxa_struct_in(&full, sizeof full, d, FXA_ATTN_DESC_SIZE_0_1, "fxa_attn_desc",
                       ctx->last_error, sizeof ctx->last_error);
    if (st != FXA_OK)
        return st;
    full.mode = FXA_MODE_AUTO;
    fxa_attn_desc raw = full;
    raw.center = 0;
    full.center = 1;

    fxa_attn_plan *plan_c = NULL;
    fxa_attn_plan *plan_r = NULL;
    void *ws = NULL;
    void *zero_v = NULL;
    float *bound_c = NULL, *bound_r = NULL;
    uint8_t *fb_c = NULL, *fb_r = NULL;
    double *kbar = NULL, *scratch = NULL;
    check_keys *keys = NULL;
    float *row_bufs = NULL;
    fxa_check_head *heads = NULL;
    size_t ws_c = 0, ws_r = 0;
    /* The descriptor is validated (by the plan) before anything is sized
     * from it. */
    if ((st = fxa_attn_plan_create(ctx, &full, &plan_c, &ws_c)) != FXA_OK)
        goto out;
    if (!v) {
        /* Without V the bound pass reads zeros: one zero row per batch
         * (token and head strides 0) gives the bounds of a whole tensor of
         * zeros. The caller's V strides were checked by the plan above. */
        raw.v_strides = (fxa_attn_strides){.batch = 1, .token = 0, .head = 0};
        full.v_strides = raw.v_strides;
        fxa_attn_plan_destroy(plan_c);
        plan_c = NULL;
        if ((st = fxa_attn_plan_create(ctx, &full, &plan_c, &ws_c)) != FXA_OK)
            goto out;
    }
    if ((st = fxa_attn_plan_create(ctx, &raw, &plan_r, &ws_r)) != FXA_OK)
        goto out;

    const size_t rows = (size_t)(full.batch * full.heads_q * full.seq_q);
    const int64_t n = full.batch * full.seq_q;
    const int64_t want = sample_rows ? sample_rows : FXA_CHECK_SAMPLE_ROWS;
    const int64_t samples = full.seq_q < want ? full.seq_q : want;
    const size_t threads = (size_t)fxa_ctx_threads(ctx);
    const size_t dim = (size_t)full.head_dim;
    const size_t n_kv = (size_t)(full.batch * full.heads_kv);
    const size_t ws_bytes = ws_c > ws_r ? ws_c : ws_r;
    const size_t scratch_len =
        add_sat(mul_sat(3, (size_t)n), mul_sat(2, mul_sat((size_t)samples, (size_t)full.batch)));
    size_t need = add_sat(ws_bytes, mul_sat(rows, 2 * (sizeof(float) + 1)));
    need = add_sat(need, mul_sat(n_kv, (dim + 3) * sizeof(double)));
    need = add_sat(need, mul_sat(mul_sat(scratch_len, threads), sizeof(double)));
    const uint64_t avail = fxa_available_memory();
    if (need == SIZE_MAX || (uint64_t)need > avail) {
        st = fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY,
                          "fxa_attn_check needs %.1f GiB of scratch, %.1f GiB available",
                          (double)need / 1073741824.0, (double)avail / 1073741824.0);
        goto out;
    }
    if (!v && !(zero_v = calloc((size_t)full.batch + dim, sizeof(float)))) {
        st = fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory for fxa_attn_check's scratch");
        goto out;
    }
    ws = ws_bytes ? fxa_malloc_aligned(ws_bytes) : NULL;
    bound_c = malloc(rows * sizeof(float));
    bound_r = malloc(rows * sizeof(float));
    fb_c = malloc(rows);
    fb_r = malloc(rows);
    kbar = malloc(n_kv * dim * sizeof(double));
    keys = malloc(n_kv * sizeof *keys);
    scratch = malloc(scratch_len * threads * sizeof(double));
    row_bufs = malloc(threads * 2 * dim * sizeof(float));
    heads = malloc((size_t)full.heads_q * sizeof *heads);
    if ((ws_bytes && !ws) || !bound_c || !bound_r || !fb_c || !fb_r || !kbar || !keys || !scratch ||
        !row_bufs || !heads) {
        st = fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory for fxa_attn_check's scratch");
        goto out;
    }
    const void *v_in = v ? v : zero_v;
    if ((st = bound_pass(plan_c, q, k, v_in, ws, bound_c, fb_c)) != FXA_OK ||
        (st = bound_pass(plan_r, q, k, v_in, ws, bound_r, fb_r)) != FXA_OK)
        goto out;
    check_job job = {.p = plan_c,
                     .q = q,
                     .k = k,
                     .v = v,
                     .bound_c = bound_c,
                     .bound_r = bound_r,
                     .fb_c = fb_c,
                     .fb_r = fb_r,
                     .kbar = kbar,
                     .keys = keys,
                     .scratch = scratch,
                     .scratch_len = scratch_len,
                     .rows = row_bufs,
                     .samples = samples,
                     .out = heads};
    fxa_pool_run(&ctx->pool, keys_item, &job, (int64_t)n_kv);
    fxa_pool_run(&ctx->pool, head_item, &job, full.heads_q);
    for (int64_t h = 0; h < full.heads_q; h++) {
        heads[h].struct_size = head_struct_size;
        memcpy((unsigned char *)heads_out + (size_t)h * head_struct_size, &heads[h],
               head_struct_size);
    }
out:
    fxa_attn_plan_destroy(plan_c);
    fxa_attn_plan_destroy(plan_r);
    fxa_free_aligned(ws);
    free(zero_v);
    free(bound_c);
    free(bound_r);
    free(fb_c);
    free(fb_r);
    free(kbar);
    free(keys);
    free(scratch);
    free(row_bufs);
    free(heads);
    return st;
}

fxa_status fxa_attn_check(fxa_ctx *ctx, const fxa_attn_desc *d, const void *q, const void *k,
                          const void *v, int sample_rows, fxa_check_head *heads_out,
                          size_t head_struct_size)
{
    if (!ctx)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(ctx);
    const fxa_status st = check(ctx, d, q, k, v, sample_rows, heads_out, head_struct_size);
    fxa_ctx_end(ctx);
    return st;
}
