/*
 * Runs on caller memory: after its plan and one warm-up run, a projection
 * (fp32, bf16 and FP8 operands, with and without RMSNorm and RoPE, a bf16
 * output, a tensor-parallel plan with its reduce callback) and the Wan
 * layer (fp32 and bf16) call no allocator (malloc, calloc, realloc,
 * posix_memalign, aligned_alloc) from any thread (tests/common/
 * alloc_count.h) beyond what the GEMM libraries do inside their calls:
 *  - OpenBLAS's threaded sgemm allocates its job array on every call, so
 *    the context has one thread (fp32 GEMMs forced to OpenBLAS with
 *    FXA_PROJ_GEMM=openblas): there fp32 GEMMs allocate nothing;
 *  - oneDNN's primitive execution allocates its argument maps (C++) on
 *    every call: a bf16 GEMM on oneDNN (AVX512-BF16 without the `amx`
 *    kernel set) must allocate exactly what one bare oneDNN matmul
 *    execution does, measured here, per GEMM; on AMX tiles, nothing.
 * Built without the sanitizers only (they own malloc).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "alloc_count.h"
#include "fxattn_proj.h"
#include "fxattn_wan.h"
#include "testutil.h"
#include "wan_fixtures.h"

#define TOKENS 40
#define HEADS 2
#define DIM 32
#define IN 64
#define N_OUT (3 * HEADS * DIM)
#define RUNS 3

static fxa_ctx *g_ctx;
static long g_exec_allocs; /* of one bare oneDNN matmul execution */
static int g_onednn_bf16;  /* bf16 GEMMs run on oneDNN (not on AMX tiles, not fp32: the context's
                           * bf16 products are the faster ones) */

/* Operands of every format, filled once. */
static float g_x[TOKENS * IN], g_w[N_OUT * IN], g_bias[N_OUT], g_gamma[HEADS * DIM];
static uint16_t g_x16[TOKENS * IN], g_w16[N_OUT * IN];
static uint8_t g_x8[TOKENS * (IN + 4)], g_w8[N_OUT * IN];
static float g_ws[N_OUT], g_cs[TOKENS * DIM], g_sn[TOKENS * DIM];
static float g_out[3][TOKENS * HEADS * DIM];

static void fill(void)
{
    for (int i = 0; i < TOKENS * IN; i++) {
        g_x[i] = sinf(0.37f * (float)i);
        g_x16[i] = fxa_f32_to_bf16(g_x[i]);
    }
    for (int i = 0; i < N_OUT * IN; i++) {
        g_w[i] = 0.125f * cosf(0.11f * (float)i);
        g_w16[i] = fxa_f32_to_bf16(g_w[i]);
    }
    for (int i = 0; i < N_OUT; i++)
        g_bias[i] = 0.01f * (float)(i % 7);
    for (int i = 0; i < HEADS * DIM; i++)
        g_gamma[i] = 1.0f + 0.001f * (float)i;
    CHECK(fxa_e4m3_quantize_rows(g_x, TOKENS, IN, g_x8) == FXA_OK, "quantize x");
    CHECK(fxa_e4m3_quantize_weights(g_w, N_OUT, IN, g_w8, g_ws) == FXA_OK, "quantize w");
    CHECK(fxa_wan_rope_tables(1, 1, TOKENS, DIM, 1e4, g_cs, g_sn) == FXA_OK, "rope tables");
}

/* Allocations of one execution of a bf16 matmul x [TOKENS][IN] by w^T
 * [IN][N_OUT] on oneDNN with a user scratchpad, as gemm_onednn.c makes and
 * runs it (after a warm-up execution). -1 when oneDNN refuses. */
static long onednn_exec_allocs(void)
{
    dnnl_engine_t eng = NULL;
    dnnl_stream_t stream = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL};
    dnnl_dims_t x_dims = {TOKENS, IN}, w_dims = {IN, N_OUT}, y_dims = {TOKENS, N_OUT};
    dnnl_dims_t x_str = {IN, 1}, w_str = {1, IN}, y_str = {N_OUT, 1};
    dnnl_memory_desc_t x_md, w_md, y_md, s_md;
    dnnl_matmul_desc_t md;
    int ok =
        dnnl_engine_create(&eng, dnnl_cpu, 0) == dnnl_success &&
        dnnl_stream_create(&stream, eng, dnnl_stream_default_flags) == dnnl_success &&
        dnnl_memory_desc_init_by_strides(&x_md, 2, x_dims, dnnl_bf16, x_str) == dnnl_success &&
        dnnl_memory_desc_init_by_strides(&w_md, 2, w_dims, dnnl_bf16, w_str) == dnnl_success &&
        dnnl_memory_desc_init_by_strides(&y_md, 2, y_dims, dnnl_f32, y_str) == dnnl_success &&
        dnnl_matmul_desc_init(&md, &x_md, &w_md, NULL, &y_md) == dnnl_success &&
        dnnl_primitive_attr_create(&attr) == dnnl_success &&
        dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success &&
        dnnl_primitive_desc_create(&pd, &md, attr, eng, NULL) == dnnl_success;
    if (ok) {
        s_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        ok = dnnl_primitive_create(&prim, pd) == dnnl_success;
    }
    static float y[TOKENS * N_OUT];
    void *scratch = ok ? aligned_alloc(64, dnnl_memory_desc_get_size(&s_md) + 64) : NULL;
    ok = ok && scratch && dnnl_memory_create(&mem[0], &x_md, eng, g_x16) == dnnl_success &&
         dnnl_memory_create(&mem[1], &w_md, eng, g_w16) == dnnl_success &&
         dnnl_memory_create(&mem[2], &y_md, eng, y) == dnnl_success &&
         dnnl_memory_create(&mem[3], &s_md, eng, scratch) == dnnl_success;
    const dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, mem[0]},
                                     {DNNL_ARG_WEIGHTS, mem[1]},
                                     {DNNL_ARG_DST, mem[2]},
                                     {DNNL_ARG_SCRATCHPAD, mem[3]}};
    const int n_args = dnnl_memory_desc_get_size(&s_md) ? 4 : 3;
    long n = -1;
    if (ok && dnnl_primitive_execute(prim, stream, n_args, args) == dnnl_success &&
        dnnl_stream_wait(stream) == dnnl_success) {
        fxt_alloc_count_begin();
        ok = dnnl_primitive_execute(prim, stream, n_args, args) == dnnl_success &&
             dnnl_stream_wait(stream) == dnnl_success;
        n = ok ? (long)fxt_alloc_count_end() : ((void)fxt_alloc_count_end(), -1L);
    }
    for (int i = 0; i < 4; i++)
        if (mem[i])
            dnnl_memory_destroy(mem[i]);
    if (prim)
        dnnl_primitive_destroy(prim);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (stream)
        dnnl_stream_destroy(stream);
    if (eng)
        dnnl_engine_destroy(eng);
    free(scratch);
    return n;
}

/* The group of one rank: the sums are already the group's. */
static fxa_status reduce_alone(double *sums, int64_t n, void *arg)
{
    (void)sums;
    (void)n;
    (*(int *)arg)++;
    return FXA_OK;
}

/* Plan d (tensor parallel with tp), warm up, then count the allocations of
 * RUNS runs (one GEMM each: the weight is one block). */
static void check_proj(const char *what, const fxa_proj_desc *d, const fxa_proj_tp *tp)
{
    const int on_onednn =
        g_onednn_bf16 && d->x_format != FXA_PROJ_X_F32 && d->w_format != FXA_PROJ_W_F32;
    const long want = on_onednn ? RUNS * g_exec_allocs : 0;
    const void *x = d->x_format == FXA_PROJ_X_F32    ? (const void *)g_x
                    : d->x_format == FXA_PROJ_X_BF16 ? (const void *)g_x16
                                                     : (const void *)g_x8;
    const void *w = d->w_format == FXA_PROJ_W_F32    ? (const void *)g_w
                    : d->w_format == FXA_PROJ_W_BF16 ? (const void *)g_w16
                                                     : (const void *)g_w8;
    const fxa_proj_args a = {.struct_size = sizeof a,
                             .x = x,
                             .w = w,
                             .w_scales = g_ws,
                             .bias = g_bias,
                             .gamma_q = g_gamma,
                             .gamma_k = g_gamma,
                             .rope_cos = g_cs,
                             .rope_sin = g_sn,
                             .q_out = g_out[0],
                             .k_out = g_out[1],
                             .v_out = g_out[2]};
    fxa_proj_plan *plan = NULL;
    size_t bytes = 0;
    const fxa_status st = tp ? fxa_proj_plan_create_tp(g_ctx, d, tp, &plan, &bytes)
                             : fxa_proj_plan_create(g_ctx, d, &plan, &bytes);
    CHECK(st == FXA_OK, "%s: plan: %s", what, fxa_ctx_last_error(g_ctx));
    if (st != FXA_OK)
        return;
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    CHECK(fxa_proj_run(plan, &a, ws) == FXA_OK, "%s: warm-up: %s", what, fxa_ctx_last_error(g_ctx));
    int ok = 1;
    fxt_alloc_count_begin();
    for (int r = 0; r < RUNS; r++)
        ok &= fxa_proj_run(plan, &a, ws) == FXA_OK;
    const long n = (long)fxt_alloc_count_end();
    CHECK(ok, "%s: runs: %s", what, fxa_ctx_last_error(g_ctx));
    CHECK(n == want, "%s: %ld allocations in %d runs, expected %ld (%s)", what, n, RUNS, want,
          on_onednn ? "oneDNN's executions" : "none");
    free(ws);
    fxa_proj_plan_destroy(plan);
}

/* d: the projection of this test's shape, every other field its default. */
static void proj_desc(fxa_proj_desc *d)
{
    fxa_proj_desc_init(d);
    d->tokens = TOKENS;
    d->in_features = IN;
    d->heads_q = d->heads_kv = HEADS;
    d->head_dim = DIM;
}

static void test_proj(void)
{
    static const struct {
        const char *what;
        fxa_proj_x x;
        fxa_proj_w w;
        int norm, rope;
        fxa_dtype out;
    } cases[] = {
        {"fp32, norm and rope", FXA_PROJ_X_F32, FXA_PROJ_W_F32, 1, 1, FXA_F32},
        {"fp32, plain", FXA_PROJ_X_F32, FXA_PROJ_W_F32, 0, 0, FXA_F32},
        {"bf16, norm and rope", FXA_PROJ_X_BF16, FXA_PROJ_W_BF16, 1, 1, FXA_F32},
        {"bf16, bf16 output", FXA_PROJ_X_BF16, FXA_PROJ_W_BF16, 1, 1, FXA_BF16},
        {"fp32 x, FP8 w", FXA_PROJ_X_F32, FXA_PROJ_W_E4M3, 1, 1, FXA_F32},
        {"FP8 x and w", FXA_PROJ_X_E4M3_ROWS, FXA_PROJ_W_E4M3, 1, 1, FXA_F32},
        {"FP8 x and w, plain", FXA_PROJ_X_E4M3_ROWS, FXA_PROJ_W_E4M3, 0, 0, FXA_F32},
        {"bf16 x, fp32 w", FXA_PROJ_X_BF16, FXA_PROJ_W_F32, 0, 1, FXA_F32},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fxa_proj_desc d;
        proj_desc(&d);
        d.x_format = cases[i].x;
        d.w_format = cases[i].w;
        d.norm = cases[i].norm;
        d.rope = cases[i].rope;
        d.out_dtype = cases[i].out;
        check_proj(cases[i].what, &d, NULL);
    }
    fxa_proj_desc d;
    proj_desc(&d);
    d.norm = d.rope = 1;
    int calls = 0;
    const fxa_proj_tp tp = {.struct_size = sizeof tp,
                            .norm_features_q = HEADS * DIM,
                            .norm_features_k = HEADS * DIM,
                            .reduce = reduce_alone,
                            .arg = &calls};
    check_proj("tensor parallel, fp32", &d, &tp);
    CHECK(calls == RUNS + 1, "the reduce callback ran %d times, expected %d", calls, RUNS + 1);
}

/* The Wan layer of `dtype` on synthetic weights. */
static void check_wan(const char *what, fxa_dtype dtype)
{
    /* bf16: the QKV and the output projection are bf16 GEMMs. */
    const long want = dtype == FXA_BF16 && g_onednn_bf16 ? 2 * RUNS * g_exec_allocs : 0;
    const fxa_wan_load_params p = wan_synth_params(4, 4 * DIM, 5, dtype);
    fxa_wan_weights w;
    char err[300];
    CHECK(fxa_wan_weights_load(NULL, &p, &w, err, sizeof err) == FXA_OK, "%s: weights: %s", what,
          err);
    fxa_wan_desc d;
    fxa_wan_desc_init(&d);
    d.frames = 2;
    d.height = 3;
    d.width = 5;
    d.heads = 4;
    d.head_dim = DIM;
    d.dtype = dtype;
    const int64_t n = 30 * 4 * DIM;
    float *x = malloc((size_t)n * sizeof(float));
    float *y = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        x[i] = fxa_wan_synth(5, FXA_WAN_SYNTH_X, (uint64_t)i);
    fxa_wan_plan *plan = NULL;
    size_t bytes = 0;
    CHECK(fxa_wan_plan_create(g_ctx, &d, &plan, &bytes) == FXA_OK, "%s: plan: %s", what,
          fxa_ctx_last_error(g_ctx));
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64);
    fxa_wan_stats s = {.struct_size = sizeof s};
    CHECK(plan && fxa_wan_run(plan, &w, x, y, ws, &s) == FXA_OK, "%s: warm-up: %s", what,
          fxa_ctx_last_error(g_ctx));
    int ok = 1;
    fxt_alloc_count_begin();
    for (int r = 0; r < RUNS && plan; r++)
        ok &= fxa_wan_run(plan, &w, x, y, ws, &s) == FXA_OK;
    const long count = (long)fxt_alloc_count_end();
    CHECK(ok, "%s: runs: %s", what, fxa_ctx_last_error(g_ctx));
    CHECK(count == want, "%s: %ld allocations in %d runs, expected %ld", what, count, RUNS, want);
    fxa_wan_plan_destroy(plan);
    free(ws);
    free(x);
    free(y);
    fxa_wan_weights_free(&w);
}

int main(void)
{
    setenv("FXA_PROJ_GEMM", "openblas", 1); /* read by fxa_ctx_create */
    g_ctx = fxt_ctx(1);
    if (!g_ctx)
        return 1;
    fill();
    fxa_compute_choice c = {.struct_size = sizeof c};
    CHECK(fxa_ctx_compute_choice(g_ctx, FXA_BF16, 128, &c) == FXA_OK, "compute choice");
    g_onednn_bf16 = __builtin_cpu_supports("avx512bf16") &&
                    strcmp(fxa_ctx_isa(g_ctx), "amx") != 0 && c.compute == FXA_COMPUTE_BF16;
    if (g_onednn_bf16) {
        g_exec_allocs = onednn_exec_allocs();
        CHECK(g_exec_allocs >= 0, "a bare oneDNN bf16 matmul");
        printf("  one oneDNN matmul execution: %ld allocations\n", g_exec_allocs);
    }
    test_proj();
    check_wan("Wan layer, fp32", FXA_F32);
    check_wan("Wan layer, bf16", FXA_BF16);
    fxa_ctx_destroy(g_ctx);
    return test_summary("test_zero_alloc_proj");
}
