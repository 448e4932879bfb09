/*
 * test_run_alloc: runs allocate nothing. After plan creation and one
 * warm-up call, a counting allocator (tests/common/alloc_count.h) sees no
 * malloc, calloc, realloc, aligned allocation or free, from any thread,
 * during:
 *  - fxa_attn_run: fp32 and bf16 inputs (fp32 and bf16 compute), rows on
 *    the fixed-max path and rows that fall back, LSE, row diagnostics and
 *    stats, a key-split (decode-like) shape, online mode, causal and an
 *    additive mask;
 *  - fxa_attn_bounds;
 *  - fxa_kv_summarize and a blockwise pass (fxa_attn_acc_begin, _add,
 *    _finish) of two blocks;
 *  - fxa_check_run, with V and without;
 * on contexts of 1 and 3 threads, with the default kernel set and the
 * reference one. Self-checks prove that the counter counts: a malloc and
 * a free in the test, and fxa_attn_check's plan and workspace (the
 * one-call form allocates them).
 * Built only without sanitizers (they own malloc).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_count.h"
#include "fxattn.h"
#include "fxattn_diag.h"
#include "testutil.h"
#include "unit_fixtures.h"

enum { B = 1, HQ = 4, HKV = 2, SQ = 96, SKV = 300, D = 32, HOT = 3 };
#define NQ ((size_t)B * SQ * HQ * D)
#define NKV ((size_t)B * SKV * HKV * D)
#define ROWS ((size_t)B * HQ * SQ)

static float g_q[NQ], g_k[NKV], g_v[NKV];
static float g_mask[SQ * SKV]; /* additive [1, 1, Sq, Skv] */
static uint16_t g_q16[NQ], g_k16[NKV], g_v16[NKV];

/* The allocation calls of the counted call (fxa_status) `call`, which must
 * succeed, are none. */
#define NO_ALLOC(ctx, label, call)                                                                 \
    do {                                                                                           \
        fxt_alloc_count_begin();                                                                   \
        const fxa_status st_ = (call);                                                             \
        const long n_ = fxt_alloc_count_end();                                                     \
        CHECK(st_ == FXA_OK, "[%s] %s: %s", label, #call, fxa_ctx_last_error(ctx));                \
        CHECK(n_ == 0, "[%s] %s: %ld allocation calls, the first from %p", label, #call, n_,       \
              fxt_alloc_first_caller());                                                           \
    } while (0)

/* Warm up with call, then count it. */
#define WARM_NO_ALLOC(ctx, label, call)                                                            \
    do {                                                                                           \
        CHECK((call) == FXA_OK, "[%s] warm-up %s: %s", label, #call, fxa_ctx_last_error(ctx));     \
        NO_ALLOC(ctx, label, call);                                                                \
    } while (0)

static void self_check(void)
{
    fxt_alloc_count_begin();
    void *volatile p = malloc(24);
    free(p);
    const long n = fxt_alloc_count_end();
    CHECK(n == 2 && fxt_alloc_first_caller() != NULL,
          "the counter saw %ld calls (first from %p) of a malloc and a free", n,
          fxt_alloc_first_caller());
    fxt_alloc_count_begin();
    CHECK(fxt_alloc_count_end() == 0, "an empty window counts nothing");
}

/* The test's heads and head dimension, seq_q queries against seq_kv keys of dtype. */
static void init_desc(fxa_attn_desc *d, int64_t seq_q, int64_t seq_kv, fxa_dtype dtype)
{
    fxt_attn_desc(d, B, HQ, HKV, seq_q, seq_kv, D);
    d->dtype = dtype;
}

/* fxa_attn_run and fxa_attn_bounds of d on (q, k, v), with every output. */
static void attn_runs(fxa_ctx *ctx, const char *label, const fxa_attn_desc *d, const void *q,
                      const void *k, const void *v, int want_both_paths)
{
    fxa_attn_plan *plan = NULL;
    size_t bytes = 0;
    CHECK(fxa_attn_plan_create(ctx, d, &plan, &bytes) == FXA_OK, "[%s] plan: %s", label,
          fxa_ctx_last_error(ctx));
    if (!plan)
        return;
    const size_t rows = (size_t)(d->batch * d->heads_q * d->seq_q);
    void *ws = unit_ws_alloc(bytes);
    float *out = malloc(rows * D * sizeof(float));
    float *lse = malloc(rows * sizeof(float));
    float *bound = malloc(rows * sizeof(float));
    uint8_t *fb = malloc(rows);
    fxa_attn_args a = unit_attn_args(q, k, v, out, lse);
    a.row_fallback = fb;
    a.row_bound = bound;
    a.mask = g_mask;
    fxa_attn_stats st = {.struct_size = sizeof st};
    WARM_NO_ALLOC(ctx, label, fxa_attn_run(plan, &a, ws, &st));
    if (want_both_paths)
        CHECK(st.fallback_rows > 0 && st.fallback_rows < st.rows,
              "[%s] want rows on both paths: %lld of %lld fall back", label,
              (long long)st.fallback_rows, (long long)st.rows);
    WARM_NO_ALLOC(ctx, label, fxa_attn_bounds(plan, &a, ws, &st));
    free(ws);
    free(out);
    free(lse);
    free(bound);
    free(fb);
    fxa_attn_plan_destroy(plan);
}

/* Two blocks of SKV / 2 keys through the accumulator. */
static void blockwise(fxa_ctx *ctx, const char *label)
{
    fxa_attn_desc d;
    init_desc(&d, SQ, SKV / 2, FXA_F32);
    fxa_attn_plan *plan = NULL;
    size_t bytes = 0;
    fxa_attn_acc *acc = NULL;
    CHECK(fxa_attn_plan_create(ctx, &d, &plan, &bytes) == FXA_OK &&
              fxa_attn_acc_create(plan, &acc) == FXA_OK && fxa_attn_acc_reserve(acc, 2) == FXA_OK,
          "[%s] plan and accumulator: %s", label, fxa_ctx_last_error(ctx));
    if (!acc)
        return;
    const size_t len = fxa_kv_summary_len(plan);
    double *sums = malloc(2 * len * sizeof(double));
    float *out = malloc(ROWS * D * sizeof(float));
    float *lse = malloc(ROWS * sizeof(float));
    const size_t half = NKV / 2; /* BSHD, B = 1: the second block starts here */
    const fxa_attn_args a = {.struct_size = sizeof a, .out = out, .lse = lse};
    fxa_attn_stats st = {.struct_size = sizeof st};
    for (int pass = 0; pass < 2; pass++) { /* the first warms up */
        NO_ALLOC(ctx, label, fxa_kv_summarize(plan, g_k, g_v, SKV / 2, sums));
        NO_ALLOC(ctx, label, fxa_kv_summarize(plan, g_k + half, g_v + half, SKV / 2, sums + len));
        NO_ALLOC(ctx, label, fxa_attn_acc_begin(acc, g_q, sums, 2));
        NO_ALLOC(ctx, label, fxa_attn_acc_add(acc, g_k + half, g_v + half, SKV / 2));
        NO_ALLOC(ctx, label, fxa_attn_acc_add(acc, g_k, g_v, SKV / 2));
        NO_ALLOC(ctx, label, fxa_attn_acc_finish(acc, &a, &st));
    }
    CHECK(st.keys == SKV && st.rows == (int64_t)ROWS, "[%s] blockwise stats: %lld keys", label,
          (long long)st.keys);
    free(sums);
    free(out);
    free(lse);
    fxa_attn_acc_destroy(acc);
    fxa_attn_plan_destroy(plan);
}

static void check_runs(fxa_ctx *ctx, const char *label)
{
    fxa_attn_desc d;
    init_desc(&d, SQ, SKV, FXA_F32);
    for (int has_v = 0; has_v < 2; has_v++) {
        fxa_check_desc cd;
        fxa_check_desc_init(&cd);
        cd.attn = &d;
        cd.has_v = has_v;
        fxa_check_plan *plan = NULL;
        size_t bytes = 0;
        CHECK(fxa_check_plan_create(ctx, &cd, &plan, &bytes) == FXA_OK, "[%s] check plan: %s",
              label, fxa_ctx_last_error(ctx));
        if (!plan)
            continue;
        void *ws = unit_ws_alloc(bytes);
        fxa_check_head heads[HQ];
        const fxa_attn_args a = {
            .struct_size = sizeof a, .q = g_q, .k = g_k, .v = has_v ? g_v : NULL};
        WARM_NO_ALLOC(ctx, label, fxa_check_run(plan, &a, ws, heads, sizeof heads[0]));
        /* The counter sees the library's own allocations: the one-call
         * form allocates its plan and workspace. */
        fxt_alloc_count_begin();
        const fxa_status st = fxa_attn_check(ctx, &d, g_q, g_k, a.v, 0, heads, sizeof heads[0]);
        const long n = fxt_alloc_count_end();
        CHECK(st == FXA_OK && n >= 4, "[%s] fxa_attn_check: %ld allocation calls counted", label,
              n);
        free(ws);
        fxa_check_plan_destroy(plan);
    }
}

static void on_context(const char *isa, int threads)
{
    char label[64];
    snprintf(label, sizeof label, "%s, %d threads", isa ? isa : "default", threads);
    fxa_ctx *ctx = unit_ctx_with_env("FXA_ISA", isa, threads);
    CHECK(ctx != NULL, "[%s] context", label);
    if (!ctx)
        return;
    printf("  %s: kernels %s\n", label, fxa_ctx_isa(ctx));
    fxa_attn_desc d;
    init_desc(&d, SQ, SKV, FXA_F32);
    attn_runs(ctx, label, &d, g_q, g_k, g_v, 1);
    d.mode = FXA_MODE_ONLINE;
    attn_runs(ctx, label, &d, g_q, g_k, g_v, 0);
    init_desc(&d, SQ, SKV, FXA_BF16);
    attn_runs(ctx, label, &d, g_q16, g_k16, g_v16, 0);
    d.compute = FXA_COMPUTE_BF16;
    attn_runs(ctx, label, &d, g_q16, g_k16, g_v16, 0);
    init_desc(&d, 2, SKV, FXA_F32); /* few rows: the keys are split */
    attn_runs(ctx, label, &d, g_q, g_k, g_v, 0);
    init_desc(&d, SQ, SKV, FXA_F32);
    d.causal = 1;
    attn_runs(ctx, label, &d, g_q, g_k, g_v, 0);
    d.causal = 0;
    d.mask_kind = FXA_MASK_ADD;
    d.mask_strides = (fxa_mask_strides){0, 0, SKV, 1};
    attn_runs(ctx, label, &d, g_q, g_k, g_v, 0);
    blockwise(ctx, label);
    check_runs(ctx, label);
    fxa_ctx_destroy(ctx);
}

int main(void)
{
    self_check();
    fxt_rng r;
    fxt_rng_seed(&r, 33);
    /* Head HOT's even rows 60x longer: they fail the gate and fall back. */
    for (int i = 0; i < SQ; i++)
        for (int h = 0; h < HQ; h++)
            for (int c = 0; c < D; c++) {
                const float x = (float)fxt_rng_normal(&r);
                g_q[((size_t)i * HQ + (size_t)h) * D + (size_t)c] =
                    h == HOT && i % 2 == 0 ? 60.0f * x : x;
            }
    for (size_t i = 0; i < NKV; i++) {
        g_k[i] = (float)fxt_rng_normal(&r);
        g_v[i] = (float)fxt_rng_normal(&r);
    }
    for (size_t i = 0; i < (size_t)SQ * SKV; i++) /* a bias, a tenth of the keys masked */
        g_mask[i] = i % 10 == 3 ? -INFINITY : (float)fxt_rng_normal(&r);
    for (size_t i = 0; i < NQ; i++)
        g_q16[i] = fxa_f32_to_bf16(g_q[i]);
    for (size_t i = 0; i < NKV; i++) {
        g_k16[i] = fxa_f32_to_bf16(g_k[i]);
        g_v16[i] = fxa_f32_to_bf16(g_v[i]);
    }
    const int threads[2] = {1, 3};
    for (int t = 0; t < 2; t++) {
        on_context(NULL, threads[t]);
        on_context("ref", threads[t]);
    }
    return test_summary("test_run_alloc");
}
