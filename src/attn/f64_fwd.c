/*
 * The fp64 forward (f64.h): a pass over K, V and Q in double (finite, key
 * mean, radii, max |v|), then work items of F64_BLOCK_Q query rows of one
 * head, each running its rows over every key tile in order and writing
 * them: results do not depend on the thread count, bit for bit.
 */
#include <math.h>
#include <string.h>

#include "../base/alloc.h"
#include "../base/clock.h"
#include "../base/struct_size.h"
#include "f64.h"

#define F64_BLOCK_Q 16
#define LOG2E 1.4426950408889634

/* Per (batch, kv head): what the bound needs. */
typedef struct f64_head {
    double kmax;   /* max_j ||k_j|| */
    double radius; /* max_j ||k_j - kbar|| with centring, else kmax */
    double vmax;   /* max |v| */
    double pad;
} f64_head;

/* One thread's buffers (F64_BLOCK_Q rows, one key tile). */
typedef struct f64_scratch {
    double *q, *o;                     /* [BQ][D] */
    double *m, *l, *center, *bias_max; /* [BQ] */
    double *scores;                    /* [KV] */
    double *bias;                      /* [BQ][KV] */
    uint8_t *online;                   /* [BQ] */
    int64_t *fallback_rows;
    double *max_bound; /* largest ceil(U_i) in base 2 */
} f64_scratch;

typedef struct f64_job {
    const fxa_attn_plan *p;
    const fxa_attn_args *a;
    unsigned char *ws;
    int64_t n_blocks; /* query blocks per head */
} f64_job;

static size_t heads_bytes(const fxa_attn_plan *p)
{
    const size_t n = (size_t)(p->d.batch * p->d.heads_kv);
    return fxa_align_up(n * sizeof(f64_head)) + fxa_align_up(n * (size_t)p->d.head_dim * 8);
}

static size_t thread_bytes(const fxa_attn_plan *p)
{
    const size_t d = (size_t)p->d.head_dim;
    return 2 * fxa_align_up(F64_BLOCK_Q * d * 8) + 4 * fxa_align_up(F64_BLOCK_Q * 8) +
           fxa_align_up(FXA_F64_KV_TILE * 8) + fxa_align_up(F64_BLOCK_Q * FXA_F64_KV_TILE * 8) +
           fxa_align_up(F64_BLOCK_Q) + 2 * FXA_ALIGN;
}

size_t fxa_f64_workspace(const fxa_attn_plan *p, int n_threads)
{
    return heads_bytes(p) + (size_t)n_threads * thread_bytes(p);
}

/* Carve thread t's buffers from the workspace. */
static f64_scratch scratch_of(const fxa_attn_plan *p, unsigned char *ws, int t)
{
    const size_t d = (size_t)p->d.head_dim;
    unsigned char *at = ws + heads_bytes(p) + (size_t)t * thread_bytes(p);
    f64_scratch s;
#define TAKE(field, type, bytes)                                                                   \
    s.field = (type *)(void *)at;                                                                  \
    at += fxa_align_up(bytes)
    TAKE(q, double, F64_BLOCK_Q *d * 8);
    TAKE(o, double, F64_BLOCK_Q *d * 8);
    TAKE(m, double, F64_BLOCK_Q * 8);
    TAKE(l, double, F64_BLOCK_Q * 8);
    TAKE(center, double, F64_BLOCK_Q * 8);
    TAKE(bias_max, double, F64_BLOCK_Q * 8);
    TAKE(scores, double, FXA_F64_KV_TILE * 8);
    TAKE(bias, double, F64_BLOCK_Q *FXA_F64_KV_TILE * 8);
    TAKE(online, uint8_t, F64_BLOCK_Q);
    TAKE(fallback_rows, int64_t, 8);
    TAKE(max_bound, double, 8);
#undef TAKE
    return s;
}

static const f64_head *heads_of(const unsigned char *ws)
{
    return (const f64_head *)(const void *)ws;
}

static double *kbar_of(const fxa_attn_plan *p, unsigned char *ws, int64_t bh)
{
    const size_t n = (size_t)(p->d.batch * p->d.heads_kv);
    return (double *)(void *)(ws + fxa_align_up(n * sizeof(f64_head))) + bh * p->d.head_dim;
}

/* ||x||, without overflow or underflow of the squares. */
static double norm(const double *x, int64_t d)
{
    double amax = 0.0, sum = 0.0;
    for (int64_t c = 0; c < d; c++)
        amax = fabs(x[c]) > amax ? fabs(x[c]) : amax;
    if (amax == 0.0)
        return 0.0;
    for (int64_t c = 0; c < d; c++)
        sum += (x[c] / amax) * (x[c] / amax);
    return amax * sqrt(sum);
}

static double dot(const double *x, const double *y, int64_t d)
{
    double s = 0.0;
    for (int64_t c = 0; c < d; c++)
        s += x[c] * y[c];
    return s;
}

/* Key mean, key radii and max |v| of every (batch, kv head). */
static void scan_kv(const fxa_attn_plan *p, const double *k, const double *v, unsigned char *ws)
{
    const int64_t d = p->d.head_dim, n = p->d.seq_kv;
    f64_head *heads = (f64_head *)(void *)ws;
    double diff[FXA_MAX_HEAD_DIM];
    for (int64_t b = 0; b < p->d.batch; b++)
        for (int64_t g = 0; g < p->d.heads_kv; g++) {
            const int64_t bh = b * p->d.heads_kv + g;
            double *kbar = kbar_of(p, ws, bh);
            f64_head hd = {0.0, 0.0, 0.0, 0.0};
            memset(kbar, 0, (size_t)d * sizeof(double));
            for (int64_t t = 0; t < n; t++) {
                const double *kr = k + fxa_f64_row(&p->k_strides, b, g, t);
                const double *vr = v + fxa_f64_row(&p->v_strides, b, g, t);
                const double kn = norm(kr, d);
                hd.kmax = kn > hd.kmax ? kn : hd.kmax;
                for (int64_t c = 0; c < d; c++) {
                    kbar[c] += kr[c] / (double)n;
                    hd.vmax = fabs(vr[c]) > hd.vmax ? fabs(vr[c]) : hd.vmax;
                }
            }
            hd.radius = hd.kmax;
            if (p->d.center) {
                hd.radius = 0.0;
                for (int64_t t = 0; t < n; t++) {
                    const double *kr = k + fxa_f64_row(&p->k_strides, b, g, t);
                    for (int64_t c = 0; c < d; c++)
                        diff[c] = kr[c] - kbar[c];
                    const double r = norm(diff, d);
                    hd.radius = r > hd.radius ? r : hd.radius;
                }
            }
            heads[bh] = hd;
        }
}

/* The inputs: finite, and inside the range whose scores, sums and outputs
 * stay finite in fp64. */
static fxa_status check_inputs(const fxa_attn_plan *p, const fxa_attn_args *a, unsigned char *ws)
{
    fxa_status st;
    if ((st = fxa_f64_check_finite(p, "K", a->k, &p->k_strides, p->d.heads_kv, p->d.seq_kv)) !=
            FXA_OK ||
        (st = fxa_f64_check_finite(p, "V", a->v, &p->v_strides, p->d.heads_kv, p->d.seq_kv)) !=
            FXA_OK ||
        (st = fxa_f64_check_finite(p, "Q", a->q, &p->q_strides, p->d.heads_q, p->d.seq_q)) !=
            FXA_OK)
        return st;
    scan_kv(p, a->k, a->v, ws);
    double qmax = 0.0, kmax = 0.0, vmax = 0.0;
    for (int64_t b = 0; b < p->d.batch; b++)
        for (int64_t h = 0; h < p->d.heads_q; h++)
            for (int64_t t = 0; t < p->d.seq_q; t++) {
                const double n =
                    norm((const double *)a->q + fxa_f64_row(&p->q_strides, b, h, t), p->d.head_dim);
                qmax = n > qmax ? n : qmax;
            }
    const f64_head *heads = heads_of(ws);
    for (int64_t i = 0; i < p->d.batch * p->d.heads_kv; i++) {
        kmax = heads[i].kmax > kmax ? heads[i].kmax : kmax;
        vmax = heads[i].vmax > vmax ? heads[i].vmax : vmax;
    }
    if (fabs(p->d.scale) * qmax * kmax > FXA_F64_LIMIT)
        return fxa_ctx_fail(p->ctx, FXA_ERR_UNSUPPORTED,
                            "fp64 scores past 2^1000: |scale| max||q|| max||k|| = %g",
                            fabs(p->d.scale) * qmax * kmax);
    if ((double)p->d.seq_kv * vmax > FXA_F64_LIMIT)
        return fxa_ctx_fail(p->ctx, FXA_ERR_UNSUPPORTED,
                            "fp64 sums past 2^1000: keys x max|v| = %g",
                            (double)p->d.seq_kv * vmax);
    return FXA_OK;
}

/* Row r of the block (query i of head (b, h)): its centre, shift, kind
 * and *bound = ceil(U_i) in base 2. Returns 1 when it runs online softmax. */
static int decide_row(const fxa_attn_plan *p, const f64_head *hd, const double *kbar,
                      const f64_scratch *s, size_t r, const void *mask, int64_t b, int64_t h,
                      int64_t i, double *bound)
{
    const int64_t d = p->d.head_dim;
    const double *q = s->q + r * (size_t)d;
    const double tau = fabs(p->d.scale), qn = norm(q, d);
    /* the rounding of q.k_j and q.kbar: (2D + 2) 2^-53 ||q|| kmax and more */
    const double u = tau * qn * (hd->radius + (double)(d + 1) * 0x1p-51 * hd->kmax) * (1 + 0x1p-50);
    double bias_max = 0.0;
    if (p->d.causal) {
        bias_max = i + fxa_causal_shift(p) >= 0 ? 0.0 : -INFINITY;
    } else if (p->d.mask_kind != FXA_MASK_NONE) {
        bias_max = -INFINITY;
        double row[FXA_F64_KV_TILE];
        for (int64_t j0 = 0; j0 < p->d.seq_kv; j0 += FXA_F64_KV_TILE) {
            const size_t n =
                (size_t)(p->d.seq_kv - j0 < FXA_F64_KV_TILE ? p->d.seq_kv - j0 : FXA_F64_KV_TILE);
            fxa_f64_tile_bias(p, mask, b, h, i, 1, j0, n, n, row);
            for (size_t j = 0; j < n; j++)
                bias_max = row[j] > bias_max ? row[j] : bias_max;
        }
    }
    s->center[r] = p->d.center ? dot(q, kbar, d) : 0.0;
    s->bias_max[r] = bias_max;
    s->l[r] = 0.0;
    memset(s->o + r * (size_t)d, 0, (size_t)d * sizeof(double));
    *bound = ceil(u * LOG2E);
    *s->max_bound = *bound > *s->max_bound ? *bound : *s->max_bound;
    const int fixed =
        p->d.mode == FXA_MODE_AUTO && bias_max > -INFINITY &&
        (2.0 * u <= FXA_F64_GATE || (p->d.center && !fxa_attn_masked(p) && u <= FXA_F64_GATE));
    s->online[r] = (uint8_t)!fixed;
    s->m[r] = fixed ? u + bias_max : -INFINITY;
    return !fixed;
}

/* Write row r's output, lse and diagnostics. */
static void finish_row(const fxa_attn_plan *p, const fxa_attn_args *a, const f64_scratch *s,
                       size_t r, int64_t b, int64_t h, int64_t i, double bound)
{
    const int64_t d = p->d.head_dim;
    double *out = (double *)a->out + fxa_f64_row(&p->o_strides, b, h, i);
    const double *o = s->o + r * (size_t)d;
    const double l = s->l[r];
    for (int64_t c = 0; c < d; c++)
        out[c] = l > 0.0 ? o[c] / l : 0.0;
    const double lse = l > 0.0 ? s->m[r] + log(l) + p->d.scale * s->center[r] : -INFINITY;
    const int64_t at = (b * p->d.heads_q + h) * p->d.seq_q + i;
    if (a->lse_f64)
        a->lse_f64[at] = lse;
    if (a->lse)
        a->lse[at] = (float)lse;
    if (a->row_fallback)
        a->row_fallback[at] = s->online[r];
    if (a->row_bound)
        a->row_bound[at] = (float)bound;
}

static void work_item(void *arg, int64_t item, int thread_id)
{
    const f64_job *job = arg;
    const fxa_attn_plan *p = job->p;
    const fxa_attn_args *a = job->a;
    f64_scratch s = scratch_of(p, job->ws, thread_id);
    const int64_t blk = item % job->n_blocks, bh_q = item / job->n_blocks;
    const int64_t b = bh_q / p->d.heads_q, h = bh_q % p->d.heads_q, g = h / p->group;
    const int64_t i0 = blk * F64_BLOCK_Q, d = p->d.head_dim;
    const size_t n = (size_t)(p->d.seq_q - i0 < F64_BLOCK_Q ? p->d.seq_q - i0 : F64_BLOCK_Q);
    const f64_head *hd = heads_of(job->ws) + b * p->d.heads_kv + g;
    const double *kbar = kbar_of(p, job->ws, b * p->d.heads_kv + g);
    double bound[F64_BLOCK_Q];
    for (size_t r = 0; r < n; r++) {
        memcpy(s.q + r * (size_t)d,
               (const double *)a->q + fxa_f64_row(&p->q_strides, b, h, i0 + (int64_t)r),
               (size_t)d * sizeof(double));
        *s.fallback_rows +=
            decide_row(p, hd, kbar, &s, r, a->mask, b, h, i0 + (int64_t)r, &bound[r]);
    }
    fxa_attn_tile_f64 t = {.n_q = n,
                           .d = (size_t)d,
                           .tau = p->d.scale,
                           .q = s.q,
                           .ldq = (size_t)d,
                           .ldk = p->k_strides.token,
                           .ldv = p->v_strides.token,
                           .center = s.center,
                           .online = s.online,
                           .m = s.m,
                           .l = s.l,
                           .o = s.o,
                           .ldo = (size_t)d,
                           .scores = s.scores,
                           .ld_bias = FXA_F64_KV_TILE};
    fxa_f64_rows_over_keys(p, a->k, a->v, a->mask, b, h, i0, n, &t, s.bias);
    for (size_t r = 0; r < n; r++)
        finish_row(p, a, &s, r, b, h, i0 + (int64_t)r, bound[r]);
}

fxa_status fxa_f64_run(const fxa_attn_plan *p, const fxa_attn_args *a, unsigned char *ws,
                       fxa_attn_stats *stats)
{
    if (a->lse_parts)
        return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                            "an fp64 plan takes no lse_parts (its backward reads lse_f64)");
    const double t0 = fxa_now_seconds();
    fxa_status st = check_inputs(p, a, ws);
    if (st != FXA_OK)
        return st;
    const int n_threads = p->ctx->pool.n_threads;
    for (int t = 0; t < n_threads; t++) {
        const f64_scratch s = scratch_of(p, ws, t);
        *s.fallback_rows = 0;
        *s.max_bound = 0.0;
    }
    f64_job job = {p, a, ws, (p->d.seq_q + F64_BLOCK_Q - 1) / F64_BLOCK_Q};
    fxa_pool_run(&p->ctx->pool, work_item, &job, p->d.batch * p->d.heads_q * job.n_blocks);
    if (stats) {
        fxa_attn_stats full = {0};
        full.struct_size = sizeof full;
        full.rows = p->d.batch * p->d.heads_q * p->d.seq_q;
        full.keys = p->d.seq_kv;
        full.compute = FXA_COMPUTE_FP64;
        full.gate_strict = (int)floor(FXA_F64_GATE / 2 * LOG2E);
        full.gate_centered = p->d.center ? (int)floor(FXA_F64_GATE * LOG2E) : 0;
        const f64_head *heads = heads_of(ws);
        for (int64_t i = 0; i < p->d.batch * p->d.heads_kv; i++)
            full.vmax = heads[i].vmax > full.vmax ? heads[i].vmax : full.vmax;
        for (int t = 0; t < n_threads; t++) {
            const f64_scratch s = scratch_of(p, ws, t);
            full.fallback_rows += *s.fallback_rows;
            full.max_bound = *s.max_bound > full.max_bound ? *s.max_bound : full.max_bound;
        }
        full.seconds = fxa_now_seconds() - t0;
        fxa_struct_out(stats, &full, sizeof full);
    }
    return FXA_OK;
}
