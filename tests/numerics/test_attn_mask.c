/*
 * Attention masks and causal (fxa_attn_desc.causal, mask_kind), on the kernel
 * set FXA_ISA selects, against attention in double with the same mask:
 *  - boolean masks [B, Hq, Sq, Skv] with a row whose keys are all masked
 *    (output 0, LSE -inf), additive masks broadcast over batch and heads
 *    with -inf entries, key padding [B, 1, 1, Skv] masking whole kv tiles,
 *    causal with Sq = Skv, Sq < Skv (key splits, some wholly masked) and
 *    Sq > Skv, GQA heads, hot heads whose rows run online softmax; fp32 and
 *    bf16 compute. Tolerance: fp32 compute within 2^-15 max|v| (fp32 rounding
 *    of scores, biases and sums; measured errors are ~1e-7); bf16 compute
 *    within 2^-6 max|v| (twice test_attn_bf16.c's budget of 2^-7 max|v|).
 *  - bit for bit: 1 and 3 threads, block_q 256, 32 and 100, heads_per_tile 1 and 2
 *    (other tiles skipped, cut short, masked per element or, causal, run in row steps),
 *    fp32 and bf16 compute; an all-true boolean mask and an all-zero additive one give the
 *    unmasked bits.
 *  - refused with a message: causal with a mask, NaN, +inf and values past
 *    2^120 in an additive mask (naming the element), negative mask strides,
 *    a missing mask, an unknown mask kind; blockwise attention and the check
 *    report (FXA_ERR_UNSUPPORTED).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_bwd_ref.h"
#include "fxattn_diag.h"
#include "testutil.h"

#define MAXN 4000000

typedef struct problem {
    fxa_attn_desc d;  /* BHSD, contiguous */
    float *q, *k, *v; /* fp32 values (bf16-exact when d.dtype is bf16) */
    uint16_t *q16, *k16, *v16;
    void *mask;
} problem;

static fxa_ctx *g_ctx;

static void problem_init(problem *p, int64_t b, int64_t hq, int64_t hkv, int64_t sq, int64_t skv,
                         int64_t dim, fxa_dtype dtype, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    fxt_attn_desc(&p->d, b, hq, hkv, sq, skv, dim);
    p->d.layout = FXA_LAYOUT_BHSD;
    p->d.dtype = dtype;
    const size_t nq = (size_t)(b * hq * sq * dim), nk = (size_t)(b * hkv * skv * dim);
    p->q = malloc(nq * sizeof(float));
    p->k = malloc(nk * sizeof(float));
    p->v = malloc(nk * sizeof(float));
    p->q16 = malloc(nq * 2);
    p->k16 = malloc(nk * 2);
    p->v16 = malloc(nk * 2);
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    for (size_t i = 0; i < nq; i++) {
        const int64_t h = (int64_t)(i / (size_t)(sq * dim)) % hq;
        p->q[i] = (float)((h == hq - 1 && hq > 1 ? 40.0 : 1.0) * fxt_rng_normal(&r)); /* hot head */
    }
    for (size_t i = 0; i < nk; i++) {
        p->k[i] = (float)(fxt_rng_normal(&r) + 0.3);
        p->v[i] = (float)fxt_rng_normal(&r);
    }
    if (dtype == FXA_BF16) {
        float *t[3] = {p->q, p->k, p->v};
        uint16_t *u[3] = {p->q16, p->k16, p->v16};
        const size_t n[3] = {nq, nk, nk};
        for (int a = 0; a < 3; a++)
            for (size_t i = 0; i < n[a]; i++) {
                u[a][i] = fxa_f32_to_bf16(t[a][i]);
                t[a][i] = fxa_bf16_to_f32(u[a][i]);
            }
    }
}

static void problem_free(problem *p)
{
    free(p->q), free(p->k), free(p->v), free(p->q16), free(p->k16), free(p->v16), free(p->mask);
}

static int64_t mask_off(const fxa_attn_desc *d, int64_t b, int64_t h, int64_t i, int64_t j)
{
    const fxa_mask_strides *s = &d->mask_strides;
    return b * s->batch + h * s->head + i * s->query + j * s->key;
}

/* The problem in double with the same mask (attn_bwd_ref.h): out [B, Hq,
 * Sq, D] and lse [B, Hq, Sq]; a row with no key: out 0, lse -inf. */
static void reference(const problem *p, double *out, double *lse)
{
    const fxa_attn_desc *d = &p->d;
    const fxt_bwd_shape s = {d->batch,
                             d->heads_q,
                             d->heads_kv,
                             d->seq_q,
                             d->seq_kv,
                             d->head_dim,
                             d->scale > 0 ? d->scale : 1.0 / sqrt((double)d->head_dim)};
    const size_t rows = (size_t)(s.b * s.hq * s.sq), nq = rows * (size_t)s.d;
    const size_t nk = (size_t)(s.b * s.hkv * s.skv * s.d);
    double *x[3] = {malloc(nq * sizeof(double)), malloc(nk * sizeof(double)),
                    malloc(nk * sizeof(double))};
    const float *src[3] = {p->q, p->k, p->v};
    for (int t = 0; t < 3; t++)
        for (size_t e = 0; e < (t == 0 ? nq : nk); e++)
            x[t][e] = src[t][e];
    double *bias = malloc(rows * (size_t)s.skv * sizeof(double));
    fxt_ref_bias(d, p->mask, bias);
    fxt_ref_attn_fwd(&s, x[0], x[1], x[2], bias, out, lse);
    free(bias);
    for (int t = 0; t < 3; t++)
        free(x[t]);
}

static fxa_status run_on(fxa_ctx *ctx, const problem *p, const fxa_attn_desc *d, float *out,
                         float *lse, int64_t *fallback)
{
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    fxa_status st = fxa_attn_plan_create(ctx, d, &plan, &ws_bytes);
    if (st != FXA_OK)
        return st;
    void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64 + 64);
    const int bf = d->dtype == FXA_BF16;
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = bf ? (const void *)p->q16 : p->q,
                             .k = bf ? (const void *)p->k16 : p->k,
                             .v = bf ? (const void *)p->v16 : p->v,
                             .out = out,
                             .lse = lse,
                             .mask = p->mask};
    fxa_attn_stats stats = {.struct_size = sizeof stats};
    st = fxa_attn_run(plan, &a, ws, &stats);
    if (fallback)
        *fallback = stats.fallback_rows;
    free(ws);
    fxa_attn_plan_destroy(plan);
    return st;
}

/* Run p and compare every row with the reference; returns the max error over max|v|. */
static double check_against_reference(const problem *p, const char *label, double tol)
{
    const fxa_attn_desc *d = &p->d;
    const int64_t rows = d->batch * d->heads_q * d->seq_q, dim = d->head_dim;
    float *out = malloc((size_t)(rows * dim) * sizeof(float));
    float *lse = malloc((size_t)rows * sizeof(float));
    int64_t fallback = 0;
    const fxa_status st = run_on(g_ctx, p, d, out, lse, &fallback);
    CHECK(st == FXA_OK, "%s: %s", label, fxa_ctx_last_error(g_ctx));
    double vmax = 0.0, err = 0.0, lse_err = 0.0;
    for (int64_t i = 0; i < d->batch * d->heads_kv * d->seq_kv * dim; i++)
        vmax = fmax(vmax, fabs(p->v[i]));
    double *ref = malloc((size_t)(rows * dim) * sizeof(double));
    double *ref_lse = malloc((size_t)rows * sizeof(double));
    reference(p, ref, ref_lse);
    int bad_empty = 0;
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < dim; c++)
            err = fmax(err, fabs(out[r * dim + c] - ref[r * dim + c]));
        if (ref_lse[r] == -INFINITY)
            bad_empty += lse[r] != -INFINITY;
        else
            lse_err = fmax(lse_err, fabs(lse[r] - ref_lse[r]) / fmax(1.0, fabs(ref_lse[r])));
    }
    free(ref);
    free(ref_lse);
    CHECK(st != FXA_OK || err <= tol * vmax, "%s: error %.3g > %.3g max|v| (%.3g)", label, err, tol,
          vmax);
    CHECK(st != FXA_OK || lse_err <= 8.0 * tol, "%s: LSE error %.3g", label, lse_err);
    CHECK(bad_empty == 0, "%s: %d rows with every key masked have an LSE other than -inf", label,
          bad_empty);
    printf("%-44s error %.2e max|v|, LSE %.2e, %lld online rows\n", label, err / vmax, lse_err,
           (long long)fallback);
    free(out);
    free(lse);
    return err / vmax;
}

static void set_bool_mask(problem *p, int64_t nb, int64_t nh, int64_t nsq, uint64_t seed,
                          double keep)
{
    const int64_t skv = p->d.seq_kv;
    p->d.mask_kind = FXA_MASK_BOOL;
    p->d.mask_strides = (fxa_mask_strides){nb > 1 ? nh * nsq * skv : 0, nh > 1 ? nsq * skv : 0,
                                           nsq > 1 ? skv : 0, 1};
    uint8_t *m = malloc((size_t)(nb * nh * nsq * skv));
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    for (int64_t x = 0; x < nb * nh * nsq * skv; x++)
        m[x] = (uint8_t)(fxt_rng_uniform(&r) < keep ? 1 + x % 7 : 0); /* any nonzero attends */
    p->mask = m;
}

static void test_bool_masks(fxa_dtype dtype, fxa_compute compute, double tol)
{
    const char *tag = compute == FXA_COMPUTE_BF16 ? "bf16" : dtype == FXA_BF16 ? "bf16 in" : "fp32";
    char label[96];
    problem p;
    /* Full [B, Hq, Sq, Skv] mask; row 3 of head 1 has every key masked. */
    problem_init(&p, 2, 4, 2, 37, 300, 64, dtype, 1);
    p.d.compute = compute;
    set_bool_mask(&p, 2, 4, 37, 2, 0.7);
    memset((uint8_t *)p.mask + mask_off(&p.d, 0, 1, 3, 0), 0, 300);
    snprintf(label, sizeof label, "bool [B,H,Sq,Skv] %s", tag);
    check_against_reference(&p, label, tol);
    problem_free(&p);
    /* Key padding [B, 1, 1, Skv]: batch 1 keeps its first 150 of 1100 keys, so whole kv tiles
     * are masked. */
    problem_init(&p, 2, 2, 2, 70, 1100, 32, dtype, 3);
    p.d.compute = compute;
    set_bool_mask(&p, 2, 1, 1, 4, 1.0);
    memset((uint8_t *)p.mask + 1100 + 150, 0, 1100 - 150);
    snprintf(label, sizeof label, "key padding [B,1,1,Skv] %s", tag);
    check_against_reference(&p, label, tol);
    problem_free(&p);
}

static void test_add_masks(void)
{
    problem p;
    /* [1, 1, Sq, Skv] broadcast over batch and heads: N(0, 3) values, 10% -inf, a row all
     * -inf, a row of -3.4e38 (masked: -inf in base 2). */
    problem_init(&p, 2, 4, 4, 45, 333, 48, FXA_F32, 5);
    p.d.mask_kind = FXA_MASK_ADD;
    p.d.mask_strides = (fxa_mask_strides){0, 0, 333, 1};
    float *m = malloc(45 * 333 * sizeof(float));
    fxt_rng r;
    fxt_rng_seed(&r, 6);
    for (int64_t x = 0; x < 45 * 333; x++)
        m[x] = fxt_rng_uniform(&r) < 0.1 ? -INFINITY : (float)(3.0 * fxt_rng_normal(&r));
    for (int64_t j = 0; j < 333; j++) {
        m[7 * 333 + j] = -INFINITY;
        m[11 * 333 + j] = j % 3 ? -3.4e38f : 0.5f; /* HF's finfo.min as the masked value */
    }
    p.mask = m;
    check_against_reference(&p, "additive [1,1,Sq,Skv] fp32", 0x1p-15);
    problem_free(&p);
    /* Biases near 70000 (past 2^16 in base 2: online rows). fp32 rounds z + b to |b| 2^-24,
     * as fp32 SDPA rounds its scores plus mask: each weight moves by up to 2^-23 |b| log2(e)
     * ln 2 relatively, the output by twice that in max|v|. */
    problem_init(&p, 1, 2, 2, 16, 100, 32, FXA_F32, 8);
    p.d.mask_kind = FXA_MASK_ADD;
    p.d.mask_strides = (fxa_mask_strides){0, 0, 100, 1};
    m = malloc(16 * 100 * sizeof(float));
    for (int64_t x = 0; x < 16 * 100; x++)
        m[x] = (float)(70000.0 + 2.0 * fxt_rng_normal(&r));
    p.mask = m;
    check_against_reference(&p, "additive near 70000 fp32", 0x1p-15 + 2.0 * 0x1p-23 * 70010.0);
    problem_free(&p);
    /* [B, Hq, 1, Skv] (per head, broadcast over queries), GQA. */
    problem_init(&p, 2, 4, 2, 20, 200, 64, FXA_F32, 7);
    p.d.mask_kind = FXA_MASK_ADD;
    p.d.mask_strides = (fxa_mask_strides){4 * 200, 200, 0, 1};
    m = malloc(2 * 4 * 200 * sizeof(float));
    for (int64_t x = 0; x < 2 * 4 * 200; x++)
        m[x] = (float)(-0.05 * (double)(x % 200)); /* an ALiBi-like slope */
    p.mask = m;
    check_against_reference(&p, "additive [B,H,1,Skv] GQA fp32", 0x1p-15);
    problem_free(&p);
}

static void test_causal(fxa_compute compute, double tol)
{
    const int64_t shapes[][2] = {{300, 300}, {100, 700}, {500, 130}, {1, 40}};
    for (int s = 0; s < 4; s++) {
        problem p;
        problem_init(&p, 1, 4, 2, shapes[s][0], shapes[s][1], 64,
                     compute == FXA_COMPUTE_BF16 ? FXA_BF16 : FXA_F32, 10 + (uint64_t)s);
        p.d.compute = compute;
        p.d.causal = 1;
        char label[96];
        snprintf(label, sizeof label, "causal Sq %lld Skv %lld %s", (long long)shapes[s][0],
                 (long long)shapes[s][1], compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32");
        check_against_reference(&p, label, tol);
        problem_free(&p);
    }
}

/* Results of p at 1 and 3 threads, block_q 256 / 32 / 100 and heads_per_tile 1 / 2 (3
 * threads, block_q 100: causal diagonal tiles in several row steps, the last one short) are
 * the same bits. */
static void bit_identical(problem *p, const char *label)
{
    const int64_t n = p->d.batch * p->d.heads_q * p->d.seq_q * p->d.head_dim;
    float *a = malloc((size_t)n * sizeof(float)), *b = malloc((size_t)n * sizeof(float));
    float *c = malloc((size_t)n * sizeof(float));
    fxa_ctx *ctx1 = fxt_ctx(1), *ctx3 = fxt_ctx(3);
    CHECK(ctx1 != NULL, "ctx");
    CHECK(ctx3 != NULL, "ctx");
    fxa_attn_desc d = p->d;
    CHECK(run_on(ctx1, p, &d, a, NULL, NULL) == FXA_OK, "%s", fxa_ctx_last_error(ctx1));
    d.block_q = 32;
    CHECK(run_on(ctx3, p, &d, b, NULL, NULL) == FXA_OK, "%s", fxa_ctx_last_error(ctx3));
    CHECK(memcmp(a, b, (size_t)n * sizeof(float)) == 0,
          "%s: 1 thread / block_q 256 and 3 threads / block_q 32 differ", label);
    d.block_q = 100;
    d.heads_per_tile = 2;
    CHECK(run_on(ctx3, p, &d, c, NULL, NULL) == FXA_OK, "%s", fxa_ctx_last_error(ctx3));
    CHECK(memcmp(a, c, (size_t)n * sizeof(float)) == 0,
          "%s: block_q 256 / 1 head a tile and block_q 100 / 2 heads a tile differ", label);
    fxa_ctx_destroy(ctx1);
    fxa_ctx_destroy(ctx3);
    free(a);
    free(b);
    free(c);
}

static void test_bits(void)
{
    problem p;
    problem_init(&p, 1, 2, 1, 300, 600, 64, FXA_F32, 20);
    p.d.causal = 1;
    bit_identical(&p, "causal");
    p.d.causal = 0;
    problem bp;
    problem_init(&bp, 1, 2, 1, 300, 601, 64, FXA_BF16, 22);
    bp.d.compute = FXA_COMPUTE_BF16;
    bp.d.causal = 1;
    bit_identical(&bp, "causal bf16 compute");
    problem_free(&bp);
    set_bool_mask(&p, 1, 2, 300, 21, 0.6);
    bit_identical(&p, "bool mask");
    /* An all-true boolean mask and an all-zero additive one: the unmasked bits. */
    const size_t n = 2 * 300 * 64;
    float *plain = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    fxa_attn_desc d = p.d;
    d.mask_kind = FXA_MASK_NONE;
    CHECK(run_on(g_ctx, &p, &d, plain, NULL, NULL) == FXA_OK, "plain");
    memset(p.mask, 1, 2 * 300 * 600);
    CHECK(run_on(g_ctx, &p, &p.d, got, NULL, NULL) == FXA_OK &&
              memcmp(plain, got, n * sizeof(float)) == 0,
          "an all-true boolean mask changes the bits");
    free(p.mask);
    p.mask = calloc(600, sizeof(float));
    d.mask_kind = FXA_MASK_ADD;
    d.mask_strides = (fxa_mask_strides){0, 0, 0, 1};
    CHECK(run_on(g_ctx, &p, &d, got, NULL, NULL) == FXA_OK &&
              memcmp(plain, got, n * sizeof(float)) == 0,
          "an all-zero additive mask changes the bits");
    free(plain);
    free(got);
    problem_free(&p);
}

static void expect_refused(const problem *p, const fxa_attn_desc *d, fxa_status want,
                           const char *needle)
{
    float out[4 * 8 * 16];
    const fxa_status st = run_on(g_ctx, p, d, out, NULL, NULL);
    CHECK(st == want && strstr(fxa_ctx_last_error(g_ctx), needle),
          "wanted status %d with '%s': %d '%s'", (int)want, needle, (int)st,
          fxa_ctx_last_error(g_ctx));
}

static void test_errors(void)
{
    problem p;
    problem_init(&p, 1, 2, 2, 4, 8, 16, FXA_F32, 30);
    float *m = calloc(4 * 8, sizeof(float));
    p.mask = m;
    fxa_attn_desc d = p.d;
    d.mask_kind = FXA_MASK_ADD;
    d.mask_strides = (fxa_mask_strides){0, 0, 8, 1};
    d.causal = 1;
    expect_refused(&p, &d, FXA_ERR_INVALID_ARG, "causal and a mask together");
    d.causal = 0;
    m[2 * 8 + 5] = NAN;
    expect_refused(&p, &d, FXA_ERR_INVALID_ARG, "nan at batch 0, head 0, query 2, key 5");
    m[2 * 8 + 5] = INFINITY;
    expect_refused(&p, &d, FXA_ERR_INVALID_ARG, "inf at batch 0, head 0, query 2, key 5");
    m[2 * 8 + 5] = 1e37f;
    expect_refused(&p, &d, FXA_ERR_INVALID_ARG, "up to 2^120");
    m[2 * 8 + 5] = 0.0f;
    d.mask_strides.key = -1;
    expect_refused(&p, &d, FXA_ERR_INVALID_ARG, "must not be negative");
    d.mask_strides.key = 1;
    d.mask_kind = (fxa_mask_kind)7;
    expect_refused(&p, &d, FXA_ERR_INVALID_ARG, "mask_kind 7");
    d.mask_kind = FXA_MASK_BOOL;
    p.mask = NULL;
    expect_refused(&p, &d, FXA_ERR_INVALID_ARG, "args->mask is NULL");
    p.mask = m;
    /* Blockwise attention takes no mask or causal. */
    d.mask_kind = FXA_MASK_NONE;
    d.causal = 1;
    fxa_attn_plan *plan = NULL;
    size_t ws = 0;
    CHECK(fxa_attn_plan_create(g_ctx, &d, &plan, &ws) == FXA_OK, "causal plan");
    fxa_attn_acc *acc = NULL;
    CHECK(fxa_attn_acc_create(plan, &acc) == FXA_ERR_UNSUPPORTED && !acc &&
              strstr(fxa_ctx_last_error(g_ctx), "blockwise attention"),
          "blockwise with causal: '%s'", fxa_ctx_last_error(g_ctx));
    fxa_attn_plan_destroy(plan);
    /* The check report neither. */
    fxa_check_desc cd;
    fxa_check_desc_init(&cd);
    cd.attn = &d;
    fxa_check_plan *check = NULL;
    CHECK(fxa_check_plan_create(g_ctx, &cd, &check, &ws) == FXA_ERR_UNSUPPORTED && !check &&
              strstr(fxa_ctx_last_error(g_ctx), "check report takes no attention mask"),
          "check with causal: '%s'", fxa_ctx_last_error(g_ctx));
    problem_free(&p);
}

int main(void)
{
    test_require_isa("test_attn_mask");
    g_ctx = fxt_ctx(0);
    CHECK(g_ctx != NULL, "context");
    test_bool_masks(FXA_F32, FXA_COMPUTE_FP32, 0x1p-15);
    test_bool_masks(FXA_BF16, FXA_COMPUTE_FP32, 0x1p-15);
    test_bool_masks(FXA_BF16, FXA_COMPUTE_BF16, 0x1p-6);
    test_add_masks();
    test_causal(FXA_COMPUTE_FP32, 0x1p-15);
    test_causal(FXA_COMPUTE_BF16, 0x1p-6);
    test_bits();
    test_errors();
    fxa_ctx_destroy(g_ctx);
    return test_summary("test_attn_mask");
}
