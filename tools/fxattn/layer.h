/*
 * The Wan2.2 self-attention layer behind `fxattn layer` (cmd_layer.c, and
 * layer_mpi.c under mpirun):
 *
 *   x [S, hidden] -> fused QKV projection [Q|K|V] + bias -> RMSNorm across all
 *   heads of Q and of K (gammas norm_q / norm_k, eps 1e-6) -> Wan 3-D RoPE
 *   (rotate-half, theta 1e4, grid F x H x W = S tokens) -> fixed-max
 *   attention (BSHD, Hq = Hkv = heads) -> output projection + bias -> y.
 *
 * Weights come from a .safetensors checkpoint (Wan2.2 names, layer_weights.c)
 * or are synthetic; checkpoints with interleaved RoPE pairs are permuted to
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

#define FXT_LAYER_THETA 1e4
#define FXT_LAYER_EPS 1e-6
#define FXT_LAYER_VERIFY_TOKENS 16

/* The problem, settled from the options and the files' shapes. */
typedef struct fxt_layer_cfg {
    int64_t frames, height, width; /* latent grid: tokens = frames * height * width */
    int64_t tokens;
    int64_t hidden; /* heads * head_dim */
    int64_t heads;
    int64_t head_dim;
    int interleaved; /* 1: the weights use interleaved RoPE pairs (converted at load) */
    int x_axis;      /* token axis of -x: 0 for [S, hidden], 1 for [1, S, hidden] */
} fxt_layer_cfg;

/* One Linear as fxa_proj_run takes it. */
typedef struct fxt_layer_mat {
    fxa_proj_w format; /* FXA_PROJ_W_F32 or FXA_PROJ_W_E4M3 */
    int64_t rows;      /* output channels */
    int64_t cols;      /* input features */
    void *w;           /* [rows][cols]: floats, or E4M3 codes */
    float *scales;     /* [rows] per output channel (E4M3), else NULL */
    float *bias;       /* [rows], or NULL */
} fxt_layer_mat;

typedef struct fxt_layer_weights {
    fxt_layer_mat qkv; /* [3 hidden][hidden]: Q, K, V rows; Q/K rows in rotate-half order */
    fxt_layer_mat o;   /* [hidden][hidden] */
    float *gamma_q;    /* [hidden], rotate-half order */
    float *gamma_k;
} fxt_layer_weights;

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
    double tolerance;    /* min(2 fp32_rel_err + 2^-22, 2^-12): max_rel_err must not exceed it */
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
    const fxt_layer_check *check;                       /* NULL without --verify */
} fxt_layer_report;

/* Checks that need no file: --rope-layout, --grid syntax. (The parallel
 * grid is checked against the ranks under MPI, layer_mpi.c.) */
int fxt_layer_check_opts(const layer_opts *o);

/* Settle cfg from the options and the shapes of -x and --weights (headers
 * only): hidden from q.weight, else x, else heads * (--dim or 128); heads
 * must divide it; S from x must equal F * H * W. */
int fxt_layer_setup(const layer_opts *o, fxt_layer_cfg *cfg);

/* hidden of checkpoint `path`: the input size of block's q.weight (its
 * shapes are checked when the weights are loaded). */
int fxt_layer_weights_hidden(const char *path, int64_t block, int64_t *hidden);

/* Synthetic value i of a stream (stream FXT_LAYER_STREAM_X is x, element
 * token * hidden + channel): approximately N(0, 1), deterministic from the
 * seed and the same on every platform. */
#define FXT_LAYER_STREAM_X 0
float fxt_layer_synth(uint64_t seed, uint64_t stream, uint64_t i);

/* Heads [h0, h0 + nh) of the weights (0, cfg->heads: the whole layer) from
 * --weights (layer_weights.c: only the slice's rows and o's columns are
 * kept) or synthetic from --seed; converted to rotate-half when
 * cfg->interleaved, FP8 with --fp8. w->qkv is [3 nh head_dim][hidden] (the
 * heads' Q, K, V rows), w->o [hidden][nh head_dim] (o.weight's columns of
 * the heads) with all hidden scales and biases, the gammas [nh head_dim]:
 * the same bits as those heads have in the whole layer. */
int fxt_layer_load_weights(const layer_opts *o, const fxt_layer_cfg *cfg, int64_t h0, int64_t nh,
                           fxt_layer_weights *w);
void fxt_layer_weights_free(fxt_layer_weights *w);

/* Tokens [start, start + len) of x: from -x (only those rows are read) or
 * synthetic from --seed; row-quantised with --fp8. */
int fxt_layer_load_x(const layer_opts *o, const fxt_layer_cfg *cfg, int64_t start, int64_t len,
                     fxt_layer_x *x);
void fxt_layer_x_free(fxt_layer_x *x);

/* Wan RoPE tables of all tokens, [S][head_dim] each (caller frees). */
int fxt_layer_rope(const fxt_layer_cfg *cfg, float **cos_out, float **sin_out);

/* The fused QKV projection of x's tokens with the `heads` heads of w (all,
 * or a tensor-parallel slice): descriptor and arguments for fxa_proj_run or
 * fxa_mpi_proj_run. cs/sn: RoPE rows of x's first token. q, k, v:
 * [x->len][heads][head_dim]. */
void fxt_layer_qkv_call(const fxt_layer_cfg *cfg, const fxt_layer_weights *w, int64_t heads,
                        const fxt_layer_x *x, const float *cs, const float *sn, float *q,
                        float *k, float *v, fxa_proj_desc *d, fxa_proj_args *a);

/* y [tokens][hidden] = a [tokens][o->cols] o->w^T (+ o->bias): the output
 * projection, or a tensor-parallel partial of it, as one single-segment
 * fxa_proj_run without norm or RoPE. */
fxa_status fxt_layer_out(fxa_ctx *ctx, const fxt_layer_cfg *cfg, const fxt_layer_mat *o,
                         int64_t tokens, const float *a, float *y);

/* Attention descriptor of `heads` heads over all S tokens (BSHD, f32). */
void fxt_layer_attn_desc(const fxt_layer_cfg *cfg, int64_t heads, fxa_attn_desc *d);

/* FLOPs of the layer: QKV 6 S hidden^2, attention, output 2 S hidden^2. */
double fxt_layer_flops(const fxt_layer_cfg *cfg);

/* --verify: the layer in double and in plain fp32 on FXT_LAYER_VERIFY_TOKENS
 * evenly spaced tokens (all when S is smaller), from the operands the kernels
 * saw (w, and x with all tokens; FP8 decoded), compared with y (layer_ref.c).
 * Needs the keys and values of every token: O(S hidden^2) work on one
 * thread, slow for large S (13 s at hidden 5120 and S = 32; about half an
 * hour at S = 4096).
 * Returns 0 or an exit code. */
int fxt_layer_verify(const fxt_layer_cfg *cfg, const fxt_layer_weights *w, const fxt_layer_x *x,
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
