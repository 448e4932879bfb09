/*
 * The QKV projection (fxattn_proj.h): Y = X W^T, then a threaded epilogue
 * per token: scales and bias, RMSNorm across the heads of the Q and of the
 * K segment, rotate-half RoPE with the inverse RMS folded into the cos/sin
 * products, and the store in the requested layout.
 * The GEMM is oneDNN's bf16 matmul when both operands are 16- or 8-bit
 * (every E4M3 value is a bf16 value), else an fp32 GEMM: OpenBLAS sgemm, or
 * oneDNN's fp32 matmul where OpenBLAS lacks AVX-512 kernels for an AVX-512
 * CPU (gemm_f32_on_onednn).
 * Operands in another format are decoded exactly (FP8 scales kept for the
 * epilogue); a weight is decoded one block of output channels at a time,
 * each block multiplied as soon as it is decoded, so the decoded copy is
 * one block and an FP8 weight never exists whole in 16 or 32 bits.
 */
#include <cblas.h>
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../base/alloc.h"
#include "../base/convert_inline.h"
#include "../base/cpu.h"
#include "../core/ctx_api.h"
#include "../base/spans.h"
#include "../base/struct_size.h"
#include "fxattn_proj.h"
#include "gemm_amx.h"
#include "gemm_onednn.h"

void fxa_proj_desc_init(fxa_proj_desc *d)
{
    *d = (fxa_proj_desc){0};
    d->struct_size = sizeof *d;
    d->x_format = FXA_PROJ_X_F32;
    d->w_format = FXA_PROJ_W_F32;
    d->eps = 1e-6;
    d->out_layout = FXA_PROJ_TOKEN_MAJOR;
    d->out_dtype = FXA_F32;
}

static int64_t out_features(const fxa_proj_desc *d)
{
    return (d->heads_q + 2 * d->heads_kv) * d->head_dim;
}

/* Positive sizes, an even head_dim within FXA_MAX_HEAD_DIM. */
static int shape_ok(const fxa_proj_desc *d)
{
    return d->tokens >= 1 && d->in_features >= 1 && d->heads_q >= 1 && d->heads_kv >= 0 &&
           d->head_dim >= 2 && d->head_dim % 2 == 0 && d->head_dim <= FXA_MAX_HEAD_DIM;
}

/* For a shape_ok d: every buffer is addressable and every GEMM dimension
 * fits the libraries' int. */
static int sizes_fit(const fxa_proj_desc *d)
{
    if (d->heads_q > INT32_MAX || d->heads_kv > INT32_MAX) /* out_features fits int64 */
        return 0;
    const double elems =
        (double)d->tokens *
        (double)(out_features(d) > d->in_features ? out_features(d) : d->in_features);
    return elems * 4.0 <= (double)PTRDIFF_MAX / 2 &&
           (double)out_features(d) * (double)d->in_features * 4.0 <= (double)PTRDIFF_MAX / 2 &&
           d->in_features <= INT32_MAX && out_features(d) <= INT32_MAX && d->tokens <= INT32_MAX;
}

/* Known formats, layout, output dtype and 0/1 flags. */
static int flags_ok(const fxa_proj_desc *d)
{
    return (unsigned)d->x_format <= FXA_PROJ_X_E4M3_ROWS &&
           (unsigned)d->w_format <= FXA_PROJ_W_E4M3 &&
           (unsigned)d->out_layout <= FXA_PROJ_HEAD_MAJOR &&
           (d->out_dtype == FXA_F32 || d->out_dtype == FXA_BF16) &&
           (d->norm == 0 || d->norm == 1) && (d->rope == 0 || d->rope == 1);
}

/* Workspace layout (byte offsets; 0 = not used, except xs which is first
 * only when nothing precedes it: offsets are checked through the flags). */
typedef struct proj_ws {
    int bf16_path;   /* 16/8-bit operands on both sides multiply as bf16 */
    int f32_onednn;  /* the fp32 GEMM runs on oneDNN instead of OpenBLAS */
    int64_t w_block; /* output channels decoded (w32/w16) per GEMM */
    size_t x32, x16, w32, w16, xs, y, sums, bad, stage_bad, stage_tmp, onednn, amx, total;
} proj_ws;

struct fxa_proj_plan {
    fxa_ctx *ctx;
    fxa_proj_desc d; /* current size, defaults past the caller's struct_size */
    int has_tp;
    fxa_proj_tp tp;
    int n_threads;
    proj_ws l;
    fxa_gemm_onednn *g; /* bf16 GEMMs, or fp32 ones on oneDNN; else NULL */
};

/* Outputs that share a byte with each other or with the workspace. Inputs
 * may alias the outputs: every input is read before any output is stored. */
static fxa_status check_output_spans(fxa_ctx *ctx, const fxa_proj_desc *d, const fxa_proj_args *a,
                                     const void *ws, size_t ws_bytes)
{
    const size_t elem = d->out_dtype == FXA_F32 ? sizeof(float) : sizeof(uint16_t);
    const size_t q_bytes = (size_t)(d->tokens * d->heads_q * d->head_dim) * elem;
    const size_t kv_bytes = (size_t)(d->tokens * d->heads_kv * d->head_dim) * elem;
    const fxa_span span[4] = {{"q_out", a->q_out, q_bytes},
                              {"k_out", a->k_out, kv_bytes},
                              {"v_out", a->v_out, kv_bytes},
                              {"workspace", ws, ws_bytes}};
    const fxa_span *x, *y;
    if (fxa_spans_clash(span, 4, NULL, 0, &x, &y))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s and %s overlap", x->name, y->name);
    return FXA_OK;
}

/* The plan's checks of d (already copied in). */
static fxa_status check_desc(fxa_ctx *ctx, const fxa_proj_desc *d)
{
    if (!shape_ok(d))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "projection shape: tokens %lld, in_features %lld, heads %lld/%lld, "
                            "head_dim %lld (even, 2..%d)",
                            (long long)d->tokens, (long long)d->in_features, (long long)d->heads_q,
                            (long long)d->heads_kv, (long long)d->head_dim, FXA_MAX_HEAD_DIM);
    if (!sizes_fit(d))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "projection sizes overflow");
    if (!flags_ok(d))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "unknown projection format, layout, output dtype or flag");
    if (d->norm && !(d->eps >= FLT_TRUE_MIN && d->eps <= FLT_MAX))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "RMSNorm eps %g is outside fp32's positive range (%g..%g)", d->eps,
                            (double)FLT_TRUE_MIN, (double)FLT_MAX);
    return FXA_OK;
}

/* The run's checks of a (copied in) and the workspace. */
static fxa_status check_args(const fxa_proj_plan *p, const fxa_proj_args *a, const void *ws)
{
    fxa_ctx *ctx = p->ctx;
    const fxa_proj_desc *d = &p->d;
    if (!ws)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "the projection needs its workspace (%zu bytes, the plan's)",
                            p->l.total);
    if (((uintptr_t)ws % FXA_ALIGN) != 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "workspace must be 64-byte aligned");
    if (!a->x || !a->w || !a->q_out || (d->heads_kv > 0 && (!a->k_out || !a->v_out)))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "x, w and the outputs must not be NULL");
    if (d->w_format == FXA_PROJ_W_E4M3 && !a->w_scales)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "FP8 weights need w_scales");
    if (d->norm && (!a->gamma_q || (d->heads_kv > 0 && !a->gamma_k)))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "RMSNorm needs gamma_q (and gamma_k)");
    if (d->rope && (!a->rope_cos || !a->rope_sin))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "RoPE needs rope_cos and rope_sin");
    if (check_output_spans(ctx, d, a, ws, p->l.total) != FXA_OK)
        return FXA_ERR_INVALID_ARG;
    const int64_t qn = d->heads_q * d->head_dim;
    const int64_t kn = d->heads_kv * d->head_dim;
    const int64_t rope_n = d->tokens * d->head_dim;
    const struct {
        const float *p;
        int64_t n;
        const char *name;
    } vec[] = {{a->bias, out_features(d), "bias"},
               {d->norm ? a->gamma_q : NULL, qn, "gamma_q"},
               {d->norm ? a->gamma_k : NULL, kn, "gamma_k"},
               {d->rope ? a->rope_cos : NULL, rope_n, "rope_cos"},
               {d->rope ? a->rope_sin : NULL, rope_n, "rope_sin"}};
    for (size_t v = 0; v < sizeof vec / sizeof vec[0]; v++)
        for (int64_t i = 0; vec[v].p && i < vec[v].n; i++)
            if (!isfinite(vec[v].p[i]))
                return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s[%lld] is not finite", vec[v].name,
                                    (long long)i);
    return FXA_OK;
}

/* Staging: operands become fp32 rows for the GEMM, threaded over row
 * blocks; fp32 operands are only checked (the GEMM reads them in place). */
enum { SRC_F32, SRC_BF16, SRC_E4M3_ROWS, SRC_E4M3 };

#define STAGE_ROWS 64 /* rows per work item */

typedef struct stage_job {
    const void *src;
    int kind;
    int check; /* scan sources that are read in place (fp32, bf16 on the bf16 path) */
    int64_t rows;
    int64_t row0;    /* index of the first row, for messages */
    int64_t n;       /* values per row */
    float *dst;      /* fp32 copy [rows][n], or NULL */
    uint16_t *dst16; /* bf16 copy of E4M3 codes [rows][n] (exact), or NULL */
    float *scales;   /* SRC_E4M3_ROWS: each row's scale */
    float *tmp;      /* [n_threads][n]: rows decoded only to be checked */
    float lut[256];  /* E4M3 decode tables */
    uint16_t lut16[256];
    int64_t *bad; /* per item: first bad (row, col), or -1; col -1: bad scale */
} stage_job;

static void stage_item(void *arg, int64_t item, int thread_id)
{
    stage_job *job = arg;
    const int64_t r0 = item * STAGE_ROWS;
    const int64_t r1 = r0 + STAGE_ROWS < job->rows ? r0 + STAGE_ROWS : job->rows;
    const int64_t n = job->n;
    int64_t *bad = job->bad + 2 * item;
    bad[0] = -1;
    if (!job->dst && !job->dst16 && !job->check)
        return; /* read in place, unchecked: poisoned outputs reveal it */
    for (int64_t r = r0; r < r1; r++) {
        const float *row;
        float *dst = job->dst ? job->dst + r * n : job->tmp + (size_t)thread_id * (size_t)n;
        if (job->kind == SRC_F32) {
            row = (const float *)job->src + r * n;
        } else if (job->kind == SRC_BF16) {
            const uint16_t *src = (const uint16_t *)job->src + r * n;
            for (int64_t i = 0; i < n; i++)
                dst[i] = fxa_bf16_bits_to_f32(src[i]);
            row = dst;
        } else {
            const int64_t stride = job->kind == SRC_E4M3_ROWS ? n + 4 : n;
            const uint8_t *src = (const uint8_t *)job->src + r * stride;
            if (job->dst16) {
                /* bf16 copy; the only non-finite codes are the NaNs S.1111.111. */
                unsigned nan = 0;
                for (int64_t i = 0; i < n; i++) {
                    job->dst16[r * n + i] = job->lut16[src[i]];
                    nan |= (src[i] & 0x7fu) == 0x7fu;
                }
                if (nan) {
                    int64_t i = 0;
                    while ((src[i] & 0x7fu) != 0x7fu)
                        i++;
                    bad[0] = r;
                    bad[1] = i;
                    return;
                }
            } else {
                for (int64_t i = 0; i < n; i++)
                    dst[i] = job->lut[src[i]];
            }
            if (job->kind == SRC_E4M3_ROWS) {
                memcpy(&job->scales[r], src + n, sizeof(float));
                if (!isfinite(job->scales[r]) || job->scales[r] < 0.0f) {
                    bad[0] = r;
                    bad[1] = -1;
                    return;
                }
            }
            if (job->dst16)
                continue; /* codes checked above */
            row = dst;
        }
        uint32_t any = 0;
        for (int64_t i = 0; i < n; i++) {
            uint32_t b;
            memcpy(&b, row + i, sizeof b);
            any |= (b & 0x7f800000u) == 0x7f800000u;
        }
        if (any) {
            int64_t i = 0;
            while (isfinite(row[i]))
                i++;
            bad[0] = r;
            bad[1] = i;
            return;
        }
    }
}

/* Run a staging job with its per-item results and per-thread rows in the
 * workspace; the first bad row (in row order) becomes the error. */
static fxa_status stage(const fxa_proj_plan *p, unsigned char *ws, stage_job *job, const char *what,
                        const char *row_name, const char *col_name)
{
    fxa_ctx *ctx = p->ctx;
    const int64_t items = (job->rows + STAGE_ROWS - 1) / STAGE_ROWS;
    job->bad = (int64_t *)(ws + p->l.stage_bad);
    job->tmp = (float *)(ws + p->l.stage_tmp);
    for (int c = 0; c < 256; c++) {
        job->lut[c] = fxa_e4m3_to_f32((uint8_t)c);
        job->lut16[c] = fxa_f32_to_bf16(job->lut[c]); /* exact */
    }
    fxa_pool_run(fxa_ctx_pool(ctx), stage_item, job, items);
    fxa_status st = FXA_OK;
    for (int64_t i = 0; i < items && st == FXA_OK; i++) {
        const int64_t *bad = job->bad + 2 * i;
        if (bad[0] < 0)
            continue;
        if (bad[1] < 0)
            st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s %s %lld has a bad scale (%g)", what,
                              row_name, (long long)(job->row0 + bad[0]),
                              (double)job->scales[bad[0]]);
        else
            st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                              "%s has a non-finite value at %s %lld, %s %lld", what, row_name,
                              (long long)(job->row0 + bad[0]), col_name, (long long)bad[1]);
    }
    return st;
}

/* X for the GEMM, with row scales in xs (1 unless FP8): fp32 and bf16
 * inputs are read in place (scanned only with check), FP8 codes decoded
 * exactly into x32 (fp32 path) or x16 (bf16 path). *x_out: what the GEMM
 * reads. */
static fxa_status stage_x(const fxa_proj_plan *p, unsigned char *ws, const void *x, float *x32,
                          uint16_t *x16, float *xs, const void **x_out, int check)
{
    const fxa_proj_desc *d = &p->d;
    stage_job job = {.src = x,
                     .check = check,
                     .kind = d->x_format == FXA_PROJ_X_F32    ? SRC_F32
                             : d->x_format == FXA_PROJ_X_BF16 ? SRC_BF16
                                                              : SRC_E4M3_ROWS,
                     .rows = d->tokens,
                     .n = d->in_features,
                     .dst = x32,
                     .dst16 = x16,
                     .scales = xs};
    for (int64_t s = 0; s < d->tokens; s++)
        xs[s] = 1.0f;
    *x_out = x32 ? (const void *)x32 : x16 ? (const void *)x16 : x;
    return stage(p, ws, &job, "x", "token", "feature");
}

/* Rows [row0, row0 + rows) of W [I][H] for the GEMM, the same way (FP8
 * scales stay separate). */
static fxa_status stage_w(const fxa_proj_plan *p, unsigned char *ws, const void *w, int64_t row0,
                          int64_t rows, float *w32, uint16_t *w16, const void **w_out, int check)
{
    const fxa_proj_desc *d = &p->d;
    const size_t elem = d->w_format == FXA_PROJ_W_F32    ? sizeof(float)
                        : d->w_format == FXA_PROJ_W_BF16 ? sizeof(uint16_t)
                                                         : 1;
    const void *src = (const unsigned char *)w + (size_t)row0 * (size_t)d->in_features * elem;
    stage_job job = {.src = src,
                     .check = check,
                     .kind = d->w_format == FXA_PROJ_W_F32    ? SRC_F32
                             : d->w_format == FXA_PROJ_W_BF16 ? SRC_BF16
                                                              : SRC_E4M3,
                     .rows = rows,
                     .row0 = row0,
                     .n = d->in_features,
                     .dst = w32,
                     .dst16 = w16};
    *w_out = w32 ? (const void *)w32 : w16 ? (const void *)w16 : src;
    return stage(p, ws, &job, "w", "output", "input");
}

typedef struct epi_job {
    const fxa_proj_desc *d;
    const fxa_proj_args *a;
    float *y;     /* [S][I] GEMM result; dequantised in place by phase A, finished by B */
    float *xs;    /* [S] row scales */
    double *sums; /* [S][2]: sum of y^2 over the Q and the K segment */
    double n_q;   /* channels each RMS is taken over (all ranks) */
    double n_k;
    int64_t tokens_per_item;
    int64_t *bad; /* per item: first token whose y (or output) is not finite, or -1 */
} epi_job;

/* Store head h's head_dim values of token s of a segment of `heads` heads
 * in d's layout and output dtype. */
static void store_row(const fxa_proj_desc *d, void *base, int64_t heads, int64_t s, int64_t h,
                      const float *v)
{
    const int64_t row = d->out_layout == FXA_PROJ_TOKEN_MAJOR ? s * heads + h : h * d->tokens + s;
    if (d->out_dtype == FXA_F32) {
        memcpy((float *)base + row * d->head_dim, v, (size_t)d->head_dim * sizeof(float));
        return;
    }
    uint16_t *o = (uint16_t *)base + row * d->head_dim;
    for (int64_t i = 0; i < d->head_dim; i++)
        o[i] = fxa_f32_to_bf16_bits(v[i]);
}

/* Sum of y^2 in double, in index order. */
static double sum_squares(const float *y, int64_t n)
{
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)y[i] * (double)y[i];
    return sum;
}

/* 1 / sqrt(mean + eps): the mean rounded to fp32, then 1.0f / sqrtf in fp32.
 * A mean of squares at or above 2^126 (every y finite, but y^2 past fp32)
 * is normalised by a power of two instead: *shift = e with the mean scaled
 * by 2^-2e into [2^-2, 2) (eps, below 2^-100 of it, does not change the
 * fp32 sum), and the caller scales y by 2^-e first (exact), so y 2^-e *
 * (r gamma) equals what an fp32 with a wider exponent would give; *shift =
 * 0 otherwise, with the ordinary bits. */
static float inv_rms(double sum, double n, double eps, int *shift)
{
    const double mean_d = sum / n;
    *shift = 0;
    if (mean_d >= 0x1p126) {
        int ex;
        frexp(mean_d, &ex); /* mean_d = f 2^ex, f in [0.5, 1) */
        *shift = ex / 2;
        return 1.0f / sqrtf((float)ldexp(mean_d, -2 * *shift));
    }
    const float mean = (float)mean_d;
    return 1.0f / sqrtf(mean + (float)eps);
}

/* 1 when v is finite and stays finite in d's output dtype (a value past
 * bf16's largest finite rounds to Inf there). */
static int out_finite(const fxa_proj_desc *d, float v)
{
    if (d->out_dtype == FXA_F32)
        return isfinite(v);
    return (fxa_f32_to_bf16_bits(v) & 0x7f80u) != 0x7f80u;
}

/* Normalise (r; 1 without norm) and rotate one segment of one token in
 * place. Returns 0 when some result is not finite in the output dtype. */
static int finish_segment(const fxa_proj_desc *d, float *y, int64_t heads, const float *gamma,
                          const float *cs, const float *sn, float r, int shift)
{
    const int64_t dim = d->head_dim;
    const int64_t half = dim / 2;
    float ys[FXA_MAX_HEAD_DIM], o[FXA_MAX_HEAD_DIM];
    int ok = 1;
    for (int64_t h = 0; h < heads; h++) {
        float *yh_out = y + h * dim;
        const float *yh = yh_out;
        if (shift) { /* inv_rms's power of two: exact for these large y */
            for (int64_t i = 0; i < dim; i++)
                ys[i] = ldexpf(yh[i], -shift);
            yh = ys;
        }
        const float *g = d->norm ? gamma + h * dim : NULL;
        if (!d->rope) {
            for (int64_t i = 0; i < dim; i++)
                o[i] = d->norm ? yh[i] * (r * g[i]) : yh[i];
        } else {
            float t[FXA_MAX_HEAD_DIM];
            for (int64_t i = 0; i < dim; i++)
                t[i] = d->norm ? yh[i] * g[i] : yh[i];
            for (int64_t i = 0; i < dim; i++) {
                const float rc = r * cs[i];
                const float rs = r * sn[i];
                o[i] = i < half ? t[i] * rc - t[i + half] * rs : t[i] * rc + t[i - half] * rs;
            }
        }
        for (int64_t i = 0; i < dim; i++)
            ok &= out_finite(d, o[i]);
        memcpy(yh_out, o, (size_t)dim * sizeof(float));
    }
    return ok;
}

/* Phase A of token s: y = acc * x_scale * w_scale + b in place, and the
 * segments' sums of squares. Returns 0 when some y is not finite (a non-
 * finite fp32 operand poisons its whole row or column, so this also catches
 * those without scanning the inputs on every call). */
static int dequantise_token(const epi_job *job, int64_t s)
{
    const fxa_proj_desc *d = job->d;
    const fxa_proj_args *a = job->a;
    const int64_t n_out = out_features(d);
    float *y = job->y + s * n_out;
    for (int64_t i = 0; i < n_out; i++) {
        float v = y[i] * job->xs[s];
        if (d->w_format == FXA_PROJ_W_E4M3)
            v *= a->w_scales[i];
        y[i] = a->bias ? v + a->bias[i] : v;
    }
    uint32_t any = 0;
    for (int64_t i = 0; i < n_out; i++) {
        uint32_t b;
        memcpy(&b, y + i, sizeof b);
        any |= (b & 0x7f800000u) == 0x7f800000u;
    }
    if (!d->norm)
        return !any;
    const int64_t qn = d->heads_q * d->head_dim;
    job->sums[2 * s] = sum_squares(y, qn);
    job->sums[2 * s + 1] = d->heads_kv > 0 ? sum_squares(y + qn, d->heads_kv * d->head_dim) : 0.0;
    return !any;
}

/* Phase B of token s: normalise and rotate Q and K in place. Returns 0
 * when some output value (V's too) is not finite in the output dtype. */
static int finish_token(const epi_job *job, int64_t s)
{
    const fxa_proj_desc *d = job->d;
    const fxa_proj_args *a = job->a;
    float *y = job->y + s * out_features(d);
    const int64_t qn = d->heads_q * d->head_dim;
    const int64_t kn = d->heads_kv * d->head_dim;
    const float *cs = d->rope ? a->rope_cos + s * d->head_dim : NULL;
    const float *sn = d->rope ? a->rope_sin + s * d->head_dim : NULL;
    int shift = 0;
    const float rq = d->norm ? inv_rms(job->sums[2 * s], job->n_q, d->eps, &shift) : 1.0f;
    int ok = finish_segment(d, y, d->heads_q, a->gamma_q, cs, sn, rq, shift);
    if (d->heads_kv == 0)
        return ok;
    shift = 0;
    const float rk = d->norm ? inv_rms(job->sums[2 * s + 1], job->n_k, d->eps, &shift) : 1.0f;
    ok &= finish_segment(d, y + qn, d->heads_kv, a->gamma_k, cs, sn, rk, shift);
    for (int64_t i = 0; i < kn; i++)
        ok &= out_finite(d, y[qn + kn + i]);
    return ok;
}

/* Phase C of token s: store every segment. */
static void store_token(const epi_job *job, int64_t s)
{
    const fxa_proj_desc *d = job->d;
    const fxa_proj_args *a = job->a;
    const float *y = job->y + s * out_features(d);
    const int64_t dim = d->head_dim;
    for (int64_t h = 0; h < d->heads_q; h++)
        store_row(d, a->q_out, d->heads_q, s, h, y + h * dim);
    y += d->heads_q * dim;
    for (int64_t h = 0; h < d->heads_kv; h++)
        store_row(d, a->k_out, d->heads_kv, s, h, y + h * dim);
    y += d->heads_kv * dim;
    for (int64_t h = 0; h < d->heads_kv; h++)
        store_row(d, a->v_out, d->heads_kv, s, h, y + h * dim);
}

/* Items of tokens_per_item tokens: phase A (dequantise, sums, checks),
 * phase B (normalise, rotate, checks) or phase C (store); every token
 * passes A and B before any is stored, so that a failure leaves the outputs
 * untouched and a reduction can sit between A and B. */
enum { PHASE_A = 1, PHASE_B = 2, PHASE_C = 4 };

typedef struct phase_job {
    const epi_job *job;
    int phases;
} phase_job;

static void phase_item(void *arg, int64_t item, int thread_id)
{
    const phase_job *pj = arg;
    const epi_job *job = pj->job;
    const int64_t s0 = item * job->tokens_per_item;
    const int64_t s1 =
        s0 + job->tokens_per_item < job->d->tokens ? s0 + job->tokens_per_item : job->d->tokens;
    (void)thread_id;
    if (pj->phases & (PHASE_A | PHASE_B))
        job->bad[item] = -1;
    for (int64_t s = s0; s < s1; s++) {
        if ((pj->phases & PHASE_A) && !dequantise_token(job, s) && job->bad[item] < 0)
            job->bad[item] = s;
        if ((pj->phases & PHASE_B) && !finish_token(job, s) && job->bad[item] < 0)
            job->bad[item] = s;
        if (pj->phases & PHASE_C)
            store_token(job, s);
    }
}

/* The first token an A or B pass marked bad, or -1. */
static int64_t first_bad(const epi_job *job, int64_t n_items)
{
    int64_t first = -1;
    for (int64_t i = 0; i < n_items && first < 0; i++)
        first = job->bad[i];
    return first;
}

/* Phases B and C: normalise and rotate every token, then store them all,
 * or refuse (nothing stored) when an output value overflows. */
static fxa_status phase_bc(fxa_ctx *ctx, epi_job *job, int64_t n_items)
{
    fxa_pool *pool = fxa_ctx_pool(ctx);
    const phase_job pb = {job, PHASE_B};
    fxa_pool_run(pool, phase_item, (void *)&pb, n_items);
    const int64_t first = first_bad(job, n_items);
    if (first >= 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "the projection's output for token %lld overflows %s (RMSNorm gamma or "
                            "RoPE tables too large)",
                            (long long)first, job->d->out_dtype == FXA_F32 ? "fp32" : "bf16");
    const phase_job pc = {job, PHASE_C};
    fxa_pool_run(pool, phase_item, (void *)&pc, n_items);
    return FXA_OK;
}

/* Phase A over all tokens; a non-finite y is traced back to its cause:
 * a non-finite fp32 operand (found by scanning them now), else overflow. */
static fxa_status phase_a(const fxa_proj_plan *p, unsigned char *ws, epi_job *job, int64_t n_items)
{
    const fxa_proj_desc *d = job->d;
    const phase_job pj = {job, PHASE_A};
    fxa_pool_run(fxa_ctx_pool(p->ctx), phase_item, (void *)&pj, n_items);
    const int64_t first = first_bad(job, n_items);
    if (first < 0)
        return FXA_OK;
    const void *unused;
    fxa_status st = stage_x(p, ws, job->a->x, NULL, NULL, job->xs, &unused, 1);
    if (st == FXA_OK)
        st = stage_w(p, ws, job->a->w, 0, out_features(d), NULL, NULL, &unused, 1);
    if (st != FXA_OK)
        return st;
    return fxa_ctx_fail(p->ctx, FXA_ERR_INVALID_ARG,
                        "the projection of token %lld overflows fp32 (inputs too large)",
                        (long long)first);
}

/* Bytes of decoded weight per block. Each block's GEMM reads all of x
 * again, so blocks must be wide: at S = 4096, H = 5120 (FP8 operands, bf16
 * GEMM, 2 threads) 4 MiB blocks cost 1.07x the bf16 time, 16 MiB 1.004x,
 * 32 MiB 0.97-1.00x, the whole weight 1.004x. */
#define W_BLOCK_BYTES ((size_t)32 << 20)

static int64_t w_block_rows(const fxa_proj_desc *d, size_t elem)
{
    int64_t rows = (int64_t)(W_BLOCK_BYTES / ((size_t)d->in_features * elem)) / 64 * 64;
    if (rows < 64)
        rows = 64;
    return rows < out_features(d) ? rows : out_features(d);
}

static size_t take(size_t *at, size_t bytes)
{
    const size_t here = *at;
    *at += fxa_align_up(bytes);
    return here;
}

/* The automatic choice, made once per process: the CPU and the loaded
 * OpenBLAS do not change. */
static int g_auto_onednn;
static pthread_once_t g_auto_once = PTHREAD_ONCE_INIT;

static void decide_auto(void)
{
    static const char *const avx512_cores[] = {"skylakex", "cooperlake", "sapphirerapids"};
    const char *core = openblas_get_corename();
    char lower[32] = "";
    for (size_t i = 0; core && core[i] && i + 1 < sizeof lower; i++)
        lower[i] = (char)(core[i] >= 'A' && core[i] <= 'Z' ? core[i] - 'A' + 'a' : core[i]);
    int known = 0;
    for (size_t i = 0; i < sizeof avx512_cores / sizeof avx512_cores[0]; i++)
        known |= strstr(lower, avx512_cores[i]) != NULL;
    g_auto_onednn = fxa_cpu_get()->avx512f && !known;
}

/* Whether fp32 GEMMs go to oneDNN's matmul (1), OpenBLAS (0), or neither
 * (-1: FXA_PROJ_GEMM names no backend). force: FXA_PROJ_GEMM as the
 * context read it at its creation. FXA_PROJ_GEMM=openblas|onednn
 * forces one (tests pin OpenBLAS's bytes; benchmarks compare the two);
 * unset or "auto": oneDNN on AVX-512 CPUs when the OpenBLAS loaded at run
 * time picked a kernel set without AVX-512 (a DYNAMIC_ARCH OpenBLAS older
 * than the CPU: 0.3.21 runs its Haswell kernels on Zen 5, 136 GFLOP/s
 * against 255 with its SkylakeX ones and ~235 on oneDNN, S 4096 x 5120 x
 * 15360 on 2 threads), OpenBLAS otherwise. */
static int gemm_f32_on_onednn(const char *force)
{
    if (strcmp(force, "openblas") == 0)
        return 0;
    if (strcmp(force, "onednn") == 0)
        return 1;
    if (*force && strcmp(force, "auto") != 0)
        return -1;
    pthread_once(&g_auto_once, decide_auto);
    return g_auto_onednn;
}

/* *faster = 1 where 16-bit operands multiply faster as bf16 than in fp32: the CPU has
 * AVX512-BF16 (oneDNN has no bf16 matmul without it) and the context's bf16 products run
 * faster than its fp32 ones, as the attention's automatic compute measures them
 * (fxa_ctx_compute_choice: vdpbf16ps on AMD Zen 4 and 5, AMX tiles; not Intel cores whose
 * vdpbf16ps runs at half the FMA rate, where an fp32 GEMM of the same exact products is
 * faster). */
static fxa_status bf16_gemm_faster(fxa_ctx *ctx, int64_t head_dim, int *faster)
{
    *faster = 0;
    if (!fxa_cpu_get()->avx512bf16)
        return FXA_OK;
    fxa_compute_choice c = {.struct_size = sizeof c};
    const fxa_status st = fxa_ctx_compute_choice(ctx, FXA_BF16, head_dim, &c);
    *faster = st == FXA_OK && c.compute == FXA_COMPUTE_BF16;
    return st;
}

/* 16- and 8-bit operands on both sides multiply as bf16 (exact: every E4M3
 * value is a bf16 value), read in place when bf16, decoded when E4M3, where
 * bf16_gemm (bf16_gemm_faster); otherwise the GEMM is fp32, reading fp32 in
 * place and decoding the rest (every bf16 and E4M3 value is an fp32 value:
 * the same products). */
static void layout(const fxa_proj_desc *d, int n_threads, int bf16_gemm, proj_ws *l)
{
    const size_t s = (size_t)d->tokens;
    const size_t x_elems = s * (size_t)d->in_features;
    *l = (proj_ws){0};
    l->bf16_path = d->x_format != FXA_PROJ_X_F32 && d->w_format != FXA_PROJ_W_F32 && bf16_gemm;
    const int decode_w16 = l->bf16_path && d->w_format == FXA_PROJ_W_E4M3;
    const int decode_w32 = !l->bf16_path && d->w_format != FXA_PROJ_W_F32;
    l->w_block = decode_w16   ? w_block_rows(d, sizeof(uint16_t))
                 : decode_w32 ? w_block_rows(d, sizeof(float))
                              : out_features(d);
    const size_t w_elems = (size_t)l->w_block * (size_t)d->in_features;
    size_t at = FXA_ALIGN; /* offset 0 means "none" */
    if (l->bf16_path && d->x_format == FXA_PROJ_X_E4M3_ROWS)
        l->x16 = take(&at, x_elems * sizeof(uint16_t));
    else if (!l->bf16_path && d->x_format != FXA_PROJ_X_F32)
        l->x32 = take(&at, x_elems * sizeof(float));
    if (decode_w16)
        l->w16 = take(&at, w_elems * sizeof(uint16_t));
    else if (decode_w32)
        l->w32 = take(&at, w_elems * sizeof(float));
    l->xs = take(&at, s * sizeof(float));
    l->y = take(&at, s * (size_t)out_features(d) * sizeof(float));
    l->sums = take(&at, (2 * s + 1) * sizeof(double));
    l->bad = take(&at, ((s + 15) / 16 + 1) * sizeof(int64_t));
    /* Staging's per-item results (up to every output channel, when the
     * epilogue traces an overflow to a weight) and per-thread rows. */
    const size_t rows = s > (size_t)out_features(d) ? s : (size_t)out_features(d);
    l->stage_bad = take(&at, (2 * ((rows + STAGE_ROWS - 1) / STAGE_ROWS) + 2) * sizeof(int64_t));
    l->stage_tmp = take(&at, (size_t)n_threads * (size_t)d->in_features * sizeof(float));
    l->total = at;
}

/* OpenBLAS (0.3.21) has one process-wide thread count and no per-call
 * one. Each fp32 GEMM sets it to the context's threads and restores the
 * host program's setting while holding this lock, so that projections on
 * other threads never take one call's setting for the host's. */
static pthread_mutex_t g_blas_threads_lock = PTHREAD_MUTEX_INITIALIZER;

/* y [m][ldy] = x [m][k] w [n][k]^T on OpenBLAS with n_threads threads. */
static void sgemm_on_threads(int n_threads, int64_t m, int64_t n, int64_t k, const float *x,
                             const float *w, float *y, int64_t ldy)
{
    pthread_mutex_lock(&g_blas_threads_lock);
    const int host_threads = openblas_get_num_threads();
    if (host_threads != n_threads)
        openblas_set_num_threads(n_threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, x, (int)k, w,
                (int)k, 0.0f, y, (int)ldy);
    if (host_threads != n_threads)
        openblas_set_num_threads(host_threads);
    pthread_mutex_unlock(&g_blas_threads_lock);
}

/* y [S][I] = x W^T, W staged and multiplied l->w_block output channels at
 * a time: on AMX tiles where the plan has their scratch and the block fits
 * (gemm_amx.h: faster than Debian's oneDNN on them), else on oneDNN or
 * OpenBLAS; in a process forked after oneDNN ran, fp32 GEMMs go to
 * OpenBLAS and bf16 ones are refused. */
static fxa_status multiply(const fxa_proj_plan *p, unsigned char *ws, const void *xg, const void *w,
                           float *y)
{
    const fxa_proj_desc *d = &p->d;
    const proj_ws *l = &p->l;
    fxa_ctx *ctx = p->ctx;
    const int64_t n_out = out_features(d);
    const int64_t k = d->in_features;
    float *w32 = l->w32 ? (float *)(ws + l->w32) : NULL;
    uint16_t *w16 = l->w16 ? (uint16_t *)(ws + l->w16) : NULL;
    const int forked = fxa_gemm_onednn_forked(); /* OpenMP cannot run in this child */
    if (forked && l->bf16_path)
        return fxa_ctx_fail(
            ctx, FXA_ERR_UNSUPPORTED,
            "bf16 projections run on oneDNN (OpenMP), which cannot run in a process "
            "forked after its parent ran oneDNN; start workers with spawn or "
            "forkserver instead of fork");
    const int blas = !l->bf16_path && (!l->f32_onednn || forked);
    char why[160];
    fxa_status st = FXA_OK;
    for (int64_t n0 = 0; st == FXA_OK && n0 < n_out; n0 += l->w_block) {
        const int64_t nb = n_out - n0 < l->w_block ? n_out - n0 : l->w_block;
        const void *wg = NULL;
        if ((st = stage_w(p, ws, w, n0, nb, w32, w16, &wg, 0)) != FXA_OK)
            break;
        if (l->amx && fxa_gemm_amx_fits(ctx, k, nb, wg))
            fxa_gemm_amx_run(ctx, xg, d->tokens, k, wg, nb, y + n0, n_out, ws + l->amx);
        else if (blas)
            sgemm_on_threads(p->n_threads, d->tokens, nb, k, xg, wg, y + n0, n_out);
        else if ((st = fxa_gemm_onednn_run(p->g, xg, wg, nb, y + n0, ws + l->onednn, why,
                                           sizeof why)) != FXA_OK)
            st = fxa_ctx_fail(ctx, st, "%s", why);
    }
    return st;
}

/* Local work up to the reduction; then (after the reduce of a tensor-
 * parallel plan) phases B and C. */
static fxa_status run(fxa_proj_plan *p, const fxa_proj_args *args, unsigned char *ws)
{
    fxa_ctx *ctx = p->ctx;
    const fxa_proj_desc *d = &p->d;
    const proj_ws *l = &p->l;
    fxa_proj_args a = {0};
    char msg[200];
    fxa_status st = FXA_OK;
    if (!args)
        st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "projection args missing");
    else if (fxa_struct_in(&a, sizeof a, args, FXA_PROJ_ARGS_SIZE_0_3, "fxa_proj_args", msg,
                           sizeof msg) != FXA_OK)
        st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s", msg);
    if (st == FXA_OK)
        st = check_args(p, &a, ws);
    const int64_t n_out = out_features(d);
    float *x32 = l->x32 ? (float *)(ws + l->x32) : NULL;
    uint16_t *x16 = l->x16 ? (uint16_t *)(ws + l->x16) : NULL;
    float *xs = st == FXA_OK ? (float *)(ws + l->xs) : NULL;
    float *y = st == FXA_OK ? (float *)(ws + l->y) : NULL;
    double *sums = st == FXA_OK ? (double *)(ws + l->sums) : NULL;
    int64_t *bad = st == FXA_OK ? (int64_t *)(ws + l->bad) : NULL;
    const size_t s = (size_t)d->tokens;
    const void *xg = NULL; /* what the GEMM reads */
    if (st == FXA_OK)
        st = stage_x(p, ws, a.x, x32, x16, xs, &xg, 0);
    for (int64_t i = 0; st == FXA_OK && d->w_format == FXA_PROJ_W_E4M3 && i < n_out; i++)
        if (!isfinite(a.w_scales[i]) || a.w_scales[i] < 0.0f)
            st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "w_scales[%lld] is %g", (long long)i,
                              (double)a.w_scales[i]);
    epi_job job = {d, &a, y, xs, sums, 0.0, 0.0, 16, bad};
    if (st == FXA_OK)
        st = multiply(p, ws, xg, a.w, y);
    job.n_q = (double)(p->has_tp ? p->tp.norm_features_q : d->heads_q * d->head_dim);
    job.n_k = (double)(p->has_tp ? p->tp.norm_features_k : d->heads_kv * d->head_dim);
    const int64_t n_items = (d->tokens + 15) / 16;
    /* Phase A for every token before any output is written: a failure
     * found there leaves the outputs untouched. */
    if (st == FXA_OK)
        st = phase_a(p, ws, &job, n_items);
    if (!p->has_tp) {
        if (st == FXA_OK)
            st = phase_bc(ctx, &job, n_items);
        return st;
    }
    /* Every rank reaches the reduction, failed or not, so none waits
     * forever; the last element counts the ranks that failed. */
    double fail_only[3] = {0.0, 0.0, 1.0};
    double *buf = st == FXA_OK ? sums : fail_only;
    const int64_t n_tok = st == FXA_OK ? d->tokens : 1;
    if (st == FXA_OK) {
        if (!d->norm)
            memset(sums, 0, 2 * s * sizeof(double));
        sums[2 * s] = 0.0;
    }
    const fxa_status rs = p->tp.reduce(buf, 2 * n_tok + 1, p->tp.arg);
    if (st == FXA_OK && rs != FXA_OK)
        st = fxa_ctx_fail(ctx, rs, "the tensor-parallel reduction failed");
    else if (st == FXA_OK && buf[2 * n_tok] != 0.0)
        st = fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "another tensor-parallel rank failed");
    if (st == FXA_OK)
        st = phase_bc(ctx, &job, n_items);
    return st;
}

fxa_status fxa_proj_run(fxa_proj_plan *p, const fxa_proj_args *args, void *workspace)
{
    if (!p)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(p->ctx); /* one call at a time per context */
    return fxa_ctx_end_with(p->ctx, run(p, args, workspace));
}

/* The GEMM's backends for d: oneDNN's primitives (with their scratchpad in
 * the workspace) for bf16 GEMMs and fp32 ones on oneDNN, the AMX packing
 * scratch where the `amx` kernel set may take bf16 blocks. */
static fxa_status plan_gemm(fxa_proj_plan *p)
{
    fxa_ctx *ctx = p->ctx;
    proj_ws *l = &p->l;
    const int64_t n_out = out_features(&p->d);
    const int64_t k = p->d.in_features;
    l->f32_onednn = l->bf16_path ? 0 : gemm_f32_on_onednn(fxa_ctx_proj_gemm(ctx));
    if (l->f32_onednn < 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "FXA_PROJ_GEMM=%s: unknown GEMM (choose openblas, onednn or auto)",
                            fxa_ctx_proj_gemm(ctx));
    if (fxa_gemm_onednn_forked()) { /* OpenMP cannot run in this child */
        if (l->bf16_path)
            return fxa_ctx_fail(ctx, FXA_ERR_UNSUPPORTED,
                                "bf16 projections run on oneDNN (OpenMP), which cannot run in a "
                                "process forked after its parent ran oneDNN; start workers with "
                                "spawn or forkserver instead of fork");
        l->f32_onednn = 0;
    }
    size_t at = l->total;
    if (l->bf16_path && fxa_gemm_amx_usable(ctx) && k % 32 == 0)
        l->amx = take(&at, fxa_gemm_amx_scratch_bytes(k, p->n_threads));
    if (l->bf16_path || l->f32_onednn) {
        const int64_t widths[2] = {l->w_block, n_out % l->w_block};
        char why[160];
        const fxa_status st =
            fxa_gemm_onednn_create(&p->g, l->bf16_path ? FXA_BF16 : FXA_F32, p->d.tokens, k, n_out,
                                   p->n_threads, widths, why, sizeof why);
        if (st != FXA_OK)
            return fxa_ctx_fail(ctx, st, "%s", why);
        l->onednn = take(&at, fxa_gemm_onednn_scratch_bytes(p->g));
    }
    l->total = at;
    return FXA_OK;
}

static fxa_status plan_build(fxa_ctx *ctx, const fxa_proj_desc *d, const fxa_proj_tp *tp,
                             fxa_proj_plan **out, size_t *workspace_bytes)
{
    if (!d || !out || !workspace_bytes)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "fxa_proj_plan_create: NULL argument");
    *out = NULL;
    fxa_proj_desc full;
    fxa_proj_desc_init(&full);
    char msg[200];
    if (fxa_struct_in(&full, sizeof full, d, FXA_PROJ_DESC_SIZE_0_1, "fxa_proj_desc", msg,
                      sizeof msg) != FXA_OK)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s", msg);
    fxa_status st = check_desc(ctx, &full);
    if (st != FXA_OK)
        return st;
    fxa_proj_tp tp_full = {.struct_size = sizeof tp_full};
    if (tp && fxa_struct_in(&tp_full, sizeof tp_full, tp, FXA_PROJ_TP_SIZE_0_1, "fxa_proj_tp", msg,
                            sizeof msg) != FXA_OK)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s", msg);
    if (tp && (!tp_full.reduce || tp_full.norm_features_q < 1 || tp_full.norm_features_k < 0))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "tensor-parallel settings missing or bad");
    fxa_proj_plan *p = calloc(1, sizeof *p);
    if (!p)
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory for the projection's plan");
    p->ctx = ctx;
    p->d = full;
    p->has_tp = tp != NULL;
    p->tp = tp_full;
    p->n_threads = fxa_ctx_threads(ctx);
    int bf16_gemm = 0;
    if ((st = bf16_gemm_faster(ctx, p->d.head_dim, &bf16_gemm)) != FXA_OK) {
        fxa_proj_plan_destroy(p);
        return st;
    }
    layout(&p->d, p->n_threads, bf16_gemm, &p->l);
    if ((st = plan_gemm(p)) != FXA_OK) {
        fxa_proj_plan_destroy(p);
        return st;
    }
    *workspace_bytes = p->l.total;
    *out = p;
    return FXA_OK;
}

fxa_status fxa_proj_plan_create(fxa_ctx *ctx, const fxa_proj_desc *d, fxa_proj_plan **plan,
                                size_t *workspace_bytes)
{
    const fxa_status st = fxa_ctx_enter(ctx);
    return st != FXA_OK ? st
                        : fxa_ctx_end_with(ctx, plan_build(ctx, d, NULL, plan, workspace_bytes));
}

fxa_status fxa_proj_plan_create_tp(fxa_ctx *ctx, const fxa_proj_desc *d, const fxa_proj_tp *tp,
                                   fxa_proj_plan **plan, size_t *workspace_bytes)
{
    if (!ctx)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(ctx);
    const fxa_status st =
        tp ? plan_build(ctx, d, tp, plan, workspace_bytes)
           : fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                          "fxa_proj_plan_create_tp: NULL tensor-parallel settings");
    fxa_ctx_end(ctx);
    return st;
}

void fxa_proj_plan_destroy(fxa_proj_plan *p)
{
    if (!p)
        return;
    fxa_gemm_onednn_destroy(p->g);
    free(p);
}
