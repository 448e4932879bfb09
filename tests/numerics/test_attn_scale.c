/*
 * Any finite scale. A negative scale -s gives, bit for bit, what s gives on
 * -q: the output and the LSE, and in the backward dq negated, dk and dv
 * equal (negation is exact and every sum only changes sign); the bound
 * takes |scale|, so both runs pass the same gates. Checked for fp32 and
 * bf16 compute, auto and online modes, centring on and off, with both
 * within the fp32 envelope of the fp64 reference. A scale that is not
 * finite is refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_bwd_ref.h"
#include "testutil.h"

#define B 1
#define HQ 4
#define HKV 2
#define SQ 37
#define SKV 53
#define DIM 40
#define NQ (B * HQ * SQ * DIM)
#define NKV (B * HKV * SKV * DIM)
#define ROWS (B * HQ * SQ)

typedef struct run_out {
    float out[NQ], lse[ROWS], dq[NQ], dk[NKV], dv[NKV];
} run_out;

/* Forward and backward of t (its descriptor's scale) with dout. */
static int run(const tcase *t, fxa_ctx *ctx, const float *dout, run_out *r, const char *label)
{
    fxa_status st = tcase_run(t, ctx, t->d.mode, NULL, r->out, r->lse, NULL, NULL, NULL);
    CHECK(st == FXA_OK, "%s: forward: %s", label, fxa_ctx_last_error(ctx));
    if (st != FXA_OK)
        return 1;
    const int f32 = t->d.dtype == FXA_F32;
    const fxa_attn_bwd_args a =
        fxt_bwd_args(f32 ? (const void *)t->q : t->q16, f32 ? (const void *)t->k : t->k16,
                     f32 ? (const void *)t->v : t->v16, r->out, dout, r->lse, r->dq, r->dk, r->dv);
    char msg[256] = "";
    st = fxt_bwd_once(&t->d, 2, &a, NULL, msg, sizeof msg);
    CHECK(st == FXA_OK, "%s: backward: %s", label, msg);
    return st != FXA_OK;
}

static int bits_equal(const float *a, const float *b, size_t n, float sign)
{
    for (size_t i = 0; i < n; i++)
        if (test_f32_bits(a[i]) != test_f32_bits(sign * b[i]))
            return 0;
    return 1;
}

static void negate_q(tcase *t)
{
    for (int64_t i = 0; i < t->nq; i++)
        t->q[i] = -t->q[i];
    tcase_round(t);
}

static void test_negative_is_positive_on_negated_q(fxa_ctx *ctx, fxa_dtype dtype,
                                                   fxa_compute compute, fxa_mode mode, int center,
                                                   double scale)
{
    char label[128];
    snprintf(label, sizeof label, "%s inputs, %s compute, %s, center %d, scale %g",
             dtype == FXA_F32 ? "f32" : "bf16", compute == FXA_COMPUTE_FP32 ? "fp32" : "bf16",
             mode == FXA_MODE_AUTO ? "auto" : "online", center, scale);
    fxa_attn_desc d;
    fxt_attn_desc(&d, B, HQ, HKV, SQ, SKV, DIM);
    d.dtype = dtype;
    d.compute = compute;
    d.mode = mode;
    d.center = center;
    d.scale = -scale;
    tcase t;
    tcase_init(&t, &d);
    fxt_rng r;
    fxt_rng_seed(&r, 11);
    for (int64_t i = 0; i < t.nq; i++)
        t.q[i] = fxt_rng_gauss4(&r);
    for (int64_t i = 0; i < t.nkv; i++) {
        t.k[i] = fxt_rng_gauss4(&r) + 0.5f; /* off-centre keys: centring matters */
        t.v[i] = fxt_rng_gauss4(&r);
    }
    tcase_round(&t);
    static float dout[NQ];
    for (int i = 0; i < NQ; i++)
        dout[i] = fxt_rng_gauss4(&r);
    static run_out neg, pos;
    if (run(&t, ctx, dout, &neg, label)) {
        tcase_free(&t);
        return;
    }
    terr e;
    tcase_errors(&t, neg.out, neg.lse, &e);
    CHECK(compute == FXA_COMPUTE_BF16 || terr_within_envelope(&e), "%s: outside the envelope",
          label);
    if (compute != FXA_COMPUTE_BF16 && !terr_within_envelope(&e))
        terr_print(label, &e);
    negate_q(&t);
    t.d.scale = scale;
    if (!run(&t, ctx, dout, &pos, label)) {
        CHECK(bits_equal(neg.out, pos.out, NQ, 1.0f), "%s: out differs from scale %g on -q", label,
              scale);
        CHECK(bits_equal(neg.lse, pos.lse, ROWS, 1.0f), "%s: lse differs", label);
        CHECK(bits_equal(neg.dq, pos.dq, NQ, -1.0f), "%s: dq is not minus dq on -q", label);
        CHECK(bits_equal(neg.dk, pos.dk, NKV, 1.0f), "%s: dk differs", label);
        CHECK(bits_equal(neg.dv, pos.dv, NKV, 1.0f), "%s: dv differs", label);
    }
    tcase_free(&t);
}

static void test_not_finite_refused(fxa_ctx *ctx)
{
    const double bad[] = {INFINITY, -INFINITY, NAN};
    for (int i = 0; i < 3; i++) {
        fxa_attn_desc d;
        fxt_attn_desc(&d, B, HQ, HKV, SQ, SKV, DIM);
        d.scale = bad[i];
        char label[32];
        snprintf(label, sizeof label, "scale %g", bad[i]);
        fxt_expect_plan_refused(ctx, &d, "scale must be finite", label);
    }
}

int main(void)
{
    test_require_isa("test_attn_scale");
    fxa_ctx *ctx = fxt_ctx(2);
    if (!ctx)
        return 1;
    const double scales[] = {0.3, 1e-3, 7.0};
    for (int s = 0; s < 3; s++)
        for (int center = 0; center <= 1; center++) {
            test_negative_is_positive_on_negated_q(ctx, FXA_F32, FXA_COMPUTE_FP32, FXA_MODE_AUTO,
                                                   center, scales[s]);
            test_negative_is_positive_on_negated_q(ctx, FXA_BF16, FXA_COMPUTE_BF16, FXA_MODE_AUTO,
                                                   center, scales[s]);
        }
    test_negative_is_positive_on_negated_q(ctx, FXA_F32, FXA_COMPUTE_FP32, FXA_MODE_ONLINE, 1, 0.3);
    test_not_finite_refused(ctx);
    fxa_ctx_destroy(ctx);
    return test_summary("test_attn_scale");
}
