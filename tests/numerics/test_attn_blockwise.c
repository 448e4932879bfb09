/*
 * Blockwise attention (fxa_kv_summarize / fxa_attn_acc_*), the engine of the
 * ring: one block is bit-identical to fxa_attn_run; several blocks (uneven,
 * empty, added in any order) stay within the fp32 envelope of the fp64
 * reference; a sink or a huge V in one block is handled globally; misuse is
 * refused (a block that is not one of the summarised ones, outputs that
 * overlap Q), leaving the accumulator usable.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "blockwise_fixtures.h"
#include "fxattn_diag.h"
#include "testutil.h"

static fxa_ctx *g_ctx;

static void fill_normal(tcase *t, fxt_rng *r, double qscale)
{
    for (int64_t i = 0; i < t->nq; i++)
        t->q[i] = (float)(qscale * fxt_rng_normal(r));
    for (int64_t i = 0; i < t->nkv; i++) {
        t->k[i] = (float)fxt_rng_normal(r);
        t->v[i] = (float)fxt_rng_normal(r);
    }
}

static int same_bits(const void *a, const void *b, size_t bytes)
{
    return memcmp(a, b, bytes) == 0;
}

/* One block: the same bits as fxa_attn_run (2048 query rows per head: the
 * run splits no keys either). */
static void test_single_block(fxa_layout layout, fxa_dtype dtype, int center)
{
    fxa_attn_desc d;
    tcase t;
    fxt_rng r;
    fxt_rng_seed(&r, 100 + (uint64_t)layout * 10 + (uint64_t)dtype * 3 + (uint64_t)center);
    fxt_attn_desc(&d, 1, 4, 2, 2048, 300, 24);
    d.layout = layout;
    d.dtype = dtype;
    d.center = center;
    tcase_init(&t, &d);
    fill_normal(&t, &r, 1.0);
    tcase_round(&t);
    run_out a;
    run_out b;
    run_out_init(&a, &t);
    run_out_init(&b, &t);
    const size_t rows = (size_t)(d.batch * d.heads_q * d.seq_q);
    fxa_status s1 = tcase_run(&t, g_ctx, d.mode, NULL, a.out, a.lse, a.fb, a.bound, &a.st);
    const int64_t sizes[1] = {300};
    const int order[1] = {0};
    fxa_status s2 = run_blocks(g_ctx, &t, sizes, 1, order, &b);
    CHECK(s1 == FXA_OK && s2 == FXA_OK, "runs failed: %s", fxa_ctx_last_error(g_ctx));
    CHECK(same_bits(a.out, b.out, (size_t)t.nq * 4), "layout %d dtype %d center %d: out bits",
          layout, dtype, center);
    CHECK(same_bits(a.lse, b.lse, rows * 4), "lse bits");
    CHECK(same_bits(a.fb, b.fb, rows), "fallback flags");
    CHECK(same_bits(a.bound, b.bound, rows * 4), "bounds");
    CHECK(a.st.fallback_rows == b.st.fallback_rows && a.st.c_min == b.st.c_min &&
              a.st.max_bound == b.st.max_bound && a.st.gate_centered == b.st.gate_centered,
          "stats agree");
    run_out_free(&a);
    run_out_free(&b);
    tcase_free(&t);
}

/* Uneven blocks, one empty, added out of order, GQA, batch 2: within the
 * envelope, and close to the single run. */
static void test_uneven_blocks(fxa_dtype dtype, int center)
{
    fxa_attn_desc d;
    tcase t;
    fxt_rng r;
    fxt_rng_seed(&r, 200 + (uint64_t)dtype * 2 + (uint64_t)center);
    fxt_attn_desc(&d, 2, 6, 3, 77, 300, 40);
    d.dtype = dtype;
    d.center = center;
    tcase_init(&t, &d);
    fill_normal(&t, &r, 2.0);
    tcase_round(&t);
    const int64_t sizes[4] = {101, 0, 77, 122};
    const int order[4] = {2, 0, 3, 1};
    run_out o;
    run_out_init(&o, &t);
    fxa_status st = run_blocks(g_ctx, &t, sizes, 4, order, &o);
    CHECK(st == FXA_OK, "blocks failed: %s", fxa_ctx_last_error(g_ctx));
    terr e;
    tcase_errors(&t, o.out, o.lse, &e);
    terr_print("uneven blocks", &e);
    CHECK(terr_within_envelope(&e), "uneven blocks (dtype %d, center %d) outside the envelope",
          dtype, center);
    CHECK(o.st.fallback_rows == 0, "ordinary rows stay fixed (%lld fell back)",
          (long long)o.st.fallback_rows);
    CHECK(o.st.c_min == fxa_fixed_m_c(300, o.st.vmax), "C uses the global key count");
    run_out_free(&o);
    tcase_free(&t);
}

/* A sink in the last block only: exactly the rows that fall back in the
 * single run fall back here too; a huge V in one block stays exact. */
static void test_sink_and_huge_v(void)
{
    fxa_attn_desc d;
    tcase t;
    fxt_rng r;
    fxt_rng_seed(&r, 300);
    fxt_attn_desc(&d, 1, 2, 2, 256, 256, 64);
    tcase_init(&t, &d);
    fill_normal(&t, &r, 1.0);
    for (int64_t i = 1; i < d.seq_q; i += 2) {
        float *q = t.q + tcase_q_off(&t, 0, 0, i);
        for (int64_t c = 0; c < d.head_dim; c++)
            q[c] *= 1e-3f;
    }
    float *sink = t.k + tcase_kv_off(&t, 0, 0, 200);
    for (int64_t c = 0; c < d.head_dim; c++)
        sink[c] *= 1000.0f;
    float *big = t.v + tcase_kv_off(&t, 0, 1, 10);
    big[3] = 1e30f;
    const size_t rows = (size_t)(d.heads_q * d.seq_q);
    run_out a;
    run_out b;
    run_out_init(&a, &t);
    run_out_init(&b, &t);
    CHECK(tcase_run(&t, g_ctx, d.mode, NULL, a.out, a.lse, a.fb, a.bound, &a.st) == FXA_OK,
          "single run");
    const int64_t sizes[4] = {64, 64, 64, 64};
    const int order[4] = {1, 2, 3, 0};
    CHECK(run_blocks(g_ctx, &t, sizes, 4, order, &b) == FXA_OK, "blocks: %s",
          fxa_ctx_last_error(g_ctx));
    CHECK(same_bits(a.fb, b.fb, rows), "the same rows fall back");
    CHECK(b.st.fallback_rows == d.seq_q / 2, "the sink head's ordinary rows fall back (%lld)",
          (long long)b.st.fallback_rows);
    CHECK(b.st.vmax == 1e30f, "global Vmax");
    terr e;
    tcase_errors(&t, b.out, b.lse, &e);
    terr_print("sink + huge V in blocks", &e);
    CHECK(terr_within_envelope(&e), "sink + huge V outside the envelope");
    run_out_free(&a);
    run_out_free(&b);
    tcase_free(&t);
}

static void test_misuse(void)
{
    fxa_attn_desc d;
    fxt_attn_desc(&d, 1, 1, 1, 8, 16, 8);
    fxa_attn_plan *plan = NULL;
    size_t ws = 0;
    CHECK(fxa_attn_plan_create(g_ctx, &d, &plan, &ws) == FXA_OK, "plan");
    float q[64];
    float k[128];
    float v[128];
    float out[64];
    for (int i = 0; i < 128; i++) {
        k[i] = (float)(i % 7) - 3.0f;
        v[i] = (float)(i % 5);
        if (i < 64)
            q[i] = 0.25f * (float)(i % 3);
    }
    const size_t len = fxa_kv_summary_len(plan);
    CHECK(len == 12, "summary length %zu", len);
    double sums[2][12];
    CHECK(fxa_kv_summarize(plan, k, v, 17, sums[0]) == FXA_ERR_INVALID_ARG,
          "a block larger than seq_kv is refused");
    CHECK(fxa_kv_summarize(plan, k, v, 16, sums[0]) == FXA_OK, "summarise");
    CHECK(fxa_kv_summarize(plan, k, v, 8, sums[1]) == FXA_OK, "summarise half");
    k[3] = NAN;
    CHECK(fxa_kv_summarize(plan, k, v, 16, sums[1]) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "K has a non-finite") != NULL,
          "a NaN key is refused: %s", fxa_ctx_last_error(g_ctx));
    k[3] = 0.0f;
    CHECK(fxa_kv_summarize(plan, k, v, 8, sums[1]) == FXA_OK, "summarise half again");
    fxa_attn_acc *acc = NULL;
    CHECK(fxa_attn_acc_create(plan, &acc) == FXA_OK, "acc");
    CHECK(fxa_attn_acc_add(acc, k, v, 16) == FXA_ERR_INVALID_ARG, "add before begin");
    double bad[12];
    memcpy(bad, sums[0], sizeof bad);
    bad[0] = 2.5;
    CHECK(fxa_attn_acc_begin(acc, q, bad, 1) == FXA_ERR_INVALID_ARG, "fractional count refused");
    bad[0] = 16.0;
    bad[5] = INFINITY;
    CHECK(fxa_attn_acc_begin(acc, q, bad, 1) == FXA_ERR_INVALID_ARG, "non-finite summary refused");
    q[5] = INFINITY;
    CHECK(fxa_attn_acc_begin(acc, q, &sums[0][0], 2) == FXA_ERR_INVALID_ARG,
          "non-finite Q refused");
    q[5] = 0.0f;
    CHECK(fxa_attn_acc_begin(acc, q, &sums[0][0], 2) == FXA_OK, "begin: %s",
          fxa_ctx_last_error(g_ctx));
    CHECK(fxa_attn_acc_add(acc, k, v, 16) == FXA_OK, "add 16");
    CHECK(fxa_attn_acc_add(acc, k, v, 16) == FXA_ERR_INVALID_ARG, "more keys than summarised");
    fxa_attn_args a = {.struct_size = sizeof a, .out = out};
    CHECK(fxa_attn_acc_finish(acc, &a, NULL) == FXA_ERR_INVALID_ARG, "missing keys at finish");
    CHECK(fxa_attn_acc_add(acc, k, v, 8) == FXA_OK, "add 8");
    CHECK(fxa_attn_acc_finish(acc, &a, NULL) == FXA_OK, "finish");
    CHECK(fxa_attn_acc_finish(acc, &a, NULL) == FXA_ERR_INVALID_ARG, "finish twice");
    fxa_attn_acc_destroy(acc);
    fxa_attn_plan_destroy(plan);
}

/* One pass over blocks A and B (32 keys each): out, and the status of
 * finish. Misuse between begin and the good adds: each misused add must be
 * refused with `word` in the message and leave the rows untouched. */
typedef struct misuse {
    const char *what;
    const char *word;
    const float *k;
    const float *v;
    int64_t n;
    int before; /* 1: tried before block A is added, 0: after both */
} misuse;

/* Adds each block of bad whose .before is `before` to acc: each refused
 * with its word in the message. */
static void refuse_blocks(fxa_attn_acc *acc, const misuse *bad, int n_bad, int before)
{
    for (int i = 0; i < n_bad; i++) {
        if (bad[i].before != before)
            continue;
        const fxa_status st = fxa_attn_acc_add(acc, bad[i].k, bad[i].v, bad[i].n);
        CHECK(st == FXA_ERR_INVALID_ARG && strstr(fxa_ctx_last_error(g_ctx), bad[i].word),
              "%s: status %d, message '%s' (expected '%s')", bad[i].what, (int)st,
              fxa_ctx_last_error(g_ctx), bad[i].word);
    }
}

static void contract_pass(const fxa_attn_plan *plan, const float *q, const double *sums,
                          const float *kv[2][2], const misuse *bad, int n_bad, float *out)
{
    fxa_attn_acc *acc = NULL;
    CHECK(fxa_attn_acc_create(plan, &acc) == FXA_OK, "acc");
    CHECK(fxa_attn_acc_begin(acc, q, sums, 2) == FXA_OK, "begin: %s", fxa_ctx_last_error(g_ctx));
    refuse_blocks(acc, bad, n_bad, 1);
    CHECK(fxa_attn_acc_add(acc, kv[0][0], kv[0][1], 32) == FXA_OK, "add A: %s",
          fxa_ctx_last_error(g_ctx));
    refuse_blocks(acc, bad, n_bad, 0);
    CHECK(fxa_attn_acc_add(acc, kv[1][0], kv[1][1], 32) == FXA_OK, "add B: %s",
          fxa_ctx_last_error(g_ctx));
    const fxa_attn_args a = {.struct_size = sizeof a, .out = out};
    CHECK(fxa_attn_acc_finish(acc, &a, NULL) == FXA_OK, "finish: %s", fxa_ctx_last_error(g_ctx));
    fxa_attn_acc_destroy(acc);
}

/* A block that is not one of the summarised ones (added twice, NaN in V,
 * keys moved beyond the summaries' radius, keys never summarised) is
 * refused, and the pass then gives the same bits as a clean one. */
static void test_block_contract(void)
{
    enum { SQ = 8, SKV = 32, HQ = 2, D = 8 };
    fxa_attn_desc d;
    fxt_attn_desc(&d, 1, HQ, 1, SQ, SKV, D);
    fxa_attn_plan *plan = NULL;
    size_t ws = 0;
    CHECK(fxa_attn_plan_create(g_ctx, &d, &plan, &ws) == FXA_OK, "plan");
    static float q[SQ * HQ * D], k[2][SKV * D], v[2][SKV * D];
    static float k_nan_v[SKV * D], v_nan[SKV * D], k_far[SKV * D], k_new[SKV * D];
    fxt_rng r;
    fxt_rng_seed(&r, 91);
    for (int i = 0; i < SQ * HQ * D; i++)
        q[i] = (float)fxt_rng_normal(&r);
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < SKV * D; i++) {
            k[b][i] = (float)fxt_rng_normal(&r);
            v[b][i] = (float)fxt_rng_normal(&r);
        }
    const size_t len = fxa_kv_summary_len(plan);
    double *sums = calloc(2 * len, sizeof(double));
    for (int b = 0; b < 2; b++)
        CHECK(fxa_kv_summarize(plan, k[b], v[b], SKV, sums + (size_t)b * len) == FXA_OK,
              "summarise");
    const float *kv[2][2] = {{k[0], v[0]}, {k[1], v[1]}};
    static float clean[SQ * HQ * D], after[SQ * HQ * D];
    contract_pass(plan, q, sums, kv, NULL, 0, clean);

    memcpy(k_nan_v, k[1], sizeof k_nan_v);
    memcpy(v_nan, v[1], sizeof v_nan);
    v_nan[5 * D + 3] = NAN;
    memcpy(k_far, k[1], sizeof k_far);
    for (int c = 0; c < D; c++)
        k_far[7 * D + c] *= 1000.0f; /* one key far beyond the radius */
    for (int i = 0; i < SKV * D; i++)
        k_new[i] = (float)fxt_rng_normal(&r); /* same count and spread, never summarised */
    const misuse bad[] = {
        {"block A added twice", "added already", k[0], v[0], SKV, 0},
        {"NaN in V", "V has a non-finite", k_nan_v, v_nan, SKV, 1},
        {"NaN in V after A", "V has a non-finite", k_nan_v, v_nan, SKV, 0},
        {"a key beyond the radius", "none of the summarised blocks", k_far, v[1], SKV, 1},
        {"keys never summarised", "none of the summarised blocks", k_new, v[1], SKV, 0},
        {"first half of B", "none of the summarised blocks", k[1], v[1], SKV / 2, 1},
    };
    contract_pass(plan, q, sums, kv, bad, (int)(sizeof bad / sizeof bad[0]), after);
    CHECK(same_bits(clean, after, sizeof clean),
          "refused blocks changed the result of the blocks added after them");
    free(sums);
    fxa_attn_plan_destroy(plan);
}

/* The outputs of fxa_attn_acc_finish must not overlap Q or each other:
 * refused, nothing written, and the pass can still finish. */
static void test_finish_overlap(void)
{
    enum { SQ = 8, SKV = 16, D = 8 };
    fxa_attn_desc d;
    fxt_attn_desc(&d, 1, 1, 1, SQ, SKV, D);
    fxa_attn_plan *plan = NULL;
    size_t ws = 0;
    CHECK(fxa_attn_plan_create(g_ctx, &d, &plan, &ws) == FXA_OK, "plan");
    float q[SQ * D], q_saved[SQ * D], k[SKV * D], v[SKV * D], out[SQ * D], lse[SQ];
    for (int i = 0; i < SKV * D; i++) {
        k[i] = (float)(i % 7) - 3.0f;
        v[i] = (float)(i % 5);
        if (i < SQ * D)
            q[i] = 0.25f * (float)(i % 3);
    }
    memcpy(q_saved, q, sizeof q);
    double sums[12];
    CHECK(fxa_kv_summarize(plan, k, v, SKV, sums) == FXA_OK, "summarise");
    fxa_attn_acc *acc = NULL;
    CHECK(fxa_attn_acc_create(plan, &acc) == FXA_OK, "acc");
    CHECK(fxa_attn_acc_begin(acc, q, sums, 1) == FXA_OK, "begin");
    CHECK(fxa_attn_acc_add(acc, k, v, SKV) == FXA_OK, "add");
    fxa_attn_args a = {.struct_size = sizeof a, .out = out, .lse = q + 2};
    CHECK(fxa_attn_acc_finish(acc, &a, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "lse overlaps Q"),
          "lse into q: %s", fxa_ctx_last_error(g_ctx));
    CHECK(memcmp(q, q_saved, sizeof q) == 0, "lse into q: Q was written");
    a.lse = out + 1;
    CHECK(fxa_attn_acc_finish(acc, &a, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "out overlaps lse"),
          "lse into out: %s", fxa_ctx_last_error(g_ctx));
    a.lse = lse;
    a.row_bound = (float *)q;
    CHECK(fxa_attn_acc_finish(acc, &a, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "row_bound overlaps Q"),
          "row_bound at q: %s", fxa_ctx_last_error(g_ctx));
    a.row_bound = NULL;
    CHECK(fxa_attn_acc_finish(acc, &a, NULL) == FXA_OK, "finish after refusals: %s",
          fxa_ctx_last_error(g_ctx));
    CHECK(memcmp(q, q_saved, sizeof q) == 0, "Q was written");
    fxa_attn_acc_destroy(acc);
    fxa_attn_plan_destroy(plan);
}

int main(void)
{
    test_require_isa("test_attn_blockwise");
    g_ctx = fxt_ctx(2);
    if (!g_ctx)
        return 1;
    for (int layout = 0; layout < 2; layout++)
        for (int center = 0; center < 2; center++) {
            test_single_block((fxa_layout)layout, FXA_F32, center);
            test_single_block((fxa_layout)layout, FXA_BF16, center);
        }
    test_uneven_blocks(FXA_F32, 1);
    test_uneven_blocks(FXA_F32, 0);
    test_uneven_blocks(FXA_F16, 1);
    test_sink_and_huge_v();
    test_misuse();
    test_block_contract();
    test_finish_overlap();
    fxa_ctx_destroy(g_ctx);
    return test_summary("test_attn_blockwise");
}
