/*
 * fp64 attention (dtype FXA_F64, FXA_COMPUTE_FP64), forward and backward,
 * against a long-double reference: the scores tau q.k summed in long double
 * (with an additive mask, rounded to double before the mask is added, as
 * fp64 SDPA adds it), the exact row max, then softmax, LSE and the
 * gradients in long double. Both sides then differ by fp64 rounding only:
 * each score carries at most about D 2^-53 |tau| ||q|| ||k|| of error, and
 * the sums of at most 61 terms about 61 2^-53 of their magnitude, so
 * 1e-12 relative to max |v| (outputs, dv), 1 + |lse| (LSE) and the
 * gradients' own scale is a bound with a wide margin that fp32 rounding
 * (2^-24) would break by four orders of magnitude. Cases: GQA, BSHD and
 * BHSD, negative scale, rows past both gates (online softmax) and in auto
 * and online modes, boolean masks with fully masked rows, float and
 * double additive masks with -DBL_MAX rows (scores absorbed, as in fp64
 * SDPA), causal in both alignments with Sq != Skv. Results are
 * bit-identical for 1, 2 and 3 threads. Misuse is refused: fp32 compute or
 * a float output on f64 inputs, fp64 pieces on other plans, non-finite
 * inputs (named), lse_parts, the bound pass, blockwise attention, and
 * inputs whose scores would pass fp64's range.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define B 2
#define HQ 4
#define HKV 2
#define SQ 29
#define SKV 61
#define DIM 24
#define NQ (B * HQ * SQ * DIM)
#define NKV (B * HKV * SKV * DIM)
#define ROWS (B * HQ * SQ)
#define NMASK (B * HQ * SQ * SKV)
#define TOL 1e-12

typedef struct prob {
    fxa_attn_desc d;
    double q[NQ], k[NKV], v[NKV], dout[NQ];
    uint8_t mask_bool[NMASK];
    float mask_f32[NMASK];
    double mask_f64[NMASK];
} prob;

typedef struct result {
    double out[NQ], lse[ROWS], dq[NQ], dk[NKV], dv[NKV];
} result;

static const void *mask_of(const prob *pr)
{
    switch (pr->d.mask_kind) {
    case FXA_MASK_BOOL: return pr->mask_bool;
    case FXA_MASK_ADD: return pr->mask_f32;
    case FXA_MASK_ADD_F64: return pr->mask_f64;
    default: return NULL;
    }
}

/* Element offsets of row (b, h, s) in Q-shaped and K-shaped tensors. */
static int64_t q_at(const fxa_attn_desc *d, int64_t b, int64_t h, int64_t s)
{
    const fxa_attn_strides st = fxa_attn_layout_strides(d->layout, d->heads_q, d->seq_q, DIM);
    return b * st.batch + h * st.head + s * st.token;
}

static int64_t kv_at(const fxa_attn_desc *d, int64_t b, int64_t h, int64_t s)
{
    const fxa_attn_strides st = fxa_attn_layout_strides(d->layout, d->heads_kv, d->seq_kv, DIM);
    return b * st.batch + h * st.head + s * st.token;
}

/* The mask's bias of (b, h, i, j): natural log, -INFINITY masks. Masks
 * here are dense [B, HQ, SQ, SKV]. */
static double bias_at(const prob *pr, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const fxa_attn_desc *d = &pr->d;
    const int64_t at = ((b * HQ + h) * SQ + i) * SKV + j;
    if (d->causal) {
        const int64_t shift = d->causal == FXA_CAUSAL_LOWER_RIGHT ? SKV - SQ : 0;
        return j <= i + shift ? 0.0 : -INFINITY;
    }
    switch (d->mask_kind) {
    case FXA_MASK_BOOL: return pr->mask_bool[at] ? 0.0 : -INFINITY;
    case FXA_MASK_ADD: return pr->mask_f32[at];
    case FXA_MASK_ADD_F64: return pr->mask_f64[at];
    default: return 0.0;
    }
}

/* Row (b, h, i)'s reference weights p[j] (normalised) and LSE. */
static long double ref_row(const prob *pr, int64_t b, int64_t h, int64_t i, long double *p)
{
    const fxa_attn_desc *d = &pr->d;
    const double *q = pr->q + q_at(d, b, h, i);
    const int64_t g = h / (HQ / HKV);
    long double mx = -INFINITY;
    for (int64_t j = 0; j < SKV; j++) {
        const double *k = pr->k + kv_at(d, b, g, j);
        long double s = 0.0L;
        for (int c = 0; c < DIM; c++)
            s += (long double)q[c] * k[c];
        s *= d->scale;
        const double bias = bias_at(pr, b, h, i, j);
        if (bias == -INFINITY)
            p[j] = -INFINITY;
        else if (d->mask_kind == FXA_MASK_ADD || d->mask_kind == FXA_MASK_ADD_F64)
            p[j] = (long double)((double)s + bias);
        else
            p[j] = s;
        mx = p[j] > mx ? p[j] : mx;
    }
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < SKV; j++)
            p[j] = 0.0L;
        return -INFINITY;
    }
    long double sum = 0.0L;
    for (int64_t j = 0; j < SKV; j++) {
        p[j] = p[j] == -INFINITY ? 0.0L : expl(p[j] - mx);
        sum += p[j];
    }
    for (int64_t j = 0; j < SKV; j++)
        p[j] /= sum;
    return mx + logl(sum);
}

/* The reference forward and backward of pr into r. */
static void reference(const prob *pr, result *r)
{
    const fxa_attn_desc *d = &pr->d;
    static long double dq[NQ], dk[NKV], dv[NKV];
    memset(dq, 0, sizeof dq);
    memset(dk, 0, sizeof dk);
    memset(dv, 0, sizeof dv);
    long double p[SKV];
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < HQ; h++)
            for (int64_t i = 0; i < SQ; i++) {
                const int64_t g = h / (HQ / HKV), qo = q_at(d, b, h, i);
                const long double lse = ref_row(pr, b, h, i, p);
                r->lse[(b * HQ + h) * SQ + i] = (double)lse;
                long double o[DIM] = {0}, delta = 0.0L;
                for (int64_t j = 0; j < SKV; j++)
                    for (int c = 0; c < DIM; c++)
                        o[c] += p[j] * pr->v[kv_at(d, b, g, j) + c];
                for (int c = 0; c < DIM; c++) {
                    r->out[qo + c] = (double)o[c];
                    delta += o[c] * pr->dout[qo + c];
                }
                for (int64_t j = 0; j < SKV; j++) {
                    const int64_t ko = kv_at(d, b, g, j);
                    long double dp = 0.0L;
                    for (int c = 0; c < DIM; c++)
                        dp += (long double)pr->dout[qo + c] * pr->v[ko + c];
                    const long double ds = p[j] * (dp - delta) * d->scale;
                    for (int c = 0; c < DIM; c++) {
                        dq[qo + c] += ds * pr->k[ko + c];
                        dk[ko + c] += ds * pr->q[qo + c];
                        dv[ko + c] += p[j] * pr->dout[qo + c];
                    }
                }
            }
    for (int64_t x = 0; x < NQ; x++)
        r->dq[x] = (double)dq[x];
    for (int64_t x = 0; x < NKV; x++) {
        r->dk[x] = (double)dk[x];
        r->dv[x] = (double)dv[x];
    }
}

static void fill(prob *pr, uint64_t seed, double q_scale)
{
    fxt_rng rng;
    fxt_rng_seed(&rng, seed);
    for (int64_t x = 0; x < NQ; x++) {
        pr->q[x] = q_scale * fxt_rng_normal(&rng);
        pr->dout[x] = fxt_rng_normal(&rng);
    }
    for (int64_t x = 0; x < NKV; x++) {
        pr->k[x] = 0.5 + fxt_rng_normal(&rng);
        pr->v[x] = fxt_rng_normal(&rng);
    }
    for (int64_t x = 0; x < NMASK; x++) {
        pr->mask_bool[x] = fxt_rng_uniform(&rng) < 0.7;
        pr->mask_f32[x] = (float)(4.0 * fxt_rng_normal(&rng));
        pr->mask_f64[x] = 4.0 * fxt_rng_normal(&rng);
    }
    /* row 3 of (batch 0, head 1): every key masked, or every key at
     * -DBL_MAX (-FLT_MAX for the float mask) */
    for (int64_t j = 0; j < SKV; j++) {
        const int64_t at = ((0 * HQ + 1) * SQ + 3) * SKV + j;
        pr->mask_bool[at] = 0;
        pr->mask_f32[at] = -FLT_MAX;
        pr->mask_f64[at] = -DBL_MAX;
    }
    /* row 5 of (batch 1, head 2): a few keys at -DBL_MAX beside ordinary ones */
    for (int64_t j = 0; j < SKV; j += 3)
        pr->mask_f64[((1 * HQ + 2) * SQ + 5) * SKV + j] = -DBL_MAX;
}

static void desc(prob *pr, fxa_layout layout, double scale)
{
    fxt_attn_desc(&pr->d, B, HQ, HKV, SQ, SKV, DIM);
    pr->d.dtype = FXA_F64;
    pr->d.out_dtype = FXA_F64;
    pr->d.compute = FXA_COMPUTE_FP64;
    pr->d.layout = layout;
    pr->d.scale = scale;
}

/* Forward (with stats) and backward of pr on ctx into r. */
static fxa_status run(const prob *pr, fxa_ctx *ctx, result *r, fxa_attn_stats *stats)
{
    fxa_attn_desc d = pr->d;
    if (d.mask_kind != FXA_MASK_NONE)
        d.mask_strides = (fxa_mask_strides){HQ * SQ * SKV, SQ * SKV, SKV, 1};
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    fxa_status st = fxa_attn_plan_create(ctx, &d, &plan, &ws_bytes);
    if (st != FXA_OK)
        return st;
    void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64 + 64);
    fxa_attn_args a = {.struct_size = sizeof a};
    a.q = pr->q, a.k = pr->k, a.v = pr->v, a.out = r->out, a.lse_f64 = r->lse;
    a.mask = mask_of(pr);
    st = fxa_attn_run(plan, &a, ws, stats);
    free(ws);
    fxa_attn_plan_destroy(plan);
    if (st != FXA_OK)
        return st;
    fxa_attn_bwd_plan *bp = NULL;
    if ((st = fxa_attn_bwd_plan_create(ctx, &d, &bp, &ws_bytes)) != FXA_OK)
        return st;
    ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64 + 64);
    fxa_attn_bwd_args ba =
        fxt_bwd_args(pr->q, pr->k, pr->v, r->out, pr->dout, NULL, r->dq, r->dk, r->dv);
    ba.mask = mask_of(pr);
    ba.grad_dtype = FXA_F64;
    ba.lse_f64 = r->lse;
    st = fxa_attn_bwd_run(bp, &ba, ws, NULL);
    free(ws);
    fxa_attn_bwd_plan_destroy(bp);
    return st;
}

/* Largest |x - y| over n, with matching infinities counting 0. */
static double max_diff(const double *x, const double *y, int64_t n)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double dlt = x[i] == y[i] ? 0.0 : fabs(x[i] - y[i]);
        e = dlt > e || isnan(dlt) ? dlt : e;
    }
    return e;
}

static double max_abs(const double *x, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        m = isfinite(x[i]) && fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

static result g_ref, g_got, g_other;

/* pr against the reference on ctx; returns the forward's stats. */
static fxa_attn_stats check_case(const prob *pr, fxa_ctx *ctx, const char *label)
{
    fxa_attn_stats stats = {.struct_size = sizeof stats};
    const fxa_status st = run(pr, ctx, &g_got, &stats);
    CHECK(st == FXA_OK, "%s: %s", label, fxa_ctx_last_error(ctx));
    if (st != FXA_OK)
        return stats;
    reference(pr, &g_ref);
    const double vmax = max_abs(pr->v, NKV), lmax = 1.0 + max_abs(g_ref.lse, ROWS);
    const struct {
        const char *name;
        const double *got, *ref;
        int64_t n;
        double scale;
    } t[5] = {{"out", g_got.out, g_ref.out, NQ, vmax},
              {"lse", g_got.lse, g_ref.lse, ROWS, lmax},
              {"dq", g_got.dq, g_ref.dq, NQ, 1.0 + max_abs(g_ref.dq, NQ)},
              {"dk", g_got.dk, g_ref.dk, NKV, 1.0 + max_abs(g_ref.dk, NKV)},
              {"dv", g_got.dv, g_ref.dv, NKV, 1.0 + max_abs(g_ref.dv, NKV)}};
    for (int i = 0; i < 5; i++) {
        const double e = max_diff(t[i].got, t[i].ref, t[i].n);
        CHECK(e <= TOL * t[i].scale, "%s: %s differs from the reference by %g (scale %g)", label,
              t[i].name, e, t[i].scale);
    }
    CHECK(stats.compute == FXA_COMPUTE_FP64, "%s: stats.compute %d", label, (int)stats.compute);
    CHECK(stats.rows == ROWS && stats.keys == SKV, "%s: stats rows %lld keys %lld", label,
          (long long)stats.rows, (long long)stats.keys);
    /* the same bits on 1 and 3 threads */
    fxa_ctx *other = fxt_ctx(3);
    if (other) {
        CHECK(run(pr, other, &g_other, NULL) == FXA_OK, "%s: 3 threads", label);
        CHECK(memcmp(&g_other, &g_got, sizeof g_got) == 0, "%s: 3 threads give other bits", label);
        fxa_ctx_destroy(other);
    }
    return stats;
}

static prob g_pr;

static void accuracy(fxa_ctx *ctx)
{
    prob *pr = &g_pr;
    fill(pr, 7, 1.0);
    desc(pr, FXA_LAYOUT_BSHD, 0.0);
    pr->d.scale = 1.0 / sqrt((double)DIM); /* the reference reads it */
    fxa_attn_stats st = check_case(pr, ctx, "plain");
    CHECK(st.fallback_rows == 0, "plain: %lld rows fell back", (long long)st.fallback_rows);

    desc(pr, FXA_LAYOUT_BHSD, -0.7);
    check_case(pr, ctx, "bhsd, negative scale");

    /* scores of hundreds of nats: past both gates, online softmax */
    fill(pr, 8, 18.0);
    desc(pr, FXA_LAYOUT_BSHD, 0.9);
    st = check_case(pr, ctx, "large scores");
    CHECK(st.fallback_rows > 0 && st.fallback_rows < ROWS,
          "large scores: %lld of %d rows fell back (some, not all, should)",
          (long long)st.fallback_rows, ROWS);
    pr->d.mode = FXA_MODE_ONLINE;
    st = check_case(pr, ctx, "online mode");
    CHECK(st.fallback_rows == ROWS, "online mode: %lld rows online", (long long)st.fallback_rows);
    pr->d.mode = FXA_MODE_AUTO;
    pr->d.center = 0;
    check_case(pr, ctx, "large scores, no centring");

    fill(pr, 9, 1.0);
    const fxa_mask_kind kinds[3] = {FXA_MASK_BOOL, FXA_MASK_ADD, FXA_MASK_ADD_F64};
    const char *names[3] = {"bool mask", "float mask", "double mask"};
    for (int i = 0; i < 3; i++) {
        desc(pr, FXA_LAYOUT_BSHD, 0.35);
        pr->d.mask_kind = kinds[i];
        check_case(pr, ctx, names[i]);
    }
    CHECK(isfinite(g_got.lse[1 * SQ + 3]) && g_got.lse[1 * SQ + 3] < -1e308,
          "a -DBL_MAX row's lse is %g (its scores are absorbed: about -DBL_MAX)",
          g_got.lse[1 * SQ + 3]);
    pr->d.mask_kind = FXA_MASK_BOOL;
    check_case(pr, ctx, "bool mask again");
    CHECK(g_got.lse[1 * SQ + 3] == -INFINITY, "a fully masked row's lse is %g",
          g_got.lse[1 * SQ + 3]);
    for (int c = 0; c < 2; c++) {
        desc(pr, c ? FXA_LAYOUT_BHSD : FXA_LAYOUT_BSHD, 0.4);
        pr->d.causal = c ? FXA_CAUSAL_LOWER_RIGHT : FXA_CAUSAL_UPPER_LEFT;
        check_case(pr, ctx, c ? "causal lower-right" : "causal upper-left");
    }
}

static void expect_refused(fxa_ctx *ctx, const fxa_attn_desc *d, const char *word,
                           const char *label)
{
    fxt_expect_plan_refused(ctx, d, word, label);
}

/* The backward refuses an lse_f64 that is not the forward's (writing
 * nothing), a missing one, float pieces, and a float gradient dtype. */
static void bwd_misuse(fxa_ctx *ctx, prob *pr)
{
    CHECK(run(pr, ctx, &g_got, NULL) == FXA_OK, "forward and backward: %s",
          fxa_ctx_last_error(ctx));
    fxa_attn_bwd_plan *bp = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_bwd_plan_create(ctx, &pr->d, &bp, &ws_bytes) == FXA_OK, "bwd plan");
    if (!bp)
        return;
    void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64 + 64);
    static double lse[ROWS];
    memcpy(lse, g_got.lse, sizeof lse);
    lse[ROWS - 2] += 1e-6;
    fxa_attn_bwd_args ba = fxt_bwd_args(pr->q, pr->k, pr->v, g_got.out, pr->dout, NULL, g_other.dq,
                                        g_other.dk, g_other.dv);
    ba.grad_dtype = FXA_F64;
    ba.lse_f64 = lse;
    memset(&g_other, 0x5a, sizeof g_other);
    CHECK(fxa_attn_bwd_run(bp, &ba, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "lse_f64 is not the forward's") &&
              strstr(fxa_ctx_last_error(ctx), "batch 1, head 3, token 27"),
          "an lse_f64 off by 1e-6: %s", fxa_ctx_last_error(ctx));
    CHECK(((unsigned char *)g_other.dq)[0] == 0x5a && ((unsigned char *)g_other.dv)[0] == 0x5a,
          "a refused backward wrote gradients");
    ba.lse_f64 = NULL;
    CHECK(fxa_attn_bwd_run(bp, &ba, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "lse_f64 is missing"),
          "no lse_f64: %s", fxa_ctx_last_error(ctx));
    float lse32[ROWS] = {0};
    ba.lse_f64 = g_got.lse;
    ba.lse = lse32;
    CHECK(fxa_attn_bwd_run(bp, &ba, ws, NULL) == FXA_ERR_INVALID_ARG, "a float lse: %s",
          fxa_ctx_last_error(ctx));
    ba.lse = NULL;
    ba.grad_dtype = FXA_F32;
    CHECK(fxa_attn_bwd_run(bp, &ba, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "FXA_F64"),
          "float gradients: %s", fxa_ctx_last_error(ctx));
    ba.grad_dtype = FXA_F64;
    CHECK(fxa_attn_bwd_run(bp, &ba, ws, NULL) == FXA_OK &&
              memcmp(g_other.dq, g_got.dq, sizeof g_got.dq) == 0,
          "the backward after its refusals: %s", fxa_ctx_last_error(ctx));
    free(ws);
    fxa_attn_bwd_plan_destroy(bp);
}

static void misuse(fxa_ctx *ctx)
{
    prob *pr = &g_pr;
    fill(pr, 10, 1.0);
    desc(pr, FXA_LAYOUT_BSHD, 0.3);
    fxa_attn_desc d = pr->d;
    d.compute = FXA_COMPUTE_FP32;
    expect_refused(ctx, &d, "fp64", "f64 inputs, fp32 compute");
    d = pr->d;
    d.out_dtype = FXA_F32;
    expect_refused(ctx, &d, "FXA_F64", "f64 inputs, float output");
    fxt_attn_desc(&d, B, HQ, HKV, SQ, SKV, DIM);
    d.compute = FXA_COMPUTE_FP64;
    expect_refused(ctx, &d, "f64 inputs", "fp64 compute on f32 inputs");
    fxt_attn_desc(&d, B, HQ, HKV, SQ, SKV, DIM);
    d.mask_kind = FXA_MASK_ADD_F64;
    d.mask_strides = (fxa_mask_strides){0, 0, 0, 1};
    expect_refused(ctx, &d, "FXA_MASK_ADD_F64", "double mask on f32 inputs");

    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_plan_create(ctx, &pr->d, &plan, &ws_bytes) == FXA_OK, "plan: %s",
          fxa_ctx_last_error(ctx));
    if (!plan)
        return;
    void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64 + 64);
    fxa_attn_args a = {.struct_size = sizeof a};
    a.q = pr->q, a.k = pr->k, a.v = pr->v, a.out = g_got.out, a.lse_f64 = g_got.lse;
    memset(g_got.out, 0x5a, sizeof g_got.out);
    pr->k[kv_at(&pr->d, 1, 1, 7) + 5] = NAN;
    CHECK(fxa_attn_run(plan, &a, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "K has a non-finite value (nan) at batch 1, token "
                                              "7, head 1, dim 5"),
          "a NaN in K: %s", fxa_ctx_last_error(ctx));
    CHECK(g_got.out[0] == g_got.out[1] && ((unsigned char *)g_got.out)[0] == 0x5a,
          "a refused run wrote its output");
    pr->k[kv_at(&pr->d, 1, 1, 7) + 5] = 0.0;
    pr->v[9] = 1e300;
    CHECK(fxa_attn_run(plan, &a, ws, NULL) == FXA_ERR_UNSUPPORTED, "|v| 1e300 over %d keys: %s",
          SKV, fxa_ctx_last_error(ctx));
    pr->v[9] = 0.0;
    pr->q[3] = 1e303;
    CHECK(fxa_attn_run(plan, &a, ws, NULL) == FXA_ERR_UNSUPPORTED &&
              strstr(fxa_ctx_last_error(ctx), "2^1000"),
          "scores past 2^1000: %s", fxa_ctx_last_error(ctx));
    pr->q[3] = 0.0;
    float parts[3 * ROWS];
    a.lse_parts = parts;
    CHECK(fxa_attn_run(plan, &a, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "lse_parts"),
          "lse_parts on an fp64 plan: %s", fxa_ctx_last_error(ctx));
    a.lse_parts = NULL;
    CHECK(fxa_attn_bounds(plan, &a, ws, NULL) == FXA_ERR_UNSUPPORTED, "the bound pass: %s",
          fxa_ctx_last_error(ctx));
    fxa_attn_acc *acc = NULL;
    CHECK(fxa_attn_acc_create(plan, &acc) == FXA_ERR_UNSUPPORTED && !acc, "blockwise attention: %s",
          fxa_ctx_last_error(ctx));
    CHECK(fxa_attn_run(plan, &a, ws, NULL) == FXA_OK, "the run after its refusals: %s",
          fxa_ctx_last_error(ctx));
    free(ws);
    fxa_attn_plan_destroy(plan);

    bwd_misuse(ctx, pr);

    /* an f32 plan takes no lse_f64 */
    fxt_attn_desc(&d, 1, 1, 1, 4, 4, 8);
    float f[32] = {0}, o[32];
    CHECK(fxa_attn_plan_create(ctx, &d, &plan, &ws_bytes) == FXA_OK, "f32 plan");
    ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64 + 64);
    fxa_attn_args fa = {.struct_size = sizeof fa};
    fa.q = f, fa.k = f, fa.v = f, fa.out = o, fa.lse_f64 = g_got.lse;
    CHECK(fxa_attn_run(plan, &fa, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "lse_f64"),
          "lse_f64 on an f32 plan: %s", fxa_ctx_last_error(ctx));
    free(ws);
    fxa_attn_plan_destroy(plan);
}

int main(void)
{
    fxa_ctx *ctx = fxt_ctx(1);
    if (!ctx)
        return 1;
    fxa_compute_choice c = {.struct_size = sizeof c};
    CHECK(fxa_ctx_compute_choice(ctx, FXA_F64, DIM, &c) == FXA_OK && c.compute == FXA_COMPUTE_FP64,
          "f64 inputs' automatic compute: %d", (int)c.compute);
    accuracy(ctx);
    misuse(ctx);
    fxa_ctx_destroy(ctx);
    return test_summary("test_attn_f64");
}
