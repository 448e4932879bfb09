/*
 * --verify for `fxattn layer` (layer.h): the layer evaluated on sampled
 * tokens from the operands the kernels saw (fp32 or bf16 values, E4M3 codes
 * times their fp32 scales; x rounded to bf16 in a bf16 layer):
 *   - in double: the reference y64;
 *   - in plain fp32: the same loops with every operation rounded to fp32
 *     (recursive sums over the hidden and the key dimensions, RMS in fp32,
 *     two-pass softmax): what straightforward fp32 code gets, y32;
 *   - for a bf16 layer, in plain bf16: the fp32 loops with q, k, v, the
 *     probabilities and the attention output rounded to bf16 where the bf16
 *     layer rounds them: what straightforward bf16 storage gets, y16.
 * The tolerance is the project's acceptance envelope (docs/numerics.md): fxattn's
 * error is at most twice that of the plain twin of its precision on the same
 * data, plus a floor (2^-22 max|y64| in fp32: four fp32 roundings at the
 * output's scale, for the case where the plain fp32 sums happen to be lucky;
 * 2^-12 in bf16: eight bf16 roundings' worth of 2^-9 at 1/64 of the output's
 * scale), and never above an absolute ceiling (2^-12 in fp32, 2^-5 in bf16).
 * Errors are measured over all compared elements, relative to max|y64|.
 *
 * Cost: the keys and values of every token, per head, in both precisions:
 * about 6 S hidden^2 multiply-adds (the K segment twice: once for its RMS)
 * on one thread, with O(S head_dim) memory.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "layer.h"

typedef struct ref {
    const fxt_layer_cfg *cfg;
    const fxa_wan_weights *w;
    const fxt_layer_x *x;
    int fp32;          /* 1: round every operation to fp32 */
    int bf16;          /* 1 (with fp32): also round q, k, v, p and a to bf16 */
    int x_bf16;        /* x was rounded to bf16 before the projection (bf16 layer) */
    int64_t n_samples; /* tokens compared */
    double dec[256];   /* E4M3 codes decoded */
    double *xrow;      /* [hidden]: the current token of x */
    double *y;         /* [hidden]: one segment before RMSNorm */
    double *rk;        /* [S]: K's RMS factor per token */
    double *q, *a;     /* [n][hidden]: queries and attention outputs of the samples */
    double *k, *v;     /* [S][D]: one head */
    double *p;         /* [S]: one row's probabilities */
    double *cs, *sn;   /* [D]: one token's RoPE */
} ref;

/* One operation's result: exact in double, or rounded to fp32. */
static double rnd(const ref *r, double v)
{
    return r->fp32 ? (double)(float)v : v;
}

/* A value the bf16 layer stores in bf16: rounded to bf16 in the bf16 twin. */
static double rnd16(const ref *r, double v)
{
    return r->bf16 ? (double)fxa_bf16_to_f32(fxa_f32_to_bf16((float)v)) : v;
}

static int ref_alloc(ref *r)
{
    const size_t h = (size_t)r->cfg->hidden;
    const size_t sq = (size_t)r->cfg->tokens;
    const size_t d = (size_t)r->cfg->head_dim;
    const size_t n = (size_t)r->n_samples;
    double **const arrays[] = {&r->xrow, &r->y, &r->rk, &r->q,  &r->a,
                               &r->k,    &r->v, &r->p,  &r->cs, &r->sn};
    const size_t sizes[] = {h, h, sq, n * h, n * h, sq * d, sq * d, sq, d, d};
    int ok = 1;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        ok &= (*arrays[i] = malloc(sizes[i] * sizeof(double))) != NULL;
    for (int c = 0; c < 256; c++)
        r->dec[c] = (double)fxa_e4m3_to_f32((uint8_t)c);
    return ok ? 0 : fxt_fail(FXT_EXIT_FAILURE, "out of memory for --verify");
}

static void ref_free(ref *r)
{
    double *const arrays[] = {r->xrow, r->y, r->rk, r->q, r->a, r->k, r->v, r->p, r->cs, r->sn};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++)
        free(arrays[i]);
}

/* Token s of x, as the projection saw it, into r->xrow. */
static void load_row(ref *r, int64_t s)
{
    const int64_t h = r->cfg->hidden;
    if (r->x->format == FXA_PROJ_X_F32) {
        const float *src = (const float *)r->x->data + s * h;
        for (int64_t i = 0; i < h; i++)
            r->xrow[i] =
                r->x_bf16 ? (double)fxa_bf16_to_f32(fxa_f32_to_bf16(src[i])) : (double)src[i];
        return;
    }
    const uint8_t *row = (const uint8_t *)r->x->data + s * (h + 4);
    float scale;
    memcpy(&scale, row + h, sizeof scale);
    for (int64_t i = 0; i < h; i++)
        r->xrow[i] = rnd(r, r->dec[row[i]] * (double)scale);
}

/* Channel `row` of linear m on the row xr: sum_k xr[k] w[row][k] + b. */
static double linear_one(const ref *r, const fxa_wan_linear *m, int64_t row, const double *xr)
{
    double acc = 0.0;
    if (m->format == FXA_PROJ_W_F32) {
        const float *w = (const float *)m->w + row * m->cols;
        for (int64_t k = 0; k < m->cols; k++)
            acc = rnd(r, acc + rnd(r, xr[k] * (double)w[k]));
    } else if (m->format == FXA_PROJ_W_BF16) {
        const uint16_t *w = (const uint16_t *)m->w + row * m->cols;
        for (int64_t k = 0; k < m->cols; k++)
            acc = rnd(r, acc + rnd(r, xr[k] * (double)fxa_bf16_to_f32(w[k])));
    } else {
        const uint8_t *w = (const uint8_t *)m->w + row * m->cols;
        for (int64_t k = 0; k < m->cols; k++)
            acc = rnd(r, acc + rnd(r, xr[k] * r->dec[w[k]]));
        acc = rnd(r, acc * (double)m->scales[row]);
    }
    return m->bias ? rnd(r, acc + (double)m->bias[row]) : acc;
}

/* Channels [c0, c0 + n) of linear m on row xr into y. */
static void linear(const ref *r, const fxa_wan_linear *m, const double *xr, int64_t c0, int64_t n,
                   double *y)
{
    for (int64_t c = 0; c < n; c++)
        y[c] = linear_one(r, m, c0 + c, xr);
}

/* RMSNorm factor 1 / sqrt(mean y^2 + eps) of n channels. */
static double rms(const ref *r, const double *y, int64_t n)
{
    double ss = 0.0;
    for (int64_t c = 0; c < n; c++)
        ss = rnd(r, ss + rnd(r, y[c] * y[c]));
    const double mean = rnd(r, ss / (double)n);
    return rnd(r, 1.0 / rnd(r, sqrt(rnd(r, mean + FXA_WAN_EPS))));
}

/* Wan's RoPE of token s (rotate-half lanes) into r->cs / r->sn. */
static void angles(ref *r, int64_t s)
{
    const fxt_layer_cfg *cfg = r->cfg;
    const int64_t half = cfg->head_dim / 2;
    const int64_t pos[3] = {s / (cfg->height * cfg->width), (s / cfg->width) % cfg->height,
                            s % cfg->width};
    int64_t n[3];
    fxa_wan_rope_bands(cfg->head_dim, &n[0], &n[1], &n[2]);
    int64_t p = 0;
    for (int b = 0; b < 3; b++)
        for (int64_t j = 0; j < n[b]; j++, p++) {
            const double t = (double)pos[b] * pow(FXA_WAN_ROPE_THETA, -(double)j / (double)n[b]);
            r->cs[p] = r->cs[p + half] = rnd(r, cos(t));
            r->sn[p] = r->sn[p + half] = rnd(r, sin(t));
        }
}

/* One head y [d] with gammas g, normalised by rr and rotated (rotate-half). */
static void rope_head(const ref *r, const double *y, const float *g, double rr, double *out)
{
    const int64_t d = r->cfg->head_dim;
    const int64_t half = d / 2;
    for (int64_t i = 0; i < d; i++) {
        const int64_t j = i < half ? i + half : i - half;
        const double a = rnd(r, rnd(r, y[i] * (double)g[i]) * rnd(r, rr * r->cs[i]));
        const double b = rnd(r, rnd(r, y[j] * (double)g[j]) * rnd(r, rr * r->sn[i]));
        out[i] = rnd16(r, rnd(r, i < half ? a - b : a + b));
    }
}

static int64_t sample_token(const ref *r, int64_t i)
{
    return i * r->cfg->tokens / r->n_samples;
}

/* Every token's K RMS factor; the sampled tokens' queries (all heads). */
static void pass_norms(ref *r)
{
    const fxt_layer_cfg *cfg = r->cfg;
    const int64_t h = cfg->hidden;
    const int64_t d = cfg->head_dim;
    for (int64_t s = 0; s < cfg->tokens; s++) {
        load_row(r, s);
        linear(r, &r->w->qkv, r->xrow, h, h, r->y);
        r->rk[s] = rms(r, r->y, h);
    }
    for (int64_t i = 0; i < r->n_samples; i++) {
        const int64_t s = sample_token(r, i);
        load_row(r, s);
        linear(r, &r->w->qkv, r->xrow, 0, h, r->y);
        const double rq = rms(r, r->y, h);
        angles(r, s);
        for (int64_t hh = 0; hh < cfg->heads; hh++)
            rope_head(r, r->y + hh * d, r->w->gamma_q + hh * d, rq, r->q + i * h + hh * d);
    }
}

/* Keys and values of head hh for every token. */
static void head_kv(ref *r, int64_t hh)
{
    const fxt_layer_cfg *cfg = r->cfg;
    const int64_t h = cfg->hidden;
    const int64_t d = cfg->head_dim;
    for (int64_t s = 0; s < cfg->tokens; s++) {
        load_row(r, s);
        linear(r, &r->w->qkv, r->xrow, h + hh * d, d, r->y);
        angles(r, s);
        rope_head(r, r->y, r->w->gamma_k + hh * d, r->rk[s], r->k + s * d);
        linear(r, &r->w->qkv, r->xrow, 2 * h + hh * d, d, r->v + s * d);
        for (int64_t c = 0; r->bf16 && c < d; c++)
            r->v[s * d + c] = rnd16(r, r->v[s * d + c]);
    }
}

/* Softmax attention of query q over the head in r (exact row max). */
static void attend(ref *r, const double *q, double *a)
{
    const int64_t n = r->cfg->tokens;
    const int64_t d = r->cfg->head_dim;
    const double tau = rnd(r, 1.0 / sqrt((double)d));
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < n; j++) {
        double dot = 0.0;
        for (int64_t c = 0; c < d; c++)
            dot = rnd(r, dot + rnd(r, q[c] * r->k[j * d + c]));
        r->p[j] = rnd(r, tau * dot);
        mx = r->p[j] > mx ? r->p[j] : mx;
    }
    for (int64_t j = 0; j < n; j++) {
        r->p[j] = rnd(r, exp(rnd(r, r->p[j] - mx)));
        sum = rnd(r, sum + r->p[j]);
        r->p[j] = rnd16(r, r->p[j]); /* P.V on bf16 probabilities */
    }
    for (int64_t c = 0; c < d; c++) {
        double acc = 0.0;
        for (int64_t j = 0; j < n; j++)
            acc = rnd(r, acc + rnd(r, r->p[j] * r->v[j * d + c]));
        a[c] = rnd16(r, rnd(r, acc / sum));
    }
}

/* y [n_samples][hidden] of the layer in r's precision. */
static void evaluate(ref *r, double *y)
{
    const int64_t h = r->cfg->hidden;
    const int64_t d = r->cfg->head_dim;
    pass_norms(r);
    for (int64_t hh = 0; hh < r->cfg->heads; hh++) {
        head_kv(r, hh);
        for (int64_t i = 0; i < r->n_samples; i++)
            attend(r, r->q + i * h + hh * d, r->a + i * h + hh * d);
    }
    for (int64_t i = 0; i < r->n_samples; i++)
        linear(r, &r->w->o, r->a + i * h, 0, h, y + i * h);
}

/* Errors of y, of the plain fp32 y32 and of the plain bf16 y16 (bf16
 * layer; else NULL) against y64 over the samples. */
static void compare(const ref *r, const float *y, const double *y64, const double *y32,
                    const double *y16, fxt_layer_check *res)
{
    const int64_t h = r->cfg->hidden;
    double ymax = 0.0, err32 = 0.0, err16 = 0.0;
    for (int64_t i = 0; i < r->n_samples; i++) {
        const int64_t s = sample_token(r, i);
        for (int64_t o = 0; o < h; o++) {
            const double ref64 = y64[i * h + o];
            const double err = fabs((double)y[s * h + o] - ref64);
            ymax = fabs(ref64) > ymax ? fabs(ref64) : ymax;
            err32 = fabs(y32[i * h + o] - ref64) > err32 ? fabs(y32[i * h + o] - ref64) : err32;
            if (y16)
                err16 = fmax(err16, fabs(y16[i * h + o] - ref64));
            if (err > res->max_abs_err || isnan(err)) {
                res->max_abs_err = isnan(err) ? INFINITY : err;
                res->worst_token = s;
                res->worst_channel = o;
            }
        }
    }
    const double scale = ymax > 0.0 ? ymax : 1.0;
    res->tokens = r->n_samples;
    res->max_rel_err = res->max_abs_err / scale;
    res->fp32_rel_err = err32 / scale;
    res->bf16_rel_err = y16 ? err16 / scale : 0.0;
    /* Capped by an absolute ceiling: a plain twin that fails the same way
     * (or a NaN in it) can never widen the tolerance beyond it. */
    res->tolerance = y16 ? fmin(2.0 * res->bf16_rel_err + 0x1p-12, 0x1p-5)
                         : fmin(2.0 * res->fp32_rel_err + 0x1p-22, 0x1p-12);
}

int fxt_layer_verify(const fxt_layer_cfg *cfg, const fxa_wan_weights *w, const fxt_layer_x *x,
                     const float *y, fxt_layer_check *res)
{
    ref r;
    memset(&r, 0, sizeof r);
    memset(res, 0, sizeof *res);
    r.cfg = cfg;
    r.w = w;
    r.x = x;
    r.x_bf16 = cfg->wan.dtype == FXA_BF16;
    r.n_samples = cfg->tokens < FXT_LAYER_VERIFY_TOKENS ? cfg->tokens : FXT_LAYER_VERIFY_TOKENS;
    const size_t n = (size_t)(r.n_samples * cfg->hidden);
    double *y64 = malloc(n * sizeof(double));
    double *y32 = malloc(n * sizeof(double));
    double *y16 = r.x_bf16 ? malloc(n * sizeof(double)) : NULL;
    int code = y64 && y32 && (y16 || !r.x_bf16)
                   ? ref_alloc(&r)
                   : fxt_fail(FXT_EXIT_FAILURE, "out of memory for --verify");
    if (!code) {
        evaluate(&r, y64);
        r.fp32 = 1;
        evaluate(&r, y32);
        r.bf16 = r.x_bf16;
        if (y16)
            evaluate(&r, y16);
        compare(&r, y, y64, y32, y16, res);
    }
    ref_free(&r);
    free(y64);
    free(y32);
    free(y16);
    return code;
}
