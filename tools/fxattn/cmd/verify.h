/* Error of an attention output against the fp64 reference, on sampled rows
 * (`fxattn attn --verify`, `fxattn demo`). */
#ifndef FXT_VERIFY_H
#define FXT_VERIFY_H

#include <stdint.h>

#include "fxattn.h"

typedef struct fxt_verify_result {
    int64_t rows;       /* rows compared */
    double max_abs_err; /* max |out - ref| */
    double max_rel_err; /* max_abs_err / max |v| */
    double max_lse_err; /* max |lse - ref lse| (0 without lse) */
    double max_lse_rel; /* max |lse - ref lse| / max(1, |ref lse|) (0 without lse) */
} fxt_verify_result;

/* `attn --verify` passes when max_rel_err and max_lse_rel are at most this:
 * an absolute ceiling against the fp64 reference (2^-12; fp32 results on
 * ordinary inputs are 1e-7..1e-5 off, docs/numerics.md), never relative
 * to another fp32 computation that could fail the same way. bf16 compute
 * rounds P to bf16 (error up to ~2^-7 max|v|): 2^-6 there. */
#define FXT_VERIFY_TOL 0x1p-12
#define FXT_VERIFY_TOL_BF16 0x1p-6

/* q, k, v: fp32 values as the kernels saw them; lse may be NULL. Compares
 * rows_per_head evenly spaced rows of every (batch, head) (all rows when
 * Sq is smaller). */
void fxt_verify(const fxa_attn_desc *d, const float *q, const float *k, const float *v,
                const float *out, const float *lse, int64_t rows_per_head, fxt_verify_result *res);

#endif
