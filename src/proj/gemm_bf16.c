/* bf16 GEMM on oneDNN (gemm_bf16.h). A primitive per call: the projection's
 * GEMMs are large, so creating it (~1 ms) is noise next to running it. */
#include "gemm_bf16.h"

#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>

fxa_status fxa_gemm_bf16(const uint16_t *x, const uint16_t *w, int64_t m, int64_t n, int64_t k,
                         float *y, char *err, size_t errlen)
{
    dnnl_engine_t eng = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[3] = {NULL, NULL, NULL};
    const char *step = "engine";
    dnnl_status_t s = dnnl_engine_create(&eng, dnnl_cpu, 0);
    if (s == dnnl_success) {
        step = "stream";
        s = dnnl_stream_create(&stream, eng, dnnl_stream_default_flags);
    }
    /* x [m][k], w^T as [k][n] with strides (1, k), y [m][n]. */
    dnnl_dims_t x_dims = {m, k}, w_dims = {k, n}, y_dims = {m, n};
    dnnl_dims_t x_str = {k, 1}, w_str = {1, k}, y_str = {n, 1};
    dnnl_memory_desc_t x_md, w_md, y_md;
    if (s == dnnl_success) {
        step = "memory descriptors";
        s = dnnl_memory_desc_init_by_strides(&x_md, 2, x_dims, dnnl_bf16, x_str);
        if (s == dnnl_success)
            s = dnnl_memory_desc_init_by_strides(&w_md, 2, w_dims, dnnl_bf16, w_str);
        if (s == dnnl_success)
            s = dnnl_memory_desc_init_by_strides(&y_md, 2, y_dims, dnnl_f32, y_str);
    }
    dnnl_matmul_desc_t md;
    if (s == dnnl_success) {
        step = "matmul descriptor";
        s = dnnl_matmul_desc_init(&md, &x_md, &w_md, NULL, &y_md);
    }
    if (s == dnnl_success) {
        step = "matmul primitive";
        s = dnnl_primitive_desc_create(&pd, &md, NULL, eng, NULL);
        if (s == dnnl_success)
            s = dnnl_primitive_create(&prim, pd);
    }
    if (s == dnnl_success) {
        step = "memory";
        s = dnnl_memory_create(&mem[0], &x_md, eng, (void *)x);
        if (s == dnnl_success)
            s = dnnl_memory_create(&mem[1], &w_md, eng, (void *)w);
        if (s == dnnl_success)
            s = dnnl_memory_create(&mem[2], &y_md, eng, y);
    }
    if (s == dnnl_success) {
        step = "execution";
        const dnnl_exec_arg_t args[3] = {
            {DNNL_ARG_SRC, mem[0]}, {DNNL_ARG_WEIGHTS, mem[1]}, {DNNL_ARG_DST, mem[2]}};
        s = dnnl_primitive_execute(prim, stream, 3, args);
        if (s == dnnl_success)
            s = dnnl_stream_wait(stream);
    }
    for (int i = 0; i < 3; i++)
        if (mem[i])
            dnnl_memory_destroy(mem[i]);
    if (prim)
        dnnl_primitive_destroy(prim);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (stream)
        dnnl_stream_destroy(stream);
    if (eng)
        dnnl_engine_destroy(eng);
    if (s == dnnl_success)
        return FXA_OK;
    if (err && errlen)
        snprintf(err, errlen, "oneDNN bf16 matmul failed at the %s (status %d)", step, (int)s);
    return FXA_ERR_INTERNAL;
}
