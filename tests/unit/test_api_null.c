/*
 * Every public function of libfxattn (fxattn.h, fxattn_diag.h) that takes a
 * handle or a pointer accepts NULL there without crashing: fallible calls
 * return FXA_ERR_INVALID_ARG, accessors their documented neutral value
 * (0, 0.0 or ""), initialisers and destroyers do nothing; a call refused on
 * a live context, plan or accumulator leaves a message in
 * fxa_ctx_last_error. A crash fails the test.
 */
#include <stdlib.h>
#include <string.h>

#include "fxattn_diag.h"
#include "testutil.h"
#include "unit_fixtures.h"

#define INVALID(call) CHECK((call) == FXA_ERR_INVALID_ARG, "%s", #call)
/* A refused call on a live context explains itself there. */
#define INVALID_SAID(ctx, call)                                                                    \
    CHECK((call) == FXA_ERR_INVALID_ARG && fxa_ctx_last_error(ctx)[0] != '\0',                     \
          "%s: no refusal or no message", #call)

static void test_context_calls(fxa_ctx *ctx)
{
    fxa_ctx_params_init(NULL);
    INVALID(fxa_ctx_create(NULL, NULL));
    CHECK(fxa_ctx_create_error()[0] != '\0', "fxa_ctx_create(NULL, NULL): no message");
    fxa_ctx_destroy(NULL);
    CHECK(fxa_ctx_threads(NULL) == 0, "fxa_ctx_threads(NULL) is %d", fxa_ctx_threads(NULL));
    CHECK(strcmp(fxa_ctx_isa(NULL), "") == 0, "fxa_ctx_isa(NULL)");
    CHECK(strcmp(fxa_ctx_kernel_info(NULL), "") == 0, "fxa_ctx_kernel_info(NULL)");
    CHECK(strcmp(fxa_ctx_last_error(NULL), "") == 0, "fxa_ctx_last_error(NULL)");
    CHECK(fxa_ctx_threads(ctx) == 2 && fxa_ctx_isa(ctx)[0] != '\0', "the context's accessors");
}

static void test_plan_calls(fxa_ctx *ctx, const fxa_attn_desc *d)
{
    fxa_attn_plan *plan = (fxa_attn_plan *)&plan;
    size_t ws = 0;
    fxa_attn_desc_init(NULL);
    CHECK(fxa_attn_flops(NULL) == 0.0, "fxa_attn_flops(NULL)");
    INVALID(fxa_attn_plan_create(NULL, d, &plan, &ws));
    CHECK(plan == NULL, "a failed plan_create leaves *plan_out NULL");
    INVALID_SAID(ctx, fxa_attn_plan_create(ctx, NULL, &plan, &ws));
    INVALID_SAID(ctx, fxa_attn_plan_create(ctx, d, NULL, &ws));
    INVALID_SAID(ctx, fxa_attn_plan_create(ctx, d, &plan, NULL));
    INVALID(fxa_attn_plan_create(NULL, NULL, NULL, NULL));
    fxa_attn_plan_destroy(NULL);
    fxa_attn_plan_set_progress(NULL, NULL, NULL);
    INVALID(fxa_attn_run(NULL, NULL, NULL, NULL));
    INVALID(fxa_attn_bounds(NULL, NULL, NULL, NULL));
    CHECK(fxa_kv_summary_len(NULL) == 0, "fxa_kv_summary_len(NULL)");
    INVALID(fxa_kv_summarize(NULL, NULL, NULL, 0, NULL));
    fxa_check_head head;
    INVALID(fxa_attn_check(NULL, NULL, NULL, NULL, NULL, 0, NULL, 0));
    INVALID_SAID(ctx, fxa_attn_check(ctx, NULL, NULL, NULL, NULL, 0, &head, sizeof head));
    fxa_check_desc cd;
    fxa_check_desc_init(NULL);
    fxa_check_desc_init(&cd);
    cd.attn = d;
    fxa_check_plan *check = (fxa_check_plan *)&check;
    INVALID(fxa_check_plan_create(NULL, &cd, &check, &ws));
    CHECK(check == NULL, "a failed check_plan_create leaves *plan_out NULL");
    INVALID_SAID(ctx, fxa_check_plan_create(ctx, NULL, &check, &ws));
    INVALID_SAID(ctx, fxa_check_plan_create(ctx, &cd, NULL, &ws));
    INVALID_SAID(ctx, fxa_check_plan_create(ctx, &cd, &check, NULL));
    fxa_check_plan_destroy(NULL);
    INVALID(fxa_check_run(NULL, NULL, NULL, NULL, 0));
    CHECK(fxa_check_plan_create(ctx, &cd, &check, &ws) == FXA_OK, "check plan: %s",
          fxa_ctx_last_error(ctx));
    INVALID_SAID(ctx, fxa_check_run(check, NULL, NULL, NULL, 0));
    INVALID_SAID(ctx, fxa_check_run(check, NULL, NULL, &head, sizeof head));
    fxa_check_plan_destroy(check);
    INVALID(fxa_convert_f32(NULL, FXA_BF16, NULL, 4));
    CHECK(fxa_status_str(FXA_OK) != NULL && fxa_version() != NULL, "static strings");
}

static void test_run_calls(fxa_ctx *ctx, const fxa_attn_desc *d)
{
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_plan_create(ctx, d, &plan, &ws_bytes) == FXA_OK, "plan: %s",
          fxa_ctx_last_error(ctx));
    void *ws = unit_ws_alloc(ws_bytes);
    float q[4 * 8] = {0}, k[4 * 8] = {0}, v[4 * 8] = {0}, out[4 * 8];
    const fxa_attn_args args = {.struct_size = sizeof args, .q = q, .k = k, .v = v, .out = out};
    INVALID_SAID(ctx, fxa_attn_run(plan, NULL, ws, NULL));
    INVALID_SAID(ctx, fxa_attn_bounds(plan, NULL, ws, NULL));
    CHECK(fxa_attn_run(plan, &args, ws, NULL) == FXA_OK, "run: %s", fxa_ctx_last_error(ctx));
    INVALID_SAID(ctx, fxa_kv_summarize(plan, NULL, NULL, 4, NULL));
    double sums[12];
    INVALID_SAID(ctx, fxa_kv_summarize(plan, NULL, v, 4, sums));
    INVALID_SAID(ctx, fxa_kv_summarize(plan, k, v, 4, NULL));
    fxa_attn_acc *acc = (fxa_attn_acc *)&acc;
    INVALID(fxa_attn_acc_create(NULL, &acc));
    CHECK(acc == NULL, "a failed acc_create leaves *acc_out NULL");
    INVALID_SAID(ctx, fxa_attn_acc_create(plan, NULL));
    INVALID(fxa_attn_acc_create(NULL, NULL));
    fxa_attn_acc_destroy(NULL);
    fxa_attn_acc_set_progress(NULL, NULL, NULL);
    INVALID(fxa_attn_acc_begin(NULL, NULL, NULL, 1));
    INVALID(fxa_attn_acc_add(NULL, NULL, NULL, 0));
    INVALID(fxa_attn_acc_finish(NULL, NULL, NULL));
    INVALID(fxa_attn_acc_reserve(NULL, 2));
    CHECK(fxa_attn_acc_create(plan, &acc) == FXA_OK, "acc");
    INVALID_SAID(ctx, fxa_attn_acc_reserve(acc, 0));
    CHECK(fxa_attn_acc_reserve(acc, 3) == FXA_OK, "reserve: %s", fxa_ctx_last_error(ctx));
    CHECK(fxa_kv_summarize(plan, k, v, 4, sums) == FXA_OK, "summarise");
    INVALID_SAID(ctx, fxa_attn_acc_begin(acc, NULL, sums, 1));
    INVALID_SAID(ctx, fxa_attn_acc_begin(acc, q, NULL, 1));
    CHECK(fxa_attn_acc_begin(acc, q, sums, 1) == FXA_OK, "begin");
    INVALID_SAID(ctx, fxa_attn_acc_add(acc, NULL, v, 4));
    INVALID_SAID(ctx, fxa_attn_acc_add(acc, k, NULL, 4));
    CHECK(fxa_attn_acc_add(acc, k, v, 4) == FXA_OK, "add");
    INVALID_SAID(ctx, fxa_attn_acc_finish(acc, NULL, NULL));
    CHECK(fxa_attn_acc_finish(acc, &args, NULL) == FXA_OK, "finish");
    fxa_attn_acc_destroy(acc);
    fxa_attn_plan_destroy(plan);
    free(ws);
}

/* The backward: plan creation, runs, flops and destroy. */
static void test_bwd_calls(fxa_ctx *ctx, const fxa_attn_desc *d)
{
    fxa_attn_bwd_plan *plan = NULL;
    size_t ws = 0;
    INVALID(fxa_attn_bwd_plan_create(NULL, d, &plan, &ws));
    INVALID_SAID(ctx, fxa_attn_bwd_plan_create(ctx, NULL, &plan, &ws));
    INVALID_SAID(ctx, fxa_attn_bwd_plan_create(ctx, d, NULL, &ws));
    INVALID_SAID(ctx, fxa_attn_bwd_plan_create(ctx, d, &plan, NULL));
    fxa_attn_bwd_plan_destroy(NULL);
    CHECK(fxa_attn_bwd_flops(NULL) == 0.0, "fxa_attn_bwd_flops(NULL)");
    CHECK(fxa_attn_bwd_plan_create(ctx, d, &plan, &ws) == FXA_OK, "bwd plan: %s",
          fxa_ctx_last_error(ctx));
    void *w = unit_ws_alloc(ws);
    float x[32] = {0}, lse[4] = {0}, g[3][32];
    const fxa_attn_bwd_args a = fxt_bwd_args(x, x, x, x, x, lse, g[0], g[1], g[2]);
    INVALID(fxa_attn_bwd_run(NULL, &a, w, NULL));
    INVALID_SAID(ctx, fxa_attn_bwd_run(plan, NULL, w, NULL));
    INVALID_SAID(ctx, fxa_attn_bwd_run(plan, &a, NULL, NULL));
    fxa_attn_bwd_args b = a;
    b.dout = NULL;
    INVALID_SAID(ctx, fxa_attn_bwd_run(plan, &b, w, NULL));
    b = a;
    b.lse = NULL;
    INVALID_SAID(ctx, fxa_attn_bwd_run(plan, &b, w, NULL));
    b = a;
    b.dk = NULL;
    INVALID_SAID(ctx, fxa_attn_bwd_run(plan, &b, w, NULL));
    free(w);
    fxa_attn_bwd_plan_destroy(plan);
}

int main(void)
{
    fxa_ctx *ctx = fxt_ctx(2);
    if (!ctx)
        return 1;
    fxa_attn_desc d;
    fxt_attn_desc(&d, 1, 1, 1, 4, 4, 8);
    test_context_calls(ctx);
    test_plan_calls(ctx, &d);
    test_run_calls(ctx, &d);
    test_bwd_calls(ctx, &d);
    fxa_ctx_destroy(ctx);
    return test_summary("test_api_null");
}
