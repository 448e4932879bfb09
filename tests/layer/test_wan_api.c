/*
 * libfxattn_wan in-process (fxattn_wan.h): the layer through plan/run on
 * the loader's synthetic weights gives the bytes of `fxattn layer` on the
 * same seed (the CLI is a thin caller of the same library); a head slice
 * holds the bits of those heads in the whole layer; the bf16 layer loads
 * its weights as the fp32 ones rounded once, gives the CLI's bytes, and the
 * same bytes from an fp32 x as from that x rounded to bf16 by the caller;
 * every misuse returns a status and a message and leaves y untouched.
 *
 * Usage: test_wan_api /path/to/fxattn
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>
#include <string.h>

#include "fxattn_npy.h"
#include "fxattn_wan.h"
#include "testutil.h"
#include "wan_fixtures.h"

#define HEADS 8
#define DIM 32
#define HIDDEN (HEADS * DIM)
#define TOKENS 36 /* grid 2 x 3 x 6 */
#define SEED 3

static char g_err[700];

static void desc(fxa_wan_desc *d)
{
    fxa_wan_desc_init(d);
    d->frames = 2;
    d->height = 3;
    d->width = 6;
    d->heads = HEADS;
    d->head_dim = DIM;
}

/* st must be `want` with a message containing `word`. */
static void expect(const char *what, fxa_status st, fxa_status want, const char *msg,
                   const char *word)
{
    CHECK(st == want, "%s: status %s, expected %s", what, fxa_status_str(st), fxa_status_str(want));
    CHECK(strstr(msg, word) != NULL, "%s: message '%s' lacks '%s'", what, msg, word);
}

static void expect_msg(const char *what, fxa_status st, const char *msg, const char *word)
{
    expect(what, st, FXA_ERR_INVALID_ARG, msg, word);
}

static fxa_status load_as(int64_t h0, int64_t nh, fxa_dtype dtype, fxa_wan_weights *w)
{
    fxa_wan_load_params p = wan_synth_params(HEADS, HIDDEN, SEED, dtype);
    p.head_begin = h0;
    p.head_count = nh;
    return fxa_wan_weights_load(NULL, &p, w, g_err, sizeof g_err);
}

static fxa_status load(int64_t h0, int64_t nh, fxa_wan_weights *w)
{
    return load_as(h0, nh, FXA_F32, w);
}

/* The CLI's synthetic x: stream FXA_WAN_SYNTH_X, element token * hidden + c. */
static void synth_x(float *x)
{
    for (int64_t i = 0; i < TOKENS * HIDDEN; i++)
        x[i] = fxa_wan_synth(SEED, FXA_WAN_SYNTH_X, (uint64_t)i);
}

/* fxa_wan_plan_create with its failure's message (the context's) in msg. */
static fxa_status plan_create(fxa_ctx *ctx, const fxa_wan_desc *d, fxa_wan_plan **plan,
                              size_t *bytes, char *msg, size_t cap)
{
    const fxa_status st = fxa_wan_plan_create(ctx, d, plan, bytes);
    if (st != FXA_OK)
        snprintf(msg, cap, "%s", fxa_ctx_last_error(ctx));
    return st;
}

/* plan + run; y and the status. */
static fxa_status run(fxa_ctx *ctx, const fxa_wan_desc *d, const fxa_wan_weights *w, const void *x,
                      float *y, char *msg, size_t cap)
{
    fxa_wan_plan *plan = NULL;
    size_t bytes = 0;
    fxa_status st = plan_create(ctx, d, &plan, &bytes, msg, cap);
    if (st != FXA_OK)
        return st;
    void *ws = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    fxa_wan_stats s = {.struct_size = sizeof s};
    const fxa_wan_args a = {.struct_size = sizeof a, .weights = w, .x = x, .y = y};
    st = ws ? fxa_wan_layer_run(plan, &a, ws, &s) : FXA_ERR_NO_MEMORY;
    if (st != FXA_OK)
        snprintf(msg, cap, "%s", fxa_ctx_last_error(ctx));
    else
        CHECK(s.rows == (int64_t)HEADS * TOKENS, "stats: %lld attention rows, expected %d",
              (long long)s.rows, HEADS * TOKENS);
    free(ws);
    fxa_wan_plan_destroy(plan);
    return st;
}

static void test_cli_bytes(fxa_ctx *ctx, const char *fxattn)
{
    fxa_wan_desc d;
    fxa_wan_weights w;
    desc(&d);
    CHECK(load(0, 0, &w) == FXA_OK, "synthetic weights: %s", g_err);
    float *x = malloc(sizeof(float) * TOKENS * HIDDEN);
    float *y = malloc(sizeof(float) * TOKENS * HIDDEN);
    float *y2 = malloc(sizeof(float) * TOKENS * HIDDEN);
    synth_x(x);
    char msg[700] = "";
    CHECK(run(ctx, &d, &w, x, y, msg, sizeof msg) == FXA_OK, "run: %s", msg);
    CHECK(run(ctx, &d, &w, x, y2, msg, sizeof msg) == FXA_OK, "second run: %s", msg);
    CHECK(memcmp(y, y2, sizeof(float) * TOKENS * HIDDEN) == 0, "two runs differ");

    char dir[] = "/tmp/test_wan_api.XXXXXX", cmd[1200], out[64];
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(out, sizeof out, "%s/y.npy", dir);
    snprintf(cmd, sizeof cmd,
             "'%s' layer --grid 2,3,6 --heads %d --dim %d --seed %d --threads %d -o %s", fxattn,
             HEADS, DIM, SEED, fxa_ctx_threads(ctx), out);
    CHECK(system(cmd) == 0, "fxattn layer failed: %s", cmd);
    fxa_npy a;
    if (fxa_npy_read(out, &a, g_err, sizeof g_err) == FXA_OK) {
        CHECK(a.count == TOKENS * HIDDEN && memcmp(a.data, y, sizeof(float) * TOKENS * HIDDEN) == 0,
              "the library's y differs from fxattn layer's");
        fxa_npy_free(&a);
    } else {
        CHECK(0, "cannot read the CLI's y: %s", g_err);
    }
    remove(out);
    remove(dir);
    free(x);
    free(y);
    free(y2);
    fxa_wan_weights_free(&w);
}

/* n weights of a bf16 load against the fp32 load's, rounded once. */
static int rounded(const uint16_t *h, const float *f, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (h[i] != fxa_f32_to_bf16(f[i]))
            return 0;
    return 1;
}

/* Reads `fxattn layer ... -o` into y; 1 on success. */
static int cli_y(const char *fxattn, int threads, const char *extra, float *y)
{
    char dir[] = "/tmp/test_wan_api.XXXXXX", cmd[1200], out[64];
    if (!mkdtemp(dir))
        return 0;
    snprintf(out, sizeof out, "%s/y.npy", dir);
    snprintf(cmd, sizeof cmd,
             "'%s' layer --grid 2,3,6 --heads %d --dim %d --seed %d --threads %d %s -o %s", fxattn,
             HEADS, DIM, SEED, threads, extra, out);
    int ok = system(cmd) == 0;
    fxa_npy a;
    if (ok && fxa_npy_read(out, &a, g_err, sizeof g_err) == FXA_OK) {
        ok = a.count == TOKENS * HIDDEN;
        if (ok)
            memcpy(y, a.data, sizeof(float) * TOKENS * HIDDEN);
        fxa_npy_free(&a);
    } else {
        ok = 0;
    }
    remove(out);
    remove(dir);
    return ok;
}

static void test_bf16(fxa_ctx *ctx, const char *fxattn)
{
    fxa_wan_weights w32, w16;
    CHECK(load(0, 0, &w32) == FXA_OK && load_as(0, 0, FXA_BF16, &w16) == FXA_OK, "weights: %s",
          g_err);
    CHECK(w16.qkv.format == FXA_PROJ_W_BF16 && w16.o.format == FXA_PROJ_W_BF16 &&
              rounded(w16.qkv.w, w32.qkv.w, 3 * HIDDEN * HIDDEN) &&
              rounded(w16.o.w, w32.o.w, HIDDEN * HIDDEN),
          "bf16 weights are not the fp32 ones rounded once");
    CHECK(memcmp(w16.qkv.bias, w32.qkv.bias, sizeof(float) * 3 * HIDDEN) == 0 &&
              memcmp(w16.gamma_k, w32.gamma_k, sizeof(float) * HIDDEN) == 0,
          "biases and gammas stay fp32");
    fxa_wan_desc d;
    desc(&d);
    d.dtype = FXA_BF16;
    float *x = malloc(sizeof(float) * TOKENS * HIDDEN);
    uint16_t *x16 = malloc(sizeof(uint16_t) * TOKENS * HIDDEN);
    float *y = malloc(sizeof(float) * TOKENS * HIDDEN);
    float *y2 = malloc(sizeof(float) * TOKENS * HIDDEN);
    float *y32 = malloc(sizeof(float) * TOKENS * HIDDEN);
    synth_x(x);
    for (int i = 0; i < TOKENS * HIDDEN; i++)
        x16[i] = fxa_f32_to_bf16(x[i]);
    char msg[700] = "";
    CHECK(run(ctx, &d, &w16, x, y, msg, sizeof msg) == FXA_OK, "bf16 run: %s", msg);
    d.x_format = FXA_PROJ_X_BF16;
    CHECK(run(ctx, &d, &w16, x16, y2, msg, sizeof msg) == FXA_OK, "bf16 x: %s", msg);
    CHECK(memcmp(y, y2, sizeof(float) * TOKENS * HIDDEN) == 0,
          "fp32 x rounded by the layer differs from the caller's bf16 x");
    CHECK(cli_y(fxattn, fxa_ctx_threads(ctx), "--dtype bf16", y2) &&
              memcmp(y, y2, sizeof(float) * TOKENS * HIDDEN) == 0,
          "the library's bf16 y differs from fxattn layer --dtype bf16's");
    desc(&d);
    CHECK(run(ctx, &d, &w32, x, y32, msg, sizeof msg) == FXA_OK, "fp32 run: %s", msg);
    double diff = 0.0, ymax = 0.0;
    for (int i = 0; i < TOKENS * HIDDEN; i++) {
        diff = fmax(diff, fabs((double)y[i] - (double)y32[i]));
        ymax = fmax(ymax, fabs((double)y32[i]));
    }
    CHECK(diff > 0x1p-14 * ymax && diff < 0x1p-5 * ymax,
          "bf16 layer vs fp32: %.3g of max|y| (bf16 storage, not fp32, within 2^-5)", diff / ymax);
    size_t b32 = 0, b16 = 0;
    fxa_wan_plan *p32 = NULL, *p16 = NULL;
    desc(&d);
    CHECK(plan_create(ctx, &d, &p32, &b32, msg, sizeof msg) == FXA_OK, "plan: %s", msg);
    d.dtype = FXA_BF16;
    d.x_format = FXA_PROJ_X_BF16;
    CHECK(plan_create(ctx, &d, &p16, &b16, msg, sizeof msg) == FXA_OK, "plan: %s", msg);
    CHECK(b16 < b32, "the bf16 layer's workspace (%zu B) is not below the fp32 one's (%zu B)", b16,
          b32);
    fxa_wan_plan_destroy(p32);
    fxa_wan_plan_destroy(p16);

    /* A finite fp32 x beyond bf16's range, and a NaN: refused, y untouched. */
    d.x_format = FXA_PROJ_X_F32;
    for (int i = 0; i < TOKENS * HIDDEN; i++)
        y[i] = -7.0f;
    x[3 * HIDDEN + 9] = 3.4e38f;
    expect_msg("x beyond bf16", run(ctx, &d, &w16, x, y, msg, sizeof msg), msg,
               "token 3, feature 9");
    x[3 * HIDDEN + 9] = NAN;
    expect_msg("NaN x in a bf16 layer", run(ctx, &d, &w16, x, y, msg, sizeof msg), msg,
               "token 3, feature 9");
    int untouched = 1;
    for (int i = 0; i < TOKENS * HIDDEN; i++)
        untouched &= y[i] == -7.0f;
    CHECK(untouched, "a failed bf16 run wrote y");
    free(x);
    free(x16);
    free(y);
    free(y2);
    free(y32);
    fxa_wan_weights_free(&w32);
    fxa_wan_weights_free(&w16);
}

static void test_slice_bits(void)
{
    fxa_wan_weights all, part;
    CHECK(load(0, 0, &all) == FXA_OK, "whole layer: %s", g_err);
    CHECK(load(2, 3, &part) == FXA_OK, "heads [2, 5): %s", g_err);
    const int64_t n = 3 * DIM, c0 = 2 * DIM;
    int same = part.head_begin == 2 && part.head_count == 3 && part.qkv.rows == 3 * n;
    for (int m = 0; same && m < 3; m++) /* Q, K, V rows of the slice */
        same = memcmp((float *)part.qkv.w + m * n * HIDDEN,
                      (float *)all.qkv.w + (m * HIDDEN + c0) * HIDDEN,
                      sizeof(float) * (size_t)(n * HIDDEN)) == 0;
    for (int64_t r = 0; same && r < HIDDEN; r++) /* o's columns of the slice */
        same = memcmp((float *)part.o.w + r * n, (float *)all.o.w + r * HIDDEN + c0,
                      sizeof(float) * (size_t)n) == 0;
    same = same && memcmp(part.gamma_q, all.gamma_q + c0, sizeof(float) * (size_t)n) == 0 &&
           memcmp(part.o.bias, all.o.bias, sizeof(float) * HIDDEN) == 0;
    CHECK(same, "heads [2, 5) do not hold the whole layer's bits of those heads");
    fxa_wan_weights_free(&all);
    fxa_wan_weights_free(&part);
}

static void test_errors(fxa_ctx *ctx)
{
    fxa_wan_desc d;
    fxa_wan_weights w, part;
    fxa_wan_plan *plan = NULL;
    size_t bytes = 0;
    char msg[700];

    desc(&d);
    d.struct_size -= 8;
    expect("small desc", plan_create(ctx, &d, &plan, &bytes, msg, sizeof msg), FXA_ERR_INVALID_ARG,
           msg, "struct_size");
    desc(&d);
    d.width = 0;
    expect("empty grid", plan_create(ctx, &d, &plan, &bytes, msg, sizeof msg), FXA_ERR_INVALID_ARG,
           msg, "grid");
    desc(&d);
    d.head_dim = 7;
    expect("odd head_dim", plan_create(ctx, &d, &plan, &bytes, msg, sizeof msg),
           FXA_ERR_INVALID_ARG, msg, "even");
    CHECK(plan == NULL, "a failed plan was returned");
    desc(&d);
    d.dtype = FXA_F16;
    expect("f16 activations", plan_create(ctx, &d, &plan, &bytes, msg, sizeof msg),
           FXA_ERR_INVALID_ARG, msg, "dtype");

    fxa_wan_load_params p = wan_synth_params(7, HIDDEN, 0, FXA_F32);
    expect("7 heads of 256", fxa_wan_weights_load(NULL, &p, &w, msg, sizeof msg),
           FXA_ERR_INVALID_ARG, msg, "divide");
    p.heads = HEADS;
    p.head_begin = 6;
    p.head_count = 3;
    expect("heads past the end", fxa_wan_weights_load(NULL, &p, &w, msg, sizeof msg),
           FXA_ERR_INVALID_ARG, msg, "not within");
    p.head_begin = p.head_count = 0;
    p.dtype = FXA_F16;
    expect("f16 weights", fxa_wan_weights_load(NULL, &p, &w, msg, sizeof msg), FXA_ERR_INVALID_ARG,
           msg, "dtype");
    p.dtype = FXA_F32;
    expect("missing checkpoint",
           fxa_wan_weights_load("/nonexistent/wan.safetensors", &p, &w, msg, sizeof msg),
           FXA_ERR_IO, msg, "/nonexistent/wan.safetensors");

    CHECK(load(0, 0, &w) == FXA_OK && load(0, 4, &part) == FXA_OK, "weights: %s", g_err);
    float *x = malloc(sizeof(float) * TOKENS * HIDDEN);
    float *y = malloc(sizeof(float) * TOKENS * HIDDEN);
    synth_x(x);
    for (int i = 0; i < TOKENS * HIDDEN; i++)
        y[i] = -7.0f;
    desc(&d);
    expect("a head slice for the whole layer", run(ctx, &d, &part, x, y, msg, sizeof msg),
           FXA_ERR_INVALID_ARG, msg, "not the whole layer");
    x[5 * HIDDEN + 17] = NAN;
    expect("NaN in x", run(ctx, &d, &w, x, y, msg, sizeof msg), FXA_ERR_INVALID_ARG, msg,
           "QKV projection");
    int untouched = 1;
    for (int i = 0; i < TOKENS * HIDDEN; i++)
        untouched &= y[i] == -7.0f;
    CHECK(untouched, "a failed run wrote y");
    CHECK(plan_create(ctx, &d, &plan, &bytes, msg, sizeof msg) == FXA_OK, "plan: %s", msg);
    CHECK(fxa_wan_run(plan, &w, NULL, y, y, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "must not be NULL") != NULL,
          "NULL x: '%s'", fxa_ctx_last_error(ctx));
    fxa_wan_plan_destroy(plan);
    free(x);
    free(y);
    fxa_wan_weights_free(&w);
    fxa_wan_weights_free(&part);
}

/* Sizes past int64 or the address space, and a y inside the workspace:
 * refused with a message (the sanitizer builds see any overflow on the
 * way). */
static void test_hostile_sizes(fxa_ctx *ctx)
{
    fxa_wan_desc d;
    fxa_wan_plan *plan = NULL;
    size_t bytes = 0;
    char msg[700];
    const int64_t big = (int64_t)1 << 57;
    desc(&d);
    d.width = big; /* S head_dim floats of RoPE table overflow int64 */
    expect_msg("2^57 tokens", plan_create(ctx, &d, &plan, &bytes, msg, sizeof msg), msg,
               "overflow");
    desc(&d);
    d.heads = big;
    expect_msg("2^57 heads", plan_create(ctx, &d, &plan, &bytes, msg, sizeof msg), msg, "overflow");
    desc(&d);
    d.frames = d.height = (int64_t)1 << 32;
    expect_msg("a grid past int64", plan_create(ctx, &d, &plan, &bytes, msg, sizeof msg), msg,
               "overflows");
    CHECK(plan == NULL, "a failed plan was returned");
    float one[8];
    CHECK(fxa_wan_rope(&d, one, one) == FXA_ERR_INVALID_ARG, "RoPE tables of a grid past int64");
    desc(&d);
    d.width = big;
    CHECK(fxa_wan_rope(&d, one, one) == FXA_ERR_INVALID_ARG, "RoPE tables past the address space");
    CHECK(fxa_wan_flops(NULL) == 0.0, "fxa_wan_flops(NULL)");
    desc(&d);
    CHECK(fxa_wan_flops(&d) == 8.0 * TOKENS * HIDDEN * HIDDEN + 4.0 * TOKENS * TOKENS * HIDDEN,
          "fxa_wan_flops: %g", fxa_wan_flops(&d));

    fxa_wan_load_params p = wan_synth_params(HEADS, HIDDEN, 0, FXA_F32);
    fxa_wan_weights w;
    p.head_begin = INT64_MAX;
    p.head_count = 1;
    expect_msg("head_begin INT64_MAX", fxa_wan_weights_load(NULL, &p, &w, msg, sizeof msg), msg,
               "not within");
    p.head_begin = 1;
    p.head_count = INT64_MAX;
    expect_msg("head_count INT64_MAX", fxa_wan_weights_load(NULL, &p, &w, msg, sizeof msg), msg,
               "not within");
    p.head_begin = p.head_count = 0;
    p.heads = 1;
    p.hidden = (int64_t)1 << 40;
    expect_msg("hidden 2^40", fxa_wan_weights_load(NULL, &p, &w, msg, sizeof msg), msg,
               "too large");

    CHECK(load(0, 0, &w) == FXA_OK, "weights: %s", g_err);
    desc(&d);
    CHECK(plan_create(ctx, &d, &plan, &bytes, msg, sizeof msg) == FXA_OK, "plan: %s", msg);
    float *x = malloc(sizeof(float) * TOKENS * HIDDEN);
    unsigned char *ws = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    synth_x(x);
    for (size_t at = 0; at <= bytes; at += bytes / 2) { /* y over each part of the workspace */
        float *y = (float *)(ws + (at / 64 * 64 < bytes ? at / 64 * 64 : bytes - 64));
        CHECK(fxa_wan_run(plan, &w, x, y, ws, NULL) == FXA_ERR_INVALID_ARG &&
                  strstr(fxa_ctx_last_error(ctx), "overlap") != NULL,
              "y at byte %zu of the workspace: '%s'", at, fxa_ctx_last_error(ctx));
    }
    free(ws);
    /* fxa_wan_stats: written within the caller's struct_size only (canaries
     * past it untouched); a size below the first version's is refused, the
     * struct untouched. */
    float *y = malloc(sizeof(float) * TOKENS * HIDDEN);
    ws = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    unsigned char buf[sizeof(fxa_wan_stats) + 32];
    memset(buf, 0xc3, sizeof buf);
    fxa_wan_stats *st = (fxa_wan_stats *)(void *)buf;
    st->struct_size = sizeof *st;
    CHECK(fxa_wan_run(plan, &w, x, y, ws, st) == FXA_OK, "run: %s", fxa_ctx_last_error(ctx));
    int canary = 1;
    for (size_t i = sizeof *st; i < sizeof buf; i++)
        canary &= buf[i] == 0xc3;
    CHECK(canary && st->rows == (int64_t)HEADS * TOKENS && st->struct_size == sizeof *st,
          "stats: %lld rows, canaries %s", (long long)st->rows, canary ? "kept" : "overwritten");
    memset(buf, 0xc3, sizeof buf);
    st->struct_size = offsetof(fxa_wan_stats, rows);
    CHECK(fxa_wan_run(plan, &w, x, y, ws, st) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "fxa_wan_stats.struct_size") != NULL,
          "stats of %zu bytes: '%s'", st->struct_size, fxa_ctx_last_error(ctx));
    canary = 1;
    for (size_t i = sizeof st->struct_size; i < sizeof buf; i++)
        canary &= buf[i] == 0xc3;
    CHECK(canary, "a refused stats struct was written");
    /* A descriptor of the first version (before dtype) is an fp32 layer: the
     * same y as the current one's default. */
    float *y0 = malloc(sizeof(float) * TOKENS * HIDDEN);
    fxa_wan_desc d0 = d;
    d0.struct_size = offsetof(fxa_wan_desc, dtype);
    d0.dtype = (fxa_dtype)99; /* past its struct_size: not read */
    fxa_wan_plan *plan0 = NULL;
    size_t bytes0 = 0;
    CHECK(plan_create(ctx, &d0, &plan0, &bytes0, msg, sizeof msg) == FXA_OK && bytes0 == bytes,
          "0.1 desc: %s", msg);
    CHECK(plan0 && fxa_wan_run(plan0, &w, x, y0, ws, NULL) == FXA_OK &&
              fxa_wan_run(plan, &w, x, y, ws, NULL) == FXA_OK &&
              memcmp(y, y0, sizeof(float) * TOKENS * HIDDEN) == 0,
          "the 0.1 desc's layer differs: %s", fxa_ctx_last_error(ctx));
    fxa_wan_plan_destroy(plan0);
    free(y0);
    /* Load parameters of the first version (before dtype): fp32 weights,
     * the same bits as the current struct's default. */
    /* dtype 77: past the 0.1 size, not read */
    fxa_wan_load_params lp = wan_synth_params(HEADS, HIDDEN, SEED, (fxa_dtype)77);
    lp.struct_size = offsetof(fxa_wan_load_params, dtype);
    fxa_wan_weights w0;
    CHECK(fxa_wan_weights_load(NULL, &lp, &w0, msg, sizeof msg) == FXA_OK, "0.1 params: %s", msg);
    CHECK(w0.qkv.format == FXA_PROJ_W_F32 && w.qkv.format == FXA_PROJ_W_F32 &&
              memcmp(w0.qkv.w, w.qkv.w, sizeof(float) * 3 * HIDDEN * HIDDEN) == 0,
          "the 0.1 params' weights differ");
    fxa_wan_weights_free(&w0);
    lp.struct_size = offsetof(fxa_wan_load_params, dtype) - 8;
    expect_msg("load params of a size below 0.1's",
               fxa_wan_weights_load(NULL, &lp, &w0, msg, sizeof msg), msg,
               "fxa_wan_load_params.struct_size");
    free(ws);
    free(y);
    free(x);
    fxa_wan_plan_destroy(plan);
    fxa_wan_weights_free(&w);
}

/* fxa_wan_layer_run's fxa_wan_args: the bytes of fxa_wan_run (its
 * wrapper); NULL args and a struct_size outside [0.3's, today's] refused
 * with a message naming them, y untouched. */
static void test_args(fxa_ctx *ctx)
{
    fxa_wan_desc d;
    desc(&d);
    fxa_wan_weights w;
    CHECK(load(0, 0, &w) == FXA_OK, "weights: %s", g_err);
    fxa_wan_plan *plan = NULL;
    size_t bytes = 0;
    char msg[700];
    CHECK(plan_create(ctx, &d, &plan, &bytes, msg, sizeof msg) == FXA_OK, "plan: %s", msg);
    const size_t n = (size_t)TOKENS * HIDDEN;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    float *y_old = malloc(sizeof(float) * n);
    void *ws = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    synth_x(x);
    fxa_wan_args a = {.struct_size = sizeof a, .weights = &w, .x = x, .y = y};
    CHECK(fxa_wan_layer_run(plan, &a, ws, NULL) == FXA_OK &&
              fxa_wan_run(plan, &w, x, y_old, ws, NULL) == FXA_OK &&
              memcmp(y, y_old, sizeof(float) * n) == 0,
          "fxa_wan_run and fxa_wan_layer_run differ: %s", fxa_ctx_last_error(ctx));
    CHECK(fxa_wan_layer_run(plan, NULL, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "NULL args") != NULL,
          "NULL args: '%s'", fxa_ctx_last_error(ctx));
    const size_t sizes[2] = {sizeof(size_t), sizeof a + 8};
    for (int i = 0; i < 2; i++) {
        for (size_t j = 0; j < n; j++)
            y[j] = -7.0f;
        a.struct_size = sizes[i];
        int untouched = 1;
        CHECK(fxa_wan_layer_run(plan, &a, ws, NULL) == FXA_ERR_INVALID_ARG &&
                  strstr(fxa_ctx_last_error(ctx), "fxa_wan_args.struct_size") != NULL,
              "struct_size %zu: '%s'", sizes[i], fxa_ctx_last_error(ctx));
        for (size_t j = 0; j < n; j++)
            untouched &= y[j] == -7.0f;
        CHECK(untouched, "a refused fxa_wan_args wrote y");
    }
    a.struct_size = sizeof a;
    a.x = NULL;
    CHECK(fxa_wan_layer_run(plan, &a, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "must not be NULL") != NULL,
          "NULL x: '%s'", fxa_ctx_last_error(ctx));
    free(ws);
    free(y_old);
    free(y);
    free(x);
    fxa_wan_plan_destroy(plan);
    fxa_wan_weights_free(&w);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s /path/to/fxattn\n", argv[0]);
        return 2;
    }
    fxa_ctx *ctx = fxt_ctx(0);
    if (!ctx)
        return 1;
    test_cli_bytes(ctx, argv[1]);
    test_slice_bits();
    test_bf16(ctx, argv[1]);
    test_errors(ctx);
    test_hostile_sizes(ctx);
    test_args(ctx);
    fxa_ctx_destroy(ctx);
    return test_summary("test_wan_api");
}
