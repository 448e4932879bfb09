/* GEMM on oneDNN's matmul (gemm_onednn.h). Creating a primitive costs ~1 ms, so
 * the object makes one per distinct block width (a blocked weight has at
 * most two: the full blocks and the last) when it is created, each with a
 * user scratchpad (the caller's memory). oneDNN runs on OpenMP: the
 * calling thread's OpenMP thread count is set to the context's for the
 * call and restored after. libgomp does not survive fork(): the process
 * that ran oneDNN is recorded (fxa_gemm_onednn_forked). */
#include "gemm_onednn.h"

#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define N_SLOTS 2

/* The process that last ran a oneDNN primitive (0: none yet); a child of
 * fork() inherits it and so knows that its OpenMP state is its parent's. */
static _Atomic long g_ran_in;

typedef struct prim_slot {
    int64_t n; /* 0: empty */
    dnnl_primitive_t prim;
    dnnl_memory_t mem[4]; /* x, w, y, scratchpad; data handles set per run */
    size_t scratch_bytes;
} prim_slot;

struct fxa_gemm_onednn {
    dnnl_data_type_t type; /* of x and w */
    int64_t m, k, ldy;
    int n_threads;
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    prim_slot slot[N_SLOTS];
};

static fxa_status fail(dnnl_status_t s, const char *step, char *err, size_t errlen)
{
    if (err && errlen)
        snprintf(err, errlen, "oneDNN matmul failed at the %s (status %d)", step, (int)s);
    return FXA_ERR_INTERNAL;
}

static void clear_slot(prim_slot *p)
{
    for (int i = 0; i < 4; i++)
        if (p->mem[i])
            dnnl_memory_destroy(p->mem[i]);
    if (p->prim)
        dnnl_primitive_destroy(p->prim);
    *p = (prim_slot){0};
}

static dnnl_status_t make_slot(fxa_gemm_onednn *g, prim_slot *p, int64_t n, const char **step);

fxa_status fxa_gemm_onednn_create(fxa_gemm_onednn **g, fxa_dtype type, int64_t m, int64_t k,
                                  int64_t ldy, int n_threads, const int64_t widths[2], char *err,
                                  size_t errlen)
{
    fxa_gemm_onednn *o = calloc(1, sizeof *o);
    *g = NULL;
    if (!o) {
        if (err && errlen)
            snprintf(err, errlen, "out of memory");
        return FXA_ERR_NO_MEMORY;
    }
    *o = (fxa_gemm_onednn){.type = type == FXA_BF16 ? dnnl_bf16 : dnnl_f32,
                           .m = m,
                           .k = k,
                           .ldy = ldy,
                           .n_threads = n_threads};
    dnnl_status_t s = dnnl_engine_create(&o->eng, dnnl_cpu, 0);
    if (s != dnnl_success) {
        free(o);
        return fail(s, "engine", err, errlen);
    }
    if ((s = dnnl_stream_create(&o->stream, o->eng, dnnl_stream_default_flags)) != dnnl_success) {
        fxa_gemm_onednn_destroy(o);
        return fail(s, "stream", err, errlen);
    }
    for (int i = 0; i < N_SLOTS; i++) {
        const char *step = "";
        if (widths[i] > 0 && (s = make_slot(o, &o->slot[i], widths[i], &step)) != dnnl_success) {
            fxa_gemm_onednn_destroy(o);
            return fail(s, step, err, errlen);
        }
    }
    *g = o;
    return FXA_OK;
}

size_t fxa_gemm_onednn_scratch_bytes(const fxa_gemm_onednn *g)
{
    size_t most = 0;
    for (int i = 0; i < N_SLOTS; i++)
        most = g->slot[i].scratch_bytes > most ? g->slot[i].scratch_bytes : most;
    return most;
}

/* A primitive for width n: x [m][k], w^T as [k][n] with strides (1, k),
 * y [m][n] with row stride ldy, its scratchpad the caller's. */
static dnnl_status_t make_slot(fxa_gemm_onednn *g, prim_slot *p, int64_t n, const char **step)
{
    dnnl_dims_t x_dims = {g->m, g->k}, w_dims = {g->k, n}, y_dims = {g->m, n};
    dnnl_dims_t x_str = {g->k, 1}, w_str = {1, g->k}, y_str = {g->ldy, 1};
    dnnl_memory_desc_t x_md, w_md, y_md;
    *step = "memory descriptors";
    dnnl_status_t s = dnnl_memory_desc_init_by_strides(&x_md, 2, x_dims, g->type, x_str);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&w_md, 2, w_dims, g->type, w_str);
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&y_md, 2, y_dims, dnnl_f32, y_str);
    dnnl_matmul_desc_t md;
    if (s == dnnl_success) {
        *step = "matmul descriptor";
        s = dnnl_matmul_desc_init(&md, &x_md, &w_md, NULL, &y_md);
    }
    dnnl_primitive_attr_t attr = NULL;
    if (s == dnnl_success) {
        *step = "primitive attributes";
        s = dnnl_primitive_attr_create(&attr);
        if (s == dnnl_success)
            s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    }
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_desc_t scratch_md;
    if (s == dnnl_success) {
        *step = "matmul primitive";
        s = dnnl_primitive_desc_create(&pd, &md, attr, g->eng, NULL);
        if (s == dnnl_success) {
            scratch_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
            p->scratch_bytes = dnnl_memory_desc_get_size(&scratch_md);
            s = dnnl_primitive_create(&p->prim, pd);
        }
        if (pd)
            dnnl_primitive_desc_destroy(pd);
    }
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (s == dnnl_success) {
        *step = "memory";
        s = dnnl_memory_create(&p->mem[0], &x_md, g->eng, DNNL_MEMORY_NONE);
        if (s == dnnl_success)
            s = dnnl_memory_create(&p->mem[1], &w_md, g->eng, DNNL_MEMORY_NONE);
        if (s == dnnl_success)
            s = dnnl_memory_create(&p->mem[2], &y_md, g->eng, DNNL_MEMORY_NONE);
        if (s == dnnl_success)
            s = dnnl_memory_create(&p->mem[3], &scratch_md, g->eng, DNNL_MEMORY_NONE);
    }
    if (s == dnnl_success)
        p->n = n;
    else
        clear_slot(p);
    return s;
}

fxa_status fxa_gemm_onednn_run(fxa_gemm_onednn *g, const void *x, const void *w, int64_t n,
                               float *y, void *scratch, char *err, size_t errlen)
{
    prim_slot *p = NULL;
    for (int i = 0; i < N_SLOTS && !p; i++)
        if (g->slot[i].n == n)
            p = &g->slot[i];
    const char *step = "primitive lookup (a width the plan did not make)";
    dnnl_status_t s = p ? dnnl_success : dnnl_invalid_arguments;
    if (s == dnnl_success) {
        step = "memory";
        s = dnnl_memory_set_data_handle(p->mem[0], (void *)x);
        if (s == dnnl_success)
            s = dnnl_memory_set_data_handle(p->mem[1], (void *)w);
        if (s == dnnl_success)
            s = dnnl_memory_set_data_handle(p->mem[2], y);
        if (s == dnnl_success && p->scratch_bytes)
            s = dnnl_memory_set_data_handle(p->mem[3], scratch);
    }
    if (s == dnnl_success) {
        step = "execution";
        const dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->mem[0]},
                                         {DNNL_ARG_WEIGHTS, p->mem[1]},
                                         {DNNL_ARG_DST, p->mem[2]},
                                         {DNNL_ARG_SCRATCHPAD, p->mem[3]}};
        atomic_store(&g_ran_in, (long)getpid());
        const int caller_threads = omp_get_max_threads();
        omp_set_num_threads(g->n_threads);
        s = dnnl_primitive_execute(p->prim, g->stream, p->scratch_bytes ? 4 : 3, args);
        if (s == dnnl_success)
            s = dnnl_stream_wait(g->stream);
        omp_set_num_threads(caller_threads);
    }
    return s == dnnl_success ? FXA_OK : fail(s, step, err, errlen);
}

int fxa_gemm_onednn_forked(void)
{
    const long ran_in = atomic_load(&g_ran_in);
    return ran_in != 0 && ran_in != (long)getpid();
}

void fxa_gemm_onednn_destroy(fxa_gemm_onednn *g)
{
    if (!g)
        return;
    for (int i = 0; i < N_SLOTS; i++)
        clear_slot(&g->slot[i]);
    if (g->stream)
        dnnl_stream_destroy(g->stream);
    if (g->eng)
        dnnl_engine_destroy(g->eng);
    free(g);
}
