/* Wan-like synthetic attention inputs in any dtype, for `demo` and `bench`:
 * fxt_wan_synth_qkv on a (frames, height, width) grid, converted (RNE). */
#ifndef FXT_WORKLOAD_H
#define FXT_WORKLOAD_H

#include "fxattn.h"
#include "synth_wan.h"

typedef struct fxt_workload {
    fxa_attn_desc d; /* B = 1, BSHD, Hq = Hkv */
    float *q32;      /* fp32 values as the kernels see them (rounded to dtype) */
    float *k32;
    float *v32;
    void *q; /* the same in d.dtype (aliases q32 for f32) */
    void *k;
    void *v;
} fxt_workload;

/* Returns 0 or an exit code (error printed). */
int fxt_workload_make(const fxt_wan_synth *p, fxa_dtype dtype, fxt_workload *w);
/* The workload of `bench`: one frame of one row of seq tokens, heads x dim (the synthetic
 * defaults otherwise). 0 or an exit code (error printed). */
int fxt_workload_sequence(int64_t seq, int64_t heads, int64_t dim, fxa_dtype dtype,
                          fxt_workload *w);
void fxt_workload_free(fxt_workload *w);

#endif
