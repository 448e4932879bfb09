/*
 * fxattn_diag.h (libfxattn): the fixed-max constants, for diagnostics tools
 * and tests, and the per-head report of `fxattn check` (fxa_check_plan_create,
 * fxa_check_run).
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

/* One query head of the report (fxa_check_run). Norms and maxima are over every batch;
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

/* What a check plan reports on. Added in 0.3 (its first version). */
typedef struct fxa_check_desc {
    size_t struct_size;        /* sizeof(fxa_check_desc) */
    const fxa_attn_desc *attn; /* the tensors' descriptor, as fxa_attn_plan_create checks it */
    int sample_rows;           /* rows per (batch, head) whose true max is measured;
                                  0 (default) = FXA_CHECK_SAMPLE_ROWS */
    int has_v;                 /* 1 (default): runs pass V; 0: V is taken as zeros (C as
                                  for Vmax 1, and each head's vmax reads 1) */
} fxa_check_desc;

/* Fill *d with defaults: struct_size, attn NULL (must be set), sample_rows
 * 0, has_v 1. */
FXA_API void fxa_check_desc_init(fxa_check_desc *d);

typedef struct fxa_check_plan fxa_check_plan;

/*
 * Plan the per-head report of `fxattn check` for Hq = d->attn->heads_q
 * heads: validate the descriptor (d->attn as fxa_attn_plan_create checks
 * it; its mode and center are ignored), plan the two bound passes and size
 * the workspace of a run (bound-pass workspace, per-row bounds and flags,
 * fp64 norms per thread: about B Hq Sq 10 + threads B Sq 32 bytes plus
 * the attention plan's workspace). The plan owns its two attention plans;
 * destroy it before the context.
 * Errors: FXA_ERR_INVALID_ARG (NULL pointers, a struct_size out of range,
 * a bad attention descriptor, sample_rows < 0), FXA_ERR_NO_MEMORY (the
 * workspace exceeds fxa_available_memory), each with a message in
 * fxa_ctx_last_error(ctx).
 */
FXA_API fxa_status fxa_check_plan_create(fxa_ctx *ctx, const fxa_check_desc *d,
                                         fxa_check_plan **plan_out, size_t *workspace_bytes_out);
FXA_API void fxa_check_plan_destroy(fxa_check_plan *plan);

/*
 * Run the report on args->q, args->k and args->v (the tensors of an
 * fxa_attn_run with the plan's attention descriptor: its dtype, layout and
 * strides; v must be NULL when the plan has has_v 0, and set otherwise;
 * out, lse and the row diagnostics are ignored). The library's bound pass
 * (fxa_attn_bounds) runs twice, with centring on and off, in auto mode, so
 * the fallback shares are exactly what a run would do. The rest is fp64 on
 * the values the kernels see (bf16/f16 widened): norms, key means and
 * radii, and on sample_rows rows per (batch, head), evenly spaced (row
 * s (Sq - 1) / (n - 1) of n = min(sample_rows, Sq); row 0 when n is 1),
 * the true row max.
 * workspace: at least the plan's bytes, 64-byte aligned, apart from the
 * inputs and heads_out. heads_out: Hq structs of head_struct_size bytes
 * each (sizeof fxa_check_head; this library accepts 0.2's size up to its
 * own), head h at (char *)heads_out + h * head_struct_size; each gets the
 * fields that fit and its struct_size set to head_struct_size. Nothing is
 * written to heads_out on failure. Runs on the context's pool and
 * allocates nothing; results do not depend on the thread count or the
 * strides, bit for bit.
 * Errors: FXA_ERR_INVALID_ARG (NULL pointers, a head_struct_size out of
 * range, a non-finite value in Q, K or V, overlapping memory), with a
 * message in fxa_ctx_last_error. Prints nothing.
 */
FXA_API fxa_status fxa_check_run(const fxa_check_plan *plan, const fxa_attn_args *args,
                                 void *workspace, fxa_check_head *heads_out,
                                 size_t head_struct_size);

/*
 * The report in one call: fxa_check_plan_create with d (sample_rows as
 * given, has_v = v != NULL), a workspace of its size, fxa_check_run on q,
 * k, v, and the plan destroyed. Allocates the plan and workspace per call
 * (FXA_ERR_NO_MEMORY when they cannot be had); the plan form allocates
 * nothing when it runs. Errors as for those calls, in
 * fxa_ctx_last_error(ctx).
 */
FXA_API fxa_status fxa_attn_check(fxa_ctx *ctx, const fxa_attn_desc *d, const void *q,
                                  const void *k, const void *v, int sample_rows,
                                  fxa_check_head *heads_out, size_t head_struct_size);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_DIAG_H */
