/*
 * Attention in double precision with the exact row max: the reference that
 * fxattn is measured against (tests, `fxattn demo`, `fxattn attn --verify`).
 * Inputs are fp32 values (bf16/f16 inputs are passed already widened, so the
 * reference sees exactly the values the kernels see). One row at a time, so
 * callers can sample rows of large problems.
 */
#ifndef FXT_FP64_ATTN_H
#define FXT_FP64_ATTN_H

#include <stdint.h>

#include "fxattn.h"

/* Element offset of row (b, h, s) of a tensor with `heads` heads and `seq`
 * tokens in the descriptor's layout. */
int64_t fxt_row_offset(const fxa_attn_desc *d, int64_t heads, int64_t seq, int64_t b, int64_t h,
                       int64_t s);

/* out[0..D) and *lse (natural log of sum_j exp(tau q.k_j)) for query row
 * (b, h, i). lse may be NULL. */
void fxt_fp64_attn_row(const fxa_attn_desc *d, const float *q, const float *k, const float *v,
                       int64_t b, int64_t h, int64_t i, double *out, double *lse);

#endif
