/*
 * fxa_proj_run_stats: the GEMM it names is the one the environment asks for
 * (FXA_PROJ_GEMM, FXA_AUTO_COMPUTE), its compute matches that GEMM, the
 * FLOPs are the GEMM's, the times add up, the outputs are the bytes of
 * fxa_proj_run, and a bad struct_size or a failed run leaves the stats (and
 * the outputs) untouched.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "unit_fixtures.h"

#define TOKENS 24
#define IN 64
#define HEADS 2
#define DIM 16
#define OUT (3 * HEADS * DIM)

typedef struct problem {
    float x[TOKENS * IN], w[OUT * IN];
    uint16_t x16[TOKENS * IN], w16[OUT * IN];
    float q[TOKENS * HEADS * DIM], k[TOKENS * HEADS * DIM], v[TOKENS * HEADS * DIM];
} problem;

static void fill(problem *p)
{
    fxt_rng r;
    fxt_rng_seed(&r, 7);
    for (int i = 0; i < TOKENS * IN; i++) {
        p->x16[i] = fxa_f32_to_bf16((float)fxt_rng_uniform(&r) - 0.5f);
        p->x[i] = fxa_bf16_to_f32(p->x16[i]);
    }
    for (int i = 0; i < OUT * IN; i++) {
        p->w16[i] = fxa_f32_to_bf16(0.25f * ((float)fxt_rng_uniform(&r) - 0.5f));
        p->w[i] = fxa_bf16_to_f32(p->w16[i]);
    }
}

static void desc(fxa_proj_desc *d, int bf16)
{
    fxa_proj_desc_init(d);
    d->tokens = TOKENS;
    d->in_features = IN;
    d->heads_q = d->heads_kv = HEADS;
    d->head_dim = DIM;
    d->x_format = bf16 ? FXA_PROJ_X_BF16 : FXA_PROJ_X_F32;
    d->w_format = bf16 ? FXA_PROJ_W_BF16 : FXA_PROJ_W_F32;
}

static fxa_proj_args args(problem *p, int bf16)
{
    const fxa_proj_args a = {.struct_size = sizeof a,
                             .x = bf16 ? (const void *)p->x16 : (const void *)p->x,
                             .w = bf16 ? (const void *)p->w16 : (const void *)p->w,
                             .q_out = p->q,
                             .k_out = p->k,
                             .v_out = p->v};
    return a;
}

/* One plan of the given operands on a fresh context made under the
 * environment (name=value, or NULL): the stats of a run, which must give
 * the bytes of fxa_proj_run. Returns the status of the run with stats. */
static fxa_status run_with(problem *p, int bf16, const char *name, const char *value,
                           fxa_proj_stats *s)
{
    fxa_ctx *ctx = unit_ctx_with_env(name, value, 2);
    if (!ctx)
        return FXA_ERR_INTERNAL;
    fxa_proj_desc d;
    desc(&d, bf16);
    fxa_proj_plan *plan = NULL;
    size_t bytes = 0;
    fxa_status st = fxa_proj_plan_create(ctx, &d, &plan, &bytes);
    CHECK(st == FXA_OK, "plan: %s", fxa_ctx_last_error(ctx));
    void *ws = unit_ws_alloc(bytes);
    fxa_proj_args a = args(p, bf16);
    if (st == FXA_OK && ws) {
        st = fxa_proj_run(plan, &a, ws);
        static float q0[TOKENS * HEADS * DIM];
        memcpy(q0, p->q, sizeof q0);
        memset(p->q, 0, sizeof p->q);
        st = st == FXA_OK ? fxa_proj_run_stats(plan, &a, ws, s) : st;
        CHECK(st != FXA_OK || memcmp(q0, p->q, sizeof q0) == 0,
              "fxa_proj_run_stats wrote other bytes than fxa_proj_run");
    }
    free(ws);
    fxa_proj_plan_destroy(plan);
    fxa_ctx_destroy(ctx);
    return st;
}

static int is_bf16_gemm(fxa_proj_gemm g)
{
    return g == FXA_PROJ_GEMM_ONEDNN_BF16 || g == FXA_PROJ_GEMM_AMX;
}

/* What a successful run reports, whatever its GEMM. */
static void check_report(const fxa_proj_stats *s, const char *label)
{
    CHECK(fxa_proj_gemm_name(s->gemm)[0] != '\0', "%s: gemm %d has no name", label, (int)s->gemm);
    CHECK(s->compute == (is_bf16_gemm(s->gemm) ? FXA_COMPUTE_BF16 : FXA_COMPUTE_FP32),
          "%s: compute %d beside gemm %s", label, (int)s->compute, fxa_proj_gemm_name(s->gemm));
    CHECK(s->flops == 2.0 * TOKENS * IN * OUT, "%s: flops %g", label, s->flops);
    CHECK(s->gemm_seconds >= 0.0 && s->epilogue_seconds >= 0.0 &&
              s->seconds >= s->gemm_seconds + s->epilogue_seconds - 1e-9,
          "%s: seconds %g, gemm %g, epilogue %g", label, s->seconds, s->gemm_seconds,
          s->epilogue_seconds);
    printf("  %s: %s, %s compute\n", label, fxa_proj_gemm_name(s->gemm),
           s->compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32");
}

static void test_gemm_named(problem *p)
{
    fxa_proj_stats s = {.struct_size = sizeof s};
    CHECK(run_with(p, 0, "FXA_PROJ_GEMM", "openblas", &s) == FXA_OK, "fp32 on openblas");
    CHECK(s.gemm == FXA_PROJ_GEMM_OPENBLAS, "FXA_PROJ_GEMM=openblas ran %s",
          fxa_proj_gemm_name(s.gemm));
    check_report(&s, "fp32, FXA_PROJ_GEMM=openblas");
    CHECK(run_with(p, 0, "FXA_PROJ_GEMM", "onednn", &s) == FXA_OK, "fp32 on onednn");
    CHECK(s.gemm == FXA_PROJ_GEMM_ONEDNN_F32, "FXA_PROJ_GEMM=onednn ran %s",
          fxa_proj_gemm_name(s.gemm));
    check_report(&s, "fp32, FXA_PROJ_GEMM=onednn");
    CHECK(run_with(p, 1, "FXA_AUTO_COMPUTE", "fp32", &s) == FXA_OK, "bf16 operands, fp32");
    CHECK(!is_bf16_gemm(s.gemm), "FXA_AUTO_COMPUTE=fp32 ran %s", fxa_proj_gemm_name(s.gemm));
    check_report(&s, "bf16 operands, FXA_AUTO_COMPUTE=fp32");
    /* bf16 products need AVX512-BF16; elsewhere the fp32 GEMM runs. */
    CHECK(run_with(p, 1, "FXA_AUTO_COMPUTE", "bf16", &s) == FXA_OK, "bf16 operands, bf16");
    check_report(&s, "bf16 operands, FXA_AUTO_COMPUTE=bf16");
    CHECK(run_with(p, 1, NULL, NULL, &s) == FXA_OK, "bf16 operands, automatic");
    check_report(&s, "bf16 operands, automatic");
}

/* A struct_size out of range and a failed run leave the stats and the
 * outputs as they were. */
static void test_untouched(problem *p)
{
    fxa_ctx *ctx = fxt_ctx(1);
    if (!ctx) {
        CHECK(0, "context");
        return;
    }
    fxa_proj_desc d;
    desc(&d, 0);
    fxa_proj_plan *plan = NULL;
    size_t bytes = 0;
    CHECK(fxa_proj_plan_create(ctx, &d, &plan, &bytes) == FXA_OK, "plan");
    void *ws = unit_ws_alloc(bytes);
    fxa_proj_args a = args(p, 0);
    const size_t sizes[] = {sizeof(size_t), sizeof(fxa_proj_stats) - 8, sizeof(fxa_proj_stats) + 8};
    for (size_t i = 0; plan && ws && i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char buf[sizeof(fxa_proj_stats) + 16];
        memset(buf, 0xa5, sizeof buf);
        memcpy(buf, &sizes[i], sizeof sizes[i]);
        memset(p->q, 0x5a, sizeof p->q);
        const fxa_status st = fxa_proj_run_stats(plan, &a, ws, (fxa_proj_stats *)(void *)buf);
        CHECK(st == FXA_ERR_INVALID_ARG, "struct_size %zu: status %d", sizes[i], (int)st);
        CHECK(strstr(fxa_ctx_last_error(ctx), "fxa_proj_stats.struct_size") != NULL,
              "struct_size %zu: message '%s'", sizes[i], fxa_ctx_last_error(ctx));
        int same = 1;
        for (size_t j = sizeof(size_t); j < sizeof buf; j++)
            same &= buf[j] == 0xa5;
        CHECK(same, "struct_size %zu: stats written", sizes[i]);
        CHECK(((const unsigned char *)p->q)[0] == 0x5a, "struct_size %zu: q written", sizes[i]);
    }
    p->x[5] = NAN;
    unsigned char buf[sizeof(fxa_proj_stats)];
    memset(buf, 0xa5, sizeof buf);
    const size_t size = sizeof buf;
    memcpy(buf, &size, sizeof size);
    CHECK(plan && ws &&
              fxa_proj_run_stats(plan, &a, ws, (fxa_proj_stats *)(void *)buf) ==
                  FXA_ERR_INVALID_ARG,
          "NaN in x");
    int same = 1;
    for (size_t j = sizeof(size_t); j < sizeof buf; j++)
        same &= buf[j] == 0xa5;
    CHECK(same, "a failed run wrote its stats");
    p->x[5] = 0.0f;
    CHECK(plan && ws && fxa_proj_run_stats(plan, &a, ws, NULL) == FXA_OK, "NULL stats: %s",
          fxa_ctx_last_error(ctx));
    CHECK(fxa_proj_run_stats(NULL, &a, ws, NULL) == FXA_ERR_INVALID_ARG, "NULL plan");
    free(ws);
    fxa_proj_plan_destroy(plan);
    fxa_ctx_destroy(ctx);
}

static void test_names(void)
{
    const char *names[] = {"openblas", "onednn_f32", "onednn_bf16", "amx"};
    for (int g = 0; g < 4; g++)
        CHECK(strcmp(fxa_proj_gemm_name((fxa_proj_gemm)g), names[g]) == 0, "gemm %d: '%s'", g,
              fxa_proj_gemm_name((fxa_proj_gemm)g));
    CHECK(strcmp(fxa_proj_gemm_name((fxa_proj_gemm)99), "") == 0, "gemm 99 has a name");
}

int main(void)
{
    static problem p;
    fill(&p);
    test_names();
    test_gemm_named(&p);
    test_untouched(&p);
    return test_summary("test_proj_stats");
}
