/*
 * `fxattn layer` (cmd_layer.c, and layer_mpi.c under mpirun) over the Wan2.2
 * layer of libfxattn_wan (fxattn_wan.h): the options settled into a
 * problem, x and the weights loaded, --verify, the output and the report.
 *
 * Weights come from a .safetensors checkpoint (fxa_wan_weights_load) or are
 * synthetic; checkpoints with interleaved RoPE pairs are permuted to
 * rotate-half at load time. FP8 (E4M3) weights keep their codes and one
 * scale per output channel; --fp8 quantises fp32 weights that way and x per
 * row. The attention output enters the output projection in fp32 (never
 * quantised: its row scale would depend on how heads are split over ranks).
 *
 * Every function that can fail prints "fxattn: error: ..." through fxt_fail
 * (captured under MPI) and returns the CLI exit code; 0 on success.
 */
#ifndef FXT_LAYER_H
#define FXT_LAYER_H

#include <stdint.h>

#include "cmd_opts.h"
#include "fxattn.h"
#include "fxattn_proj.h"
#include "fxattn_wan.h"

#define FXT_LAYER_VERIFY_TOKENS 16

/* The problem, settled from the options and the files' shapes. */
typedef struct fxt_layer_cfg {
    int64_t frames, height, width; /* latent grid: tokens = frames * height * width */
    int64_t tokens;
    int64_t hidden; /* heads * head_dim */
    int64_t heads;
    int64_t head_dim;
    int interleaved;  /* 1: the weights use interleaved RoPE pairs (converted at load) */
    int x_axis;       /* token axis of -x: 0 for [S, hidden], 1 for [1, S, hidden] */
    fxa_wan_desc wan; /* the layer as libfxattn_wan takes it (x_format E4M3 rows with --fp8) */
} fxt_layer_cfg;

/* Input tokens [start, start + len) as the projection takes them. */
typedef struct fxt_layer_x {
    fxa_proj_x format; /* FXA_PROJ_X_F32 [len][hidden], or FXA_PROJ_X_E4M3_ROWS */
    int64_t start;
    int64_t len;
    void *data;
} fxt_layer_x;

/* --verify: y against the fp64 layer on sampled tokens (layer_ref.c). */
typedef struct fxt_layer_check {
    int64_t tokens;      /* tokens compared */
    double max_abs_err;  /* max |y - y64| */
    double max_rel_err;  /* max_abs_err / max |y64| */
    double fp32_rel_err; /* the same for the layer in plain fp32 */
    double bf16_rel_err; /* bf16 layer: the same in plain bf16 storage (else 0) */
    double tolerance;    /* fp32: min(2 fp32_rel_err + 2^-22, 2^-12); bf16: min(2
                          * bf16_rel_err + 2^-12, 2^-5). max_rel_err must not exceed it */
    int64_t worst_token; /* where max_abs_err is */
    int64_t worst_channel;
} fxt_layer_check;

/* What a run did, for --stats and the --verify line. */
typedef struct fxt_layer_report {
    const char *mode; /* "single", "context", "tensor", "tensor+context" */
    int ranks, ulysses, ring, tp;
    int threads; /* per rank */
    const char *isa;
    double qkv_seconds, attention_seconds, out_seconds; /* slowest rank */
    int64_t rows, fallback_rows;                        /* attention rows: heads * S */
    fxa_compute compute;                                /* the attention's */
    fxa_proj_gemm qkv_gemm, out_gemm;                   /* the projections' GEMMs */
    const fxt_layer_check *check;                       /* NULL without --verify */
} fxt_layer_report;

/* Checks that need no file: --rope-layout, --grid syntax. (The parallel
 * grid is checked against the ranks under MPI, layer_mpi.c.) */
int fxt_layer_check_opts(const layer_opts *o);

/* Settle cfg from the options and the shapes of -x and --weights (headers
 * only): hidden from q.weight, else x, else heads * (--dim or 128); heads
 * must divide it; S from x must equal F * H * W. */
int fxt_layer_setup(const layer_opts *o, fxt_layer_cfg *cfg);

/* Heads [h0, h0 + nh) of the weights (0, cfg->heads: the whole layer) from
 * --weights or synthetic from --seed (fxa_wan_weights_load); converted to
 * rotate-half when cfg->interleaved, FP8 with --fp8. */
int fxt_layer_load_weights(const layer_opts *o, const fxt_layer_cfg *cfg, int64_t h0, int64_t nh,
                           fxa_wan_weights *w);

/* Tokens [start, start + len) of x: from -x (only those rows are read) or
 * synthetic from --seed; row-quantised with --fp8. */
int fxt_layer_load_x(const layer_opts *o, const fxt_layer_cfg *cfg, int64_t start, int64_t len,
                     fxt_layer_x *x);
void fxt_layer_x_free(fxt_layer_x *x);

/* Wan RoPE tables of all tokens, [S][head_dim] each (caller frees). */
int fxt_layer_rope(const fxt_layer_cfg *cfg, float **cos_out, float **sin_out);

/* --verify: the layer in double, in plain fp32 (and in plain bf16 storage
 * for a bf16 layer) on FXT_LAYER_VERIFY_TOKENS
 * evenly spaced tokens (all when S is smaller), from the operands the kernels
 * saw (w, and x with all tokens; FP8 decoded), compared with y (layer_ref.c).
 * Needs the keys and values of every token: O(S hidden^2) work on one
 * thread, slow for large S (13 s at hidden 5120 and S = 32; about half an
 * hour at S = 4096).
 * Returns 0 or an exit code. */
int fxt_layer_verify(const fxt_layer_cfg *cfg, const fxa_wan_weights *w, const fxt_layer_x *x,
                     const float *y, fxt_layer_check *res);

/* After --verify: an error (exit 1) when the error exceeds the tolerance. */
int fxt_layer_check_result(const fxt_layer_check *c);

/* Write y [S][hidden] to path (staged, atomic). */
int fxt_layer_write(const char *path, const fxt_layer_cfg *cfg, const float *y);

/* --stats JSON line, or the --verify line, on stdout. */
void fxt_layer_print(const layer_opts *o, const fxt_layer_cfg *cfg, const fxt_layer_report *r);

/* Distributed when --ulysses, --ring or --tp is given, or under mpirun. */
int fxt_layer_is_distributed(const layer_opts *o);

/* `fxattn layer` on MPI (layer_mpi.c): initialises and finalises MPI. */
int fxt_layer_mpi(const layer_opts *o);

#endif
