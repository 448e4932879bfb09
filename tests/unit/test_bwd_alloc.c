/*
 * test_bwd_alloc: the attention backward's runs allocate nothing. After
 * plan creation and one warm-up run, a counting allocator
 * (tests/common/alloc_count.h) sees no allocation or free, from any
 * thread, during fxa_attn_bwd_run (GQA, a key tail, stats; fp32 compute
 * and bf16 compute on bf16 Q, K, V, each unmasked, with an additive mask
 * with -inf entries and causal) on contexts of 1 and 3 threads, with the default
 * kernel set and the reference one; a
 * malloc and free in the test prove the counter counts. Built only without
 * sanitizers (they own malloc).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "alloc_count.h"
#include "fxattn.h"
#include "testutil.h"
#include "unit_fixtures.h"

enum { B = 1, HQ = 4, HKV = 2, SQ = 70, SKV = 150, D = 40 };
#define NQ ((size_t)B * SQ * HQ * D)
#define NKV ((size_t)B * SKV * HKV * D)
#define ROWS ((size_t)B * HQ * SQ)

static float g_q[NQ], g_k[NKV], g_v[NKV], g_out[NQ], g_dout[NQ], g_lse[ROWS];
static float g_dq[NQ], g_dk[NKV], g_dv[NKV];
static float g_mask[(size_t)SQ * SKV]; /* additive, [Sq, Skv] broadcast over B and heads */
static uint16_t g_q16[NQ], g_k16[NKV], g_v16[NKV];

typedef enum masking { UNMASKED, ADDITIVE, CAUSAL } masking;

static void run_case(int threads, const char *isa, masking m, fxa_compute compute)
{
    fxa_ctx *ctx = unit_ctx_with_env("FXA_ISA", isa, threads);
    CHECK(ctx != NULL, "context on %s, %d threads", isa ? isa : "the default kernels", threads);
    fxa_attn_desc d;
    fxt_attn_desc(&d, B, HQ, HKV, SQ, SKV, D);
    d.causal = m == CAUSAL;
    if (m == ADDITIVE) {
        d.mask_kind = FXA_MASK_ADD;
        d.mask_strides = (fxa_mask_strides){0, 0, SKV, 1};
    }
    d.compute = compute;
    d.dtype = compute == FXA_COMPUTE_BF16 ? FXA_BF16 : FXA_F32;
    const int bf = compute == FXA_COMPUTE_BF16;
    const void *q = bf ? (const void *)g_q16 : g_q, *k = bf ? (const void *)g_k16 : g_k,
               *v = bf ? (const void *)g_v16 : g_v;
    fxa_attn_plan *fwd = NULL;
    fxa_attn_bwd_plan *bwd = NULL;
    size_t ws_f = 0, ws_b = 0;
    CHECK(fxa_attn_plan_create(ctx, &d, &fwd, &ws_f) == FXA_OK, "plan: %s",
          fxa_ctx_last_error(ctx));
    CHECK(fxa_attn_bwd_plan_create(ctx, &d, &bwd, &ws_b) == FXA_OK, "bwd plan: %s",
          fxa_ctx_last_error(ctx));
    void *wf = unit_ws_alloc(ws_f), *wb = unit_ws_alloc(ws_b);
    fxa_attn_args a = unit_attn_args(q, k, v, g_out, g_lse);
    a.mask = m == ADDITIVE ? g_mask : NULL;
    CHECK(fxa_attn_run(fwd, &a, wf, NULL) == FXA_OK, "forward: %s", fxa_ctx_last_error(ctx));
    fxa_attn_bwd_args g = fxt_bwd_args(q, k, v, g_out, g_dout, g_lse, g_dq, g_dk, g_dv);
    g.mask = a.mask;
    fxa_attn_bwd_stats st = {.struct_size = sizeof st};
    CHECK(fxa_attn_bwd_run(bwd, &g, wb, &st) == FXA_OK, "warm-up: %s", fxa_ctx_last_error(ctx));
    fxt_alloc_count_begin();
    const fxa_status s = fxa_attn_bwd_run(bwd, &g, wb, &st);
    const long n = fxt_alloc_count_end();
    CHECK(s == FXA_OK, "[%d threads, %s, masking %d, compute %d] backward: %s", threads,
          fxa_ctx_isa(ctx), (int)m, (int)compute, fxa_ctx_last_error(ctx));
    CHECK(n == 0,
          "[%d threads, %s, masking %d, compute %d] fxa_attn_bwd_run: %ld allocation calls, the "
          "first from %p",
          threads, fxa_ctx_isa(ctx), (int)m, (int)compute, n, fxt_alloc_first_caller());
    free(wf);
    free(wb);
    fxa_attn_bwd_plan_destroy(bwd);
    fxa_attn_plan_destroy(fwd);
    fxa_ctx_destroy(ctx);
}

int main(void)
{
    fxt_alloc_count_begin();
    void *volatile p = malloc(24);
    free(p);
    CHECK(fxt_alloc_count_end() == 2, "the counter saw a malloc and a free");
    fxt_rng r;
    fxt_rng_seed(&r, 5);
    for (size_t i = 0; i < NQ; i++) {
        g_q[i] = (float)fxt_rng_normal(&r);
        g_dout[i] = (float)fxt_rng_normal(&r);
        g_q16[i] = fxa_f32_to_bf16(g_q[i]);
    }
    for (size_t i = 0; i < NKV; i++) {
        g_k[i] = (float)fxt_rng_normal(&r);
        g_v[i] = (float)fxt_rng_normal(&r);
        g_k16[i] = fxa_f32_to_bf16(g_k[i]);
        g_v16[i] = fxa_f32_to_bf16(g_v[i]);
    }
    for (size_t i = 0; i < (size_t)SQ * SKV; i++)
        g_mask[i] = i % 7 == 3 ? -INFINITY : (float)fxt_rng_normal(&r);
    for (int t = 1; t <= 3; t += 2) {
        for (masking m = UNMASKED; m <= CAUSAL; m++) {
            run_case(t, NULL, m, FXA_COMPUTE_FP32);
            run_case(t, "ref", m, FXA_COMPUTE_FP32);
            run_case(t, NULL, m, FXA_COMPUTE_BF16);
            run_case(t, "ref", m, FXA_COMPUTE_BF16);
        }
    }
    return test_summary("test_bwd_alloc");
}
