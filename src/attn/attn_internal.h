/* The attention plan behind the opaque fxa_attn_plan handle, and the layout
 * of its workspace. */
#ifndef FXA_ATTN_INTERNAL_H
#define FXA_ATTN_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "../core/ctx_internal.h"
#include "../kernels/kernels.h"
#include "fxattn.h"

/* Where row (b, h, s) of a [B, H, S, D]-shaped tensor starts, in elements:
 * off = b*batch + h*head + s*token (the public fxa_attn_strides). */
typedef fxa_attn_strides fxa_strides;

/* Per (batch, kv head): the quantities the bound needs. */
typedef struct fxa_head_bound {
    double kmax;       /* max_j ||k_j|| (raw keys) */
    double radius;     /* max_j ||k_j - kbar|| with centring, else kmax */
    double eps_radius; /* (D + 2) 2^-23 kmax: covers fp32 rounding of the scores */
    double vmax;       /* max |v| */
    int c;             /* C(N) with this head's Vmax */
    int gate_strict;
    int gate_centered; /* used only for centred rows */
    /* Prescaling (fxa_head_prescale, steps.c): K is packed as k 2^-kshift
     * and the tiles take lambda_k = lambda 2^kshift, so that the scores
     * lambda q.k are formed without an fp32 overflow even where q.k alone
     * would overflow. kshift is 0 (and lambda_k = (float)lambda, eps_abs = 0)
     * for every ordinary input. */
    double qmax;    /* max_i ||q_i|| over the query rows of this kv head */
    double eps_abs; /* base-2 score allowance for products the shift makes subnormal */
    float lambda_k;
    int kshift;
} fxa_head_bound;

/* Largest base-2 score bound the tiles may form: FLT_MAX (1 - 2^-8), a
 * margin far above the rounding of lambda and of the final product that the
 * bound does not count. A head whose scores could exceed it is refused (or,
 * when its centred scores fit, its online rows use them). */
#define FXA_SCORE_LIMIT 0x1.fep127

/* Query rows per norm2_dot call (the kernels take any count and overlap a
 * few rows' sums). */
#define FXA_STATS_ROWS 16

/* Per-thread scratch, carved from the workspace. */
typedef struct fxa_thread_scratch {
    float *q;         /* [hpt][block_q][D] */
    float *o;         /* [hpt][block_q][D] */
    float *m;         /* [hpt][block_q] */
    float *l;         /* [hpt][block_q] */
    float *qk_center; /* [hpt][block_q] */
    float *bound;     /* [hpt][block_q]: ceil(U_i) */
    uint8_t *online;  /* [hpt][block_q] */
    float *scores;    /* [block_q][kv_tile] */
    uint16_t *q16;    /* [hpt][block_q][2 d_pairs]: bf16 compute only */
    uint16_t *p16;    /* [block_q][kv_tile]: bf16 compute only */
    /* Masks and causal only (NULL otherwise): */
    float *bias_max; /* [hpt][block_q]: each row's largest finite bias, base 2 */
    float *bias_off; /* [hpt][block_q]: each row's bias offset (mask.h) */
    float *bias;     /* [block_q][kv_tile]: one tile's bias (fxa_attn_tile.bias; also dropout) */
    /* Dropout only (NULL otherwise): the rows' state over the kept weights. */
    float *m_kept; /* [hpt][block_q] */
    float *l_kept; /* [hpt][block_q] */
    float *o_kept; /* [hpt][block_q][D] */
    int64_t fallback_rows;
    double max_bound;
} fxa_thread_scratch;

struct fxa_attn_plan {
    fxa_ctx *ctx;
    fxa_attn_desc d; /* normalised: scale, heads_per_tile and block_q set */
    double lambda;   /* scale * log2(e) */
    int64_t group;   /* Hq / Hkv */
    /* Element strides, the layout's preset where the descriptor left them
     * 0; k_set / v_set: the descriptor set them (blockwise blocks then use
     * them as they are, else the layout's for the block's length). */
    fxa_strides q_strides;
    fxa_strides k_strides;
    fxa_strides v_strides;
    fxa_strides o_strides;
    int k_set;
    int v_set;
    /* Elements from each tensor's pointer to one past its last element. */
    int64_t q_extent;
    int64_t kv_extent[2]; /* K, V (whole seq_kv) */
    int64_t o_extent;
    size_t mask_bytes; /* the mask's span (0 without one) */
    size_t in_elem;    /* bytes per element of Q, K, V */
    size_t out_elem;   /* bytes per element of O */
    size_t kv_tile;
    size_t kt_panel; /* keys per K^T panel (the kernels'; divides kv_tile) */
    int64_t n_kv_tiles;
    int64_t n_q_blocks;
    int64_t n_head_tiles;
    /* K and V are packed once per chunk of kv heads: the fewest whole kv
     * heads whose query heads form whole head tiles. */
    int64_t chunk_kv_heads;
    /* Key-dimension split for problems with few query rows: each row's kv
     * tiles run as n_splits ranges of split_tiles tiles (as separate work
     * items), merged in split order. Chosen from the shape alone, never
     * from the thread count, so results stay bit-identical. */
    int64_t n_splits;
    int64_t split_tiles;
    size_t packed_ld; /* elements per key of a packed V tile: its row stride (bf16: pairs) */
    size_t packed_head_floats; /* K (or V) floats of one packed kv head */
    /* Workspace layout: byte offsets from its start. */
    size_t ws_bounds;  /* fxa_head_bound[B * Hkv] */
    size_t ws_kbar;    /* float[B * Hkv][D] */
    size_t ws_summary; /* double[B * Hkv][summary_head_len] */
    size_t ws_scan;    /* the bound pass's scratch (scan.h) */
    /* Per kv head of the chunk, n_kv_tiles tiles of packed_head_floats /
     * n_kv_tiles floats each: fp32 compute K^T [D][kv_tile] and V
     * [kv_tile][packed_ld]; bf16 compute the pair layouts of fxa_attn_tile_bf16
     * (never larger). */
    size_t ws_packed_k;
    size_t ws_packed_v;
    size_t ws_partials; /* n_splits > 1: per split and chunk row, (m, l, o[D]) */
    size_t ws_threads;  /* fxa_thread_scratch[n_threads] */
    size_t ws_scratch;  /* per-thread buffers, thread_bytes each */
    size_t thread_bytes;
    size_t ws_total;
    void (*progress)(void *arg); /* fxa_attn_plan_set_progress (NULL: none) */
    void *progress_arg;
    /* Owned, allocated with the plan: the bound pass's scratch for a block
     * of up to seq_kv keys (fxa_scan_kv_scratch_bytes), which
     * fxa_kv_summarize and the accumulator's adds use (calls on the
     * plan's context run one at a time). */
    void *kv_scratch;
};

/* The caller's descriptor d as the current fxa_attn_desc (plan.c): the defaults of
 * fxa_attn_desc_init where d is an older, shorter version; a bad struct_size fails on ctx. */
fxa_status fxa_attn_desc_in(fxa_ctx *ctx, const fxa_attn_desc *d, fxa_attn_desc *full);

/* d->compute FXA_COMPUTE_AUTO replaced by the context's choice for d's dtype and head dim
 * (compute_choice.c: measured once per context and head dim); other values are left. */
fxa_status fxa_compute_resolve(fxa_ctx *ctx, fxa_attn_desc *d);

/* A run's versioned argument struct `args` (named `name`; its first version
 * min_size bytes) copied into full (cur_size bytes, zero-initialised by the
 * caller: the defaults), struct_size cur_size: FXA_ERR_INVALID_ARG, explained
 * on ctx, for NULL or a struct_size out of range (plan.c). */
fxa_status fxa_args_in(fxa_ctx *ctx, void *full, size_t cur_size, const void *args, size_t min_size,
                       const char *name);

/* 1 when the plan has a mask or is causal. */
static inline int fxa_attn_masked(const fxa_attn_plan *p)
{
    return p->d.causal || p->d.mask_kind != FXA_MASK_NONE;
}

/* Causal: query i attends keys j <= i + fxa_causal_shift(p) (0 upper-left,
 * Skv - Sq lower-right). */
static inline int64_t fxa_causal_shift(const fxa_attn_plan *p)
{
    return p->d.causal == FXA_CAUSAL_LOWER_RIGHT ? p->d.seq_kv - p->d.seq_q : 0;
}

/* Elements from the mask's pointer to one past its last element
 * (mask_strides over [B, Hq, Sq, Skv]), or -1 past the addressable range. */
int64_t fxa_mask_extent(const fxa_attn_desc *d);

/* 1 when no two elements of [B, heads, seq, D] with strides s share an
 * address (sorted by stride, each axis longer than 1 starts past the extent
 * of the smaller ones; a sufficient test). plan.c. */
int fxa_strides_nested(const fxa_strides *s, int64_t batch, int64_t heads, int64_t seq,
                       int64_t dim);

/* Point thread t's scratch (at ws + p->ws_threads) at its buffers in workspace ws (the plan's
 * per-thread layout, plan.c), its counters zeroed. */
void fxa_thread_scratch_carve(const fxa_attn_plan *p, unsigned char *ws, int t);

#endif
