/*
 * The bound pass: before any attention work, read every element of Q, K and
 * V once, refuse non-finite values, and collect per (batch, kv head) what the
 * fixed-max bound needs (key mean, key radii, Vmax, C and the gates).
 */
#ifndef FXA_SCAN_H
#define FXA_SCAN_H

#include "attn_internal.h"

/* First non-finite element an item found (index < 0: none). */
typedef struct fxa_scan_result {
    int64_t bad_row; /* token index within the item's (batch, head) */
    int64_t bad_col;
    float bad_value;
    char tensor; /* 'Q', 'K' or 'V' */
} fxa_scan_result;

/* Fill the head bounds and kbar in ws. On a non-finite input returns
 * FXA_ERR_INVALID_ARG with the first offending element in the message. */
fxa_status fxa_scan_inputs(const fxa_attn_plan *p, const fxa_attn_args *a, unsigned char *ws);

#endif
