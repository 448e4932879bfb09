/*
 * fxattn_diag.h (libfxattn): the fixed-max constants, for diagnostics tools
 * and tests, and the per-head report of `fxattn check` (fxa_attn_check).
 * Attention itself needs none of this: fxa_attn_run derives the constants.
 * docs/numerics.md derives them.
 */
#ifndef FXATTN_DIAG_H
#define FXATTN_DIAG_H

#include <stdint.h>

#include "fxattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* C(N) = 127 - ceil(log2 N) - ceil(log2 max(Vmax,1)). n_keys >= 1. */
FXA_API int fxa_fixed_m_c(int64_t n_keys, double vmax);
/* Strict gate floor(W/2), W = C + 125: sound for any row. */
FXA_API int fxa_fixed_m_gate_strict(int c);
/* Looser gate for rows with virtually centred keys (derivation in bound.c). */
FXA_API int fxa_fixed_m_gate_centered(int c, int64_t n_keys);

/* ------------------------------------------------------------------------ */
/* The check report: does the fixed-max bound suit these inputs?            */
/* ------------------------------------------------------------------------ */

/* Query rows per (batch, head) whose true max is measured when the caller
 * passes sample_rows 0. */
#define FXA_CHECK_SAMPLE_ROWS 32

/* One query head of fxa_attn_check. Norms and maxima are over every batch;
 * bounds and overshoots are base-2 units (the scores lambda q.k with
 * lambda = scale log2(e)); "raw" means without centring. Added in 0.2. */
typedef struct fxa_check_head {
    size_t struct_size;             /* written: the call's head_struct_size */
    double q_norm_min;              /* ||q_i|| over the head's B * Sq rows */
    double q_norm_median;           /* (the upper median: element n/2 sorted) */
    double q_norm_max;              /* (all norms in fp64) */
    double k_norm_max;              /* max ||k_j|| of its kv head */
    double k_radius_centered;       /* max ||k_j - kbar||, kbar the fp64 key mean */
    double vmax;                    /* max |v| of its kv head; 1 when v is NULL */
    double bound_median;            /* ceil(U_i) of the bound pass, centring on */
    double bound_max;               /* (max over rows and 0) */
    double bound_raw_median;        /* ceil(U_i), centring off */
    double bound_raw_max;           /* (max over rows and 0) */
    double fallback_share_centered; /* rows the bound pass sends to online softmax / B Sq */
    double fallback_share_raw;      /* the same without centring */
    double overshoot_median;        /* ceil(U_i) - lambda max_j q_i.(k_j - kbar), sampled rows */
    double overshoot_max;           /* (max over sampled rows and 0) */
    double overshoot_raw_median;    /* ceil(U_i raw) - lambda max_j q_i.k_j */
    double overshoot_raw_max;       /* (max over sampled rows and 0) */
    int64_t rows;                   /* B * Sq: the head's query rows */
    int64_t fallback_rows_centered; /* the counts behind the shares */
    int64_t fallback_rows_raw;
    int64_t sampled_rows; /* B * min(sample_rows, Sq): rows of the overshoots */
    int c;                /* C(N) with this head's vmax (fxa_fixed_m_c) */
    int gate;             /* strict gate (fxa_fixed_m_gate_strict) */
    int gate_centered;    /* centred gate (fxa_fixed_m_gate_centered) */
} fxa_check_head;

/*
 * The per-head report of `fxattn check`, for Hq = d->heads_q heads.
 * q, k, v: the tensors of an fxa_attn_run with descriptor d (its dtypes,
 * layout and strides; the other fields of d as fxa_attn_plan_create
 * checks them). v may be NULL: V is then taken as zeros (C as for Vmax 1)
 * and each head's vmax reads 1. The library's bound pass (fxa_attn_bounds)
 * runs twice, with centring on and off, in auto mode (d->center and
 * d->mode are ignored), so the fallback shares are exactly what a run
 * would do. The rest is fp64 on the values the kernels see (bf16/f16
 * widened): norms, key means and radii, and on sample_rows rows per
 * (batch, head), evenly spaced (row s (Sq - 1) / (n - 1) of n =
 * min(sample_rows, Sq); row 0 when n is 1), the true row max. sample_rows
 * 0 means FXA_CHECK_SAMPLE_ROWS; negative is refused.
 * heads_out: Hq structs of head_struct_size bytes each (sizeof
 * fxa_check_head; this library accepts 0.2's size up to its own), head h
 * at (char *)heads_out + h * head_struct_size; each gets the fields that
 * fit and its struct_size set to head_struct_size. Nothing is written on
 * failure. Runs on the context's pool; results do not depend on the thread
 * count or the strides, bit for bit.
 * A diagnostic: it allocates its own scratch (two bound-pass workspaces,
 * per-row bounds and flags, fp64 norms per thread: about
 * B Hq Sq 10 + threads B Sq 24 bytes plus the plan's workspace).
 * Errors: FXA_ERR_INVALID_ARG (NULL pointers, a head_struct_size out of
 * range, a bad descriptor, a non-finite value in Q, K or V),
 * FXA_ERR_NO_MEMORY (the scratch cannot be allocated or exceeds
 * fxa_available_memory), each with a message in fxa_ctx_last_error(ctx).
 * Prints nothing.
 */
FXA_API fxa_status fxa_attn_check(fxa_ctx *ctx, const fxa_attn_desc *d, const void *q,
                                  const void *k, const void *v, int sample_rows,
                                  fxa_check_head *heads_out, size_t head_struct_size);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_DIAG_H */
