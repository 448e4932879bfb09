/* Staging for the QKV projection's GEMM: operands become fp32 (or bf16)
 * rows, checked, threaded over row blocks. */
#include <math.h>
#include <string.h>

#include "../base/convert_inline.h"
#include "../core/ctx_api.h"
#include "proj_internal.h"

/* Staging: operands become fp32 rows for the GEMM, threaded over row
 * blocks; fp32 operands are only checked (the GEMM reads them in place). */
enum { SRC_F32, SRC_BF16, SRC_E4M3_ROWS, SRC_E4M3 };

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
fxa_status fxa_proj_stage_x(const fxa_proj_plan *p, unsigned char *ws, const void *x, float *x32,
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
fxa_status fxa_proj_stage_w(const fxa_proj_plan *p, unsigned char *ws, const void *w, int64_t row0,
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
