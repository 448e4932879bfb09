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
    fxt_attn_desc(&d, 2, 8, 2, 203, 517, 96);
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
    fxa_ctx *ctx = fxt_ctx(threads);
    fxa_attn_desc d = t->d;
    d.heads_per_tile = hpt;
    d.block_q = block_q;
    CHECK(ctx != NULL, "context with %d threads", threads);
    fxa_status rc = tcase_run(t, ctx, FXA_MODE_AUTO, &d, r->out, r->lse, r->fb, NULL, NULL);
    CHECK(rc == FXA_OK, "run: %s", fxa_ctx_last_error(ctx));
    fxa_ctx_destroy(ctx);
}

/* r: a fresh (poisoned) result, then run_into. */
static void run_fresh(const tcase *t, int threads, int hpt, int block_q, result *r)
{
    result_alloc(r, t);
    run_into(t, threads, hpt, block_q, r);
}

/* Whether run_fresh gives ref's bits. */
static int same_as(const result *ref, const tcase *t, int threads, int hpt, int block_q)
{
    result r;
    run_fresh(t, threads, hpt, block_q, &r);
    const int same = result_equal(ref, &r, t);
    result_free(&r);
    return same;
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
    fxa_ctx *ctx = fxt_ctx(2);
    CHECK(ctx != NULL, "context");
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
    run_fresh(&t, 1, 1, 0, &ref);
    int fallbacks = 0;
    for (int64_t i = 0; i < t.d.batch * t.d.heads_q * t.d.seq_q; i++)
        fallbacks += ref.fb[i];
    CHECK(fallbacks > 0 && fallbacks < t.d.batch * t.d.heads_q * t.d.seq_q,
          "%s: both paths must run (%d fallback rows)", name, fallbacks);
    for (size_t i = 0; i < sizeof threads / sizeof threads[0]; i++)
        CHECK(same_as(&ref, &t, threads[i], 1, 0), "%s: %d threads differ from 1", name,
              threads[i]);
    for (size_t i = 0; i < sizeof hpts / sizeof hpts[0]; i++)
        CHECK(same_as(&ref, &t, 2, hpts[i], 0), "%s: heads_per_tile %d differs from 1", name,
              hpts[i]);
    for (size_t i = 0; i < sizeof blocks / sizeof blocks[0]; i++)
        CHECK(same_as(&ref, &t, 3, 2, blocks[i]), "%s: block_q %d differs", name, blocks[i]);
    run_with_progress(&t, &ref, name);
    /* Same plan twice on a poisoned buffer: no state carried between runs. */
    {
        result r;
        run_fresh(&t, 2, 1, 0, &r);
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
        run_fresh(&tb, 2, 1, 0, &r);
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
