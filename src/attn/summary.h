/*
 * Key/value summaries: what the fixed-max bound needs from a block of keys
 * and values, per (batch, kv head), in a form that merges across blocks
 * (ring steps, ranks) exactly as one pass over all keys would.
 *
 * One head's summary is FXA_SUMMARY_FIXED + D doubles:
 *   [0] key count   [1] max ||k||   [2] max ||k - mean|| around the block's
 *   fp32 mean (centring on; else max ||k||)   [3] max |v|   [4..] sum of k.
 */
#ifndef FXA_SUMMARY_H
#define FXA_SUMMARY_H

#include "attn_internal.h"

#define FXA_SUMMARY_FIXED 4

/* Doubles of one head's summary. */
size_t fxa_summary_head_len(const fxa_attn_plan *p);

/* First non-finite element a summary found (bad_row < 0: none). */
typedef struct fxa_bad_value {
    int64_t bad_row; /* token index within the block */
    int64_t bad_col;
    float bad_value;
    char tensor; /* 'Q', 'K' or 'V' */
} fxa_bad_value;

/* Heads one scan item summarises together (see fxa_summarize_heads). */
#define FXA_SUMMARY_GROUP 8

/* Summarise n keys/values of n_heads <= FXA_SUMMARY_GROUP heads, head h
 * starting at element offset off + h head_stride, rows token_stride apart,
 * into summaries + h fxa_summary_head_len(p). Each head is summed in token
 * order exactly as if alone; reading the heads token by token keeps the
 * reads contiguous when heads are adjacent (token-major layouts). A head
 * stops at its first non-finite value (K before V, reported in bad[h]). */
void fxa_summarize_heads(const fxa_attn_plan *p, const void *k, const void *v, int64_t off,
                         int64_t head_stride, int64_t token_stride, int64_t n, int64_t n_heads,
                         double *summaries, fxa_bad_value *bad);

/* Merge n_blocks summaries of one head (block b at summaries + b * stride
 * doubles) into its bound quantities and key mean kbar[D]. The radius of the
 * union is max_b (radius_b + ||mean_b - kbar||) (triangle inequality), which
 * for one block is that block's radius exactly. Returns 0 if no block has a
 * key. */
int fxa_summary_merge(const fxa_attn_plan *p, const double *summaries, size_t stride,
                      int64_t n_blocks, fxa_head_bound *hb, float *kbar);

#endif
