/*
 * The bound pass: before any attention work, read every element of Q, K and
 * V (K a second time for the centred radius), refuse non-finite values, and
 * collect per (batch, kv head) what the fixed-max bound needs (key mean, key
 * radii, Vmax, C and the gates).
 */
#ifndef FXA_SCAN_H
#define FXA_SCAN_H

#include "attn_internal.h"

/* Scratch bytes fxa_scan_kv needs for seq_kv keys (64-byte aligned). */
size_t fxa_scan_kv_scratch_bytes(const fxa_attn_plan *p, int64_t seq_kv);

/* Summarise K/V (seq_kv keys of the plan, strides k_strides / v_strides) per (batch, kv
 * head) into summaries [B * Hkv][summary_head_len]. On a non-finite value
 * returns FXA_ERR_INVALID_ARG with the first offending element (lowest
 * head, then token; K before V) in the message. scratch: 64-byte aligned,
 * fxa_scan_kv_scratch_bytes. */
fxa_status fxa_scan_kv(const fxa_attn_plan *p, const void *k, const void *v, int64_t seq_kv,
                       fxa_strides k_strides, fxa_strides v_strides, double *summaries,
                       void *scratch);

/* Scratch bytes fxa_scan_q needs (64-byte aligned). */
size_t fxa_scan_q_scratch_bytes(const fxa_attn_plan *p);

/* Refuse a non-finite Q (seq_q rows of the plan); raise hb[b Hkv + kv
 * head].qmax to the largest ||q_i|| of the rows that attend that kv head. */
fxa_status fxa_scan_q(const fxa_attn_plan *p, const void *q, void *scratch, fxa_head_bound *hb);

/* Single-process bound pass: fxa_scan_kv over the whole K/V, each head's
 * summary merged on its own into ws's head bounds and kbar, then fxa_scan_q,
 * and each head's prescaling (fxa_head_prescale). */
fxa_status fxa_scan_inputs(const fxa_attn_plan *p, const fxa_attn_args *a, unsigned char *ws);

#endif
