/*
 * Lower-right causal (FXA_CAUSAL_LOWER_RIGHT: query i attends keys
 * j <= i + Skv - Sq, torch's causal_lower_right) gives, bit for bit, what
 * the boolean mask tril(ones(Sq, Skv), Skv - Sq) gives, forward (out, LSE)
 * and backward (dq, dk, dv): the causal path only skips tiles and trailing
 * keys whose terms are exact zeros. With Sq > Skv the first Sq - Skv
 * queries attend no key: output 0, LSE -inf, gradients 0. Shapes with
 * Sq < Skv, Sq = Skv (where it is upper-left causal, also bit for bit) and
 * Sq > Skv; fp32 and bf16 compute; 1 and 3 threads with several block_q.
 * An alignment outside fxa_causal is refused.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_bwd_ref.h"
#include "testutil.h"

#define HQ 4
#define HKV 2
#define DIM 64

typedef struct result {
    float *out, *lse, *dq, *dk, *dv;
} result;

typedef struct problem {
    fxa_attn_desc d;
    void *q, *k, *v; /* f32 or bf16 per d.dtype */
    float *dout;
    uint8_t *mask; /* tril(ones(Sq, Skv), Skv - Sq), broadcast over batch and heads */
    size_t nq, nkv;
} problem;

static void *values(fxt_rng *r, size_t n, fxa_dtype dtype, double shift)
{
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(fxt_rng_normal(r) + shift);
    if (dtype == FXA_F32)
        return x;
    uint16_t *h = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        h[i] = fxa_f32_to_bf16(x[i]);
    free(x);
    return h;
}

static void problem_init(problem *p, int64_t sq, int64_t skv, fxa_dtype dtype, uint64_t seed)
{
    memset(p, 0, sizeof *p);
    fxt_attn_desc(&p->d, 1, HQ, HKV, sq, skv, DIM);
    p->d.layout = FXA_LAYOUT_BHSD;
    p->d.dtype = dtype;
    p->d.compute = dtype == FXA_BF16 ? FXA_COMPUTE_BF16 : FXA_COMPUTE_FP32;
    p->nq = (size_t)(HQ * sq * DIM);
    p->nkv = (size_t)(HKV * skv * DIM);
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    p->q = values(&r, p->nq, dtype, 0.0);
    p->k = values(&r, p->nkv, dtype, 0.3);
    p->v = values(&r, p->nkv, dtype, 0.0);
    p->dout = values(&r, p->nq, FXA_F32, 0.0);
    p->mask = malloc((size_t)(sq * skv));
    for (int64_t i = 0; i < sq; i++)
        for (int64_t j = 0; j < skv; j++)
            p->mask[i * skv + j] = j <= i + skv - sq;
}

static void problem_free(problem *p)
{
    free(p->q), free(p->k), free(p->v), free(p->dout), free(p->mask);
}

static void result_init(result *r, const problem *p)
{
    const size_t rows = p->nq / DIM;
    r->out = calloc(p->nq, sizeof(float));
    r->lse = calloc(rows, sizeof(float));
    r->dq = calloc(p->nq, sizeof(float));
    r->dk = calloc(p->nkv, sizeof(float));
    r->dv = calloc(p->nkv, sizeof(float));
}

static void result_free(result *r)
{
    free(r->out), free(r->lse), free(r->dq), free(r->dk), free(r->dv);
}

/* Forward and backward of p with descriptor d on threads threads. */
static int run(const problem *p, const fxa_attn_desc *d, int threads, result *r, const char *label)
{
    fxa_ctx *ctx = fxt_ctx(threads);
    if (!ctx)
        return 1;
    fxa_attn_plan *plan = NULL;
    size_t bytes = 0;
    fxa_status st = fxa_attn_plan_create(ctx, d, &plan, &bytes);
    void *ws = aligned_alloc(64, (bytes + 64) / 64 * 64);
    const void *mask = d->mask_kind == FXA_MASK_BOOL ? p->mask : NULL;
    fxa_attn_args a = {.struct_size = sizeof a, .q = p->q, .k = p->k, .v = p->v};
    a.out = r->out, a.lse = r->lse, a.mask = mask;
    if (st == FXA_OK)
        st = fxa_attn_run(plan, &a, ws, NULL);
    CHECK(st == FXA_OK, "%s: forward: %s", label, fxa_ctx_last_error(ctx));
    free(ws);
    fxa_attn_plan_destroy(plan);
    fxa_ctx_destroy(ctx);
    if (st != FXA_OK)
        return 1;
    fxa_attn_bwd_args b =
        fxt_bwd_args(p->q, p->k, p->v, r->out, p->dout, r->lse, r->dq, r->dk, r->dv);
    b.mask = mask;
    char msg[256] = "";
    st = fxt_bwd_once(d, threads, &b, NULL, msg, sizeof msg);
    CHECK(st == FXA_OK, "%s: backward: %s", label, msg);
    return st != FXA_OK;
}

static int same(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

static void test_as_mask(int64_t sq, int64_t skv, fxa_dtype dtype)
{
    problem p;
    problem_init(&p, sq, skv, dtype, (uint64_t)(sq * 1000 + skv));
    fxa_attn_desc dm = p.d;
    dm.mask_kind = FXA_MASK_BOOL;
    dm.mask_strides = (fxa_mask_strides){0, 0, skv, 1};
    fxa_attn_desc dc = p.d;
    dc.causal = FXA_CAUSAL_LOWER_RIGHT;
    char label[96];
    snprintf(label, sizeof label, "lower-right Sq %lld Skv %lld %s", (long long)sq, (long long)skv,
             dtype == FXA_BF16 ? "bf16" : "fp32");
    result m, c;
    result_init(&m, &p);
    result_init(&c, &p);
    const size_t rows = p.nq / DIM;
    if (!run(&p, &dm, 1, &m, label)) {
        const int block_q[3] = {0, 32, 100};
        for (int t = 0; t < 3; t++) {
            dc.block_q = block_q[t];
            const int threads = t ? 3 : 1;
            if (run(&p, &dc, threads, &c, label))
                continue;
            CHECK(same(m.out, c.out, p.nq) && same(m.lse, c.lse, rows),
                  "%s, %d threads, block_q %d: forward differs from the mask's", label, threads,
                  block_q[t]);
            CHECK(same(m.dq, c.dq, p.nq) && same(m.dk, c.dk, p.nkv) && same(m.dv, c.dv, p.nkv),
                  "%s, %d threads, block_q %d: gradients differ from the mask's", label, threads,
                  block_q[t]);
        }
        /* Queries before the diagonal's start attend no key. */
        for (int64_t h = 0; h < HQ; h++)
            for (int64_t i = 0; i < sq - skv; i++) {
                const size_t row = (size_t)(h * sq + i);
                int zero = c.lse[row] == -INFINITY;
                for (size_t x = 0; x < DIM; x++)
                    zero &= c.out[row * DIM + x] == 0.0f && c.dq[row * DIM + x] == 0.0f;
                CHECK(zero, "%s: head %lld query %lld attends no key, but is not 0 / -inf", label,
                      (long long)h, (long long)i);
            }
    }
    if (sq == skv) { /* the same diagonal as upper-left */
        dc.causal = FXA_CAUSAL_UPPER_LEFT;
        dc.block_q = 0;
        if (!run(&p, &dc, 1, &c, label))
            CHECK(same(m.out, c.out, p.nq) && same(m.dk, c.dk, p.nkv),
                  "%s: upper-left differs at Sq = Skv", label);
    }
    result_free(&m);
    result_free(&c);
    problem_free(&p);
}

static void test_refused(void)
{
    fxa_ctx *ctx = fxt_ctx(1);
    if (!ctx)
        return;
    const int bad[2] = {-1, 3};
    for (int i = 0; i < 2; i++) {
        fxa_attn_desc d;
        fxt_attn_desc(&d, 1, HQ, HKV, 8, 8, DIM);
        d.causal = bad[i];
        char label[32];
        snprintf(label, sizeof label, "causal %d", bad[i]);
        fxt_expect_plan_refused(ctx, &d, "FXA_CAUSAL_LOWER_RIGHT", label);
    }
    fxa_ctx_destroy(ctx);
}

int main(void)
{
    test_require_isa("test_attn_causal_lr");
    const int64_t shapes[][2] = {{100, 700}, {300, 300}, {500, 130}, {1, 40}, {40, 1}};
    for (int s = 0; s < 5; s++) {
        test_as_mask(shapes[s][0], shapes[s][1], FXA_F32);
        test_as_mask(shapes[s][0], shapes[s][1], FXA_BF16);
    }
    test_refused();
    return test_summary("test_attn_causal_lr");
}
