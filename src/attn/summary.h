/*
 * Key/value summaries: what the fixed-max bound needs from a block of keys
 * and values, per (batch, kv head), in a form that merges across blocks
 * (ring steps, ranks) exactly as one pass over all keys would.
 *
 * One head's summary is FXA_SUMMARY_FIXED + D doubles:
 *   [0] key count   [1] max ||k||   [2] max ||k - mean|| around the block's
 *   fp32 mean (centring on; else max ||k||)   [3] max |v|   [4..] sum of k.
 * Reproducible plans (fxa_attn_desc.reproducible) follow it with one section
 * per canonical group of the plan's keys (FXA_CANONICAL_KEYS from the
 * block's first key; zeros past the block's last group, and everywhere when
 * centring is off), FXA_GROUP_FIXED + D doubles each:
 *   [0] key count   [1] max ||k - mean_g|| around the group's fp32 mean
 *   [2..] sum of the group's k.
 * Merging them in key order gives every split of the keys on group edges
 * the same key sum (one chain over the groups) and the same radius (the
 * groups' union), so the bound does not depend on the split.
 */
#ifndef FXA_SUMMARY_H
#define FXA_SUMMARY_H

#include "attn_internal.h"

#define FXA_SUMMARY_FIXED 4
#define FXA_GROUP_FIXED 2

/* Doubles of one head's summary. */
size_t fxa_summary_head_len(const fxa_attn_plan *p);

/* Doubles of one head's partial summary of a scan group (FXA_SUMMARY_FIXED
 * + D: the summary without group sections). */
size_t fxa_summary_part_len(const fxa_attn_plan *p);

/* Canonical groups of a sequence of seq keys: ceil(seq / FXA_CANONICAL_KEYS). */
int64_t fxa_summary_groups(int64_t seq);

/* Reproducible plans: the union radius max_g (radius_g + ||mean_g - kbar||)
 * over the group sections of n_blocks head summaries (block b at
 * summaries + b * stride), groups without keys skipped. */
double fxa_groups_radius(const fxa_attn_plan *p, const double *summaries, int64_t n_blocks,
                         size_t stride, const float *kbar);

/* First non-finite element a summary found (bad_row < 0: none). */
typedef struct fxa_bad_value {
    int64_t bad_row; /* token index within the block */
    int64_t bad_col;
    float bad_value;
    char tensor; /* 'Q', 'K' or 'V' */
} fxa_bad_value;

/* A block of rows of n_heads heads over n_tokens tokens: row (h, j) of a
 * tensor starts at element off + h head_stride + j token_stride. The scans
 * visit its rows in memory order (a token's heads together when heads are
 * adjacent, a head's tokens together otherwise); each head's results are
 * the same in either order. */
typedef struct fxa_row_block {
    int64_t off;
    int64_t head_stride;
    int64_t token_stride;
    int64_t n_tokens;
    int64_t n_heads;
} fxa_row_block;

/* First pass over a block of K (rows blk) and V (rows vblk: the same heads
 * and tokens, V's offset and strides): head h's partial summary goes to
 * partials + h fxa_summary_part_len(p), laid out like a summary (without
 * group sections) except that [1] holds max ||k||^2 and [2] is left for fxa_radius_block; its first
 * non-finite K element to bad[2 h] and V element to bad[2 h + 1] (bad_row
 * is the token within the block, -1 when none). */
void fxa_summarize_block(const fxa_attn_plan *p, const void *k, const void *v,
                         const fxa_row_block *blk, const fxa_row_block *vblk, double *partials,
                         fxa_bad_value *bad);

/* Second pass: partials[h part_len + 2] = max_j ||k_j - means_h||^2, means
 * [n_heads][D] the centres: the fp32 key means of the whole sequence, or
 * (reproducible plans) of the block's own group. */
void fxa_radius_block(const fxa_attn_plan *p, const void *k, const fxa_row_block *blk,
                      const float *means, double *partials);

/* The first non-finite element of each head of a block of Q in bad[h], and
 * the largest ||q||^2 of its finite rows (before the first bad one) in
 * norm2_max[h]. */
void fxa_check_block(const fxa_attn_plan *p, const void *x, const fxa_row_block *blk,
                     fxa_bad_value *bad, double *norm2_max);

/* The fp32 mean the kernels subtract: (float)(sum / n) per dimension. */
void fxa_fp32_mean(const double *sum, double n, size_t dim, float *mean);

/* Merge n_blocks summaries of one head (block b at summaries + b * stride
 * doubles) into its bound quantities and key mean kbar[D]. The radius of the
 * union is max_b (radius_b + ||mean_b - kbar||) (triangle inequality), which
 * for one block is that block's radius exactly. Reproducible plans take the
 * blocks as consecutive runs of keys in key order: the key sum chains over
 * their groups in order and the radius is fxa_groups_radius. hb->qmax is set to 0 and
 * the prescaling to none (fxa_head_prescale sets both). Returns 0 if no
 * block has a key. */
int fxa_summary_merge(const fxa_attn_plan *p, const double *summaries, size_t stride,
                      int64_t n_blocks, fxa_head_bound *hb, float *kbar);

#endif
