/*
 * Attention dropout (fxa_attn_desc.dropout_p) forward and backward against
 * an fp64 reference that takes the same keep decisions
 * (fxa_dropout_kept): out = sum_j P_ij keep_ij v_j / (1 - p) with P the
 * softmax over every key, and its gradients (dP_ij = keep_ij dO_i.v_j /
 * (1 - p), dS = P (dP - delta)). fp32 compute is held to 2e-5 of max |v| /
 * (1 - p) (outputs) and 2e-4 of each gradient's scale: several times fp32
 * attention's error here, while one wrong keep decision moves an output by
 * about P_ij |v_j| / (1 - p), above 1e-3 at these key counts. bf16 compute
 * runs on few keys (24), where one decision moves an output by about 0.06
 * and bf16's envelope is 2^-6. Cases: plain, GQA, causal both alignments,
 * boolean and additive masks. A p that keeps every weight gives the bits
 * of no dropout (on one kv tile, which no plan splits); threads,
 * heads_per_tile and block_q leave the bits alone, as do the same
 * decisions given as dropout_keep; the keep decisions have the kept share
 * 1 - p, independent neighbours, other streams for other seeds and
 * offsets, and Philox4x32-10's known answers. Misuse is refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/base/philox.h"
#include "testutil.h"

#define MAX_ROWS (1 * 4 * 77)
#define MAX_NQ (MAX_ROWS * 40)
#define MAX_NKV (1 * 4 * 301 * 40)

typedef struct prob {
    fxa_attn_desc d;
    uint64_t seed, offset;
    const uint8_t *keep; /* dropout_keep, or NULL: generated */
    float q[MAX_NQ], k[MAX_NKV], v[MAX_NKV], dout[MAX_NQ];
    uint16_t q16[MAX_NQ], k16[MAX_NKV], v16[MAX_NKV], dout16[MAX_NQ];
    uint8_t mask_bool[MAX_ROWS * 301];
    float mask_add[MAX_ROWS * 301];
} prob;

typedef struct result {
    float out[MAX_NQ], lse[MAX_ROWS], dq[MAX_NQ], dk[MAX_NKV], dv[MAX_NKV];
} result;

static prob g_pr;
static result g_got, g_other;
static double g_ref_out[MAX_NQ], g_ref_dq[MAX_NQ], g_ref_dk[MAX_NKV], g_ref_dv[MAX_NKV];

static int64_t nq_of(const fxa_attn_desc *d)
{
    return d->batch * d->heads_q * d->seq_q * d->head_dim;
}

static int64_t nkv_of(const fxa_attn_desc *d)
{
    return d->batch * d->heads_kv * d->seq_kv * d->head_dim;
}

static const void *mask_of(const prob *pr)
{
    return pr->d.mask_kind == FXA_MASK_BOOL  ? (const void *)pr->mask_bool
           : pr->d.mask_kind == FXA_MASK_ADD ? (const void *)pr->mask_add
                                             : NULL;
}

/* BSHD offsets. */
static int64_t q_at(const fxa_attn_desc *d, int64_t b, int64_t h, int64_t s)
{
    return ((b * d->seq_q + s) * d->heads_q + h) * d->head_dim;
}

static int64_t kv_at(const fxa_attn_desc *d, int64_t b, int64_t h, int64_t s)
{
    return ((b * d->seq_kv + s) * d->heads_kv + h) * d->head_dim;
}

/* Natural-log bias of (b, h, i, j): masks dense [B, Hq, Sq, Skv]. */
static double bias_at(const prob *pr, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const fxa_attn_desc *d = &pr->d;
    if (d->causal) {
        const int64_t shift = d->causal == FXA_CAUSAL_LOWER_RIGHT ? d->seq_kv - d->seq_q : 0;
        return j <= i + shift ? 0.0 : -INFINITY;
    }
    const int64_t at = ((b * d->heads_q + h) * d->seq_q + i) * d->seq_kv + j;
    if (d->mask_kind == FXA_MASK_BOOL)
        return pr->mask_bool[at] ? 0.0 : -INFINITY;
    if (d->mask_kind == FXA_MASK_ADD)
        return pr->mask_add[at];
    return 0.0;
}

/* The fp64 reference of pr's forward and backward with its dropout. */
static void reference(const prob *pr)
{
    const fxa_attn_desc *d = &pr->d;
    const int64_t dim = d->head_dim, skv = d->seq_kv;
    const double keep_scale = 1.0 / (1.0 - d->dropout_p);
    memset(g_ref_dq, 0, sizeof g_ref_dq);
    memset(g_ref_dk, 0, sizeof g_ref_dk);
    memset(g_ref_dv, 0, sizeof g_ref_dv);
    double *p = malloc((size_t)skv * sizeof *p), *w = malloc((size_t)skv * sizeof *w);
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads_q; h++)
            for (int64_t i = 0; i < d->seq_q; i++) {
                const int64_t g = h / (d->heads_q / d->heads_kv), qo = q_at(d, b, h, i);
                double mx = -INFINITY;
                for (int64_t j = 0; j < skv; j++) {
                    double s = 0.0;
                    for (int64_t c = 0; c < dim; c++)
                        s += (double)pr->q[qo + c] * pr->k[kv_at(d, b, g, j) + c];
                    p[j] = d->scale * s + bias_at(pr, b, h, i, j);
                    mx = p[j] > mx ? p[j] : mx;
                }
                double sum = 0.0;
                for (int64_t j = 0; j < skv; j++) {
                    p[j] = mx == -INFINITY ? 0.0 : exp(p[j] - mx);
                    sum += p[j];
                }
                const uint64_t e0 = (uint64_t)(((b * d->heads_q + h) * d->seq_q + i) * skv);
                for (int64_t j = 0; j < skv; j++) {
                    p[j] = sum > 0.0 ? p[j] / sum : 0.0;
                    w[j] = fxa_dropout_kept(pr->seed, pr->offset, d->dropout_p, e0 + (uint64_t)j)
                               ? keep_scale
                               : 0.0;
                }
                double delta = 0.0;
                for (int64_t c = 0; c < dim; c++) {
                    double o = 0.0;
                    for (int64_t j = 0; j < skv; j++)
                        o += p[j] * w[j] * pr->v[kv_at(d, b, g, j) + c];
                    g_ref_out[qo + c] = o;
                    delta += o * pr->dout[qo + c];
                }
                for (int64_t j = 0; j < skv; j++) {
                    const int64_t ko = kv_at(d, b, g, j);
                    double dp = 0.0;
                    for (int64_t c = 0; c < dim; c++)
                        dp += (double)pr->dout[qo + c] * pr->v[ko + c];
                    const double ds = p[j] * (w[j] * dp - delta) * d->scale;
                    for (int64_t c = 0; c < dim; c++) {
                        g_ref_dq[qo + c] += ds * pr->k[ko + c];
                        g_ref_dk[ko + c] += ds * pr->q[qo + c];
                        g_ref_dv[ko + c] += p[j] * w[j] * pr->dout[qo + c];
                    }
                }
            }
    free(p);
    free(w);
}

static void fill(prob *pr, uint64_t seed)
{
    fxt_rng rng;
    fxt_rng_seed(&rng, seed);
    for (int64_t x = 0; x < MAX_NQ; x++) {
        pr->q[x] = (float)fxt_rng_normal(&rng);
        pr->dout[x] = (float)fxt_rng_normal(&rng);
    }
    for (int64_t x = 0; x < MAX_NKV; x++) {
        pr->k[x] = (float)fxt_rng_normal(&rng);
        pr->v[x] = (float)fxt_rng_normal(&rng);
    }
    for (int64_t x = 0; x < MAX_ROWS * 301; x++) {
        pr->mask_bool[x] = fxt_rng_uniform(&rng) < 0.8;
        pr->mask_add[x] = (float)(2.0 * fxt_rng_normal(&rng));
    }
}

/* bf16 inputs: the values rounded, their bits beside them. */
static void round_bf16(prob *pr)
{
    float *x[4] = {pr->q, pr->k, pr->v, pr->dout};
    uint16_t *y[4] = {pr->q16, pr->k16, pr->v16, pr->dout16};
    const int64_t n[4] = {MAX_NQ, MAX_NKV, MAX_NKV, MAX_NQ};
    for (int t = 0; t < 4; t++)
        for (int64_t i = 0; i < n[t]; i++) {
            y[t][i] = fxa_f32_to_bf16(x[t][i]);
            x[t][i] = fxa_bf16_to_f32(y[t][i]);
        }
}

/* Forward and backward of pr (descriptor over, seed and offset) on ctx. */
static fxa_status run(const prob *pr, const fxa_attn_desc *over, fxa_ctx *ctx, result *r)
{
    fxa_attn_desc d = over ? *over : pr->d;
    const int bf16 = d.dtype == FXA_BF16;
    memset(r, 0, sizeof *r); /* the whole struct compares, past this shape's elements too */
    if (d.mask_kind != FXA_MASK_NONE)
        d.mask_strides =
            (fxa_mask_strides){d.heads_q * d.seq_q * d.seq_kv, d.seq_q * d.seq_kv, d.seq_kv, 1};
    const void *q = bf16 ? (const void *)pr->q16 : pr->q, *k = bf16 ? (const void *)pr->k16 : pr->k;
    const void *v = bf16 ? (const void *)pr->v16 : pr->v;
    fxa_attn_plan *plan = NULL;
    size_t bytes = 0;
    fxa_status st = fxa_attn_plan_create(ctx, &d, &plan, &bytes);
    if (st != FXA_OK)
        return st;
    void *ws = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    fxa_attn_args a = {.struct_size = sizeof a};
    a.q = q, a.k = k, a.v = v, a.out = r->out, a.lse = r->lse, a.mask = mask_of(pr);
    a.dropout_seed = pr->seed, a.dropout_offset = pr->offset, a.dropout_keep = pr->keep;
    st = fxa_attn_run(plan, &a, ws, NULL);
    free(ws);
    fxa_attn_plan_destroy(plan);
    if (st != FXA_OK)
        return st;
    fxa_attn_bwd_plan *bp = NULL;
    if ((st = fxa_attn_bwd_plan_create(ctx, &d, &bp, &bytes)) != FXA_OK)
        return st;
    ws = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
    fxa_attn_bwd_args ba = fxt_bwd_args(q, k, v, r->out, pr->dout, r->lse, r->dq, r->dk, r->dv);
    ba.mask = mask_of(pr);
    ba.dropout_seed = pr->seed, ba.dropout_offset = pr->offset, ba.dropout_keep = pr->keep;
    st = fxa_attn_bwd_run(bp, &ba, ws, NULL);
    free(ws);
    fxa_attn_bwd_plan_destroy(bp);
    return st;
}

static double max_err(const float *x, const double *ref, int64_t n)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)x[i] - ref[i]);
        e = d > e || isnan(d) ? d : e;
    }
    return e;
}

static double max_abs(const double *x, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* pr on ctx against the reference: outputs within out_tol max|v| / (1 -
 * p), gradients within grad_tol of their scale. */
static void check_case(prob *pr, fxa_ctx *ctx, double out_tol, double grad_tol, const char *label)
{
    const fxa_status st = run(pr, NULL, ctx, &g_got);
    CHECK(st == FXA_OK, "%s: %s", label, fxa_ctx_last_error(ctx));
    if (st != FXA_OK)
        return;
    reference(pr);
    const fxa_attn_desc *d = &pr->d;
    double vmax = 0.0;
    for (int64_t i = 0; i < nkv_of(d); i++)
        vmax = fabs(pr->v[i]) > vmax ? fabs(pr->v[i]) : vmax;
    const double e_out = max_err(g_got.out, g_ref_out, nq_of(d));
    CHECK(e_out <= out_tol * vmax / (1.0 - d->dropout_p), "%s: out off by %g (max|v| %g)", label,
          e_out, vmax);
    const struct {
        const char *name;
        const float *got;
        const double *ref;
        int64_t n;
    } g[3] = {{"dq", g_got.dq, g_ref_dq, nq_of(d)},
              {"dk", g_got.dk, g_ref_dk, nkv_of(d)},
              {"dv", g_got.dv, g_ref_dv, nkv_of(d)}};
    for (int i = 0; i < 3; i++) {
        const double scale = max_abs(g[i].ref, g[i].n);
        const double e = max_err(g[i].got, g[i].ref, g[i].n);
        CHECK(e <= grad_tol * scale, "%s: %s off by %g (scale %g)", label, g[i].name, e, scale);
    }
}

static void set_desc(prob *pr, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, double p)
{
    fxt_attn_desc(&pr->d, 1, hq, hkv, sq, skv, 40);
    pr->d.scale = 1.0 / sqrt(40.0); /* the reference reads it */
    pr->d.dropout_p = p;
}

static void accuracy(fxa_ctx *ctx)
{
    prob *pr = &g_pr;
    fill(pr, 21);
    pr->seed = 0x0123456789abcdefull;
    pr->offset = 7;
    set_desc(pr, 4, 2, 77, 301, 0.3);
    check_case(pr, ctx, 2e-5, 2e-4, "p 0.3, GQA");
    set_desc(pr, 4, 4, 77, 301, 0.85);
    check_case(pr, ctx, 2e-5, 2e-4, "p 0.85");
    for (int c = 1; c <= 2; c++) {
        set_desc(pr, 4, 2, 77, 301, 0.2);
        pr->d.causal = c;
        check_case(pr, ctx, 2e-5, 2e-4, c == 1 ? "causal" : "causal lower-right");
    }
    set_desc(pr, 4, 2, 77, 301, 0.4);
    pr->d.mask_kind = FXA_MASK_BOOL;
    check_case(pr, ctx, 2e-5, 2e-4, "bool mask");
    pr->d.mask_kind = FXA_MASK_ADD;
    check_case(pr, ctx, 2e-5, 2e-4, "additive mask");

    /* bf16 compute on few keys, against the reference on the rounded inputs */
    round_bf16(pr);
    set_desc(pr, 4, 2, 77, 24, 0.3);
    pr->d.dtype = FXA_BF16;
    pr->d.compute = FXA_COMPUTE_BF16;
    check_case(pr, ctx, 0x1p-6, 0x1p-5, "bf16 compute");
    pr->d.causal = FXA_CAUSAL_UPPER_LEFT;
    check_case(pr, ctx, 0x1p-6, 0x1p-5, "bf16 compute, causal");
    fill(pr, 21);
}

/* The same bits for a p that keeps every weight and no dropout, and for any
 * threads, heads_per_tile and block_q. */
static void bits(fxa_ctx *ctx)
{
    prob *pr = &g_pr;
    /* one kv tile: without dropout too the keys are not split */
    set_desc(pr, 4, 2, 77, 200, 0.0);
    CHECK(run(pr, NULL, ctx, &g_other) == FXA_OK, "no dropout: %s", fxa_ctx_last_error(ctx));
    pr->d.dropout_p = 1e-12; /* floor(p 2^32) = 0: every weight kept */
    CHECK(run(pr, NULL, ctx, &g_got) == FXA_OK, "p 1e-12: %s", fxa_ctx_last_error(ctx));
    CHECK(memcmp(g_got.out, g_other.out, sizeof g_got.out) == 0 &&
              memcmp(g_got.lse, g_other.lse, sizeof g_got.lse) == 0,
          "a dropout that keeps every weight changes the forward's bits");
    CHECK(memcmp(g_got.dq, g_other.dq, sizeof g_got.dq) == 0 &&
              memcmp(g_got.dk, g_other.dk, sizeof g_got.dk) == 0 &&
              memcmp(g_got.dv, g_other.dv, sizeof g_got.dv) == 0,
          "a dropout that keeps every weight changes the gradients' bits");

    set_desc(pr, 4, 2, 77, 301, 0.5);
    pr->d.causal = 1;
    CHECK(run(pr, NULL, ctx, &g_got) == FXA_OK, "p 0.5: %s", fxa_ctx_last_error(ctx));
    fxa_ctx *three = fxt_ctx(3);
    fxa_attn_desc d = pr->d;
    d.heads_per_tile = 2;
    d.block_q = 13;
    CHECK(three && run(pr, &d, three, &g_other) == FXA_OK, "3 threads");
    CHECK(memcmp(&g_got, &g_other, sizeof g_got) == 0,
          "3 threads, heads_per_tile 2, block_q 13: other bits");
    pr->offset++;
    CHECK(run(pr, NULL, ctx, &g_other) == FXA_OK &&
              memcmp(g_got.out, g_other.out, sizeof g_got.out) != 0,
          "another offset gives the same output");
    pr->offset--;
    /* the same decisions given as dropout_keep (under another seed): the same bits */
    const int64_t n_keep = 4 * 77 * 301;
    uint8_t *keep = malloc((size_t)n_keep);
    for (int64_t e = 0; e < n_keep; e++)
        keep[e] = (uint8_t)fxa_dropout_kept(pr->seed, pr->offset, 0.5, (uint64_t)e);
    pr->seed ^= 1;
    pr->keep = keep;
    CHECK(run(pr, NULL, ctx, &g_other) == FXA_OK && memcmp(&g_got, &g_other, sizeof g_got) == 0,
          "the generated decisions given as dropout_keep give other bits: %s",
          fxa_ctx_last_error(ctx));
    pr->seed ^= 1;
    pr->keep = NULL;
    free(keep);
    fxa_ctx_destroy(three);
}

/* The keep decisions: the share kept, neighbours independent, the streams
 * of other seeds and offsets apart, and Philox4x32-10's known answers
 * (Random123's kat_vectors). */
static void decisions(void)
{
    const uint32_t ctr[3][4] = {{0, 0, 0, 0},
                                {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                                {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}};
    const uint32_t key[3][2] = {{0, 0}, {0xffffffffu, 0xffffffffu}, {0xa4093822u, 0x299f31d0u}};
    const uint32_t want[3][4] = {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u},
                                 {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu},
                                 {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}};
    for (int t = 0; t < 3; t++) {
        uint32_t out[4];
        fxa_philox4x32_10(ctr[t], key[t], out);
        CHECK(memcmp(out, want[t], sizeof out) == 0, "Philox4x32-10 known answer %d", t);
    }
    const double ps[3] = {0.1, 0.5, 0.9};
    const int64_t n = 1 << 20;
    for (int t = 0; t < 3; t++) {
        const double p = ps[t];
        int64_t kept = 0, both = 0, same_other_seed = 0, same_other_offset = 0;
        int prev = fxa_dropout_kept(5, 9, p, 0);
        for (int64_t e = 0; e < n; e++) {
            const int k = fxa_dropout_kept(5, 9, p, (uint64_t)e);
            kept += k;
            both += e > 0 && k && prev;
            prev = k;
            same_other_seed += k == fxa_dropout_kept(6, 9, p, (uint64_t)e);
            same_other_offset += k == fxa_dropout_kept(5, 10, p, (uint64_t)e);
        }
        /* 5 sigma of a binomial share */
        const double q = 1.0 - p, sd = sqrt(p * q / (double)n);
        CHECK(fabs((double)kept / (double)n - q) < 5.0 * sd, "p %g: kept share %g", p,
              (double)kept / (double)n);
        CHECK(fabs((double)both / (double)(n - 1) - q * q) <
                  5.0 * sqrt(q * q * (1 - q * q) / (double)n),
              "p %g: neighbours both kept %g, independent %g", p, (double)both / (double)n, q * q);
        const double agree = p * p + q * q, sd2 = sqrt(agree * (1 - agree) / (double)n);
        CHECK(fabs((double)same_other_seed / (double)n - agree) < 5.0 * sd2 &&
                  fabs((double)same_other_offset / (double)n - agree) < 5.0 * sd2,
              "p %g: other seeds and offsets agree %g and %g of the time (independent %g)", p,
              (double)same_other_seed / (double)n, (double)same_other_offset / (double)n, agree);
    }
    CHECK(!fxa_dropout_kept(1, 2, 1.0, 3) && !fxa_dropout_kept(1, 2, NAN, 3) &&
              fxa_dropout_kept(1, 2, 0.0, 3),
          "p 1 and NaN keep nothing, p 0 everything");
}

static void misuse(fxa_ctx *ctx)
{
    fxa_attn_desc d;
    const double bad[3] = {1.0, -0.1, NAN};
    for (int i = 0; i < 3; i++) {
        fxt_attn_desc(&d, 1, 2, 2, 8, 8, 16);
        d.dropout_p = bad[i];
        fxt_expect_plan_refused(ctx, &d, "dropout_p", "dropout_p outside [0, 1)");
    }
    fxt_attn_desc(&d, 1, 2, 2, 8, 8, 16);
    d.dropout_p = 0.1;
    d.dtype = FXA_F64;
    d.out_dtype = FXA_F64;
    d.compute = FXA_COMPUTE_FP64;
    fxa_attn_plan *plan = NULL;
    size_t bytes = 0;
    CHECK(fxa_attn_plan_create(ctx, &d, &plan, &bytes) == FXA_ERR_UNSUPPORTED && !plan,
          "fp64 dropout: %s", fxa_ctx_last_error(ctx));
    fxt_attn_desc(&d, 1, 2, 2, 8, 8, 16);
    d.dropout_p = 0.1;
    CHECK(fxa_attn_plan_create(ctx, &d, &plan, &bytes) == FXA_OK, "plan");
    fxa_attn_acc *acc = NULL;
    CHECK(fxa_attn_acc_create(plan, &acc) == FXA_ERR_UNSUPPORTED && !acc,
          "blockwise attention with dropout: %s", fxa_ctx_last_error(ctx));
    fxa_attn_plan_destroy(plan);
}

int main(void)
{
    test_require_isa("test_attn_dropout");
    fxa_ctx *ctx = fxt_ctx(2);
    if (!ctx)
        return 1;
    decisions();
    accuracy(ctx);
    bits(ctx);
    misuse(ctx);
    fxa_ctx_destroy(ctx);
    return test_summary("test_attn_dropout");
}
