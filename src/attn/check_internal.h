/* The check plan behind the opaque fxa_check_plan handle, the layout of its
 * workspace, and the per-item arithmetic of a run (check_items.c). */
#ifndef FXA_CHECK_INTERNAL_H
#define FXA_CHECK_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn_diag.h"
#include "attn_internal.h"

struct fxa_check_plan {
    fxa_ctx *ctx;
    /* The bound passes, auto mode: centring on (also the strides, lambda
     * and kernels of the fp64 statistics) and off. Without V both read one
     * zero row per batch (V strides {1, 0, 0} over the workspace's zeros). */
    fxa_attn_plan *centred;
    fxa_attn_plan *raw;
    int has_v;
    int64_t samples;    /* sampled rows per (batch, head): min(sample_rows, Sq) */
    size_t scratch_len; /* doubles per thread (check_items.c's head report) */
    /* Workspace layout: byte offsets from its start. */
    size_t ws_attn;    /* the bound passes' workspace (the larger plan's) */
    size_t ws_zero_v;  /* float[B + D] of zeros when has_v is 0 */
    size_t ws_bound_c; /* float[B Hq Sq]: row bounds, centring on */
    size_t ws_bound_r; /* (off) */
    size_t ws_fb_c;    /* uint8_t[B Hq Sq]: fallback flags, centring on */
    size_t ws_fb_r;    /* (off) */
    size_t ws_kbar;    /* double[B Hkv][D]: fp64 key means */
    size_t ws_keys;    /* fxa_check_keys[B Hkv] */
    size_t ws_scratch; /* double[threads][scratch_len] */
    size_t ws_rows;    /* float[threads][2 D]: a q row and a k/v row */
    size_t ws_heads;   /* fxa_check_head[Hq]: the report before it is copied out */
    size_t ws_total;
};

/* Key statistics of one (batch, kv head). */
typedef struct fxa_check_keys {
    double kmax;   /* max ||k_j|| */
    double radius; /* max ||k_j - kbar|| */
    double vmax;   /* max |v| */
} fxa_check_keys;

/* One run: its inputs and the workspace's buffers. */
typedef struct fxa_check_job {
    const fxa_check_plan *plan;
    const void *q;
    const void *k;
    const void *v; /* NULL: no V */
    const float *bound_c, *bound_r;
    const uint8_t *fb_c, *fb_r;
    double *kbar;
    fxa_check_keys *keys;
    double *scratch;
    float *rows;
    fxa_check_head *heads;
} fxa_check_job;

/* Doubles of per-thread scratch fxa_check_head_item needs: the head's
 * norms and both bounds (3 B Sq), the overshoots of its sampled rows
 * (2 B samples) and a sort buffer (B Sq). */
size_t fxa_check_scratch_len(const fxa_attn_desc *d, int64_t samples);

/* Pool item (batch, kv head) of an fxa_check_job: key mean, max norm,
 * centred radius, Vmax. */
void fxa_check_keys_item(void *job, int64_t item, int thread_id);

/* Pool item (query head) of an fxa_check_job, after every keys item: its
 * report into job->heads. */
void fxa_check_head_item(void *job, int64_t h, int thread_id);

#endif
