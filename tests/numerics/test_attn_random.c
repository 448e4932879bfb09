/*
 * Random inputs over the shapes of the foundation issue: fp32, bf16 and fp16,
 * Sq, Skv in {1, 2, 7, 127, 128, 129, 1000, 4099}, D in {64, 128}, GQA 8q/2kv
 * and MQA, both layouts. Per head the query and key scales differ, so some
 * heads run fixed-max and some fall back. Every result, auto and online mode,
 * must sit within the envelope of an fp32 online softmax (testutil.h).
 */
#include <math.h>
#include <stdlib.h>

#include "testutil.h"

typedef struct shape {
    int64_t sq;
    int64_t skv;
    int64_t hq;
    int64_t hkv;
    int64_t dim;
    fxa_dtype dtype;
    fxa_layout layout;
} shape;

static const shape g_shapes[] = {
    {1, 1, 8, 2, 64, FXA_F32, FXA_LAYOUT_BSHD},
    {2, 2, 4, 1, 128, FXA_BF16, FXA_LAYOUT_BHSD},
    {7, 7, 8, 2, 128, FXA_F16, FXA_LAYOUT_BSHD},
    {127, 127, 4, 1, 64, FXA_F32, FXA_LAYOUT_BHSD},
    {128, 128, 8, 2, 128, FXA_BF16, FXA_LAYOUT_BSHD},
    {129, 129, 8, 2, 64, FXA_F16, FXA_LAYOUT_BHSD},
    {1000, 1000, 8, 2, 128, FXA_F32, FXA_LAYOUT_BSHD},
    {1000, 1000, 4, 1, 64, FXA_BF16, FXA_LAYOUT_BSHD},
    {4099, 4099, 8, 2, 128, FXA_F32, FXA_LAYOUT_BSHD},
    {4099, 4099, 4, 1, 64, FXA_F16, FXA_LAYOUT_BHSD},
    {1, 4099, 8, 2, 128, FXA_BF16, FXA_LAYOUT_BSHD},
    {4099, 7, 4, 1, 128, FXA_F32, FXA_LAYOUT_BHSD},
    {129, 1000, 8, 2, 64, FXA_F32, FXA_LAYOUT_BSHD},
    {1000, 127, 4, 1, 128, FXA_F16, FXA_LAYOUT_BSHD},
    {2, 129, 8, 2, 64, FXA_BF16, FXA_LAYOUT_BHSD},
    {128, 2, 4, 1, 64, FXA_F32, FXA_LAYOUT_BSHD},
};

static const char *dtype_name(fxa_dtype t)
{
    return t == FXA_F32 ? "f32" : (t == FXA_BF16 ? "bf16" : "f16");
}

/* q, k ~ N(0, s^2) with per-head scales and a common key offset; v ~ N(0,1). */
static void fill(tcase *t, fxt_rng *r)
{
    static const double q_scale[] = {0.4, 1.0, 2.0, 3.5, 1.5, 0.7, 5.0, 2.8};
    static const double k_scale[] = {1.0, 2.0, 0.8, 1.5};
    const fxa_attn_desc *d = &t->d;
    for (int64_t b = 0; b < d->batch; b++) {
        for (int64_t h = 0; h < d->heads_q; h++) {
            for (int64_t i = 0; i < d->seq_q; i++) {
                float *q = t->q + tcase_q_off(t, b, h, i);
                for (int64_t c = 0; c < d->head_dim; c++)
                    q[c] = (float)(q_scale[h % 8] * fxt_rng_normal(r));
            }
        }
        for (int64_t h = 0; h < d->heads_kv; h++) {
            for (int64_t j = 0; j < d->seq_kv; j++) {
                float *k = t->k + tcase_kv_off(t, b, h, j);
                float *v = t->v + tcase_kv_off(t, b, h, j);
                for (int64_t c = 0; c < d->head_dim; c++) {
                    const double offset = (c % 5 == 0) ? 2.0 : 0.0;
                    k[c] = (float)(k_scale[h % 4] * (fxt_rng_normal(r) + offset));
                    v[c] = (float)fxt_rng_normal(r);
                }
            }
        }
    }
    tcase_round(t);
}

int main(void)
{
    test_require_isa("test_attn_random");
    fxt_rng r;
    int64_t rows_total = 0;
    int64_t fallback_total = 0;
    fxt_rng_seed(&r, 12345);
    fxa_ctx *ctx = fxt_ctx(0);
    CHECK(ctx != NULL, "context");
    for (size_t si = 0; si < sizeof g_shapes / sizeof g_shapes[0]; si++) {
        const shape *s = &g_shapes[si];
        char name[96];
        snprintf(name, sizeof name, "%s Sq %lld Skv %lld H %lld", dtype_name(s->dtype),
                 (long long)s->sq, (long long)s->skv, (long long)s->hq);
        if (fxt_skip_under_sanitizer(s->hq * s->sq * s->skv, name))
            continue;
        fxa_attn_desc d;
        tcase t;
        fxt_attn_desc(&d, 1, s->hq, s->hkv, s->sq, s->skv, s->dim);
        d.dtype = s->dtype;
        d.layout = s->layout;
        tcase_init(&t, &d);
        fill(&t, &r);
        float *out = calloc((size_t)t.nq, sizeof(float));
        float *lse = calloc((size_t)(d.heads_q * d.seq_q), sizeof(float));
        for (int mode = 0; mode < 2; mode++) {
            fxa_attn_stats st = {.struct_size = sizeof st};
            char label[128];
            terr e;
            fxa_status rc = tcase_run(&t, ctx, (fxa_mode)mode, NULL, out, lse, NULL, NULL, &st);
            CHECK(rc == FXA_OK, "run: %s", fxa_ctx_last_error(ctx));
            tcase_errors(&t, out, lse, &e);
            snprintf(label, sizeof label, "%s Sq %lld Skv %lld H %lld/%lld D %lld %s %s",
                     dtype_name(s->dtype), (long long)s->sq, (long long)s->skv, (long long)s->hq,
                     (long long)s->hkv, (long long)s->dim,
                     s->layout == FXA_LAYOUT_BSHD ? "bshd" : "bhsd", mode ? "online" : "auto");
            terr_print(label, &e);
            printf("    fallback rows %lld of %lld, max bound %.0f, C %d\n",
                   (long long)st.fallback_rows, (long long)st.rows, st.max_bound, st.c_min);
            CHECK(terr_within_envelope(&e), "%s: outside the envelope", label);
            if (mode == 0) {
                rows_total += st.rows;
                fallback_total += st.fallback_rows;
            } else {
                CHECK(st.fallback_rows == st.rows, "online mode runs every row online");
            }
        }
        free(out);
        free(lse);
        tcase_free(&t);
    }
    /* The suite must exercise both paths, or it proves little. */
    printf("auto mode: %lld of %lld rows fell back\n", (long long)fallback_total,
           (long long)rows_total);
    CHECK(fallback_total > 0 && fallback_total < rows_total / 2,
          "fallback share %lld / %lld: both paths must be exercised", (long long)fallback_total,
          (long long)rows_total);
    fxa_ctx_destroy(ctx);
    return test_summary("test_attn_random");
}
