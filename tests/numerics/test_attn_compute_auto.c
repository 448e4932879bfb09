/*
 * FXA_COMPUTE_AUTO: the compute a context chooses by its tiles' rates.
 *
 * - fxa_ctx_compute_choice: f32 and f16 inputs compute in fp32 and measure
 *   nothing; bf16 inputs get bf16 compute exactly when the measured bf16
 *   tile rate is at least 1.25x the fp32 tile's (both measured, positive,
 *   where the kernel set has a bf16 tile of its own; none on the portable
 *   set); the context keeps the choice (a second call returns the same
 *   bytes); bad arguments are refused.
 * - A plan with FXA_COMPUTE_AUTO gives the bytes of a plan with the chosen
 *   compute named, forward and backward, and its stats say which ran.
 * - FXA_AUTO_COMPUTE pins the choice (fp32, bf16: nothing measured) and an
 *   unknown value fails fxa_ctx_create with its name.
 */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

static fxa_ctx *make_ctx(const char *pin)
{
    fxa_ctx *ctx = NULL;
    if (pin)
        setenv("FXA_AUTO_COMPUTE", pin, 1);
    const fxa_status st = fxa_ctx_create(NULL, &ctx);
    unsetenv("FXA_AUTO_COMPUTE");
    CHECK(st == FXA_OK, "context (FXA_AUTO_COMPUTE %s): %s", pin ? pin : "unset",
          fxa_ctx_create_error());
    return ctx;
}

static void check_choice(fxa_ctx *ctx, const char *isa)
{
    fxa_compute_choice c = {.struct_size = sizeof c};
    for (int dtype = FXA_F32; dtype <= FXA_F16; dtype += FXA_F16 - FXA_F32) {
        CHECK(fxa_ctx_compute_choice(ctx, (fxa_dtype)dtype, 128, &c) == FXA_OK, "%s",
              fxa_ctx_last_error(ctx));
        CHECK(c.compute == FXA_COMPUTE_FP32 && c.fp32_gflops == 0.0 && c.bf16_gflops == 0.0,
              "dtype %d: fp32, nothing measured", dtype);
    }
    const int own_bf16_tile = strcmp(isa, "ref") != 0 && strcmp(isa, "avx2") != 0 &&
                              strstr(fxa_ctx_kernel_info(ctx), "portable tile") == NULL;
    for (int64_t dim = 64; dim <= 128; dim += 64) {
        fxa_compute_choice again = {.struct_size = sizeof again};
        CHECK(fxa_ctx_compute_choice(ctx, FXA_BF16, dim, &c) == FXA_OK, "%s",
              fxa_ctx_last_error(ctx));
        CHECK(fxa_ctx_compute_choice(ctx, FXA_BF16, dim, &again) == FXA_OK, "again");
        CHECK(memcmp(&c, &again, sizeof c) == 0, "D %lld: the context keeps its choice",
              (long long)dim);
        printf("  %s D %lld: bf16 inputs compute in %s (bf16 tile %.1f GFLOP/s, fp32 tile %.1f)\n",
               isa, (long long)dim, c.compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32", c.bf16_gflops,
               c.fp32_gflops);
        if (own_bf16_tile) {
            CHECK(c.fp32_gflops > 0.0 && c.bf16_gflops > 0.0, "%s: both tiles measured", isa);
            CHECK((c.compute == FXA_COMPUTE_BF16) == (c.bf16_gflops >= 1.25 * c.fp32_gflops),
                  "%s: bf16 exactly where its tile is 1.25x faster", isa);
        } else {
            CHECK(c.compute == FXA_COMPUTE_FP32 && c.bf16_gflops == 0.0,
                  "%s: a portable bf16 tile is never chosen nor measured", isa);
        }
    }
    CHECK(fxa_ctx_compute_choice(ctx, FXA_BF16, 0, &c) == FXA_ERR_INVALID_ARG, "head_dim 0");
    CHECK(fxa_ctx_compute_choice(ctx, FXA_BF16, FXA_MAX_HEAD_DIM + 1, &c) == FXA_ERR_INVALID_ARG,
          "head_dim past the largest");
    CHECK(fxa_ctx_compute_choice(ctx, (fxa_dtype)7, 64, &c) == FXA_ERR_INVALID_ARG, "dtype 7");
    CHECK(fxa_ctx_compute_choice(ctx, FXA_BF16, 64, NULL) == FXA_ERR_INVALID_ARG, "NULL out");
    CHECK(fxa_ctx_compute_choice(NULL, FXA_BF16, 64, &c) == FXA_ERR_INVALID_ARG, "NULL ctx");
    fxa_compute_choice small = {.struct_size = sizeof small - 1};
    CHECK(fxa_ctx_compute_choice(ctx, FXA_BF16, 64, &small) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "fxa_compute_choice"),
          "a struct_size of another version is refused");
}

/* A bf16 problem with a mix of fixed and fallback rows. */
static void fill(tcase *t, fxt_rng *r)
{
    const fxa_attn_desc *d = &t->d;
    for (int64_t h = 0; h < d->heads_q; h++)
        for (int64_t i = 0; i < d->seq_q; i++)
            for (int64_t c = 0; c < d->head_dim; c++)
                t->q[tcase_q_off(t, 0, h, i) + c] = (float)((h ? 9.0 : 1.0) * fxt_rng_normal(r));
    for (int64_t h = 0; h < d->heads_kv; h++)
        for (int64_t j = 0; j < d->seq_kv; j++)
            for (int64_t c = 0; c < d->head_dim; c++) {
                t->k[tcase_kv_off(t, 0, h, j) + c] = (float)(fxt_rng_normal(r) + 0.5);
                t->v[tcase_kv_off(t, 0, h, j) + c] = (float)fxt_rng_normal(r);
            }
    tcase_round(t);
}

/* out, lse and the gradients of one run with compute c. */
static void run_both(fxa_ctx *ctx, const tcase *t, fxa_compute c, float *out, float *lse,
                     float *grads, fxa_compute *ran)
{
    fxa_attn_desc d = t->d;
    d.compute = c;
    fxa_attn_stats st = {.struct_size = sizeof st};
    CHECK(tcase_run(t, ctx, FXA_MODE_AUTO, &d, out, lse, NULL, NULL, &st) == FXA_OK, "%s",
          fxa_ctx_last_error(ctx));
    *ran = st.compute;
    fxa_attn_bwd_plan *bp = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_bwd_plan_create(ctx, &d, &bp, &ws_bytes) == FXA_OK, "%s",
          fxa_ctx_last_error(ctx));
    void *ws = aligned_alloc(64, (ws_bytes + 64) / 64 * 64);
    const size_t n = (size_t)t->nq;
    float *dout = grads + 3 * n; /* dO = out, a fixed function of the run */
    memcpy(dout, out, n * sizeof *dout);
    const fxa_attn_bwd_args a = {.struct_size = sizeof a,
                                 .q = t->q16,
                                 .k = t->k16,
                                 .v = t->v16,
                                 .out = out,
                                 .dout = dout,
                                 .lse = lse,
                                 .dq = grads,
                                 .dk = grads + n,
                                 .dv = grads + 2 * n};
    CHECK(fxa_attn_bwd_run(bp, &a, ws, NULL) == FXA_OK, "%s", fxa_ctx_last_error(ctx));
    free(ws);
    fxa_attn_bwd_plan_destroy(bp);
}

static void check_runs(fxa_ctx *ctx, fxt_rng *r)
{
    fxa_attn_desc d;
    tcase t;
    fxa_attn_desc_init(&d);
    CHECK(d.compute == FXA_COMPUTE_FP32, "fxa_attn_desc_init keeps fp32 compute");
    d.batch = 1;
    d.heads_q = d.heads_kv = 2;
    d.seq_q = d.seq_kv = 100;
    d.head_dim = 64;
    d.dtype = FXA_BF16;
    tcase_init(&t, &d);
    fill(&t, r);
    fxa_compute_choice c = {.struct_size = sizeof c};
    CHECK(fxa_ctx_compute_choice(ctx, FXA_BF16, 64, &c) == FXA_OK, "choice");
    const size_t n = (size_t)t.nq;
    const size_t rows = (size_t)(d.heads_q * d.seq_q);
    float *buf[2][3];
    fxa_compute ran[2];
    for (int i = 0; i < 2; i++) {
        buf[i][0] = calloc(n, sizeof(float));
        buf[i][1] = calloc(rows, sizeof(float));
        buf[i][2] = calloc(4 * n, sizeof(float));
        run_both(ctx, &t, i ? c.compute : FXA_COMPUTE_AUTO, buf[i][0], buf[i][1], buf[i][2],
                 &ran[i]);
    }
    CHECK(ran[0] == c.compute && ran[1] == c.compute, "stats name the compute that ran");
    CHECK(memcmp(buf[0][0], buf[1][0], n * sizeof(float)) == 0 &&
              memcmp(buf[0][1], buf[1][1], rows * sizeof(float)) == 0 &&
              memcmp(buf[0][2], buf[1][2], 3 * n * sizeof(float)) == 0,
          "auto gives the chosen compute's bytes (out, lse, dq, dk, dv)");
    /* f32 inputs: auto is fp32. */
    fxa_attn_desc f = d;
    f.dtype = FXA_F32;
    f.compute = FXA_COMPUTE_AUTO;
    fxa_attn_stats st = {.struct_size = sizeof st};
    CHECK(tcase_run(&t, ctx, FXA_MODE_AUTO, &f, buf[0][0], NULL, NULL, NULL, &st) == FXA_OK &&
              st.compute == FXA_COMPUTE_FP32,
          "f32 inputs compute in fp32");
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            free(buf[i][j]);
    tcase_free(&t);
}

static void check_pinned(fxt_rng *r)
{
    static const char *pins[] = {"fp32", "bf16"};
    for (int i = 0; i < 2; i++) {
        fxa_ctx *ctx = make_ctx(pins[i]);
        fxa_compute_choice c = {.struct_size = sizeof c};
        CHECK(fxa_ctx_compute_choice(ctx, FXA_BF16, 128, &c) == FXA_OK, "pinned choice");
        CHECK(c.compute == (i ? FXA_COMPUTE_BF16 : FXA_COMPUTE_FP32) && c.fp32_gflops == 0.0 &&
                  c.bf16_gflops == 0.0,
              "FXA_AUTO_COMPUTE=%s pins bf16 inputs' compute, nothing measured", pins[i]);
        CHECK(fxa_ctx_compute_choice(ctx, FXA_F16, 128, &c) == FXA_OK &&
                  c.compute == FXA_COMPUTE_FP32,
              "f16 inputs stay fp32");
        check_runs(ctx, r); /* both computes through auto, whatever this CPU measures */
        fxa_ctx_destroy(ctx);
    }
    fxa_ctx *ctx = NULL;
    setenv("FXA_AUTO_COMPUTE", "fast", 1);
    const fxa_status st = fxa_ctx_create(NULL, &ctx);
    unsetenv("FXA_AUTO_COMPUTE");
    CHECK(st == FXA_ERR_INVALID_ARG && !ctx && strstr(fxa_ctx_create_error(), "FXA_AUTO_COMPUTE"),
          "an unknown FXA_AUTO_COMPUTE is refused, named");
}

int main(void)
{
    fxt_rng r;
    test_require_isa("test_attn_compute_auto");
    fxt_rng_seed(&r, 77);
    unsetenv("FXA_AUTO_COMPUTE");
    fxa_ctx *ctx = make_ctx(NULL);
    printf("kernels: %s\n", fxa_ctx_isa(ctx));
    check_choice(ctx, fxa_ctx_isa(ctx));
    check_runs(ctx, &r);
    fxa_ctx_destroy(ctx);
    check_pinned(&r);
    return test_summary("test_attn_compute_auto");
}
