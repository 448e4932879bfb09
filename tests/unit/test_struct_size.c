/*
 * test_struct_size: versioned structs (fxattn.h, "Conventions";
 * src/base/struct_size.h).
 *
 *  - fxa_attn_desc: a 0.1-sized struct (ending at block_q) is accepted, the
 *    bytes past it ignored (filled with garbage here) and the 0.2 fields
 *    defaulted: the output equals the full struct's bit for bit; likewise a
 *    0.2-sized one (ending at out_dtype) with the 0.3 mask fields. One byte
 *    short of 0.1, 0 and one byte past sizeof are refused with a message.
 *  - fxa_attn_stats: struct_size 0.1 gets the 0.1 fields and no byte past
 *    them changes (a canary fills the rest of a larger buffer); the full
 *    struct gets keys too; too small or too large is refused before any
 *    output is written (out and the stats buffer stay as they were), for
 *    fxa_attn_run, fxa_attn_bounds and fxa_attn_acc_finish.
 *  - fxa_attn_args (0.1 ends before mask) and fxa_ctx_params: smaller than 0.1 or larger than now
 *    refused with a message naming the struct.
 *  - Every versioned struct at its first version's size, inside a larger
 *    buffer whose bytes past that size are a canary: fxa_ctx_params,
 *    fxa_attn_args, fxa_check_desc (inputs: accepted, the canary neither
 *    read into the result nor written) and fxa_check_head (an output array
 *    of first-version heads: each head's fields that fit, nothing past
 *    the last one). fxa_check_desc sizes out of range are refused.
 *  - fxa_attn_bwd_args: its first form (ending at dv, before mask) with a
 *    canary past it gives the full struct's gradients bit for bit on an
 *    unmasked plan; on a masked plan it has no mask and is refused (args->mask
 *    NULL); one byte short, 0 and one byte past sizeof are refused.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "base/struct_size.h"
#include "fxattn.h"
#include "fxattn_diag.h"
#include "testutil.h"
#include "unit_fixtures.h"

enum { B = 1, H = 2, S = 40, D = 16 };
#define N ((size_t)(B * H * S * D))

static fxa_ctx *g_ctx;
static float g_q[N], g_k[N], g_v[N];

/* The problem of every run here: B x H heads x S tokens, head dimension D. */
static void init_desc(fxa_attn_desc *d)
{
    fxt_attn_desc(d, B, H, H, S, S, D);
}

/* Plan from a desc buffer, run into out with stats buffer st (may be NULL). */
static fxa_status run(const void *desc, float *out, void *st, int bounds)
{
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    fxa_status s = fxa_attn_plan_create(g_ctx, desc, &plan, &ws_bytes);
    if (s != FXA_OK)
        return s;
    void *ws = unit_ws_alloc(ws_bytes);
    const fxa_attn_args a = {.struct_size = sizeof a, .q = g_q, .k = g_k, .v = g_v, .out = out};
    s = bounds ? fxa_attn_bounds(plan, &a, ws, st) : fxa_attn_run(plan, &a, ws, st);
    free(ws);
    fxa_attn_plan_destroy(plan);
    return s;
}

static void test_desc(void)
{
    static float ref[N], out[N];
    fxa_attn_desc d;
    init_desc(&d);
    CHECK(run(&d, ref, NULL, 0) == FXA_OK, "full desc: %s", fxa_ctx_last_error(g_ctx));
    /* A 0.1 caller: its struct ends at block_q; what follows is not its. */
    unsigned char buf[sizeof(fxa_attn_desc) + 32];
    memset(buf, 0xa5, sizeof buf);
    const size_t old = offsetof(fxa_attn_desc, q_strides);
    CHECK(old == FXA_ATTN_DESC_SIZE_0_1, "0.1 size %zu", old);
    memcpy(buf, &d, old);
    memcpy(buf, &old, sizeof old);
    memset(out, 0, sizeof out);
    CHECK(run(buf, out, NULL, 0) == FXA_OK, "0.1 desc: %s", fxa_ctx_last_error(g_ctx));
    CHECK(memcmp(ref, out, sizeof out) == 0, "0.1 desc: output differs from the full desc's");
    /* A 0.2 caller: its struct ends at out_dtype; the 0.3 mask fields (garbage past it) take
     * their defaults, no mask and not causal. */
    const size_t v02 = offsetof(fxa_attn_desc, causal);
    memset(buf, 0xa5, sizeof buf);
    memcpy(buf, &d, v02);
    memcpy(buf, &v02, sizeof v02);
    memset(out, 0, sizeof out);
    CHECK(run(buf, out, NULL, 0) == FXA_OK, "0.2 desc: %s", fxa_ctx_last_error(g_ctx));
    CHECK(memcmp(ref, out, sizeof out) == 0, "0.2 desc: output differs from the full desc's");
    const size_t bad[3] = {old - 1, 0, sizeof(fxa_attn_desc) + 1};
    for (int i = 0; i < 3; i++) {
        fxa_attn_desc e = d;
        e.struct_size = bad[i];
        fxa_attn_plan *plan = NULL;
        size_t ws = 0;
        CHECK(fxa_attn_plan_create(g_ctx, &e, &plan, &ws) == FXA_ERR_INVALID_ARG && !plan,
              "desc struct_size %zu accepted", bad[i]);
        CHECK(strstr(fxa_ctx_last_error(g_ctx), "fxa_attn_desc.struct_size") != NULL,
              "desc struct_size %zu: message '%s'", bad[i], fxa_ctx_last_error(g_ctx));
    }
}

static void test_stats(void)
{
    static float out[N];
    fxa_attn_desc d;
    init_desc(&d);
    const size_t v01 = FXA_ATTN_STATS_SIZE_0_1;
    CHECK(v01 == offsetof(fxa_attn_stats, keys), "0.1 stats size %zu", v01);
    for (int bounds = 0; bounds < 2; bounds++) {
        /* 0.1-sized: fields up to seconds written, the canary untouched. */
        unsigned char buf[sizeof(fxa_attn_stats) + 64];
        memset(buf, 0xcd, sizeof buf);
        memcpy(buf, &v01, sizeof v01);
        CHECK(run(&d, out, buf, bounds) == FXA_OK, "0.1 stats: %s", fxa_ctx_last_error(g_ctx));
        fxa_attn_stats got;
        memcpy(&got, buf, v01);
        CHECK(got.struct_size == v01, "0.1 stats: struct_size rewritten to %zu", got.struct_size);
        CHECK(got.rows == B * H * S, "0.1 stats: rows %lld", (long long)got.rows);
        size_t touched = 0;
        for (size_t i = v01; i < sizeof buf; i++)
            touched += buf[i] != 0xcd;
        CHECK(touched == 0, "0.1 stats (%s): %zu bytes past struct_size written",
              bounds ? "bounds" : "run", touched);
        /* Full: keys too. */
        fxa_attn_stats full = {.struct_size = sizeof full};
        CHECK(run(&d, out, &full, bounds) == FXA_OK && full.keys == S && full.rows == B * H * S,
              "full stats: keys %lld rows %lld", (long long)full.keys, (long long)full.rows);
        /* Out of range: refused before anything is written. */
        const size_t bad[3] = {v01 - 1, 0, sizeof(fxa_attn_stats) + 8};
        for (int i = 0; i < 3; i++) {
            memset(buf, 0xcd, sizeof buf);
            memcpy(buf, &bad[i], sizeof bad[i]);
            unsigned char saved[sizeof buf];
            memcpy(saved, buf, sizeof buf);
            for (size_t j = 0; j < N; j++)
                out[j] = -1.0f;
            CHECK(run(&d, out, buf, bounds) == FXA_ERR_INVALID_ARG,
                  "stats struct_size %zu accepted", bad[i]);
            CHECK(strstr(fxa_ctx_last_error(g_ctx), "fxa_attn_stats.struct_size") != NULL,
                  "stats struct_size %zu: message '%s'", bad[i], fxa_ctx_last_error(g_ctx));
            CHECK(memcmp(saved, buf, sizeof buf) == 0, "refused stats buffer written");
            CHECK(out[0] == -1.0f && out[N - 1] == -1.0f, "refused run wrote out");
        }
    }
    /* Blockwise finish. */
    fxa_attn_plan *plan = NULL;
    size_t ws = 0;
    CHECK(fxa_attn_plan_create(g_ctx, &d, &plan, &ws) == FXA_OK, "plan");
    fxa_attn_acc *acc = NULL;
    double *sum = malloc(fxa_kv_summary_len(plan) * sizeof(double));
    CHECK(fxa_kv_summarize(plan, g_k, g_v, S, sum) == FXA_OK, "summary");
    CHECK(fxa_attn_acc_create(plan, &acc) == FXA_OK, "acc");
    const fxa_attn_args a = {.struct_size = sizeof a, .out = out};
    for (int pass = 0; pass < 2; pass++) {
        CHECK(fxa_attn_acc_begin(acc, g_q, sum, 1) == FXA_OK, "begin");
        CHECK(fxa_attn_acc_add(acc, g_k, g_v, S) == FXA_OK, "add");
        unsigned char buf[sizeof(fxa_attn_stats) + 64];
        memset(buf, 0xcd, sizeof buf);
        const size_t sz = pass == 0 ? sizeof(fxa_attn_stats) + 1 : v01;
        memcpy(buf, &sz, sizeof sz);
        const fxa_status st = fxa_attn_acc_finish(acc, &a, (fxa_attn_stats *)(void *)buf);
        if (pass == 0) {
            CHECK(st == FXA_ERR_INVALID_ARG, "acc_finish: stats struct_size %zu accepted", sz);
            /* still begun: finish again with a good struct */
            fxa_attn_stats full = {.struct_size = sizeof full};
            CHECK(fxa_attn_acc_finish(acc, &a, &full) == FXA_OK && full.keys == S,
                  "acc_finish after a refused one: %s", fxa_ctx_last_error(g_ctx));
        } else {
            size_t touched = 0;
            for (size_t i = v01; i < sizeof buf; i++)
                touched += buf[i] != 0xcd;
            CHECK(st == FXA_OK && touched == 0, "acc_finish 0.1 stats: %zu bytes past written",
                  touched);
        }
    }
    fxa_attn_acc_destroy(acc);
    free(sum);
    fxa_attn_plan_destroy(plan);
}

static void test_args_and_params(void)
{
    static float out[N];
    fxa_attn_desc d;
    init_desc(&d);
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_plan_create(g_ctx, &d, &plan, &ws_bytes) == FXA_OK, "plan");
    void *ws = unit_ws_alloc(ws_bytes);
    const size_t bad[3] = {FXA_ATTN_ARGS_SIZE_0_1 - 1, 0, sizeof(fxa_attn_args) + 1};
    for (int i = 0; i < 3; i++) {
        fxa_attn_args a = {.struct_size = bad[i], .q = g_q, .k = g_k, .v = g_v, .out = out};
        CHECK(fxa_attn_run(plan, &a, ws, NULL) == FXA_ERR_INVALID_ARG,
              "args struct_size %zu accepted", bad[i]);
        CHECK(strstr(fxa_ctx_last_error(g_ctx), "fxa_attn_args.struct_size") != NULL,
              "args: message '%s'", fxa_ctx_last_error(g_ctx));
    }
    free(ws);
    fxa_attn_plan_destroy(plan);
    const size_t pbad[3] = {sizeof(fxa_ctx_params) - 1, 0, sizeof(fxa_ctx_params) + 1};
    for (int i = 0; i < 3; i++) {
        fxa_ctx_params p;
        fxa_ctx_params_init(&p);
        p.struct_size = pbad[i];
        fxa_ctx *ctx = NULL;
        CHECK(fxa_ctx_create(&p, &ctx) == FXA_ERR_INVALID_ARG && !ctx,
              "ctx params struct_size %zu accepted", pbad[i]);
        CHECK(strstr(fxa_ctx_create_error(), "fxa_ctx_params.struct_size") != NULL,
              "ctx params: message '%s'", fxa_ctx_create_error());
        fxa_ctx_destroy(ctx);
    }
}

/* 1 when buf[from..to) all hold byte c. */
static int canary_intact(const unsigned char *buf, size_t from, size_t to, unsigned char c)
{
    for (size_t i = from; i < to; i++)
        if (buf[i] != c)
            return 0;
    return 1;
}

/* Inputs at their first version's size, a canary past it. */
static void test_first_inputs(void)
{
    static float ref[N], out[N];
    fxa_attn_desc d;
    init_desc(&d);
    CHECK(run(&d, ref, NULL, 0) == FXA_OK, "reference: %s", fxa_ctx_last_error(g_ctx));
    unsigned char buf[256];
    /* fxa_ctx_params */
    const size_t p01 = FXA_CTX_PARAMS_SIZE_0_1;
    fxa_ctx_params p;
    fxa_ctx_params_init(&p);
    p.n_threads = 3;
    memset(buf, 0xa5, sizeof buf);
    memcpy(buf, &p, p01);
    memcpy(buf, &p01, sizeof p01);
    fxa_ctx *ctx = NULL;
    CHECK(fxa_ctx_create((const fxa_ctx_params *)(const void *)buf, &ctx) == FXA_OK &&
              fxa_ctx_threads(ctx) == 3,
          "0.1 ctx params: %s", fxa_ctx_create_error());
    CHECK(canary_intact(buf, p01, sizeof buf, 0xa5), "0.1 ctx params: bytes past it written");
    fxa_ctx_destroy(ctx);
    /* fxa_attn_args */
    const size_t a01 = FXA_ATTN_ARGS_SIZE_0_1;
    const fxa_attn_args a = {.struct_size = a01, .q = g_q, .k = g_k, .v = g_v, .out = out};
    memset(buf, 0xa5, sizeof buf);
    memcpy(buf, &a, a01);
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_plan_create(g_ctx, &d, &plan, &ws_bytes) == FXA_OK, "plan");
    void *ws = unit_ws_alloc(ws_bytes);
    memset(out, 0, sizeof out);
    CHECK(fxa_attn_run(plan, (const fxa_attn_args *)(const void *)buf, ws, NULL) == FXA_OK &&
              memcmp(out, ref, sizeof out) == 0,
          "0.1 args: %s", fxa_ctx_last_error(g_ctx));
    CHECK(canary_intact(buf, a01, sizeof buf, 0xa5), "0.1 args: bytes past it written");
    free(ws);
    fxa_attn_plan_destroy(plan);
    /* fxa_check_desc: its first version is 0.3's. */
    const size_t c03 = FXA_CHECK_DESC_SIZE_0_3;
    fxa_check_desc cd;
    fxa_check_desc_init(&cd);
    cd.attn = &d;
    memset(buf, 0xa5, sizeof buf);
    memcpy(buf, &cd, c03);
    memcpy(buf, &c03, sizeof c03);
    fxa_check_plan *check = NULL;
    CHECK(fxa_check_plan_create(g_ctx, (const fxa_check_desc *)(const void *)buf, &check,
                                &ws_bytes) == FXA_OK,
          "0.3 check desc: %s", fxa_ctx_last_error(g_ctx));
    CHECK(canary_intact(buf, c03, sizeof buf, 0xa5), "0.3 check desc: bytes past it written");
    fxa_check_plan_destroy(check);
    const size_t bad[3] = {c03 - 1, 0, sizeof(fxa_check_desc) + 1};
    for (int i = 0; i < 3; i++) {
        cd.struct_size = bad[i];
        check = (fxa_check_plan *)&cd;
        CHECK(fxa_check_plan_create(g_ctx, &cd, &check, &ws_bytes) == FXA_ERR_INVALID_ARG &&
                  !check && strstr(fxa_ctx_last_error(g_ctx), "fxa_check_desc.struct_size") != NULL,
              "check desc struct_size %zu: '%s'", bad[i], fxa_ctx_last_error(g_ctx));
    }
}

/* fxa_attn_bwd_args at its first form's size and out of range. */
static void test_bwd_args(void)
{
    static float out[N], lse[B * H * S], dout[N], g[3][N], h[3][N];
    static uint8_t keep[S * S];
    for (size_t i = 0; i < N; i++)
        dout[i] = (float)((int)(i * 11 % 13) - 6) * 0.25f;
    for (size_t i = 0; i < (size_t)S * S; i++)
        keep[i] = i % 5 != 2;
    fxa_attn_desc d;
    init_desc(&d);
    for (int masked = 0; masked < 2; masked++) {
        if (masked) {
            d.mask_kind = FXA_MASK_BOOL;
            d.mask_strides = (fxa_mask_strides){0, 0, S, 1};
        }
        fxa_attn_plan *fwd = NULL;
        fxa_attn_bwd_plan *bwd = NULL;
        size_t ws_f = 0, ws_b = 0;
        CHECK(fxa_attn_plan_create(g_ctx, &d, &fwd, &ws_f) == FXA_OK &&
                  fxa_attn_bwd_plan_create(g_ctx, &d, &bwd, &ws_b) == FXA_OK,
              "bwd plans: %s", fxa_ctx_last_error(g_ctx));
        void *wf = unit_ws_alloc(ws_f);
        void *wb = unit_ws_alloc(ws_b);
        fxa_attn_args a = unit_attn_args(g_q, g_k, g_v, out, lse);
        a.mask = masked ? keep : NULL;
        CHECK(fxa_attn_run(fwd, &a, wf, NULL) == FXA_OK, "forward: %s", fxa_ctx_last_error(g_ctx));
        fxa_attn_bwd_args ba = fxt_bwd_args(g_q, g_k, g_v, out, dout, lse, g[0], g[1], g[2]);
        ba.mask = masked ? keep : NULL;
        CHECK(fxa_attn_bwd_run(bwd, &ba, wb, NULL) == FXA_OK, "bwd: %s", fxa_ctx_last_error(g_ctx));
        const size_t first = FXA_ATTN_BWD_ARGS_SIZE_0_3;
        unsigned char buf[256];
        memset(buf, 0xa5, sizeof buf);
        ba.struct_size = first;
        ba.dq = h[0];
        ba.dk = h[1];
        ba.dv = h[2];
        memcpy(buf, &ba, first);
        const fxa_status st =
            fxa_attn_bwd_run(bwd, (const fxa_attn_bwd_args *)(const void *)buf, wb, NULL);
        if (masked)
            CHECK(st == FXA_ERR_INVALID_ARG &&
                      strstr(fxa_ctx_last_error(g_ctx), "args->mask is NULL") != NULL,
                  "first-form bwd args on a masked plan: %d '%s'", (int)st,
                  fxa_ctx_last_error(g_ctx));
        else
            CHECK(st == FXA_OK && memcmp(g, h, sizeof g) == 0,
                  "first-form bwd args: %d '%s' (or other gradients)", (int)st,
                  fxa_ctx_last_error(g_ctx));
        CHECK(canary_intact(buf, first, sizeof buf, 0xa5), "first-form bwd args: bytes written");
        const size_t bad[3] = {first - 1, 0, sizeof(fxa_attn_bwd_args) + 1};
        for (int i = 0; i < 3; i++) {
            ba.struct_size = bad[i];
            CHECK(fxa_attn_bwd_run(bwd, &ba, wb, NULL) == FXA_ERR_INVALID_ARG &&
                      strstr(fxa_ctx_last_error(g_ctx), "fxa_attn_bwd_args.struct_size") != NULL,
                  "bwd args struct_size %zu: '%s'", bad[i], fxa_ctx_last_error(g_ctx));
        }
        free(wf);
        free(wb);
        fxa_attn_bwd_plan_destroy(bwd);
        fxa_attn_plan_destroy(fwd);
    }
}

/* fxa_check_head outputs at the first version's size: each head's fields,
 * its struct_size set, a canary after the last head untouched. */
static void test_first_heads(void)
{
    fxa_attn_desc d;
    init_desc(&d);
    fxa_check_desc cd;
    fxa_check_desc_init(&cd);
    cd.attn = &d;
    fxa_check_plan *check = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_check_plan_create(g_ctx, &cd, &check, &ws_bytes) == FXA_OK, "check plan: %s",
          fxa_ctx_last_error(g_ctx));
    void *ws = unit_ws_alloc(ws_bytes);
    const fxa_attn_args a = {.struct_size = sizeof a, .q = g_q, .k = g_k, .v = g_v};
    fxa_check_head full[H];
    CHECK(fxa_check_run(check, &a, ws, full, sizeof full[0]) == FXA_OK, "check: %s",
          fxa_ctx_last_error(g_ctx));
    const size_t h02 = FXA_CHECK_HEAD_SIZE_0_2;
    unsigned char buf[H * sizeof(fxa_check_head) + 64];
    memset(buf, 0xcd, sizeof buf);
    CHECK(fxa_check_run(check, &a, ws, (fxa_check_head *)(void *)buf, h02) == FXA_OK,
          "0.2 heads: %s", fxa_ctx_last_error(g_ctx));
    for (int h = 0; h < H; h++) {
        fxa_check_head got;
        memcpy(&got, buf + (size_t)h * h02, h02);
        full[h].struct_size = h02;
        CHECK(memcmp(&got, &full[h], h02) == 0, "0.2 head %d differs from the full one's", h);
    }
    CHECK(canary_intact(buf, H * h02, sizeof buf, 0xcd), "0.2 heads: bytes past the last written");
    free(ws);
    fxa_check_plan_destroy(check);
}

int main(void)
{
    g_ctx = fxt_ctx(2);
    if (!g_ctx)
        return 1;
    for (size_t i = 0; i < N; i++) {
        g_q[i] = (float)((int)(i * 7 % 23) - 11) * 0.0625f;
        g_k[i] = (float)((int)(i * 5 % 19) - 9) * 0.0625f;
        g_v[i] = (float)((int)(i * 3 % 17) - 8) * 0.125f;
    }
    test_desc();
    test_stats();
    test_args_and_params();
    test_first_inputs();
    test_first_heads();
    test_bwd_args();
    fxa_ctx_destroy(g_ctx);
    return test_summary("test_struct_size");
}
