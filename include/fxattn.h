/*
 * fxattn: exact fixed-max attention for long-sequence transformers.
 *
 * Public API of libfxattn (C11, no intrinsics, no MPI). The numerical
 * contract is docs/numerics.md: every query row gets a shift from a
 * proven Cauchy-Schwarz bound, partial sums combine by plain addition and are
 * normalised once; a row whose bound fails the gate is computed by ordinary
 * online softmax, so the result is always exact (up to fp32 rounding).
 *
 * Conventions
 *  - Fallible calls return fxa_status; outputs come through trailing *_out.
 *  - Handles are opaque; every destroy accepts NULL.
 *  - Callers own all tensors and workspaces; no pointer outlives a call.
 *  - Descriptor structs start with struct_size (set it to sizeof the struct)
 *    so that they can grow without breaking old callers.
 *  - Enums have explicit values and are append-only.
 */
#ifndef FXATTN_H
#define FXATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FXA_API
#else
#define FXA_API __attribute__((visibility("default")))
#endif

#define FXA_VERSION_MAJOR 0
#define FXA_VERSION_MINOR 1
#define FXA_VERSION_PATCH 0

/* Largest supported head dimension. */
#define FXA_MAX_HEAD_DIM 256

typedef enum fxa_status {
    FXA_OK = 0,
    FXA_ERR_INVALID_ARG = 1, /* bad shapes, options or input values */
    FXA_ERR_UNSUPPORTED = 2, /* valid request this build or CPU cannot do */
    FXA_ERR_NO_MEMORY = 3,
    FXA_ERR_MPI = 4,
    FXA_ERR_INTERNAL = 5,
    FXA_ERR_IO = 6, /* used by file helpers of the tools */
    FXA_ERR_TIMEOUT = 7 /* a peer made no progress within the deadline (MPI) */
} fxa_status;

/* Static string naming a status ("invalid argument", ...). Never NULL. */
FXA_API const char *fxa_status_str(fxa_status s);

/* ------------------------------------------------------------------------ */
/* Context                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct fxa_ctx fxa_ctx;

typedef struct fxa_ctx_params {
    size_t struct_size; /* sizeof(fxa_ctx_params) */
    int n_threads;      /* worker threads including the caller; 0 = fxa_available_cpus() */
} fxa_ctx_params;

/* The number of CPUs this process may run on: its affinity mask
 * (sched_getaffinity, so `taskset -c 0` gives 1), capped by the cgroup CPU
 * quota where one is set (cgroup v2 cpu.max or v1 cpu.cfs_quota_us, rounded
 * down), at least 1 and at most 1024. Read afresh on every call. */
FXA_API int fxa_available_cpus(void);

/* Bytes of memory this process may still use: /proc/meminfo's
 * MemAvailable, capped by a cgroup memory limit where one is set (v2
 * memory.max - memory.current, v1 memory.limit_in_bytes -
 * memory.usage_in_bytes, reclaimable inactive file pages counted as free;
 * the tightest from the process's cgroup up). UINT64_MAX when unknown.
 * Plans refuse a workspace larger than this (FXA_ERR_NO_MEMORY). */
FXA_API uint64_t fxa_available_memory(void);

/* Fill *p with defaults (n_threads 0: fxa_available_cpus()). */
FXA_API void fxa_ctx_params_init(fxa_ctx_params *p);

/*
 * Create a context: a fixed-size thread pool and the kernel table chosen for
 * this CPU. The environment variable FXA_ISA (read here, once) forces a
 * kernel set; a set this build or CPU lacks is refused with
 * FXA_ERR_UNSUPPORTED. One caller thread per context at a time.
 * p may be NULL (defaults).
 */
FXA_API fxa_status fxa_ctx_create(const fxa_ctx_params *p, fxa_ctx **ctx_out);
FXA_API void fxa_ctx_destroy(fxa_ctx *ctx);

/* Why the last fxa_ctx_create on the calling thread failed ("" if unknown). */
FXA_API const char *fxa_ctx_create_error(void);

/* Number of threads the context runs (>= 1). */
FXA_API int fxa_ctx_threads(const fxa_ctx *ctx);

/* Name of the kernel set the context uses ("ref", "avx2", "avx512"). */
FXA_API const char *fxa_ctx_isa(const fxa_ctx *ctx);

/* One line saying which tile kernels the context runs. */
FXA_API const char *fxa_ctx_kernel_info(const fxa_ctx *ctx);

/*
 * Detail of the last error returned by a call on this context (plan or run):
 * a sentence such as "Q has a non-finite value at batch 0, token 3, head 1,
 * dim 7". Empty string when there was none. Valid until the next call.
 */
FXA_API const char *fxa_ctx_last_error(const fxa_ctx *ctx);

/* ------------------------------------------------------------------------ */
/* Attention                                                                 */
/* ------------------------------------------------------------------------ */

typedef enum fxa_dtype {
    FXA_F32 = 0,
    FXA_BF16 = 1, /* uint16_t storage, bfloat16 bits */
    FXA_F16 = 2   /* uint16_t storage, IEEE binary16 bits */
} fxa_dtype;

typedef enum fxa_layout {
    FXA_LAYOUT_BSHD = 0, /* Q [B,Sq,Hq,D], K/V [B,Skv,Hkv,D]: token-major */
    FXA_LAYOUT_BHSD = 1  /* Q [B,Hq,Sq,D], K/V [B,Hkv,Skv,D]: head-major  */
} fxa_layout;

typedef enum fxa_mode {
    FXA_MODE_AUTO = 0,  /* fixed-max with per-row fallback to online softmax */
    FXA_MODE_ONLINE = 1 /* classic online softmax for every row */
} fxa_mode;

typedef enum fxa_compute {
    /* All products in fp32 (bf16/f16 inputs are widened exactly): the
     * result is exact to fp32 rounding. */
    FXA_COMPUTE_FP32 = 0,
    /* bf16 inputs only: Q.K^T as bf16 products with fp32 accumulation, and
     * P rounded to bf16 (nearest even) for P.V, on vdpbf16ps where the CPU
     * has AVX512-BF16 (about twice the fp32 speed). The output error grows
     * to at most about 2^-8 max|v| (P's rounding), as in other bf16 kernels. */
    FXA_COMPUTE_BF16 = 1
} fxa_compute;

typedef struct fxa_attn_desc {
    size_t struct_size; /* sizeof(fxa_attn_desc) */
    int64_t batch;
    int64_t heads_q;  /* Hq: a multiple of heads_kv (GQA / MQA) */
    int64_t heads_kv; /* Hkv */
    int64_t seq_q;    /* Sq */
    int64_t seq_kv;   /* Skv */
    int64_t head_dim; /* D, 1..FXA_MAX_HEAD_DIM; V has the same D */
    fxa_layout layout;
    fxa_dtype dtype; /* of Q, K and V; the output is always fp32 */
    double scale;    /* softmax scale tau; 0 means 1/sqrt(D) */
    fxa_mode mode;
    int center; /* virtual key centring: 1 on (default), 0 off */
    fxa_compute compute; /* FXA_COMPUTE_FP32 (default) or FXA_COMPUTE_BF16 */
    /* Scheduling (never changes results, bit for bit): */
    int heads_per_tile; /* q heads per work item, divides Hq; 0 = 1 */
    int block_q;        /* query rows per work item; 0 = default */
} fxa_attn_desc;

/* Fill *d with defaults: BSHD, f32, scale 1/sqrt(D), auto, centring on.
 * Shapes are left 0 and must be set. */
FXA_API void fxa_attn_desc_init(fxa_attn_desc *d);

typedef struct fxa_attn_plan fxa_attn_plan;

/*
 * Validate a descriptor and size the workspace. Errors: FXA_ERR_INVALID_ARG
 * with a message in fxa_ctx_last_error(ctx). The plan keeps a pointer to ctx;
 * destroy the plan before the context.
 */
FXA_API fxa_status fxa_attn_plan_create(fxa_ctx *ctx, const fxa_attn_desc *d,
                                        fxa_attn_plan **plan_out, size_t *workspace_bytes_out);
FXA_API void fxa_attn_plan_destroy(fxa_attn_plan *plan);

/* What one run did. Per-head quantities are summarised over heads. */
typedef struct fxa_attn_stats {
    size_t struct_size;
    int64_t rows;          /* B * Hq * Sq */
    int64_t fallback_rows; /* rows computed by online softmax (all in online mode) */
    int c_min;             /* smallest C(N) over heads (C depends on each head's Vmax) */
    int gate_strict;       /* strict gate floor(W/2) at c_min */
    int gate_centered;     /* the looser gate for centred rows at c_min (0 if centring off) */
    double vmax;           /* largest |v| over all heads */
    double max_bound;      /* largest ceil(U_i) over all rows */
    double seconds;        /* wall time of the run */
} fxa_attn_stats;

/* Tensors of one run. Q, K, V have the descriptor's layout and dtype. */
typedef struct fxa_attn_args {
    size_t struct_size; /* sizeof(fxa_attn_args) */
    const void *q;
    const void *k;
    const void *v;
    float *out; /* Q's shape and layout, fp32; must not alias the inputs */
    float *lse; /* optional [B,Hq,Sq]: natural-log log-sum-exp of tau*q.k */
    /* Optional per-row diagnostics, [B,Hq,Sq] each: */
    uint8_t *row_fallback; /* 1 where the row ran online softmax */
    float *row_bound;      /* ceil(U_i), the bound in base-2 units (auto mode) */
} fxa_attn_args;

/*
 * Compute attention. workspace: at least the bytes the plan reported,
 * 64-byte aligned; may be NULL when that size is 0. Inputs are checked: a
 * non-finite value in Q, K or V gives FXA_ERR_INVALID_ARG before any output
 * is written. Results are bit-identical for any thread count and any
 * heads_per_tile / block_q. stats_out may be NULL.
 * Threads: uses the context's pool; one run per context at a time.
 */
FXA_API fxa_status fxa_attn_run(const fxa_attn_plan *plan, const fxa_attn_args *args,
                                void *workspace, fxa_attn_stats *stats_out);

/*
 * The bound pass alone (what `fxattn check` reports): validates the inputs,
 * then fills args->row_bound / args->row_fallback (either may be NULL) and
 * the stats, without computing attention. args->out and args->lse are
 * ignored. Needs the same workspace as fxa_attn_run.
 */
FXA_API fxa_status fxa_attn_bounds(const fxa_attn_plan *plan, const fxa_attn_args *args,
                                   void *workspace, fxa_attn_stats *stats_out);

/* ------------------------------------------------------------------------ */
/* Blockwise attention: keys and values arrive in blocks                     */
/* ------------------------------------------------------------------------ */

/*
 * For ring attention and other drivers that see the keys in blocks (ranks,
 * ring steps, a streamed KV cache). The query rows stay put; every block
 * adds its fixed-max partial into the rows' accumulators by plain addition
 * (rows that fail the gate continue their online softmax across blocks), and
 * the rows are normalised once at the end. The bound needs global
 * quantities (max key norm, Vmax, key count and mean), so each block is
 * first summarised and the caller brings every block's summary to every
 * holder of query rows (MPI_Allgather in libfxattn_mpi):
 *
 *   1. fxa_kv_summarize(plan, k_b, v_b, n_b, summary_b)   for each block b
 *   2. fxa_attn_acc_begin(acc, q, summaries, n_blocks)
 *   3. fxa_attn_acc_add(acc, k_b, v_b, n_b)               for each block, any order
 *   4. fxa_attn_acc_finish(acc, args, stats)
 *
 * The plan describes the queries (seq_q) and the largest block (seq_kv);
 * a block of n keys has the plan's layout with seq_kv = n. The result equals
 * fxa_attn_run over the concatenated keys up to fp32 summation order (bit
 * for bit with a single block). mode, centring and compute are the plan's;
 * key splitting (n_splits) is not used.
 */
typedef struct fxa_attn_acc fxa_attn_acc;

/* Doubles in one block's summary: B * Hkv * (D + 4). Local. */
FXA_API size_t fxa_kv_summary_len(const fxa_attn_plan *plan);

/* Summarise one block of n_kv keys/values (0 <= n_kv <= seq_kv): per
 * (batch, kv head) the key count, max key norm, radius around the block's
 * key mean, max |v| and key sum. A non-finite K or V gives
 * FXA_ERR_INVALID_ARG. Uses the plan's context pool. */
FXA_API fxa_status fxa_kv_summarize(const fxa_attn_plan *plan, const void *k, const void *v,
                                    int64_t n_kv, double *summary_out);

/* Allocate an accumulator for the plan's query rows (about
 * B * Hq * Sq * (D + 5) * 4 bytes of state plus the plan's workspace). */
FXA_API fxa_status fxa_attn_acc_create(const fxa_attn_plan *plan, fxa_attn_acc **acc_out);
FXA_API void fxa_attn_acc_destroy(fxa_attn_acc *acc);

/* Optional: fn(arg) is called on the calling thread between batches of
 * work inside fxa_attn_acc_add (a few milliseconds apart), so that a caller
 * can drive communication progress (MPI_Test) while blocks compute. */
FXA_API void fxa_attn_acc_set_progress(fxa_attn_acc *acc, void (*fn)(void *arg), void *arg);

/* Start a pass: check Q (finite), merge the n_blocks summaries (block b at
 * summaries + b * fxa_kv_summary_len) into the global bound and decide each
 * row's shift. q must stay valid and unchanged until fxa_attn_acc_finish. */
FXA_API fxa_status fxa_attn_acc_begin(fxa_attn_acc *acc, const void *q, const double *summaries,
                                      int64_t n_blocks);

/* Add one block of n_kv keys/values, which must be one of the summarised
 * blocks (each added once). */
FXA_API fxa_status fxa_attn_acc_add(fxa_attn_acc *acc, const void *k, const void *v,
                                    int64_t n_kv);

/* Normalise once and write args->out (and the optional lse, row_fallback,
 * row_bound; q, k, v are ignored). Fails if the keys added do not add up to
 * the keys summarised. stats_out may be NULL. */
FXA_API fxa_status fxa_attn_acc_finish(fxa_attn_acc *acc, const fxa_attn_args *args,
                                       fxa_attn_stats *stats_out);

/* FLOPs of one run: 4 * B * Hq * Sq * Skv * D. */
FXA_API double fxa_attn_flops(const fxa_attn_desc *d);

/* ------------------------------------------------------------------------ */
/* Fixed-max constants (docs/numerics.md), exposed for tools and tests             */
/* ------------------------------------------------------------------------ */

/* C(N) = 127 - ceil(log2 N) - ceil(log2 max(Vmax,1)). n_keys >= 1. */
FXA_API int fxa_fixed_m_c(int64_t n_keys, double vmax);
/* Strict gate floor(W/2), W = C + 125: sound for any row. */
FXA_API int fxa_fixed_m_gate_strict(int c);
/* Looser gate for rows with virtually centred keys (derivation in bound.c). */
FXA_API int fxa_fixed_m_gate_centered(int c, int64_t n_keys);

/* ------------------------------------------------------------------------ */
/* Conversions (round to nearest even)                                       */
/* ------------------------------------------------------------------------ */

FXA_API float fxa_bf16_to_f32(uint16_t h);
FXA_API float fxa_f16_to_f32(uint16_t h);
FXA_API uint16_t fxa_f32_to_bf16(float x);
FXA_API uint16_t fxa_f32_to_f16(float x);

/* Convert n values; FXA_ERR_INVALID_ARG if a finite input overflows the
 * target type (it would become Inf). NaN and Inf are carried through. */
FXA_API fxa_status fxa_convert_f32(const float *src, fxa_dtype dst_type, void *dst, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_H */
