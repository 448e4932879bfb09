/*
 * fxattn_proj: number formats of fxattn's QKV projection.
 *
 * The projection takes row-scaled FP8 activations (Trainium's "ROW_MX"
 * packing) and FP8 weights with one fp32 scale per output channel. Same
 * conventions as fxattn.h: fallible calls return fxa_status, callers own all
 * buffers, bad input values are reported (FXA_ERR_INVALID_ARG), never
 * aborted on, and a call that fails writes no output.
 */
#ifndef FXATTN_PROJ_H
#define FXATTN_PROJ_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* FP8 E4M3                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * OCP FP8 E4M3 ("e4m3fn"): 1 sign bit, 4 exponent bits with bias 7, 3
 * mantissa bits, no infinities.
 *   exponent 1..15: (-1)^s * 2^(e-7) * (1 + m/8)   (S.1111.111 excepted)
 *   exponent 0:     (-1)^s * 2^-6 * m/8            (subnormals, +-0)
 *   S.1111.111 (0x7f, 0xff): NaN.
 * Largest finite value 448 (0x7e), smallest normal 2^-6 (0x08), smallest
 * subnormal 2^-9 (0x01).
 *
 * Every E4M3 value is exactly representable in bf16, fp16 and fp32, so
 * decoding is exact, and the product of two decoded codes (at most 8
 * significant bits, magnitude in [2^-18, 448^2]) is exact in fp32.
 */

#define FXA_E4M3_MAX 448.0f

/* Exact decode of an E4M3 code. The NaN codes 0x7f / 0xff give a quiet
 * fp32 NaN with the code's sign; the zeros keep their sign. */
FXA_API float fxa_e4m3_to_f32(uint8_t code);

/*
 * Round x to E4M3, to nearest with ties to even, saturating:
 *  - every |x| >= 448, +-Inf included, gives +-448 (0x7e / 0xfe): no
 *    value rounds to the NaN codes (464 would tie to 448 anyway, anything
 *    above would round to 480, which E4M3 lacks);
 *  - NaN (of either sign, any payload) gives 0x7f;
 *  - |x| <= 2^-10 (half the smallest subnormal; the tie goes to the even
 *    code, zero) gives a zero with x's sign, so -0.0 gives 0x80.
 * Hence fxa_f32_to_e4m3(fxa_e4m3_to_f32(c)) == c for every finite code c,
 * and both NaN codes come back as 0x7f.
 */
FXA_API uint8_t fxa_f32_to_e4m3(float x);

/*
 * Row-scaled activations, packed like Trainium's ROW_MX.
 *
 * Each of `rows` rows of `n` fp32 values (x row-major [rows][n]) becomes n
 * code bytes followed by 4 bytes holding the row's fp32 scale (the
 * little-endian bytes of its bit pattern: a memcpy of the float on a
 * little-endian host), so row r occupies bytes [r * (n + 4), (r + 1) * (n + 4))
 * of `packed`, rows * (n + 4) bytes in all:
 *   scale  = absmax(row) / 448 (an fp32 division), 1.0f for an all-zero row;
 *   code_j = fxa_f32_to_e4m3(x_j / scale) (an fp32 division), so the
 *            largest-magnitude element gets +-448 (0x7e / 0xfe).
 * Rows whose absmax is below 448 * FLT_MIN (about 5.3e-36) would get a
 * subnormal or zero fp32 scale, which has too few bits (or none) to carry the
 * row; their scale is FLT_MIN (2^-126) instead, so x_j / scale is exact and
 * the error bounds below still hold (the absmax element then gets a code
 * below 448).
 * Error of x_j ~ decode(code_j) * scale: at most 2^-4 |x_j| where
 * |x_j| >= 2^-6 * scale (E4M3's normal range), at most 2^-10 * scale below
 * (its subnormal range), up to a few fp32 roundings.
 *
 * Errors (FXA_ERR_INVALID_ARG, nothing written): a NULL pointer, rows < 0,
 * n < 1, a size whose byte count does not fit in ptrdiff_t, or a non-finite
 * value in x. rows == 0 is a no-op.
 */
FXA_API fxa_status fxa_e4m3_quantize_rows(const float *x, int64_t rows, int64_t n, uint8_t *packed);

/*
 * Inverse of fxa_e4m3_quantize_rows: x[r][j] = decode(code_j) * scale_r (an
 * fp32 product) for the packed layout above. Errors (FXA_ERR_INVALID_ARG,
 * nothing written): a NULL pointer, rows < 0, n < 1, a size that does not
 * fit, a NaN code, or a scale in the data that is not finite or has its sign
 * bit set.
 */
FXA_API fxa_status fxa_e4m3_dequantize_rows(const uint8_t *packed, int64_t rows, int64_t n,
                                            float *x);

/*
 * Weights with one fp32 scale per output channel. w is a PyTorch /
 * safetensors Linear weight as stored in a checkpoint: [out_channels]
 * [in_features] row-major (the projection computes y = x W^T + b). Output:
 * codes [out][in] row-major, scales [out]: w[o][i] ~ decode(codes[o][i]) *
 * scales[o], where scales[o] = absmax of w[o][.] / 448 (1.0f for an all-zero
 * row, FLT_MIN for an absmax below 448 * FLT_MIN) and codes[o][i] =
 * fxa_f32_to_e4m3(w[o][i] / scales[o]): each output channel is quantised
 * exactly like one row of fxa_e4m3_quantize_rows, with the same error
 * bounds. Errors (FXA_ERR_INVALID_ARG, nothing written): a NULL pointer,
 * out_channels < 0, in_features < 1, a size that does not fit in ptrdiff_t,
 * or a non-finite value in w.
 */
FXA_API fxa_status fxa_e4m3_quantize_weights(const float *w, int64_t out_channels,
                                             int64_t in_features, uint8_t *codes, float *scales);

/* ------------------------------------------------------------------------ */
/* QKV projection                                                            */
/* ------------------------------------------------------------------------ */

typedef enum fxa_proj_x {
    FXA_PROJ_X_F32 = 0,      /* x [tokens][in_features] fp32 */
    FXA_PROJ_X_BF16 = 1,     /* the same, bf16 bits */
    FXA_PROJ_X_E4M3_ROWS = 2 /* [tokens][in_features + 4]: fxa_e4m3_quantize_rows' layout */
} fxa_proj_x;

typedef enum fxa_proj_w {
    FXA_PROJ_W_F32 = 0,  /* w [out][in] fp32 (a Linear weight as stored) */
    FXA_PROJ_W_BF16 = 1, /* the same, bf16 bits */
    FXA_PROJ_W_E4M3 = 2  /* codes [out][in] + w_scales [out]: fxa_e4m3_quantize_weights */
} fxa_proj_w;

typedef enum fxa_proj_layout {
    FXA_PROJ_TOKEN_MAJOR = 0, /* each output [tokens][heads * head_dim] */
    FXA_PROJ_HEAD_MAJOR = 1   /* each output [heads][tokens][head_dim] */
} fxa_proj_layout;

/*
 * Y = X W^T + b for a fused [Q|K|V] weight (heads_kv > 0: out = (Hq + 2 Hkv)
 * head_dim channels, Q rows first) or a single segment (heads_kv == 0: out =
 * Hq head_dim, written to q_out; a cross-attention Q, K or V call), then per
 * token, in fp32:
 *   dequantise: y_i = acc_i * x_scale[token] * w_scale[i] + b_i (scales 1 for
 *     fp32/bf16 operands; the products are left to right);
 *   RMSNorm across all heads of the Q segment, and of the K segment (norm):
 *     sum of y^2 in double in index order, mean = (float)(sum / n),
 *     r = 1.0f / sqrtf(mean + (float)eps), out_i = y_i * (r * gamma_i)
 *     (that association order; (y * r) * gamma rounds differently);
 *   rotate-half RoPE on Q and K (rope), with r folded into cos/sin:
 *     t_i = y_i * gamma_i, out_i = t_i (r c_i) - t_{i+d/2} (r s_i) for
 *     i < d/2 and t_i (r c_i) + t_{i-d/2} (r s_i) otherwise, with the
 *     token's tables c = rope_cos[token], s = rope_sin[token] ([tokens][d];
 *     fxa_wan_rope_tables makes Wan's); without norm, r = gamma = 1.
 * V is never normalised or rotated.
 * The GEMM goes to oneDNN's bf16 matmul when both operands are bf16 or FP8
 * (FP8 codes decode exactly to bf16), the CPU has AVX512-BF16 and the
 * context runs bf16 products faster than fp32 ones (its automatic compute
 * for bf16 inputs at this head dim is bf16, fxa_ctx_compute_choice: AMD Zen
 * 4 and 5, AMX; not Intel cores whose vdpbf16ps runs at half the FMA rate;
 * FXA_AUTO_COMPUTE pins it), else to
 * an fp32 GEMM (fp32 or mixed operands, fp32 read in place): OpenBLAS
 * sgemm, or oneDNN's fp32 matmul on AVX-512 CPUs for which the OpenBLAS
 * found at run time has no AVX-512 kernels (OpenBLAS 0.3.21 runs its
 * Haswell kernels on Zen 5, at about half the speed; the environment
 * variable FXA_PROJ_GEMM=openblas|onednn|auto, read when the context is
 * created, forces the choice). oneDNN runs on OpenMP, which does not
 * survive fork(): in a process forked after oneDNN ran in its parent, fp32
 * GEMMs run on OpenBLAS and bf16 ones are refused (FXA_ERR_UNSUPPORTED)
 * instead of waiting forever for the parent's threads. Every product of two
 * operands is exact in fp32, so only the fp32 accumulation rounds. A weight that
 * needs decoding (FP8, or 16-bit next to fp32 x) is decoded 32 MiB of
 * output channels at a time, each block multiplied as soon as it is
 * decoded: an FP8 weight never exists whole in 16 or 32 bits. Both
 * libraries run on the context's thread count. Its summation
 * order is the library's: a token's row can differ in the last bit between
 * calls with different token counts (OpenBLAS picks other kernels for small
 * GEMMs), and between the two GEMM paths; within one call and shape,
 * results are deterministic.
 */
typedef struct fxa_proj_desc {
    size_t struct_size; /* sizeof(fxa_proj_desc); 0.1's size (before out_dtype) accepted */
    int64_t tokens;
    int64_t in_features;
    int64_t heads_q;  /* >= 1 */
    int64_t heads_kv; /* >= 0; 0: a single-segment call */
    int64_t head_dim; /* even, <= FXA_MAX_HEAD_DIM */
    fxa_proj_x x_format;
    fxa_proj_w w_format;
    int norm;   /* 1: RMSNorm across heads on Q and K */
    double eps; /* default 1e-6; norm: FLT_TRUE_MIN..FLT_MAX (used as fp32) */
    int rope;   /* 1: rotate-half RoPE on Q and K */
    fxa_proj_layout out_layout;
    /* FXA_F32 (default): q_out, k_out, v_out are float. FXA_BF16: they are
     * uint16_t bfloat16 bits, each the fp32 value above rounded once to
     * nearest even (fxa_f32_to_bf16 of what FXA_F32 writes). */
    fxa_dtype out_dtype;
} fxa_proj_desc;

/* Defaults: f32 operands and outputs, no norm (eps 1e-6), no RoPE,
 * token-major. */
FXA_API void fxa_proj_desc_init(fxa_proj_desc *d);

/* The buffers of one run (struct_size: sizeof(fxa_proj_args)). */
typedef struct fxa_proj_args {
    size_t struct_size; /* sizeof(fxa_proj_args) */
    const void *x;
    const void *w;
    const float *w_scales; /* [out], FP8 weights only */
    const float *bias;     /* [out] or NULL */
    const float *gamma_q;  /* [Hq d] (norm) */
    const float *gamma_k;  /* [Hkv d] (norm, heads_kv > 0) */
    const float *rope_cos; /* [tokens][d] (rope) */
    const float *rope_sin;
    void *q_out; /* out_dtype, out_layout */
    void *k_out; /* heads_kv > 0 */
    void *v_out;
} fxa_proj_args;

/* The first sizes each struct_size may take (fxattn.h's policy: any size
 * from these to the current sizeof; fields past it keep their defaults).
 * fxa_proj_desc 0.1: before out_dtype; fxa_proj_args: its form since 0.3,
 * when the workspace moved to fxa_proj_run. */
#define FXA_PROJ_DESC_SIZE_0_1 offsetof(fxa_proj_desc, out_dtype)
#define FXA_PROJ_ARGS_SIZE_0_3 sizeof(fxa_proj_args)

typedef struct fxa_proj_plan fxa_proj_plan;

/*
 * Plan the projection d on ctx: validates d (shapes, formats, flags,
 * FXA_PROJ_GEMM as the context read it), chooses the GEMM (oneDNN's bf16
 * or fp32 matmul, OpenBLAS, or the AMX tiles of the `amx` kernel set),
 * creates oneDNN's primitives (their scratchpad is the caller's workspace),
 * and sizes the workspace of fxa_proj_run (*workspace_bytes: decoded
 * operands, the GEMM output of tokens x out floats, the epilogue's sums,
 * oneDNN's scratchpad, the AMX packing). The plan keeps a pointer to ctx:
 * destroy it before the context. Errors (fxa_ctx_last_error(ctx), *plan
 * NULL): FXA_ERR_INVALID_ARG (a NULL pointer, a struct_size outside
 * fxa_proj_desc's sizes, bad shapes or flags, an unknown FXA_PROJ_GEMM),
 * FXA_ERR_UNSUPPORTED (a bf16 GEMM in a process forked after oneDNN ran in
 * its parent), FXA_ERR_NO_MEMORY, FXA_ERR_INTERNAL (oneDNN refused).
 */
FXA_API fxa_status fxa_proj_plan_create(fxa_ctx *ctx, const fxa_proj_desc *d, fxa_proj_plan **plan,
                                        size_t *workspace_bytes);

/*
 * Tensor parallelism: when the ranks of a group hold different heads of the
 * same tokens, each RMS runs over all ranks' channels. A plan made with
 * fxa_proj_plan_create_tp runs the local GEMM and dequantisation, fills
 * sums [tokens][2] (the local sum of y^2 of this rank's Q and K segments,
 * in double, in its workspace) plus one last element (0, or 1 when this
 * rank failed), and calls reduce(sums, 2 tokens + 1, arg) on the calling
 * thread, which must replace every element by its sum over the group
 * (MPI_Allreduce with MPI_SUM: libfxattn_wan_mpi's fxa_mpi_proj_run). The
 * RMS then uses norm_features_q (all ranks' Hq d) and norm_features_k.
 * reduce is called on every rank whatever happened locally (with a short
 * buffer of 3 elements, last one 1, when this rank failed before its GEMM;
 * a group must agree on tokens first), so a failure on one rank fails every
 * rank instead of hanging it. An output that overflows after the norm and
 * RoPE is found after the reduction, on the ranks holding it alone:
 * drivers agree on the status afterwards (fxa_mpi_proj_run does).
 */
typedef fxa_status fxa_proj_reduce_fn(double *sums, int64_t n, void *arg);

typedef struct fxa_proj_tp {
    size_t struct_size; /* sizeof(fxa_proj_tp) */
    int64_t norm_features_q;
    int64_t norm_features_k;
    fxa_proj_reduce_fn *reduce;
    void *arg; /* passed to reduce on every run of the plan */
} fxa_proj_tp;

#define FXA_PROJ_TP_SIZE_0_1 sizeof(fxa_proj_tp)

/* fxa_proj_plan_create with the tensor-parallel settings tp (copied into
 * the plan; NULL reduce, norm_features_q < 1 or norm_features_k < 0:
 * FXA_ERR_INVALID_ARG). */
FXA_API fxa_status fxa_proj_plan_create_tp(fxa_ctx *ctx, const fxa_proj_desc *d,
                                           const fxa_proj_tp *tp, fxa_proj_plan **plan,
                                           size_t *workspace_bytes);

/*
 * Run the plan on ctx's threads (the GEMM on as many OpenBLAS or OpenMP
 * threads: OpenBLAS's process-wide count is set and restored under a lock,
 * OpenMP's is the calling thread's) with workspace (the plan's bytes,
 * 64-byte aligned, required). Allocates nothing. Errors (fxa_ctx_last_error
 * of the plan's context, outputs untouched): FXA_ERR_INVALID_ARG for NULL
 * buffers, a struct_size outside fxa_proj_args' sizes, a non-finite value
 * in x, w, bias, gamma or the RoPE tables, a bad scale, a result that
 * overflows fp32 (or, for a bf16 output, bf16), outputs that overlap each
 * other or the workspace; FXA_ERR_UNSUPPORTED: a oneDNN plan run in a
 * process forked after oneDNN ran in its parent (fp32 GEMMs fall back to
 * OpenBLAS there); FXA_ERR_INTERNAL: oneDNN failed. The run only reads
 * the plan.
 */
FXA_API fxa_status fxa_proj_run(const fxa_proj_plan *plan, const fxa_proj_args *args,
                                void *workspace);

/* The GEMM a projection ran on (fxa_proj_stats.gemm). */
typedef enum fxa_proj_gemm {
    FXA_PROJ_GEMM_OPENBLAS = 0,    /* OpenBLAS sgemm: fp32 products */
    FXA_PROJ_GEMM_ONEDNN_F32 = 1,  /* oneDNN's fp32 matmul */
    FXA_PROJ_GEMM_ONEDNN_BF16 = 2, /* oneDNN's bf16 matmul */
    FXA_PROJ_GEMM_AMX = 3          /* the `amx` kernel set's bf16 tiles (oneDNN's bf16
                                      matmul for any block they do not take) */
} fxa_proj_gemm;

/* What one run did. Added in 0.3. */
typedef struct fxa_proj_stats {
    size_t struct_size;      /* set by the caller (sizeof); written within it only */
    fxa_proj_gemm gemm;      /* the GEMM that ran */
    fxa_compute compute;     /* its products: FXA_COMPUTE_FP32 or FXA_COMPUTE_BF16 */
    double flops;            /* the GEMM's: 2 tokens in_features out_features */
    double seconds;          /* wall time of the run */
    double gemm_seconds;     /* staging the operands and the GEMM */
    double epilogue_seconds; /* scales, bias, RMSNorm (and its reduction), RoPE, store */
} fxa_proj_stats;

#define FXA_PROJ_STATS_SIZE_0_3 sizeof(fxa_proj_stats)

/* "openblas", "onednn_f32", "onednn_bf16" or "amx"; "" for a value outside
 * fxa_proj_gemm. Added in 0.3. */
FXA_API const char *fxa_proj_gemm_name(fxa_proj_gemm gemm);

/* fxa_proj_run, and what it did in *stats (NULL: none; else its
 * struct_size is checked first, FXA_ERR_INVALID_ARG and nothing run when
 * it is out of range; written only when the run succeeds). Added in 0.3. */
FXA_API fxa_status fxa_proj_run_stats(const fxa_proj_plan *plan, const fxa_proj_args *args,
                                      void *workspace, fxa_proj_stats *stats);

/* NULL is a no-op. */
FXA_API void fxa_proj_plan_destroy(fxa_proj_plan *plan);

/*
 * Wan2.2's 3-D RoPE as rotate-half tables for a (frames, height, width)
 * latent grid: tokens in (f, h, w) raster order, cos/sin [tokens][head_dim].
 * The head_dim / 2 pairs split into bands [t | h | w] (fxa_wan_rope_bands:
 * 22/21/21 for head_dim 128, i.e. 44/42/42 lanes); pair j of a band of n
 * pairs at position p turns by p * theta^(-j/n) (theta 1e4 in Wan), in
 * double, rounded once; pair p drives lanes p and p + head_dim/2.
 */
FXA_API void fxa_wan_rope_bands(int64_t head_dim, int64_t *t_pairs, int64_t *h_pairs,
                                int64_t *w_pairs);
FXA_API fxa_status fxa_wan_rope_tables(int64_t frames, int64_t height, int64_t width,
                                       int64_t head_dim, double theta, float *cos_out,
                                       float *sin_out);

/*
 * Load a checkpoint trained with interleaved RoPE pairs (2j, 2j+1) as it is:
 * permute, per head, the Q and K output channels of w (rows of [out][in],
 * in d's w_format), w_scales, bias, gamma_q and gamma_k so that lane i of
 * rotate-half holds interleaved lane 2i (i < d/2) or 2(i - d/2) + 1. V rows
 * are never touched; NULL arrays are skipped. Q.K^T is unchanged (the same
 * permutation on both). With heads_kv == 0 only the single segment moves.
 * FXA_ERR_INVALID_ARG, nothing moved: a struct_size outside fxa_proj_desc's
 * sizes, an odd head_dim or one past FXA_MAX_HEAD_DIM, negative heads, an unknown w_format, or a w too large to
 * address.
 */
FXA_API fxa_status fxa_rope_interleaved_to_half(const fxa_proj_desc *d, void *w, float *w_scales,
                                                float *bias, float *gamma_q, float *gamma_k);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_PROJ_H */
