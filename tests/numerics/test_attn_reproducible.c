/*
 * Reproducible attention (fxa_attn_desc.reproducible): one process at 1, 2
 * and 3 threads and blockwise attention over splits of the keys on
 * canonical group edges (FXA_CANONICAL_KEYS; blocks added in key order,
 * empty blocks included) give the same output, LSE and fallback bytes:
 * fp32 and bf16 compute, GQA, batch 2, centring on and off, online mode,
 * rows that fall back to online softmax, and short queries (which a
 * default plan splits into key ranges). Blocks added out of key order give
 * other bits, and without reproducible a split gives other row bounds (the
 * inputs do see an order-dependent sum and merge); the result stays within
 * the fp32 envelope of the fp64 reference.
 */
#include <stdlib.h>
#include <string.h>

#include "blockwise_fixtures.h"
#include "testutil.h"

#define SKV 1000

static fxa_ctx *g_ctx[3]; /* 1, 2 and 3 threads */

typedef struct variant {
    const char *name;
    fxa_dtype dtype;
    fxa_compute compute;
    int center;
    fxa_mode mode;
    double qscale; /* large: rows beyond the gates fall back */
} variant;

/* The splits of SKV keys on group edges (a 0 is an empty block). */
static const int64_t SPLITS[][4] = {{256, 744, -1, -1},
                                    {512, 256, 232, -1},
                                    {0, 256, 0, 744},
                                    {768, 0, 232, -1},
                                    {256, 256, 256, 232}};

static int n_blocks_of(const int64_t *split)
{
    int n = 0;
    while (n < 4 && split[n] >= 0)
        n++;
    return n;
}

static void fill(tcase *t, const variant *v)
{
    fxt_rng r;
    fxt_rng_seed(&r, 4700);
    const int64_t dim = t->d.head_dim;
    for (int64_t i = 0; i < t->nq; i++) /* every third row scaled */
        t->q[i] = (float)((i / dim % 3 ? 1.0 : v->qscale) * fxt_rng_normal(&r));
    for (int64_t i = 0; i < t->nkv; i++) {
        /* Off-centre keys drifting along the sequence (BSHD: token i / (Hkv D)), so that
         * blocks have means of their own and the bound depends on how it is merged. */
        const double drift = 2.0 * (double)(i / (dim * t->d.heads_kv) % SKV) / SKV;
        t->k[i] = (float)(0.5 + drift + fxt_rng_normal(&r));
        t->v[i] = (float)fxt_rng_normal(&r);
    }
    tcase_round(t);
}

/* The same output, LSE, fallback rows and row bounds. */
static int same(const run_out *a, const run_out *b, size_t n_out, size_t rows)
{
    return memcmp(a->out, b->out, n_out * sizeof(float)) == 0 &&
           memcmp(a->lse, b->lse, rows * sizeof(float)) == 0 && memcmp(a->fb, b->fb, rows) == 0 &&
           memcmp(a->bound, b->bound, rows * sizeof(float)) == 0;
}

static void test_variant(const variant *v)
{
    fxa_attn_desc d;
    fxt_attn_desc(&d, 2, 4, 2, 200, SKV, 40);
    d.dtype = v->dtype;
    d.compute = v->compute;
    d.center = v->center;
    d.mode = v->mode;
    d.reproducible = 1;
    tcase t;
    tcase_init(&t, &d);
    fill(&t, v);
    const size_t rows = (size_t)(d.batch * d.heads_q * d.seq_q);
    const size_t n_out = (size_t)t.nq;
    run_out ref;
    run_out_init(&ref, &t);
    CHECK(tcase_run(&t, g_ctx[0], d.mode, NULL, ref.out, ref.lse, ref.fb, ref.bound, &ref.st) ==
              FXA_OK,
          "%s: run: %s", v->name, fxa_ctx_last_error(g_ctx[0]));
    for (int c = 1; c < 3; c++) {
        run_out o;
        run_out_init(&o, &t);
        CHECK(tcase_run(&t, g_ctx[c], d.mode, NULL, o.out, o.lse, o.fb, o.bound, &o.st) == FXA_OK,
              "%s: run on %d threads", v->name, c + 1);
        CHECK(same(&ref, &o, n_out, rows), "%s: %d threads changed the bytes", v->name, c + 1);
        run_out_free(&o);
    }
    const int64_t whole[1] = {SKV};
    const int in_order[4] = {0, 1, 2, 3};
    run_out o;
    run_out_init(&o, &t);
    CHECK(run_blocks(g_ctx[1], &t, whole, 1, in_order, &o) == FXA_OK, "%s: one block: %s", v->name,
          fxa_ctx_last_error(g_ctx[1]));
    CHECK(same(&ref, &o, n_out, rows), "%s: one block differs from the run", v->name);
    run_out_free(&o);
    for (size_t s = 0; s < sizeof SPLITS / sizeof SPLITS[0]; s++) {
        run_out_init(&o, &t);
        CHECK(run_blocks(g_ctx[1], &t, SPLITS[s], n_blocks_of(SPLITS[s]), in_order, &o) == FXA_OK,
              "%s: split %zu: %s", v->name, s, fxa_ctx_last_error(g_ctx[1]));
        CHECK(same(&ref, &o, n_out, rows), "%s: split %zu changed the bytes", v->name, s);
        run_out_free(&o);
    }
    if (v->qscale > 1.0)
        CHECK(ref.st.fallback_rows > 0 && ref.st.fallback_rows < (int64_t)rows,
              "%s: some rows fall back (%lld)", v->name, (long long)ref.st.fallback_rows);
    if (v->dtype == FXA_F32 && v->mode == FXA_MODE_AUTO) {
        terr e;
        tcase_errors(&t, ref.out, ref.lse, &e);
        terr_print(v->name, &e);
        CHECK(terr_within_envelope(&e), "%s: outside the fp32 envelope", v->name);
        /* Blocks added out of key order (a ring's rotation) round otherwise. */
        const int rotated[3] = {2, 0, 1};
        run_out_init(&o, &t);
        CHECK(run_blocks(g_ctx[1], &t, SPLITS[1], 3, rotated, &o) == FXA_OK, "%s: rotated",
              v->name);
        CHECK(!same(&ref, &o, n_out, rows), "%s: rotated blocks gave the same bytes", v->name);
        run_out_free(&o);
    }
    if (v->dtype == FXA_F32 && v->mode == FXA_MODE_AUTO && v->center) {
        /* The same split in key order without reproducible: the blocks' own
         * means and radii give other row bounds (near a gate, other rows
         * would fall back). */
        t.d.reproducible = 0;
        run_out one;
        run_out_init(&o, &t);
        run_out_init(&one, &t);
        CHECK(run_blocks(g_ctx[1], &t, SPLITS[1], 3, in_order, &o) == FXA_OK &&
                  run_blocks(g_ctx[1], &t, whole, 1, in_order, &one) == FXA_OK,
              "%s: default blocks", v->name);
        CHECK(memcmp(one.bound, o.bound, rows * sizeof(float)) != 0,
              "%s: a default split gave the same row bounds", v->name);
        t.d.reproducible = 1;
        run_out_free(&o);
        run_out_free(&one);
    }
    run_out_free(&ref);
    tcase_free(&t);
}

int main(void)
{
    test_require_isa("test_attn_reproducible");
    for (int c = 0; c < 3; c++)
        if (!(g_ctx[c] = fxt_ctx(c + 1)))
            return 1;
    const variant variants[] = {
        {"fp32", FXA_F32, FXA_COMPUTE_FP32, 1, FXA_MODE_AUTO, 1.0},
        {"fp32, centring off", FXA_F32, FXA_COMPUTE_FP32, 0, FXA_MODE_AUTO, 1.0},
        {"fp32, fallback rows", FXA_F32, FXA_COMPUTE_FP32, 1, FXA_MODE_AUTO, 40.0},
        {"fp32, online", FXA_F32, FXA_COMPUTE_FP32, 1, FXA_MODE_ONLINE, 1.0},
        {"bf16 compute", FXA_BF16, FXA_COMPUTE_BF16, 1, FXA_MODE_AUTO, 1.0},
        {"bf16 inputs, fp32 compute", FXA_BF16, FXA_COMPUTE_FP32, 1, FXA_MODE_AUTO, 1.0},
    };
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++)
        test_variant(&variants[i]);
    for (int c = 0; c < 3; c++)
        fxa_ctx_destroy(g_ctx[c]);
    return test_summary("test_attn_reproducible");
}
