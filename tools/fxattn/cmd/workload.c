/* Synthetic workloads for demo and bench (workload.h). */
#include "workload.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Round x to dtype in place and store the encoding in *enc (owned). */
static int to_dtype(float *x, size_t n, fxa_dtype dtype, void **enc)
{
    if (dtype == FXA_F32) {
        *enc = x;
        return 0;
    }
    uint16_t *h = malloc(n * sizeof *h);
    if (!h)
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory");
    if (fxa_convert_f32(x, dtype, h, n) != FXA_OK) {
        free(h);
        return fxt_fail(FXT_EXIT_BAD_INPUT, "synthetic data overflows %s", fxt_dtype_name(dtype));
    }
    for (size_t i = 0; i < n; i++)
        x[i] = dtype == FXA_BF16 ? fxa_bf16_to_f32(h[i]) : fxa_f16_to_f32(h[i]);
    *enc = h;
    return 0;
}

int fxt_workload_make(const fxt_wan_synth *p, fxa_dtype dtype, fxt_workload *w)
{
    memset(w, 0, sizeof *w);
    const int64_t s = (int64_t)p->frames * p->height * p->width;
    const size_t n = (size_t)(s * p->heads * p->head_dim);
    fxa_attn_desc_init(&w->d);
    w->d.batch = 1;
    w->d.heads_q = w->d.heads_kv = p->heads;
    w->d.seq_q = w->d.seq_kv = s;
    w->d.head_dim = p->head_dim;
    w->d.dtype = dtype;
    w->q32 = malloc(n * sizeof(float));
    w->k32 = malloc(n * sizeof(float));
    w->v32 = malloc(n * sizeof(float));
    if (!w->q32 || !w->k32 || !w->v32) {
        fxt_workload_free(w);
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for %zu-element tensors", n);
    }
    fxa_status st = fxt_wan_synth_qkv(p, w->q32, w->k32, w->v32);
    if (st != FXA_OK) {
        fxt_workload_free(w);
        return fxt_fail(fxt_exit_code(st), "bad synthetic-data parameters");
    }
    int code = to_dtype(w->q32, n, dtype, &w->q);
    if (!code)
        code = to_dtype(w->k32, n, dtype, &w->k);
    if (!code)
        code = to_dtype(w->v32, n, dtype, &w->v);
    if (code)
        fxt_workload_free(w);
    return code;
}

int fxt_workload_sequence(int64_t seq, int64_t heads, int64_t dim, fxa_dtype dtype, fxt_workload *w)
{
    fxt_wan_synth p;
    fxt_wan_synth_defaults(&p);
    p.frames = 1;
    p.height = 1;
    p.width = (int)seq;
    p.heads = (int)heads;
    p.head_dim = (int)dim;
    return fxt_workload_make(&p, dtype, w);
}

void fxt_workload_free(fxt_workload *w)
{
    if (w->q != w->q32)
        free(w->q);
    if (w->k != w->k32)
        free(w->k);
    if (w->v != w->v32)
        free(w->v);
    free(w->q32);
    free(w->k32);
    free(w->v32);
    memset(w, 0, sizeof *w);
}
