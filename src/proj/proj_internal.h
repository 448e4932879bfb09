/* The QKV projection's parts (proj.c: plan and run; proj_check.c: the
 * descriptor's and the run's checks; proj_stage.c: operands staged for the
 * GEMM; proj_gemm.c: the workspace layout and the GEMM's backends;
 * proj_epilogue.c: scales, bias, RMSNorm, RoPE and the store). */
#ifndef FXA_PROJ_INTERNAL_H
#define FXA_PROJ_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn_proj.h"
#include "gemm_onednn.h"

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

#define STAGE_ROWS 64 /* rows per work item */

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

/* (heads_q + 2 heads_kv) head_dim. */
int64_t fxa_proj_out_features(const fxa_proj_desc *d);
/* The plan's checks of d (already copied in). */
fxa_status fxa_proj_check_desc(fxa_ctx *ctx, const fxa_proj_desc *d);
/* The run's checks of a (copied in) and the workspace. */
fxa_status fxa_proj_check_args(const fxa_proj_plan *p, const fxa_proj_args *a, const void *ws);
/* X for the GEMM (proj_stage.c); *x_out what the GEMM reads. */
fxa_status fxa_proj_stage_x(const fxa_proj_plan *p, unsigned char *ws, const void *x, float *x32,
                            uint16_t *x16, float *xs, const void **x_out, int check);
/* Rows [row0, row0 + rows) of W for the GEMM. */
fxa_status fxa_proj_stage_w(const fxa_proj_plan *p, unsigned char *ws, const void *w, int64_t row0,
                            int64_t rows, float *w32, uint16_t *w16, const void **w_out, int check);
/* *faster = 1 where 16-bit operands multiply faster as bf16 (proj_gemm.c). */
fxa_status fxa_proj_bf16_gemm_faster(fxa_ctx *ctx, int64_t head_dim, int *faster);
/* The workspace layout of d. */
void fxa_proj_ws_layout(const fxa_proj_desc *d, int n_threads, int bf16_gemm, proj_ws *l);
/* The GEMM's backends and their workspace. */
fxa_status fxa_proj_plan_gemm(fxa_proj_plan *p);
/* y [S][I] = x W^T; *gemm: the GEMM that ran. */
fxa_status fxa_proj_multiply(const fxa_proj_plan *p, unsigned char *ws, const void *xg,
                             const void *w, float *y, fxa_proj_gemm *gemm);
/* Phase A (dequantise, bias, sums of squares) over all tokens (proj_epilogue.c). */
fxa_status fxa_proj_phase_a(const fxa_proj_plan *p, unsigned char *ws, epi_job *job,
                            int64_t n_items);
/* Phases B and C: normalise and rotate every token, then store them all. */
fxa_status fxa_proj_phase_bc(fxa_ctx *ctx, epi_job *job, int64_t n_items);

#endif
