/* Attention plans: validate a descriptor once and size the workspace. */
#include <math.h>
#include <stdlib.h>

#include "../base/alloc.h"
#include "../base/struct_size.h"
#include "attn_internal.h"
#include "dropout.h"
#include "f64.h"
#include "scan.h"
#include "summary.h"

#define DEFAULT_BLOCK_Q 256 /* K/V stream once per 256 query rows: measured best at S = 4k-8k */
#define MAX_BLOCK_Q 4096

void fxa_attn_desc_init(fxa_attn_desc *d)
{
    if (!d)
        return;
    *d = (fxa_attn_desc){0};
    d->struct_size = sizeof *d;
    d->out_dtype = FXA_F32; /* strides all 0: the layout's */
    d->layout = FXA_LAYOUT_BSHD;
    d->dtype = FXA_F32;
    d->scale = 0.0;
    d->mode = FXA_MODE_AUTO;
    d->compute = FXA_COMPUTE_FP32;
    d->center = 1;
    d->heads_per_tile = 1;
}

double fxa_attn_flops(const fxa_attn_desc *d)
{
    if (!d)
        return 0.0;
    return 4.0 * (double)d->batch * (double)d->heads_q * (double)d->seq_q * (double)d->seq_kv *
           (double)d->head_dim;
}

/* a * b, or -1 (a stride every plan refuses) when it overflows int64. */
static int64_t stride_mul(int64_t a, int64_t b)
{
    int64_t r;
    return __builtin_mul_overflow(a, b, &r) ? -1 : r;
}

fxa_attn_strides fxa_attn_layout_strides(fxa_layout layout, int64_t heads, int64_t seq,
                                         int64_t head_dim)
{
    fxa_attn_strides s;
    if (layout == FXA_LAYOUT_BSHD) {
        s.token = stride_mul(heads, head_dim);
        s.head = head_dim;
        s.batch = s.token < 0 ? -1 : stride_mul(seq, s.token);
    } else {
        s.token = head_dim;
        s.head = stride_mul(seq, head_dim);
        s.batch = s.head < 0 ? -1 : stride_mul(heads, s.head);
    }
    return s;
}

static int strides_unset(const fxa_attn_strides *s)
{
    return s->batch == 0 && s->token == 0 && s->head == 0;
}

/* The tensor's strides: the descriptor's, or the layout's preset. */
static fxa_strides strides_of(const fxa_attn_desc *d, const fxa_attn_strides *set, int64_t heads,
                              int64_t seq)
{
    return strides_unset(set) ? fxa_attn_layout_strides(d->layout, heads, seq, d->head_dim) : *set;
}

/* Elements from the pointer to one past the last element of a tensor
 * [B, heads, seq, D] with strides s (non-negative), or -1 when that
 * overflows int64 or bytes (elem bytes each) overflow size_t. */
static int64_t strided_extent(const fxa_strides *s, int64_t batch, int64_t heads, int64_t seq,
                              int64_t dim, size_t elem)
{
    const int64_t n[3] = {batch, heads, seq};
    const int64_t st[3] = {s->batch, s->head, s->token};
    const int64_t lim =
        (int64_t)((SIZE_MAX < (size_t)INT64_MAX ? SIZE_MAX : (size_t)INT64_MAX) / elem);
    int64_t ext = dim;
    for (int i = 0; i < 3; i++) {
        if (n[i] > 1 && st[i] > (lim - ext) / (n[i] - 1))
            return -1;
        ext += (n[i] - 1) * st[i];
    }
    return ext;
}

/* 1 when no two elements of [B, heads, seq, D] with strides s share an
 * address: sorted by stride, each axis longer than 1 starts past the
 * extent of the smaller ones (a sufficient test; extents are checked not
 * to overflow first). */
int fxa_strides_nested(const fxa_strides *s, int64_t batch, int64_t heads, int64_t seq, int64_t dim)
{
    int64_t n[3] = {batch, heads, seq};
    int64_t st[3] = {s->batch, s->head, s->token};
    for (int i = 0; i < 3; i++) { /* insertion sort by stride */
        for (int j = i; j > 0 && st[j] < st[j - 1]; j--) {
            const int64_t ts = st[j], tn = n[j];
            st[j] = st[j - 1];
            n[j] = n[j - 1];
            st[j - 1] = ts;
            n[j - 1] = tn;
        }
    }
    int64_t ext = dim;
    for (int i = 0; i < 3; i++) {
        if (n[i] <= 1)
            continue;
        if (st[i] < ext)
            return 0;
        ext += (n[i] - 1) * st[i];
    }
    return 1;
}

int64_t fxa_mask_extent(const fxa_attn_desc *d)
{
    const int64_t n[4] = {d->batch, d->heads_q, d->seq_q, d->seq_kv};
    const int64_t st[4] = {d->mask_strides.batch, d->mask_strides.head, d->mask_strides.query,
                           d->mask_strides.key};
    const int64_t lim =
        (int64_t)((SIZE_MAX < (size_t)INT64_MAX ? SIZE_MAX : (size_t)INT64_MAX) / sizeof(float));
    int64_t ext = 1;
    for (int i = 0; i < 4; i++) {
        if (n[i] > 1 && st[i] > (lim - ext) / (n[i] - 1))
            return -1;
        ext += (n[i] - 1) * st[i];
    }
    return ext;
}

static size_t dtype_bytes(fxa_dtype t)
{
    return t == FXA_F64 ? 8 : t == FXA_F32 ? 4 : 2;
}

/* a * b * c <= limit without overflow (all >= 1). */
static int product_fits(int64_t a, int64_t b, int64_t c, int64_t limit)
{
    if (a > limit / b)
        return 0;
    return a * b <= limit / c;
}

static fxa_status check_desc(fxa_ctx *ctx, const fxa_attn_desc *d)
{
    /* Tensors must be addressable in bytes: elements * 4 fit in int64 and size_t. */
    const int64_t limit = (int64_t)((SIZE_MAX < (size_t)INT64_MAX ? SIZE_MAX : (size_t)INT64_MAX) /
                                    (4 * (size_t)FXA_MAX_HEAD_DIM));
    if (d->batch < 1 || d->heads_q < 1 || d->heads_kv < 1 || d->seq_q < 1 || d->seq_kv < 1)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "shape must be positive: batch %lld, heads %lld/%lld, seq %lld/%lld",
                            (long long)d->batch, (long long)d->heads_q, (long long)d->heads_kv,
                            (long long)d->seq_q, (long long)d->seq_kv);
    if (d->heads_q % d->heads_kv != 0)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "query heads (%lld) must be a multiple of key/value heads (%lld)",
                            (long long)d->heads_q, (long long)d->heads_kv);
    if (d->head_dim < 1 || d->head_dim > FXA_MAX_HEAD_DIM)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "head_dim %lld is outside 1..%d",
                            (long long)d->head_dim, FXA_MAX_HEAD_DIM);
    if (!product_fits(d->batch, d->heads_q, d->seq_q, limit) ||
        !product_fits(d->batch, d->heads_kv, d->seq_kv, limit))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "tensor sizes overflow");
    if (d->layout != FXA_LAYOUT_BSHD && d->layout != FXA_LAYOUT_BHSD)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "unknown layout %d", (int)d->layout);
    if (d->dtype != FXA_F32 && d->dtype != FXA_BF16 && d->dtype != FXA_F16 && d->dtype != FXA_F64)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "unknown dtype %d", (int)d->dtype);
    if (d->mode != FXA_MODE_AUTO && d->mode != FXA_MODE_ONLINE)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "unknown mode %d", (int)d->mode);
    if (d->compute != FXA_COMPUTE_FP32 && d->compute != FXA_COMPUTE_BF16 &&
        d->compute != FXA_COMPUTE_AUTO && d->compute != FXA_COMPUTE_FP64)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "unknown compute mode %d", (int)d->compute);
    if (d->dtype == FXA_F64 && d->compute != FXA_COMPUTE_FP64 && d->compute != FXA_COMPUTE_AUTO)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "f64 inputs compute in fp64: compute must be FXA_COMPUTE_FP64 or "
                            "FXA_COMPUTE_AUTO");
    if (d->dtype != FXA_F64 && d->compute == FXA_COMPUTE_FP64)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "fp64 compute needs f64 inputs (dtype is not FXA_F64)");
    if (d->compute == FXA_COMPUTE_BF16 && d->dtype != FXA_BF16)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "bf16 compute needs bf16 inputs (dtype is not FXA_BF16)");
    if (d->center != 0 && d->center != 1)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "center must be 0 or 1, not %d", d->center);
    if (!isfinite(d->scale))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "scale must be finite (0 selects 1/sqrt(D))");
    if (d->heads_per_tile < 0 || (d->heads_per_tile > 0 && d->heads_q % d->heads_per_tile != 0))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "heads_per_tile %d must divide the query heads (%lld)",
                            d->heads_per_tile, (long long)d->heads_q);
    if (d->block_q < 0 || d->block_q > MAX_BLOCK_Q)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "block_q %d is outside 0..%d", d->block_q,
                            MAX_BLOCK_Q);
    if (d->out_dtype != FXA_F32 && d->out_dtype != FXA_BF16 && d->out_dtype != FXA_F64)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "out_dtype %d is not FXA_F32, FXA_BF16 or FXA_F64", (int)d->out_dtype);
    if ((d->dtype == FXA_F64) != (d->out_dtype == FXA_F64))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            d->dtype == FXA_F64
                                ? "f64 inputs give an f64 output: out_dtype must be FXA_F64"
                                : "an FXA_F64 output needs f64 inputs (dtype FXA_F64)");
    if (d->causal < FXA_CAUSAL_NONE || d->causal > FXA_CAUSAL_LOWER_RIGHT)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "causal must be 0, FXA_CAUSAL_UPPER_LEFT (1) or "
                            "FXA_CAUSAL_LOWER_RIGHT (2), not %d",
                            d->causal);
    if (d->mask_kind != FXA_MASK_NONE && d->mask_kind != FXA_MASK_BOOL &&
        d->mask_kind != FXA_MASK_ADD && d->mask_kind != FXA_MASK_ADD_F64)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "mask_kind %d is not FXA_MASK_NONE, FXA_MASK_BOOL, FXA_MASK_ADD or "
                            "FXA_MASK_ADD_F64",
                            (int)d->mask_kind);
    if (d->mask_kind == FXA_MASK_ADD_F64 && d->dtype != FXA_F64)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "an FXA_MASK_ADD_F64 mask needs f64 inputs (FXA_MASK_ADD is the "
                            "float mask of the others)");
    if (!(d->dropout_p >= 0.0 && d->dropout_p < 1.0))
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "dropout_p %g is outside [0, 1) (0: no dropout)", d->dropout_p);
    if (d->dropout_p > 0.0 && d->dtype == FXA_F64)
        return fxa_ctx_fail(ctx, FXA_ERR_UNSUPPORTED,
                            "dropout is for fp32 and bf16 compute; an fp64 plan takes none");
    if (d->reproducible != 0 && d->reproducible != 1)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "reproducible must be 0 or 1, not %d",
                            d->reproducible);
    if (d->causal && d->mask_kind != FXA_MASK_NONE)
        return fxa_ctx_fail(
            ctx, FXA_ERR_INVALID_ARG,
            "causal and a mask together: pass one (as scaled_dot_product_attention "
            "refuses attn_mask with is_causal; fold the causal part into the mask)");
    if (d->mask_kind != FXA_MASK_NONE) {
        const fxa_mask_strides *m = &d->mask_strides;
        if (m->batch < 0 || m->head < 0 || m->query < 0 || m->key < 0)
            return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                                "mask_strides {batch %lld, head %lld, query %lld, key %lld} must "
                                "not be negative (0 broadcasts an axis)",
                                (long long)m->batch, (long long)m->head, (long long)m->query,
                                (long long)m->key);
        if (fxa_mask_extent(d) < 0)
            return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                                "mask_strides reach past the addressable range");
    }
    const struct {
        const char *name;
        const fxa_attn_strides *s;
        int64_t heads, seq;
    } t[4] = {{"q", &d->q_strides, d->heads_q, d->seq_q},
              {"k", &d->k_strides, d->heads_kv, d->seq_kv},
              {"v", &d->v_strides, d->heads_kv, d->seq_kv},
              {"o", &d->o_strides, d->heads_q, d->seq_q}};
    for (int i = 0; i < 4; i++) {
        const fxa_strides s = strides_of(d, t[i].s, t[i].heads, t[i].seq);
        if (s.batch < 0 || s.token < 0 || s.head < 0)
            return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                                "%s_strides {batch %lld, token %lld, head %lld} must not be "
                                "negative",
                                t[i].name, (long long)s.batch, (long long)s.token,
                                (long long)s.head);
        const size_t elem = i == 3 ? dtype_bytes(d->out_dtype) : dtype_bytes(d->dtype);
        if (strided_extent(&s, d->batch, t[i].heads, t[i].seq, d->head_dim, elem) < 0)
            return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                                "%s_strides reach past the addressable range", t[i].name);
        if (i == 3 && !fxa_strides_nested(&s, d->batch, t[i].heads, t[i].seq, d->head_dim))
            return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                                "o_strides {batch %lld, token %lld, head %lld} make distinct "
                                "output elements alias (each stride of an axis longer than 1 "
                                "must be at least the extent of the smaller ones, D = %lld)",
                                (long long)s.batch, (long long)s.token, (long long)s.head,
                                (long long)d->head_dim);
    }
    return FXA_OK;
}

static int64_t gcd(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* Packed K and V of one chunk stay within this many bytes (unless a single
 * chunk unit needs more): extra memory stays O(S D), and chunks of several
 * heads give the threads enough work items when sequences are short. */
#define PACK_BUDGET_BYTES ((size_t)32 << 20)

/* kv heads per chunk: a multiple of the smallest unit whose query heads form
 * whole head tiles, dividing Hkv, as large as the packing budget allows.
 * Chunking never changes results: every row is computed the same way. */
static int64_t chunk_kv_heads(const fxa_attn_plan *p)
{
    const int64_t unit = p->d.heads_per_tile / gcd(p->d.heads_per_tile, p->group);
    const int64_t units = p->d.heads_kv / unit;
    const size_t unit_bytes = (size_t)unit * 2 * p->packed_head_floats * sizeof(float);
    int64_t fit = (int64_t)(PACK_BUDGET_BYTES / unit_bytes);
    if (fit < 1)
        fit = 1;
    int64_t best = 1;
    for (int64_t k = 1; k <= units && k <= fit; k++) {
        if (units % k == 0)
            best = k;
    }
    return unit * best;
}

/* Split the keys when a head has fewer than SPLIT_ROWS query rows (decode
 * and other short queries), into at most MAX_SPLITS ranges of whole tiles.
 * A split costs a merge and a second row setup, so longer queries keep
 * their keys whole (S = 1024, 40 heads: 7-9% faster unsplit than split in
 * two, on 1 or 2 threads).
 * Chosen from (Sq, Skv) alone: however the heads are arranged (heads per
 * tile, chunks, Ulysses head sharding across ranks), every row sums its keys
 * in the same order, so results stay bit-identical. */
#define SPLIT_ROWS 512
#define MAX_SPLITS 16

static void choose_split(fxa_attn_plan *p)
{
    if (fxa_attn_dropout(p) || p->d.reproducible) {
        /* dropout: two row states; reproducible: a key split would add its
         * partial sums in an order of its own. Short queries keep their keys
         * whole. */
        p->split_tiles = p->n_kv_tiles;
        p->n_splits = 1;
        return;
    }
    const int64_t rows = p->d.seq_q;
    int64_t want = (SPLIT_ROWS + rows - 1) / rows;
    want = want < MAX_SPLITS ? want : MAX_SPLITS;
    want = want < p->n_kv_tiles ? want : p->n_kv_tiles;
    p->split_tiles = (p->n_kv_tiles + want - 1) / want;
    p->n_splits = (p->n_kv_tiles + p->split_tiles - 1) / p->split_tiles;
}

/* Lay out the workspace; returns its size in bytes. */
static size_t layout_workspace(fxa_attn_plan *p, int n_threads)
{
    const size_t dim = (size_t)p->d.head_dim;
    const size_t hpt = (size_t)p->d.heads_per_tile;
    const size_t bq = (size_t)p->d.block_q;
    const size_t n_heads_kv = (size_t)(p->d.batch * p->d.heads_kv);
    const size_t scan_kv = fxa_scan_kv_scratch_bytes(p, p->d.seq_kv);
    const size_t scan_q = fxa_scan_q_scratch_bytes(p);
    size_t off = 0;
    p->ws_bounds = off;
    off += fxa_align_up(n_heads_kv * sizeof(fxa_head_bound));
    p->ws_kbar = off;
    off += fxa_align_up(n_heads_kv * dim * sizeof(float));
    p->ws_summary = off;
    off += fxa_align_up(n_heads_kv * fxa_summary_head_len(p) * sizeof(double));
    p->ws_scan = off;
    off += scan_kv > scan_q ? scan_kv : scan_q;
    p->ws_packed_k = off;
    off += fxa_align_up((size_t)p->chunk_kv_heads * p->packed_head_floats * sizeof(float));
    p->ws_packed_v = off;
    off += fxa_align_up((size_t)p->chunk_kv_heads * p->packed_head_floats * sizeof(float));
    p->ws_partials = off;
    if (p->n_splits > 1)
        off += fxa_align_up((size_t)(p->n_splits * p->chunk_kv_heads * p->group * p->d.seq_q) *
                            ((size_t)p->d.head_dim + 2) * sizeof(float));
    p->ws_threads = off;
    off += fxa_align_up((size_t)n_threads * sizeof(fxa_thread_scratch));
    p->ws_scratch = off;
    p->thread_bytes =
        2 * fxa_align_up(hpt * bq * dim * sizeof(float)) +               /* q, o */
        4 * fxa_align_up(hpt * bq * sizeof(float)) +                     /* m, l, center, bound */
        fxa_align_up(hpt * bq) +                                         /* online */
        fxa_align_up(bq * p->kv_tile * sizeof(float)) +                  /* scores */
        fxa_align_up(hpt * bq * (dim + 1) * sizeof(uint16_t)) +          /* q16 */
        fxa_align_up(bq * p->kv_tile * sizeof(uint16_t)) +               /* p16 */
        (fxa_attn_masked(p) ? 2 * fxa_align_up(hpt * bq * sizeof(float)) /* bias_max, bias_off */
                            : 0) +
        (fxa_attn_masked(p) || fxa_attn_dropout(p) ? fxa_align_up(bq * p->kv_tile * sizeof(float))
                                                   : 0) + /* bias */
        (fxa_attn_dropout(p) ? 2 * fxa_align_up(hpt * bq * sizeof(float)) +
                                   fxa_align_up(hpt * bq * dim * sizeof(float))
                             : 0); /* m_kept, l_kept, o_kept */
    off += (size_t)n_threads * p->thread_bytes;
    return off;
}

void fxa_thread_scratch_carve(const fxa_attn_plan *p, unsigned char *ws, int t)
{
    const size_t dim = (size_t)p->d.head_dim;
    const size_t rows = (size_t)p->d.heads_per_tile * (size_t)p->d.block_q;
    fxa_thread_scratch *s = (fxa_thread_scratch *)(ws + p->ws_threads) + t;
    unsigned char *at = ws + p->ws_scratch + (size_t)t * p->thread_bytes;
    s->q = (float *)at;
    at += fxa_align_up(rows * dim * sizeof(float));
    s->o = (float *)at;
    at += fxa_align_up(rows * dim * sizeof(float));
    s->m = (float *)at;
    at += fxa_align_up(rows * sizeof(float));
    s->l = (float *)at;
    at += fxa_align_up(rows * sizeof(float));
    s->qk_center = (float *)at;
    at += fxa_align_up(rows * sizeof(float));
    s->bound = (float *)at;
    at += fxa_align_up(rows * sizeof(float));
    s->online = at;
    at += fxa_align_up(rows);
    s->scores = (float *)at;
    at += fxa_align_up((size_t)p->d.block_q * p->kv_tile * sizeof(float));
    s->q16 = (uint16_t *)at;
    at += fxa_align_up(rows * (dim + 1) * sizeof(uint16_t));
    s->p16 = (uint16_t *)at;
    at += fxa_align_up((size_t)p->d.block_q * p->kv_tile * sizeof(uint16_t));
    s->bias_max = fxa_attn_masked(p) ? (float *)at : NULL;
    at += fxa_attn_masked(p) ? fxa_align_up(rows * sizeof(float)) : 0;
    s->bias_off = fxa_attn_masked(p) ? (float *)at : NULL;
    at += fxa_attn_masked(p) ? fxa_align_up(rows * sizeof(float)) : 0;
    const int biased = fxa_attn_masked(p) || fxa_attn_dropout(p);
    s->bias = biased ? (float *)at : NULL;
    at += biased ? fxa_align_up((size_t)p->d.block_q * p->kv_tile * sizeof(float)) : 0;
    const int drop = fxa_attn_dropout(p);
    s->m_kept = drop ? (float *)at : NULL;
    at += drop ? fxa_align_up(rows * sizeof(float)) : 0;
    s->l_kept = drop ? (float *)at : NULL;
    at += drop ? fxa_align_up(rows * sizeof(float)) : 0;
    s->o_kept = drop ? (float *)at : NULL;
    s->fallback_rows = 0;
    s->max_bound = 0.0;
}

fxa_status fxa_attn_desc_in(fxa_ctx *ctx, const fxa_attn_desc *d, fxa_attn_desc *full)
{
    fxa_attn_desc_init(full);
    return fxa_struct_in(full, sizeof *full, d, FXA_ATTN_DESC_SIZE_0_1, "fxa_attn_desc",
                         ctx->last_error, sizeof ctx->last_error);
}

fxa_status fxa_args_in(fxa_ctx *ctx, void *full, size_t cur_size, const void *args, size_t min_size,
                       const char *name)
{
    if (!args)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "%s missing (NULL)", name);
    return fxa_struct_in(full, cur_size, args, min_size, name, ctx->last_error,
                         sizeof ctx->last_error);
}

/* Hand out plan p with a workspace of ws_total bytes, or free it when the
 * memory available cannot hold that. */
static fxa_status plan_finish(fxa_ctx *ctx, fxa_attn_plan *p, size_t ws_total,
                              fxa_attn_plan **plan_out, size_t *workspace_bytes_out)
{
    const uint64_t avail = fxa_available_memory();
    if ((uint64_t)ws_total > avail) {
        fxa_attn_plan_destroy(p);
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY,
                            "needs %.1f GiB, %.1f GiB available (the plan's workspace)",
                            (double)ws_total / 1073741824.0, (double)avail / 1073741824.0);
    }
    p->ws_total = ws_total;
    *plan_out = p;
    *workspace_bytes_out = ws_total;
    return FXA_OK;
}

static fxa_status plan_create(fxa_ctx *ctx, const fxa_attn_desc *d, fxa_attn_plan **plan_out,
                              size_t *workspace_bytes_out)
{
    if (!d || !plan_out || !workspace_bytes_out)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG, "NULL argument to fxa_attn_plan_create");
    fxa_attn_desc full;
    fxa_status st = fxa_attn_desc_in(ctx, d, &full);
    if (st == FXA_OK)
        st = check_desc(ctx, &full);
    if (st == FXA_OK)
        st = fxa_compute_resolve(ctx, &full);
    if (st != FXA_OK)
        return st;
    d = &full;
    fxa_attn_plan *p = fxa_calloc_aligned(sizeof *p);
    if (!p)
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory for the plan");
    p->ctx = ctx;
    p->d = *d;
    p->d.struct_size = sizeof p->d;
    if (p->d.scale == 0.0)
        p->d.scale = 1.0 / sqrt((double)d->head_dim);
    if (p->d.heads_per_tile == 0)
        p->d.heads_per_tile = 1;
    if (p->d.block_q == 0)
        p->d.block_q = DEFAULT_BLOCK_Q;
    if (p->d.block_q > p->d.seq_q)
        p->d.block_q = (int)p->d.seq_q;
    p->lambda = p->d.scale * 1.4426950408889634; /* log2(e) */
    p->group = d->heads_q / d->heads_kv;
    p->q_strides = strides_of(d, &d->q_strides, d->heads_q, d->seq_q);
    p->k_strides = strides_of(d, &d->k_strides, d->heads_kv, d->seq_kv);
    p->v_strides = strides_of(d, &d->v_strides, d->heads_kv, d->seq_kv);
    p->o_strides = strides_of(d, &d->o_strides, d->heads_q, d->seq_q);
    p->k_set = !strides_unset(&d->k_strides);
    p->v_set = !strides_unset(&d->v_strides);
    p->in_elem = dtype_bytes(d->dtype);
    p->out_elem = dtype_bytes(d->out_dtype);
    p->q_extent =
        strided_extent(&p->q_strides, d->batch, d->heads_q, d->seq_q, d->head_dim, p->in_elem);
    p->kv_extent[0] =
        strided_extent(&p->k_strides, d->batch, d->heads_kv, d->seq_kv, d->head_dim, p->in_elem);
    p->kv_extent[1] =
        strided_extent(&p->v_strides, d->batch, d->heads_kv, d->seq_kv, d->head_dim, p->in_elem);
    p->o_extent =
        strided_extent(&p->o_strides, d->batch, d->heads_q, d->seq_q, d->head_dim, p->out_elem);
    p->mask_bytes = d->mask_kind == FXA_MASK_NONE
                        ? 0
                        : (size_t)fxa_mask_extent(d) * (d->mask_kind == FXA_MASK_ADD_F64 ? 8
                                                        : d->mask_kind == FXA_MASK_ADD   ? 4
                                                                                         : 1);
    if (d->dtype == FXA_F64)
        return plan_finish(ctx, p, fxa_f64_workspace(p, ctx->pool.n_threads), plan_out,
                           workspace_bytes_out);
    /* Tiles stay a multiple of the kernels' K^T panel (itself a multiple
     * of 16 keys, the scores' row stride). */
    p->kt_panel = ctx->kernels->kt_panel;
    p->kv_tile = ctx->kernels->kv_tile;
    const size_t fit = ((size_t)d->seq_kv + p->kt_panel - 1) / p->kt_panel * p->kt_panel;
    if (fit < p->kv_tile)
        p->kv_tile = fit;
    p->n_kv_tiles = (d->seq_kv + (int64_t)p->kv_tile - 1) / (int64_t)p->kv_tile;
    p->n_q_blocks = (d->seq_q + p->d.block_q - 1) / p->d.block_q;
    p->n_head_tiles = d->heads_q / p->d.heads_per_tile;
    /* fp32 compute: V rows whose stride would be a multiple of 512 bytes
     * get one cache line of pad, so that the rows a P.V pass reads (64
     * columns of 128 keys) spread over every L1 set instead of crowding half
     * of them past their ways (S 4096, 40 heads: 4-6% faster on Intel Xeon;
     * the bf16 tiles measured no change, so bf16 pair rows stay dense). */
    p->packed_ld = (size_t)d->head_dim;
    if (d->compute == FXA_COMPUTE_FP32 && d->head_dim % 128 == 0)
        p->packed_ld += 16;
    p->packed_head_floats = (size_t)p->n_kv_tiles * p->kv_tile * p->packed_ld;
    p->chunk_kv_heads = chunk_kv_heads(p);
    choose_split(p);
    p->kv_scratch = fxa_malloc_aligned(fxa_scan_kv_scratch_bytes(p, d->seq_kv));
    if (!p->kv_scratch) {
        fxa_free_aligned(p);
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory for the plan");
    }
    return plan_finish(ctx, p, layout_workspace(p, ctx->pool.n_threads), plan_out,
                       workspace_bytes_out);
}

fxa_status fxa_attn_plan_create(fxa_ctx *ctx, const fxa_attn_desc *d, fxa_attn_plan **plan_out,
                                size_t *workspace_bytes_out)
{
    if (plan_out)
        *plan_out = NULL;
    const fxa_status st = fxa_ctx_enter(ctx);
    return st != FXA_OK ? st
                        : fxa_ctx_end_with(ctx, plan_create(ctx, d, plan_out, workspace_bytes_out));
}

void fxa_attn_plan_set_progress(fxa_attn_plan *plan, void (*fn)(void *arg), void *arg)
{
    if (!plan)
        return;
    plan->progress = fn;
    plan->progress_arg = arg;
}

void fxa_attn_plan_destroy(fxa_attn_plan *plan)
{
    if (!plan)
        return;
    fxa_free_aligned(plan->kv_scratch);
    fxa_free_aligned(plan);
}
