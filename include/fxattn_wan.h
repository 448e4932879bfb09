/*
 * fxattn_wan.h (libfxattn_wan): the Wan2.2 self-attention layer, and its
 * checkpoint loader.
 *
 *   x [S, hidden] -> fused QKV projection [Q|K|V] + bias -> RMSNorm across
 *   all heads of Q and of K (gammas norm_q / norm_k, eps 1e-6) -> Wan 3-D
 *   RoPE (rotate-half, theta 1e4, latent grid F x H x W = S tokens) ->
 *   fixed-max attention (BSHD, Hq = Hkv = heads) -> output projection +
 *   bias -> y [S, hidden]
 *
 * The layer plans once (fxa_wan_plan_create: validates, builds the RoPE
 * tables and the attention plan, reports the workspace bytes) and runs on
 * caller memory (weights, x, y, workspace). Weights come from the caller
 * (fxa_wan_weights filled by hand, PyTorch's Linear layout [out][in]) or
 * from fxa_wan_weights_load (a Wan2.2 checkpoint, or deterministic
 * synthetic weights). A tensor-parallel rank loads a range of heads alone.
 *
 * Errors: a status and a one-line message: fxa_ctx_last_error(ctx) for the
 * layer's plan and runs, the caller's err buffer for the loader; nothing
 * is printed and nothing exits. Versioned structs (struct_size) follow
 * fxattn.h's policy: every size from the struct's first release (0.1:
 * fxa_wan_desc and fxa_wan_load_params before their dtype) to the current
 * one is accepted, fields past it keep their defaults, and fxa_wan_stats
 * is written only within the caller's struct_size.
 * Threads: the context's pool (and OpenBLAS's/oneDNN's for the
 * projections, libfxattn_proj); one run per plan at a time.
 */
#ifndef FXATTN_WAN_H
#define FXATTN_WAN_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"
#include "fxattn_proj.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FXA_WAN_ROPE_THETA 1e4
#define FXA_WAN_EPS 1e-6

/* One Linear as a projection plan (fxattn_proj.h) takes it: w [rows][cols] (fp32, bf16 bits, or
 * E4M3 codes with one scale per output channel), bias [rows] or NULL. */
typedef struct fxa_wan_linear {
    fxa_proj_w format; /* FXA_PROJ_W_F32, FXA_PROJ_W_BF16 or FXA_PROJ_W_E4M3 */
    int64_t rows;      /* output channels */
    int64_t cols;      /* input features */
    void *w;
    float *scales; /* [rows] (E4M3), else NULL */
    float *bias;
} fxa_wan_linear;

/*
 * The weights of heads [head_begin, head_begin + head_count) of one block,
 * n = head_count * head_dim channels (all heads: head_begin 0, head_count
 * heads):
 *   qkv      [3 n][hidden]: the heads' Q, K, V rows, Q and K rows in
 *            rotate-half RoPE order, with their biases
 *   o        [hidden][n]: o.weight's columns of the heads, with every
 *            output channel's scale (E4M3) and the whole bias
 *   gamma_q, gamma_k  [n]: the RMSNorm gains, rotate-half order
 * A slice holds the bits the same heads have in the whole layer.
 */
typedef struct fxa_wan_weights {
    int64_t hidden;
    int64_t heads; /* of the whole layer */
    int64_t head_dim;
    int64_t head_begin;
    int64_t head_count;
    fxa_wan_linear qkv;
    fxa_wan_linear o;
    float *gamma_q;
    float *gamma_k;
} fxa_wan_weights;

/* ---- loading ------------------------------------------------------------ */

typedef struct fxa_wan_load_params {
    size_t struct_size; /* sizeof(fxa_wan_load_params) */
    int64_t block;      /* transformer block N (checkpoints) */
    int64_t heads;      /* heads of the layer; must divide hidden */
    int64_t head_begin; /* the heads to load: [head_begin, head_begin + head_count); */
    int64_t head_count; /* 0: all heads */
    int rope_half;      /* 0 (default): Q/K channels in RoPE pairs (2i, 2i+1), as Wan2.2
                         * and diffusers checkpoints store them, permuted to
                         * rotate-half at load; 1: already rotate-half (no permutation) */
    int fp8;            /* 1: fp32 weights quantised to E4M3, one scale per output
                         * channel (F8_E4M3 checkpoints stay as they are) */
    uint64_t seed;      /* synthetic weights (path NULL): the generator's seed */
    int64_t hidden;     /* synthetic weights: hidden size (checkpoints: from q.weight) */
    fxa_dtype dtype;    /* the weights' format when not FP8: FXA_F32 (default; BF16 and
                         * F16 tensors are widened exactly) or FXA_BF16 (BF16 tensors
                         * keep their bits, F32 and F16 ones are rounded once to
                         * nearest even), for a layer of fxa_wan_desc.dtype FXA_BF16;
                         * biases and gammas stay fp32 */
} fxa_wan_load_params;

/* Defaults: block 0, all heads, interleaved RoPE pairs, no FP8, fp32 weights;
 * heads must be set. */
FXA_API void fxa_wan_load_params_init(fxa_wan_load_params *p);

/*
 * Load the weights of p's heads of block p->block from checkpoint `path`
 * (a .safetensors file) into *w (allocated here; free with
 * fxa_wan_weights_free), or synthetic ones when path is NULL: W ~ N(0, 1) /
 * sqrt(hidden), biases ~ 0.1 N(0, 1), gammas ~ 1 + 0.2 N(0, 1), from a
 * counter-based generator (any slice is the same bits as in the whole
 * layer, on every platform).
 *
 * Checkpoint tensors of block N (PyTorch Linear layout [out][in]):
 *   blocks.N.self_attn.{q,k,v,o}.weight  [hidden, hidden]  F32, BF16, F16 or F8_E4M3
 *   blocks.N.self_attn.{q,k,v,o}.bias    [hidden]          F32, BF16, F16
 *   blocks.N.self_attn.norm_{q,k}.weight [hidden]          F32, BF16, F16
 * An F8_E4M3 weight needs one scale per output channel, F32, BF16 or F16,
 * named blocks.N.self_attn.X.weight_scale or .scale_weight (exactly one),
 * of shape [hidden] or [hidden, 1], or one value ([] or [1]) for every
 * channel; q, k and v are all F8_E4M3 or none.
 * Only the slice's rows of q, k, v (and of their scales, biases and the
 * gammas) are read; o.weight is read in blocks of whole rows (about 4 MiB)
 * of which the slice's columns are kept.
 * Errors: FXA_ERR_INVALID_ARG (bad parameters, a missing or malformed
 * tensor, a non-finite value: the message names the file and tensor),
 * FXA_ERR_IO (the file cannot be read), FXA_ERR_NO_MEMORY. On failure *w is
 * zeroed.
 */
FXA_API fxa_status fxa_wan_weights_load(const char *path, const fxa_wan_load_params *p,
                                        fxa_wan_weights *w, char *err, size_t errlen);

/* Free what fxa_wan_weights_load allocated and zero *w. NULL-safe. */
FXA_API void fxa_wan_weights_free(fxa_wan_weights *w);

/* Synthetic value i of a stream of the generator that fxa_wan_weights_load
 * uses without a path (stream FXA_WAN_SYNTH_X, element token * hidden +
 * channel, is the synthetic x of the tools): approximately N(0, 1),
 * deterministic from the seed and the same on every platform. */
#define FXA_WAN_SYNTH_X 0
FXA_API float fxa_wan_synth(uint64_t seed, uint64_t stream, uint64_t i);

/* The hidden size of checkpoint `path`: the input size of block's
 * q.weight (its other shapes are checked when the weights are loaded). */
FXA_API fxa_status fxa_wan_checkpoint_hidden(const char *path, int64_t block, int64_t *hidden,
                                             char *err, size_t errlen);

/* ---- the layer ---------------------------------------------------------- */

typedef struct fxa_wan_desc {
    size_t struct_size;            /* sizeof(fxa_wan_desc) */
    int64_t frames, height, width; /* latent grid: S = frames * height * width tokens */
    int64_t heads;
    int64_t head_dim;    /* even, 6..FXA_MAX_HEAD_DIM; hidden = heads * head_dim */
    fxa_proj_x x_format; /* FXA_PROJ_X_F32 [S][hidden], FXA_PROJ_X_BF16 (bf16 bits), or
                          * FXA_PROJ_X_E4M3_ROWS (fxa_e4m3_quantize_rows) */
    /* The activations between stages (docs/numerics.md, "The bf16 layer"):
     *  FXA_F32 (default): Q, K, V and the attention output in fp32, attention
     *    computed in fp32;
     *  FXA_BF16: an fp32 x rounded once to bf16; Q, K and V rounded once to
     *    bf16 after the fused epilogue (bias, RMSNorm, RoPE in fp32); attention
     *    with FXA_COMPUTE_AUTO (bf16 compute where the context measures it
     *    faster, else fp32; fxa_ctx_compute_choice) writing bf16; the output
     *    projection on that bf16
     *    with fp32 accumulation. With bf16 (or FP8) weights every GEMM runs
     *    on oneDNN's bf16 matmul (AVX512-BF16); fp32 weights are read as they
     *    are by an fp32 GEMM (the same products, slower).
     * y is fp32 either way. */
    fxa_dtype dtype;
} fxa_wan_desc;

/* Defaults: grid 0 (must be set), heads 0 (must be set), head_dim 128, fp32 x
 * and activations. */
FXA_API void fxa_wan_desc_init(fxa_wan_desc *d);

typedef struct fxa_wan_plan fxa_wan_plan;

/*
 * Validate d and plan the layer on ctx: the RoPE tables (2 S head_dim
 * floats, held by the plan), the attention plan, and the projections'
 * plans (QKV and output, one for each weight format, since the weights come
 * with each run); *workspace_bytes: Q, K, V and the attention output (4 S
 * hidden values of d->dtype; with FXA_BF16 and an fp32 x also x's bf16
 * copy), the attention plan's workspace and the projections'. The plan
 * keeps a pointer to ctx; destroy it before the context. Errors
 * (fxa_ctx_last_error(ctx), *plan_out NULL): FXA_ERR_INVALID_ARG,
 * FXA_ERR_NO_MEMORY, and those of fxa_proj_plan_create.
 */
FXA_API fxa_status fxa_wan_plan_create(fxa_ctx *ctx, const fxa_wan_desc *d, fxa_wan_plan **plan_out,
                                       size_t *workspace_bytes);
FXA_API void fxa_wan_plan_destroy(fxa_wan_plan *plan);

/* What one run did. */
typedef struct fxa_wan_stats {
    size_t struct_size; /* set by the caller (sizeof); written within it only */
    double qkv_seconds, attention_seconds, out_seconds;
    int64_t rows;          /* attention rows: heads * S */
    int64_t fallback_rows; /* rows computed by online softmax */
    /* Added in 0.3: the attention's compute (FXA_COMPUTE_AUTO resolved)
     * and the GEMMs of the QKV and the output projection (this rank's, on
     * MPI ranks). */
    fxa_compute compute;
    fxa_proj_gemm qkv_gemm;
    fxa_proj_gemm out_gemm;
} fxa_wan_stats;

/* The tensors of one run of the layer (fxa_wan_layer_run; over MPI ranks
 * fxa_wan_mpi_layer_run, with this rank's shard of each). Added in 0.3. */
typedef struct fxa_wan_args {
    size_t struct_size;             /* sizeof(fxa_wan_args) (fxattn.h's struct_size policy) */
    const fxa_wan_weights *weights; /* all heads of the plan's descriptor */
    const void *x;                  /* [S][hidden] in the descriptor's x_format */
    float *y;                       /* [S][hidden] fp32 */
} fxa_wan_args;

/*
 * args->y = the layer on args->x with args->weights, which must hold all
 * heads of the plan's descriptor (shapes checked). workspace: at least the
 * plan's bytes, 64-byte aligned, not overlapping y. Allocates nothing; only
 * reads the plan. A non-finite x or weight gives FXA_ERR_INVALID_ARG before
 * y is written. stats may be NULL. The message of a failure:
 * fxa_ctx_last_error of the plan's context. Added in 0.3.
 */
FXA_API fxa_status fxa_wan_layer_run(const fxa_wan_plan *plan, const fxa_wan_args *args,
                                     void *workspace, fxa_wan_stats *stats);

/* fxa_wan_layer_run with the tensors one by one (the 0.2 call; kept for one
 * release). */
FXA_API fxa_status fxa_wan_run(fxa_wan_plan *plan, const fxa_wan_weights *w, const void *x,
                               float *y, void *workspace, fxa_wan_stats *stats);

/* FLOPs of the layer: QKV 6 S hidden^2, attention, output 2 S hidden^2
 * (0.0 for NULL). */
FXA_API double fxa_wan_flops(const fxa_wan_desc *d);

/* ---- pieces, for distributed drivers (token shards, head slices) -------- */

/* The attention of `heads` heads over all S tokens (BSHD; f32, or bf16 in and
 * out with FXA_COMPUTE_AUTO when d->dtype is FXA_BF16). */
FXA_API void fxa_wan_attn_desc(const fxa_wan_desc *d, int64_t heads, fxa_attn_desc *ad);

/* The Wan RoPE tables of all S tokens, [S][head_dim] each, into caller
 * memory. */
FXA_API fxa_status fxa_wan_rope(const fxa_wan_desc *d, float *cos_out, float *sin_out);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_WAN_H */
