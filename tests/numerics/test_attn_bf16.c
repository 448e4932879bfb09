/*
 * FXA_COMPUTE_BF16: bf16 products and P rounded to bf16 for P.V.
 *
 * Error budget against the fp64 reference on the same bf16 inputs: the
 * scores are exact bf16 products summed in fp32, as in fp32 compute; the new
 * error is P's: bf16 compute's exp2 (relative error at most e_p =
 * FXA_EXP2_BF16_REL_ERR = 2^-18, kernels/ref/exp2_ref.h) then the rounding
 * to bf16 (u = 2^-8). With p~_j = p_j (1 + d_j), |d_j| <= u' = u + e_p (1 +
 * u), and l summing the same rounded weights, out~ - out = sum_j w_j d_j
 * (v_j - out~) / (1 + ...), so |out~ - out| <= 2u' max|v| (1 + 2u') ~ 2^-7
 * max|v|; the LSE moves by at most ln(1 + u'). Each result must stay within
 * the fp32 online envelope plus those terms. The kernel set in use must also agree with the
 * portable bf16 reference kernel (same math, other summation details), and
 * results must be bit-identical across thread counts and block sizes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ref/exp2_ref.h" /* FXA_EXP2_BF16_REL_ERR */
#include "testutil.h"

/* P's relative error bound u' (above). */
#define P_REL_ERR (0x1p-8 + FXA_EXP2_BF16_REL_ERR * (1.0 + 0x1p-8))

typedef struct shape {
    int64_t sq, skv, hq, hkv, dim;
    fxa_layout layout;
} shape;

static const shape g_shapes[] = {
    {1, 1, 2, 1, 64, FXA_LAYOUT_BSHD},     {7, 33, 4, 2, 128, FXA_LAYOUT_BHSD},
    {129, 129, 8, 2, 64, FXA_LAYOUT_BSHD}, {200, 1001, 4, 4, 128, FXA_LAYOUT_BSHD},
    {64, 257, 2, 1, 65, FXA_LAYOUT_BHSD},  {1000, 1000, 4, 1, 128, FXA_LAYOUT_BSHD},
    {3, 2049, 2, 2, 96, FXA_LAYOUT_BSHD},
};

static void fill(tcase *t, fxt_rng *r)
{
    const fxa_attn_desc *d = &t->d;
    for (int64_t b = 0; b < d->batch; b++) {
        for (int64_t h = 0; h < d->heads_q; h++) {
            const double qs = h % 3 == 2 ? 12.0 : 1.0; /* hot heads fall back */
            for (int64_t i = 0; i < d->seq_q; i++)
                for (int64_t c = 0; c < d->head_dim; c++)
                    t->q[tcase_q_off(t, b, h, i) + c] = (float)(qs * fxt_rng_normal(r));
        }
        for (int64_t h = 0; h < d->heads_kv; h++)
            for (int64_t j = 0; j < d->seq_kv; j++)
                for (int64_t c = 0; c < d->head_dim; c++) {
                    t->k[tcase_kv_off(t, b, h, j) + c] = (float)(fxt_rng_normal(r) + 0.5);
                    t->v[tcase_kv_off(t, b, h, j) + c] = (float)fxt_rng_normal(r);
                }
    }
    tcase_round(t);
}

static fxa_ctx *make_ctx(int threads, const char *isa)
{
    const char *old = getenv("FXA_ISA");
    char saved[64] = "";
    if (old)
        snprintf(saved, sizeof saved, "%s", old);
    if (isa)
        setenv("FXA_ISA", isa, 1);
    fxa_ctx *ctx = fxt_ctx(threads);
    CHECK(ctx != NULL, "context (%s)", isa ? isa : "default");
    if (isa) {
        if (old)
            setenv("FXA_ISA", saved, 1);
        else
            unsetenv("FXA_ISA");
    }
    return ctx;
}

static void check_shape(const shape *s, fxt_rng *r, fxa_ctx *ctx, fxa_ctx *ref_ctx, int64_t *rows,
                        int64_t *fallbacks)
{
    char name[64];
    snprintf(name, sizeof name, "bf16 compute Sq %lld Skv %lld", (long long)s->sq,
             (long long)s->skv);
    if (fxt_skip_under_sanitizer(2 * s->hq * s->sq * s->skv, name))
        return;
    fxa_attn_desc d;
    tcase t;
    fxt_attn_desc(&d, 2, s->hq, s->hkv, s->sq, s->skv, s->dim);
    d.layout = s->layout;
    d.dtype = FXA_BF16;
    d.compute = FXA_COMPUTE_BF16;
    tcase_init(&t, &d);
    fill(&t, r);
    const size_t n_rows = (size_t)(d.batch * d.heads_q * d.seq_q);
    float *out = calloc((size_t)t.nq, sizeof(float));
    float *out_ref = calloc((size_t)t.nq, sizeof(float));
    float *lse = calloc(n_rows, sizeof(float));
    float *lse_ref = calloc(n_rows, sizeof(float));
    fxa_attn_stats st = {.struct_size = sizeof st};
    char label[128];
    terr e;
    snprintf(label, sizeof label, "bf16 compute Sq %lld Skv %lld H %lld/%lld D %lld %s",
             (long long)s->sq, (long long)s->skv, (long long)s->hq, (long long)s->hkv,
             (long long)s->dim, s->layout == FXA_LAYOUT_BSHD ? "bshd" : "bhsd");
    CHECK(tcase_run(&t, ctx, FXA_MODE_AUTO, NULL, out, lse, NULL, NULL, &st) == FXA_OK, "%s: %s",
          label, fxa_ctx_last_error(ctx));
    CHECK(tcase_run(&t, ref_ctx, FXA_MODE_AUTO, NULL, out_ref, lse_ref, NULL, NULL, NULL) == FXA_OK,
          "%s (ref): %s", label, fxa_ctx_last_error(ref_ctx));
    tcase_errors(&t, out, lse, &e);
    terr_print(label, &e);
    const double out_tol = 1.5 * e.out_on32 + 2.0 * P_REL_ERR * (1.0 + 2.0 * P_REL_ERR) * e.vmax;
    const double lse_tol = 1.5 * e.lse_on32 + log1p(P_REL_ERR) + 0x1p-21 * fmax(1.0, e.lse_mag);
    CHECK(e.out_fxa <= out_tol, "%s: out err %.3g > %.3g", label, e.out_fxa, out_tol);
    CHECK(e.lse_fxa <= lse_tol, "%s: lse err %.3g > %.3g", label, e.lse_fxa, lse_tol);
    /* Against the portable bf16 kernel: same roundings except where an fp32
     * exp differing in its last bit rounds P to the other bf16 neighbour. */
    double diff = 0.0;
    double diff_sum = 0.0;
    for (int64_t i = 0; i < t.nq; i++) {
        diff = fmax(diff, fabs((double)out[i] - out_ref[i]));
        diff_sum += fabs((double)out[i] - out_ref[i]);
    }
    printf("    vs portable bf16 kernel: max |diff| %.3g, mean %.3g (max|v| %.3g); fallback "
           "%lld/%lld\n",
           diff, diff_sum / (double)t.nq, e.vmax, (long long)st.fallback_rows, (long long)st.rows);
    CHECK(diff <= 0x1p-7 * e.vmax, "%s: differs from the portable kernel by %.3g", label, diff);
    CHECK(diff_sum / (double)t.nq <= 0x1p-14 * e.vmax,
          "%s: mean difference from the portable kernel %.3g", label, diff_sum / (double)t.nq);
    *rows += st.rows;
    *fallbacks += st.fallback_rows;
    free(out);
    free(out_ref);
    free(lse);
    free(lse_ref);
    tcase_free(&t);
}

/* Bit-identical across threads and block_q with bf16 compute, at a head dim
 * the AMX tile hands to the vdpbf16ps tile (80) and one it runs itself
 * (128: its row blocks of 32, 16 and the last 1-15 rows must agree). */
static void check_invariance(fxt_rng *r, int64_t head_dim)
{
    fxa_attn_desc d;
    tcase t;
    fxt_attn_desc(&d, 1, 6, 3, 150, 333, head_dim);
    d.dtype = FXA_BF16;
    d.compute = FXA_COMPUTE_BF16;
    tcase_init(&t, &d);
    fill(&t, r);
    float *a = malloc((size_t)t.nq * sizeof(float));
    float *b = malloc((size_t)t.nq * sizeof(float));
    fxa_ctx *c1 = make_ctx(1, NULL);
    CHECK(tcase_run(&t, c1, FXA_MODE_AUTO, NULL, a, NULL, NULL, NULL, NULL) == FXA_OK, "1 thread");
    static const int threads[] = {2, 3};
    static const int blocks[] = {1, 13, 150};
    for (size_t i = 0; i < 2; i++) {
        fxa_ctx *c = make_ctx(threads[i], NULL);
        for (size_t k = 0; k < 3; k++) {
            fxa_attn_desc o = d;
            o.block_q = blocks[k];
            memset(b, 0xff, (size_t)t.nq * sizeof(float));
            CHECK(tcase_run(&t, c, FXA_MODE_AUTO, &o, b, NULL, NULL, NULL, NULL) == FXA_OK, "run");
            CHECK(memcmp(a, b, (size_t)t.nq * sizeof(float)) == 0,
                  "bf16 compute D %lld: %d threads, block_q %d differ from 1 thread",
                  (long long)head_dim, threads[i], blocks[k]);
        }
        fxa_ctx_destroy(c);
    }
    /* bf16 compute needs bf16 inputs. */
    fxa_attn_desc bad = d;
    fxa_attn_plan *plan = NULL;
    size_t bytes;
    bad.dtype = FXA_F32;
    CHECK(fxa_attn_plan_create(c1, &bad, &plan, &bytes) == FXA_ERR_INVALID_ARG && !plan,
          "bf16 compute on f32 inputs is refused");
    fxa_ctx_destroy(c1);
    free(a);
    free(b);
    tcase_free(&t);
}

int main(void)
{
    fxt_rng r;
    int64_t rows = 0;
    int64_t fallbacks = 0;
    test_require_isa("test_attn_bf16");
    fxt_rng_seed(&r, 4242);
    fxa_ctx *ctx = make_ctx(0, NULL);
    fxa_ctx *ref_ctx = make_ctx(0, "ref");
    printf("kernels: %s\n", fxa_ctx_isa(ctx));
    for (size_t i = 0; i < sizeof g_shapes / sizeof g_shapes[0]; i++)
        check_shape(&g_shapes[i], &r, ctx, ref_ctx, &rows, &fallbacks);
    CHECK(fallbacks > 0 && fallbacks < rows, "both paths run (%lld of %lld rows fell back)",
          (long long)fallbacks, (long long)rows);
    check_invariance(&r, 80);
    check_invariance(&r, 128);
    fxa_ctx_destroy(ctx);
    fxa_ctx_destroy(ref_ctx);
    return test_summary("test_attn_bf16");
}
