/*
 * Scheduling must never change results: outputs, LSE and fallback flags are
 * bit-identical for any thread count, heads_per_tile and block_q, and for
 * the two layouts (same values, transposed), and across repeated runs on
 * poisoned output buffers, and with a progress hook. Head dim 96 and ragged sequence lengths keep every
 * tail path in play; hot and cold heads keep both the fixed path and the
 * fallback in play.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

typedef struct result {
    float *out;
    float *lse;
    uint8_t *fb;
} result;

static void result_alloc(result *r, const tcase *t)
{
    const size_t rows = (size_t)(t->d.batch * t->d.heads_q * t->d.seq_q);
    r->out = malloc((size_t)t->nq * sizeof(float));
    r->lse = malloc(rows * sizeof(float));
    r->fb = malloc(rows);
    /* Poison: NaN bits everywhere, so an unwritten element cannot match. */
    memset(r->out, 0xff, (size_t)t->nq * sizeof(float));
    memset(r->lse, 0xff, rows * sizeof(float));
    memset(r->fb, 0xff, rows);
}

static void result_free(result *r)
{
    free(r->out);
    free(r->lse);
    free(r->fb);
}

static int result_equal(const result *a, const result *b, const tcase *t)
{
    const size_t rows = (size_t)(t->d.batch * t->d.heads_q * t->d.seq_q);
    return memcmp(a->out, b->out, (size_t)t->nq * sizeof(float)) == 0 &&
           memcmp(a->lse, b->lse, rows * sizeof(float)) == 0 && memcmp(a->fb, b->fb, rows) == 0;
}

static void make_case(tcase *t, fxa_dtype dtype, fxa_layout layout, uint64_t seed)
{
    fxa_attn_desc d;
    fxt_rng r;
    fxa_attn_desc_init(&d);
    d.batch = 2;
    d.heads_q = 8;
    d.heads_kv = 2;
    d.seq_q = 203;
    d.seq_kv = 517;
    d.head_dim = 96;
    d.dtype = dtype;
    d.layout = layout;
    tcase_init(t, &d);
    fxt_rng_seed(&r, seed);
    /* Values depend on (b, h, s, c), not on the layout, so the two layouts
     * hold the same problem. */
    for (int64_t b = 0; b < d.batch; b++) {
        for (int64_t h = 0; h < d.heads_q; h++) {
            const double qs = (h % 4 == 3) ? 16.0 : 1.0; /* hot heads fall back */
            for (int64_t i = 0; i < d.seq_q; i++)
                for (int64_t c = 0; c < d.head_dim; c++)
                    t->q[tcase_q_off(t, b, h, i) + c] = (float)(qs * fxt_rng_normal(&r));
        }
        for (int64_t h = 0; h < d.heads_kv; h++) {
            for (int64_t j = 0; j < d.seq_kv; j++) {
                for (int64_t c = 0; c < d.head_dim; c++) {
                    t->k[tcase_kv_off(t, b, h, j) + c] = (float)(fxt_rng_normal(&r) + 1.0);
                    t->v[tcase_kv_off(t, b, h, j) + c] = (float)fxt_rng_normal(&r);
                }
            }
        }
    }
    tcase_round(t);
}

static void run_into(const tcase *t, int threads, int hpt, int block_q, result *r)
{
    fxa_ctx_params p;
    fxa_ctx *ctx = NULL;
    fxa_attn_desc d = t->d;
    fxa_ctx_params_init(&p);
    p.n_threads = threads;
    d.heads_per_tile = hpt;
    d.block_q = block_q;
    CHECK(fxa_ctx_create(&p, &ctx) == FXA_OK, "context with %d threads", threads);
    fxa_status rc = tcase_run(t, ctx, FXA_MODE_AUTO, &d, r->out, r->lse, r->fb, NULL, NULL);
    CHECK(rc == FXA_OK, "run: %s", fxa_ctx_last_error(ctx));
    fxa_ctx_destroy(ctx);
}

static void count_call(void *arg)
{
    ++*(int *)arg;
}

/* A progress hook (fxa_attn_plan_set_progress): called between batches of
 * work on the calling thread, results bit for bit those without it; turned
 * off again by NULL. */
static void run_with_progress(const tcase *t, const result *ref, const char *name)
{
    fxa_ctx_params cp;
    fxa_ctx *ctx = NULL;
    fxa_ctx_params_init(&cp);
    cp.n_threads = 2;
    CHECK(fxa_ctx_create(&cp, &ctx) == FXA_OK, "context");
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_plan_create(ctx, &t->d, &plan, &ws_bytes) == FXA_OK, "plan: %s",
          fxa_ctx_last_error(ctx));
    void *ws = aligned_alloc(64, (ws_bytes + 63) & ~(size_t)63);
    const int wide = t->d.dtype != FXA_F32;
    result r;
    result_alloc(&r, t);
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = wide ? (const void *)t->q16 : (const void *)t->q,
                             .k = wide ? (const void *)t->k16 : (const void *)t->k,
                             .v = wide ? (const void *)t->v16 : (const void *)t->v,
                             .out = r.out,
                             .lse = r.lse,
                             .row_fallback = r.fb};
    int calls = 0;
    fxa_attn_plan_set_progress(plan, count_call, &calls);
    CHECK(fxa_attn_run(plan, &a, ws, NULL) == FXA_OK, "run: %s", fxa_ctx_last_error(ctx));
    /* The scan, each chunk's packing and at least one wave of work. */
    CHECK(calls >= 3, "%s: the progress hook ran %d times", name, calls);
    CHECK(result_equal(ref, &r, t), "%s: a progress hook changed the results", name);
    const int before = calls;
    fxa_attn_plan_set_progress(plan, NULL, NULL);
    CHECK(fxa_attn_run(plan, &a, ws, NULL) == FXA_OK, "run: %s", fxa_ctx_last_error(ctx));
    CHECK(calls == before, "%s: a removed progress hook still ran", name);
    result_free(&r);
    free(ws);
    fxa_attn_plan_destroy(plan);
    fxa_ctx_destroy(ctx);
}

static void check_dtype(fxa_dtype dtype, const char *name)
{
    static const int threads[] = {2, 3, 7};
    static const int hpts[] = {2, 4, 8};
    static const int blocks[] = {1, 7, 64, 203, 500};
    tcase t;
    result ref;
    make_case(&t, dtype, FXA_LAYOUT_BSHD, 99);
    result_alloc(&ref, &t);
    run_into(&t, 1, 1, 0, &ref);
    int fallbacks = 0;
    for (int64_t i = 0; i < t.d.batch * t.d.heads_q * t.d.seq_q; i++)
        fallbacks += ref.fb[i];
    CHECK(fallbacks > 0 && fallbacks < t.d.batch * t.d.heads_q * t.d.seq_q,
          "%s: both paths must run (%d fallback rows)", name, fallbacks);
    for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++) {
        result r;
        result_alloc(&r, &t);
        run_into(&t, threads[i], 1, 0, &r);
        CHECK(result_equal(&ref, &r, &t), "%s: %d threads differ from 1", name, threads[i]);
        result_free(&r);
    }
    for (size_t i = 0; i < sizeof hpts / sizeof hpts[0]; i++) {
        result r;
        result_alloc(&r, &t);
        run_into(&t, 2, hpts[i], 0, &r);
        CHECK(result_equal(&ref, &r, &t), "%s: heads_per_tile %d differs from 1", name, hpts[i]);
        result_free(&r);
    }
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++) {
        result r;
        result_alloc(&r, &t);
        run_into(&t, 3, 2, blocks[i], &r);
        CHECK(result_equal(&ref, &r, &t), "%s: block_q %d differs", name, blocks[i]);
        result_free(&r);
    }
    run_with_progress(&t, &ref, name);
    /* Same plan twice on a poisoned buffer: no state carried between runs. */
    {
        result r;
        result_alloc(&r, &t);
        run_into(&t, 2, 1, 0, &r);
        memset(r.out, 0xff, (size_t)t.nq * sizeof(float));
        run_into(&t, 2, 1, 0, &r);
        CHECK(result_equal(&ref, &r, &t), "%s: a repeated run differs", name);
        result_free(&r);
    }
    /* BHSD holds the same values transposed: outputs must match bit for bit. */
    {
        tcase tb;
        result r;
        make_case(&tb, dtype, FXA_LAYOUT_BHSD, 99);
        result_alloc(&r, &tb);
        run_into(&tb, 2, 1, 0, &r);
        int same = 1;
        for (int64_t b = 0; b < t.d.batch; b++)
            for (int64_t h = 0; h < t.d.heads_q; h++)
                for (int64_t i = 0; i < t.d.seq_q; i++)
                    same &= memcmp(ref.out + tcase_q_off(&t, b, h, i),
                                   r.out + tcase_q_off(&tb, b, h, i),
                                   (size_t)t.d.head_dim * sizeof(float)) == 0;
        CHECK(same, "%s: BHSD output differs from BSHD", name);
        CHECK(memcmp(ref.lse, r.lse, (size_t)(t.d.batch * t.d.heads_q * t.d.seq_q) * 4) == 0,
              "%s: BHSD lse differs", name);
        result_free(&r);
        tcase_free(&tb);
    }
    result_free(&ref);
    tcase_free(&t);
}

int main(void)
{
    test_require_isa("test_attn_invariance");
    check_dtype(FXA_F32, "f32");
    check_dtype(FXA_BF16, "bf16");
    check_dtype(FXA_F16, "f16");
    return test_summary("test_attn_invariance");
}
