/*
 * test_attn_bwd: the attention backward (fxa_attn_bwd_*) against the fp64
 * reference of tests/common/attn_bwd_ref.c on the same inputs (Q, K, V, dO
 * and the forward's out and lse as fxattn returned them), within the
 * first-order fp32 envelope of docs/numerics.md ("Backward"), evaluated per
 * element in fp64 (and nonzero only where a term of it reaches). The
 * reference itself is checked against central finite differences of L = sum
 * dO . O in fp64 on a tiny shape. Cases: random data, hot rows (large query
 * norms: peaked P), GQA and MQA, Sq != Skv, head dims 40, 72 and 128, BHSD,
 * BSHD and padded strides, bf16 and f16 inputs, out and dout in bf16, 6 kv
 * heads; bf16 compute within its envelope (odd D, odd Sq and Skv, two key
 * blocks), the kernel set's gradients within the envelope of the reference
 * set's; dq, dk, dv bit-identical on 1, 2 and 3 threads (which run the
 * one-pass or the two-pass schedule by the kv heads per thread: the
 * schedules agree bit for bit); a problem whose kv heads are worked in
 * several chunks gives each head the bits of a plan of that head alone; bad
 * inputs refused with messages.
 * Runs once per kernel set (FXA_ISA).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/bwd_internal.h"
#include "attn_bwd_ref.h"
#include "bwd_fixtures.h"
#include "testutil.h"

/* The reference against central differences of L = sum dO . O(q, k, v). */
static void test_finite_differences(void)
{
    const fxt_bwd_shape s = {1, 2, 1, 3, 5, 4, 0.7};
    const size_t nq = 2 * 3 * 4, nkv = 5 * 4;
    double q[24], k[20], v[20], dout[24];
    double dq[24], dk[20], dv[20];
    fxt_rng r;
    fxt_rng_seed(&r, 11);
    normal_pairs(&r, 1.0, q, dout, nq);
    normal_pairs(&r, 1.0, k, v, nkv);
    double *const grad[3] = {dq, dk, dv};
    const double worst = fxt_ref_fd_error(&s, q, k, v, NULL, dout, grad);
    /* central differences err by ~h^2 |L'''| + eps/h: ~1e-10 here */
    CHECK(worst < 1e-7, "reference gradients differ from finite differences by %.3g", worst);
    printf("finite differences: max |fd - ref| = %.3g\n", worst);
}

/* ---- one fxattn case ---- */

typedef struct bcase {
    const char *label;
    fxt_bwd_shape s;
    fxa_layout layout;
    fxa_dtype dtype;
    int pad;             /* extra elements per token row (explicit strides) */
    double hot;          /* every 7th query row scaled by this (0: none) */
    double scale;        /* input scale */
    fxa_dtype out_dtype; /* of out and dout (0: f32) */
    fxa_compute compute; /* of the forward and the backward (0: fp32) */
} bcase;

/* Element offset of row (b, h, s) in a tensor of `heads` heads and `seq`
 * tokens in the case's layout, with pad elements after each row group. */
static fxa_attn_strides case_strides(const bcase *c, int64_t heads, int64_t seq)
{
    const int64_t d = c->s.d;
    fxa_attn_strides st;
    if (c->layout == FXA_LAYOUT_BSHD) {
        st.head = d;
        st.token = heads * d + c->pad;
        st.batch = seq * st.token;
    } else {
        st.token = d + c->pad;
        st.head = seq * st.token;
        st.batch = heads * st.head;
    }
    return st;
}

static int64_t at(const fxa_attn_strides *st, int64_t b, int64_t h, int64_t s)
{
    return b * st->batch + h * st->head + s * st->token;
}

/* Scatter contiguous [B,H,S,D] doubles into a strided float tensor (or bf16
 * bits) and read back the rounded values. */
static void scatter(const bcase *c, const fxa_attn_strides *st, int64_t heads, int64_t seq,
                    double *x, void *dst, fxa_dtype dtype)
{
    for (int64_t b = 0; b < c->s.b; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t s = 0; s < seq; s++)
                for (int64_t e = 0; e < c->s.d; e++) {
                    double *src = x + ((b * heads + h) * seq + s) * c->s.d + e;
                    const int64_t o = at(st, b, h, s) + e;
                    if (dtype == FXA_F32) {
                        ((float *)dst)[o] = (float)*src;
                        *src = (float)*src;
                    } else if (dtype == FXA_BF16) {
                        ((uint16_t *)dst)[o] = fxa_f32_to_bf16((float)*src);
                        *src = fxa_bf16_to_f32(((uint16_t *)dst)[o]);
                    } else {
                        ((uint16_t *)dst)[o] = fxa_f32_to_f16((float)*src);
                        *src = fxa_f16_to_f32(((uint16_t *)dst)[o]);
                    }
                }
}

/* Read a strided float (or bf16) tensor into contiguous doubles. */
static void gather(const bcase *c, const fxa_attn_strides *st, int64_t heads, int64_t seq,
                   const void *src, fxa_dtype dtype, double *x)
{
    for (int64_t b = 0; b < c->s.b; b++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t s = 0; s < seq; s++)
                for (int64_t e = 0; e < c->s.d; e++) {
                    const int64_t o = at(st, b, h, s) + e;
                    x[((b * heads + h) * seq + s) * c->s.d + e] =
                        dtype == FXA_F32 ? ((const float *)src)[o]
                                         : fxa_bf16_to_f32(((const uint16_t *)src)[o]);
                }
}

static size_t extent(const fxa_attn_strides *st, const fxt_bwd_shape *s, int64_t heads, int64_t seq)
{
    return (size_t)(at(st, s->b - 1, heads - 1, seq - 1) + s->d);
}

/* A case's tensors as fxattn sees them, and the exact (rounded) inputs in
 * contiguous [B, H, S, D] doubles for the reference. */
typedef struct tensors {
    fxa_attn_desc d;
    fxa_attn_strides sq, skv;
    void *q, *k, *v;
    void *out, *dout; /* out_dtype */
    float *lse, *dq, *dk, *dv;
    size_t eq, ekv;
    double *xq, *xk, *xv, *xdout;
} tensors;

static void tensors_free(tensors *t)
{
    void *const p[] = {t->q,  t->k,  t->v,  t->out, t->dout, t->lse,  t->dq,
                       t->dk, t->dv, t->xq, t->xk,  t->xv,   t->xdout};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        free(p[i]);
}

/* The backward's args on the case's tensors. */
static fxa_attn_bwd_args args_of(const tensors *t)
{
    return fxt_bwd_args(t->q, t->k, t->v, t->out, t->dout, t->lse, t->dq, t->dk, t->dv);
}

/* Run the backward on a context of n_threads threads; status (the message
 * printed on failure), the stats checked. */
static fxa_status run_bwd(tensors *t, int n_threads)
{
    const fxa_attn_bwd_args a = args_of(t);
    fxa_attn_bwd_stats stats = {.struct_size = sizeof stats};
    char msg[512];
    const fxa_status st = fxt_bwd_once(&t->d, n_threads, &a, &stats, msg, sizeof msg);
    if (st != FXA_OK)
        printf("  backward: %s\n", msg);
    else
        CHECK(stats.rows == t->d.batch * t->d.heads_q * t->d.seq_q && stats.keys == t->d.seq_kv,
              "stats rows %lld keys %lld", (long long)stats.rows, (long long)stats.keys);
    return st;
}

static fxa_status run_bwd_on(void *t, int n_threads)
{
    return run_bwd(t, n_threads);
}

/* Gradients in bf16 and fp16 (grad_dtype): each element the conversion of
 * the fp32 run's (t's dq, dk, dv), padding left alone (0xffff). */
static void check_grad_dtypes(const char *label, tensors *t)
{
    const fxa_dtype dtypes[2] = {FXA_BF16, FXA_F16};
    const float *f32[3] = {t->dq, t->dk, t->dv};
    const size_t n[3] = {t->eq, t->ekv, t->ekv};
    for (int i = 0; i < 2; i++) {
        uint16_t *g[3];
        for (int w = 0; w < 3; w++) {
            g[w] = malloc(n[w] * 2);
            memset(g[w], 0xff, n[w] * 2);
        }
        fxa_attn_bwd_args a = args_of(t);
        a.dq = g[0], a.dk = g[1], a.dv = g[2];
        a.grad_dtype = dtypes[i];
        char msg[512];
        CHECK(fxt_bwd_once(&t->d, 2, &a, NULL, msg, sizeof msg) == FXA_OK, "[%s] grad_dtype %d: %s",
              label, (int)dtypes[i], msg);
        size_t wrong = 0;
        for (int w = 0; w < 3; w++) {
            for (size_t x = 0; x < n[w]; x++) {
                uint32_t bits;
                memcpy(&bits, &f32[w][x], 4);
                const uint16_t want = bits == 0xffffffffu     ? 0xffff
                                      : dtypes[i] == FXA_BF16 ? fxa_f32_to_bf16(f32[w][x])
                                                              : fxa_f32_to_f16(f32[w][x]);
                wrong += g[w][x] != want;
            }
            free(g[w]);
        }
        CHECK(wrong == 0,
              "[%s] grad_dtype %d: %zu gradient elements differ from the fp32 run's, "
              "converted",
              label, (int)dtypes[i], wrong);
    }
}

/* Build a case's tensors: random inputs, the forward's out and lse from
 * fxattn; the exact (rounded) inputs in contiguous doubles. */
static void build(const bcase *c, tensors *t)
{
    const fxt_bwd_shape *s = &c->s;
    const size_t nq = (size_t)(s->b * s->hq * s->sq * s->d);
    const size_t nkv = (size_t)(s->b * s->hkv * s->skv * s->d);
    memset(t, 0, sizeof *t);
    t->xq = malloc(nq * 8);
    t->xk = malloc(nkv * 8);
    t->xv = malloc(nkv * 8);
    t->xdout = malloc(nq * 8);
    fxt_rng r;
    fxt_rng_seed(&r, (uint64_t)(s->sq * 131 + s->skv * 7 + s->d));
    normal_pairs(&r, c->scale, t->xq, t->xdout, nq);
    if (c->hot > 0)
        for (size_t x = 0; x < nq; x++)
            if ((x / (size_t)s->d) % 7 == 3)
                t->xq[x] *= c->hot;
    normal_pairs(&r, c->scale, t->xk, t->xv, nkv);
    fxt_attn_desc(&t->d, s->b, s->hq, s->hkv, s->sq, s->skv, s->d);
    t->d.layout = c->layout;
    t->d.dtype = c->dtype;
    t->d.scale = s->tau;
    t->d.out_dtype = c->out_dtype;
    t->d.compute = c->compute;
    t->sq = case_strides(c, s->hq, s->sq);
    t->skv = case_strides(c, s->hkv, s->skv);
    if (c->pad) {
        t->d.q_strides = t->d.o_strides = t->sq;
        t->d.k_strides = t->d.v_strides = t->skv;
    }
    t->eq = extent(&t->sq, s, s->hq, s->sq);
    t->ekv = extent(&t->skv, s, s->hkv, s->skv);
    const size_t el = c->dtype == FXA_F32 ? 4 : 2;
    t->q = calloc(t->eq, el);
    t->k = calloc(t->ekv, el);
    t->v = calloc(t->ekv, el);
    t->out = calloc(t->eq, c->out_dtype == FXA_F32 ? 4 : 2);
    t->dout = calloc(t->eq, c->out_dtype == FXA_F32 ? 4 : 2);
    t->lse = calloc((size_t)(s->b * s->hq * s->sq), 4);
    t->dq = malloc(t->eq * 4);
    t->dk = malloc(t->ekv * 4);
    t->dv = malloc(t->ekv * 4);
    /* NaN bits: the backward writes every gradient element and no padding */
    memset(t->dq, 0xff, t->eq * 4);
    memset(t->dk, 0xff, t->ekv * 4);
    memset(t->dv, 0xff, t->ekv * 4);
    scatter(c, &t->sq, s->hq, s->sq, t->xq, t->q, c->dtype);
    scatter(c, &t->skv, s->hkv, s->skv, t->xk, t->k, c->dtype);
    scatter(c, &t->skv, s->hkv, s->skv, t->xv, t->v, c->dtype);
    scatter(c, &t->sq, s->hq, s->sq, t->xdout, t->dout, c->out_dtype);
    const fxa_attn_args a = {
        .struct_size = sizeof a, .q = t->q, .k = t->k, .v = t->v, .out = t->out, .lse = t->lse};
    fxt_fwd_checked(c->label, &t->d, &a);
}

/* bf16 compute: the gradients of the kernel set under test (keep) against
 * the reference set's (FXA_ISA=ref, the executable spec) on the same
 * inputs, within the first-order envelope env of either against fp64; the
 * share of elements that differ at all is printed. got: scratch. */
static void against_ref_set(const bcase *c, tensors *t, float *const keep[3], double *const env[3],
                            double *got)
{
    const fxt_bwd_shape *s = &c->s;
    const char *isa = getenv("FXA_ISA");
    char was[32] = "";
    if (isa)
        snprintf(was, sizeof was, "%s", isa);
    setenv("FXA_ISA", "ref", 1);
    CHECK(run_bwd(t, 2) == FXA_OK, "[%s] reference set", c->label);
    if (*was)
        setenv("FXA_ISA", was, 1);
    else
        unsetenv("FXA_ISA");
    const float *ref[3] = {t->dq, t->dk, t->dv};
    const char *names[3] = {"dq", "dk", "dv"};
    const size_t nq = (size_t)(s->b * s->hq * s->sq * s->d);
    const size_t nkv = (size_t)(s->b * s->hkv * s->skv * s->d);
    double *mine = malloc((nq > nkv ? nq : nkv) * 8);
    for (int w = 0; w < 3; w++) {
        const int64_t heads = w == 0 ? s->hq : s->hkv, seq = w == 0 ? s->sq : s->skv;
        const fxa_attn_strides *st = w == 0 ? &t->sq : &t->skv;
        const size_t n = w == 0 ? nq : nkv;
        gather(c, st, heads, seq, keep[w], FXA_F32, mine);
        gather(c, st, heads, seq, ref[w], FXA_F32, got);
        double worst = 0.0;
        size_t differ = 0;
        for (size_t x = 0; x < n; x++) {
            differ += mine[x] != got[x];
            worst = fmax(worst, fabs(mine[x] - got[x]) / (env[w][x] + 1e-300));
        }
        CHECK(worst <= 1.0,
              "[%s] %s: the kernel set differs from the reference set by %.3g of the "
              "envelope",
              c->label, names[w], worst);
        printf("[%s] %s against the reference set: %zu of %zu elements differ, at most %.3f of the "
               "envelope\n",
               c->label, names[w], differ, n, worst);
    }
    free(mine);
}

static void test_case(const bcase *c)
{
    const fxt_bwd_shape *s = &c->s;
    const size_t nq = (size_t)(s->b * s->hq * s->sq * s->d);
    const size_t nkv = (size_t)(s->b * s->hkv * s->skv * s->d);
    const size_t rows = (size_t)(s->b * s->hq * s->sq);
    double *out = malloc(nq * 8), *lse = malloc(rows * 8);
    double *g[3] = {malloc(nq * 8), malloc(nkv * 8), malloc(nkv * 8)};
    double *env[3] = {malloc(nq * 8), malloc(nkv * 8), malloc(nkv * 8)};
    double *got = malloc((nq > nkv ? nq : nkv) * 8);
    tensors t;
    build(c, &t);
    gather(c, &t.sq, s->hq, s->sq, t.out, c->out_dtype, out);
    for (size_t x = 0; x < rows; x++)
        lse[x] = t.lse[x];
    const fxt_bf16_rounding br = {c->compute == FXA_COMPUTE_BF16,
                                  c->compute == FXA_COMPUTE_BF16 && c->out_dtype == FXA_F32};
    fxt_ref_attn_bwd(s, br, t.xq, t.xk, t.xv, NULL, out, t.xdout, lse, g, env);
    CHECK(run_bwd(&t, 2) == FXA_OK, "[%s] backward failed", c->label);
    const float *res[3] = {t.dq, t.dk, t.dv};
    const char *names[3] = {"dq", "dk", "dv"};
    for (int w = 0; w < 3; w++) {
        const int64_t heads = w == 0 ? s->hq : s->hkv, seq = w == 0 ? s->sq : s->skv;
        gather(c, w == 0 ? &t.sq : &t.skv, heads, seq, res[w], FXA_F32, got);
        fxt_bwd_compare(c->label, names[w], got, g[w], env[w], w == 0 ? nq : nkv);
    }
    /* Bit-identical on 1, 2 and 3 threads (padding left alone). */
    float *keep[3] = {malloc(t.eq * 4), malloc(t.ekv * 4), malloc(t.ekv * 4)};
    float *const grads[3] = {t.dq, t.dk, t.dv};
    const size_t ng[3] = {t.eq, t.ekv, t.ekv};
    fxt_bwd_check_threads(c->label, run_bwd_on, &t, grads, keep, ng);
    check_grad_dtypes(c->label, &t);
    if (c->compute == FXA_COMPUTE_BF16)
        against_ref_set(c, &t, keep, env, got);
    for (int w = 0; w < 3; w++) {
        free(keep[w]);
        free(g[w]);
        free(env[w]);
    }
    free(got);
    free(out);
    free(lse);
    tensors_free(&t);
}

/* A run in chunks of one kv head (GQA 16:1, D 256: one head's Q and dO fill
 * the chunk budget; one thread) gives every head the bits of a plan over
 * that head alone (strided into the same buffers). On two threads a chunk
 * of one kv head would run two passes, so the plan's chunk takes both kv
 * heads (one pass, past the budget): the same bits again. */
static void test_chunks(void)
{
    enum { HQ = 32, HKV = 2, G = 16, SQ = 1030, SKV = 16, DD = 256 };
    const size_t nq = (size_t)HQ * SQ * DD, nkv = (size_t)HKV * SKV * DD, ng = nq + 2 * nkv;
    const char *isa = getenv("FXA_ISA");
    if (isa && strcmp(isa, "ref") == 0) { /* the driver is the same for every set */
        printf("chunks: run with the SIMD kernel sets (ref: too slow for its 3 GFLOP)\n");
        return;
    }
    float *q = malloc(nq * 4), *k = malloc(nkv * 4), *v = malloc(nkv * 4), *dout = malloc(nq * 4);
    float *out = malloc(nq * 4), *lse = malloc((size_t)HQ * SQ * 4);
    /* dq, dk and dv back to back: of the chunked run (g) and of the others (h) */
    float *g = malloc(ng * 4), *h = malloc(ng * 4);
    fxt_rng r;
    fxt_rng_seed(&r, 3); /* uniform in [-2, 2): cheap for 17M values */
    for (size_t x = 0; x < nq; x++) {
        q[x] = 4.0f * fxt_rng_uniform24(&r) - 2.0f;
        dout[x] = 4.0f * fxt_rng_uniform24(&r) - 2.0f;
    }
    for (size_t x = 0; x < nkv; x++) {
        k[x] = 4.0f * fxt_rng_uniform24(&r) - 2.0f;
        v[x] = 4.0f * fxt_rng_uniform24(&r) - 2.0f;
    }
    fxa_ctx *ctx = fxt_ctx(1);
    fxa_attn_desc d;
    fxt_attn_desc(&d, 1, HQ, HKV, SQ, SKV, DD);
    d.layout = FXA_LAYOUT_BHSD;
    fxa_attn_plan *fwd = NULL;
    fxa_attn_bwd_plan *bwd = NULL;
    size_t ws_f = 0, ws_b = 0;
    CHECK(fxa_attn_plan_create(ctx, &d, &fwd, &ws_f) == FXA_OK, "chunks: %s",
          fxa_ctx_last_error(ctx));
    void *wf = aligned_alloc(64, (ws_f + 63) / 64 * 64);
    const fxa_attn_args fa = {
        .struct_size = sizeof fa, .q = q, .k = k, .v = v, .out = out, .lse = lse};
    CHECK(fxa_attn_run(fwd, &fa, wf, NULL) == FXA_OK, "chunks forward: %s",
          fxa_ctx_last_error(ctx));
    CHECK(fxa_attn_bwd_plan_create(ctx, &d, &bwd, &ws_b) == FXA_OK, "chunks: %s",
          fxa_ctx_last_error(ctx));
    CHECK(bwd && bwd->chunk_kv_heads == 1, "the chunk holds %lld kv heads, not 1",
          bwd ? (long long)bwd->chunk_kv_heads : -1LL);
    void *wb = aligned_alloc(64, (ws_b + 63) / 64 * 64);
    fxa_attn_bwd_args a = fxt_bwd_args(q, k, v, out, dout, lse, g, g + nq, g + nq + nkv);
    CHECK(fxa_attn_bwd_run(bwd, &a, wb, NULL) == FXA_OK, "chunks: %s", fxa_ctx_last_error(ctx));
    fxa_attn_bwd_plan_destroy(bwd);
    free(wb);
    fxa_ctx *ctx2 = fxt_ctx(2);
    CHECK(ctx2 != NULL, "two threads");
    CHECK(fxa_attn_bwd_plan_create(ctx2, &d, &bwd, &ws_b) == FXA_OK, "two threads: %s",
          fxa_ctx_last_error(ctx2));
    CHECK(bwd && bwd->chunk_kv_heads == 2, "two threads: the chunk holds %lld kv heads, not 2",
          bwd ? (long long)bwd->chunk_kv_heads : -1LL);
    wb = aligned_alloc(64, (ws_b + 63) / 64 * 64);
    a.dq = h;
    a.dk = h + nq;
    a.dv = h + nq + nkv;
    CHECK(fxa_attn_bwd_run(bwd, &a, wb, NULL) == FXA_OK, "two threads: %s",
          fxa_ctx_last_error(ctx2));
    CHECK(memcmp(g, h, ng * 4) == 0,
          "two threads, one pass: gradients differ from the chunks of one kv head");
    fxa_attn_bwd_plan_destroy(bwd);
    fxa_ctx_destroy(ctx2);
    free(wb);
    memset(h, 0, ng * 4);
    /* Each kv head alone, through strides of the whole tensors. */
    fxa_attn_desc one = d;
    one.heads_q = G;
    one.heads_kv = 1;
    one.q_strides = one.o_strides = fxa_attn_layout_strides(FXA_LAYOUT_BHSD, HQ, SQ, DD);
    one.k_strides = one.v_strides = fxa_attn_layout_strides(FXA_LAYOUT_BHSD, HKV, SKV, DD);
    CHECK(fxa_attn_bwd_plan_create(ctx, &one, &bwd, &ws_b) == FXA_OK, "one head: %s",
          fxa_ctx_last_error(ctx));
    wb = aligned_alloc(64, (ws_b + 63) / 64 * 64);
    for (int64_t kv = 0; kv < HKV; kv++) {
        const size_t qo = (size_t)(kv * G * SQ * DD), ko = (size_t)(kv * SKV * DD);
        a = fxt_bwd_args(q + qo, k + ko, v + ko, out + qo, dout + qo, lse + kv * G * SQ, h + qo,
                         h + nq + ko, h + nq + nkv + ko);
        CHECK(fxa_attn_bwd_run(bwd, &a, wb, NULL) == FXA_OK, "one head: %s",
              fxa_ctx_last_error(ctx));
    }
    CHECK(memcmp(g, h, ng * 4) == 0, "chunked gradients differ from each head's own plan's");
    fxa_attn_bwd_plan_destroy(bwd);
    fxa_attn_plan_destroy(fwd);
    fxa_ctx_destroy(ctx);
    float *const bufs[] = {q, k, v, dout, out, lse, g, h};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    free(wb);
    free(wf);
}

/* Bad inputs: refused with a status and a message, no output written. */
static void test_refusals(void)
{
    const bcase c = {
        "refusals",      {1, 2, 1, 20, 30, 16, 0.25}, FXA_LAYOUT_BHSD, FXA_F32, 0, 0, 1, FXA_F32,
        FXA_COMPUTE_FP32};
    const fxt_bwd_shape *s = &c.s;
    tensors t;
    build(&c, &t);
    fxa_ctx *ctx = fxt_ctx(0);
    fxa_attn_bwd_plan *plan = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_bwd_plan_create(ctx, &t.d, &plan, &ws_bytes) == FXA_OK, "plan: %s",
          fxa_ctx_last_error(ctx));
    void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64);
    fxa_attn_bwd_args a = args_of(&t);
    memset(t.dq, 0xff, t.eq * 4);
    struct {
        const char *what, *expect;
        fxa_attn_bwd_args a;
    } bad[6];
    for (int i = 0; i < 6; i++)
        bad[i].a = a;
    bad[0].what = "NULL q";
    bad[0].expect = "must not be NULL";
    bad[0].a.q = NULL;
    bad[1].what = "missing lse";
    bad[1].expect = "lse is missing";
    bad[1].a.lse = NULL;
    bad[2].what = "NULL dv";
    bad[2].expect = "must not be NULL";
    bad[2].a.dv = NULL;
    bad[3].what = "struct_size";
    bad[3].expect = "fxa_attn_bwd_args";
    bad[3].a.struct_size = 3;
    bad[4].what = "dq over K";
    bad[4].expect = "dq";
    bad[4].a.dq = (float *)t.k;
    bad[5].what = "dout NaN";
    bad[5].expect = "dout has a non-finite value at batch 0, token 5, head 1, dim 3";
    float *dout32 = t.dout;
    const float keep = dout32[(1 * s->sq + 5) * s->d + 3];
    for (int i = 0; i < 6; i++) {
        if (i == 5)
            dout32[(1 * s->sq + 5) * s->d + 3] = NAN;
        const fxa_status st = fxa_attn_bwd_run(plan, &bad[i].a, ws, NULL);
        CHECK(st == FXA_ERR_INVALID_ARG && strstr(fxa_ctx_last_error(ctx), bad[i].expect),
              "%s: status %d, message \"%s\"", bad[i].what, (int)st, fxa_ctx_last_error(ctx));
        printf("refused (%s): %s\n", bad[i].what, fxa_ctx_last_error(ctx));
    }
    /* Several non-finite values, checked on the context's threads: the
     * first in tensor order (Q, K, V, out, dout), then row order (batch,
     * head, token), is the one named. */
    float *k32 = t.k;
    const float k_keep = k32[(0 * s->skv + 29) * s->d + 15];
    const float dout_keep = dout32[(0 * s->sq + 17) * s->d + 9];
    dout32[(0 * s->sq + 17) * s->d + 9] = INFINITY;
    CHECK(fxa_attn_bwd_run(plan, &a, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx),
                     "dout has a non-finite value at batch 0, token 17, head 0, dim 9"),
          "two non-finite dout values: %s", fxa_ctx_last_error(ctx));
    k32[(0 * s->skv + 29) * s->d + 15] = -INFINITY;
    CHECK(fxa_attn_bwd_run(plan, &a, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx),
                     "K has a non-finite value at batch 0, token 29, head 0, dim 15"),
          "K and dout non-finite: %s", fxa_ctx_last_error(ctx));
    k32[(0 * s->skv + 29) * s->d + 15] = k_keep;
    dout32[(0 * s->sq + 17) * s->d + 9] = dout_keep;
    dout32[(1 * s->sq + 5) * s->d + 3] = keep;
    const float lse_keep = t.lse[7];
    t.lse[7] = INFINITY;
    CHECK(fxa_attn_bwd_run(plan, &a, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "lse has a non-finite value"),
          "Inf lse: %s", fxa_ctx_last_error(ctx));
    t.lse[7] = lse_keep;
    uint32_t bits;
    memcpy(&bits, t.dq, 4);
    CHECK(bits == 0xffffffffu, "a refused run wrote dq");
    /* Stats: written within struct_size (a canary past it stays), a size
     * past sizeof refused before anything is computed. */
    unsigned char buf[sizeof(fxa_attn_bwd_stats) + 16];
    memset(buf, 0xa5, sizeof buf);
    const size_t ssz = sizeof(fxa_attn_bwd_stats);
    memcpy(buf, &ssz, sizeof ssz);
    CHECK(fxa_attn_bwd_run(plan, &a, ws, (fxa_attn_bwd_stats *)(void *)buf) == FXA_OK, "stats: %s",
          fxa_ctx_last_error(ctx));
    int canary = 1;
    for (size_t x = ssz; x < sizeof buf; x++)
        canary &= buf[x] == 0xa5;
    CHECK(canary, "the stats were written past struct_size");
    fxa_attn_bwd_stats big = {.struct_size = sizeof big + 8};
    CHECK(fxa_attn_bwd_run(plan, &a, ws, &big) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "fxa_attn_bwd_stats"),
          "oversized stats: %s", fxa_ctx_last_error(ctx));
    /* Finite inputs whose q.k could overflow fp32: unsupported, said so. */
    float *huge = malloc(t.eq * 4);
    for (size_t x = 0; x < t.eq; x++)
        huge[x] = 1e38f;
    fxa_attn_bwd_args h = a;
    h.q = huge;
    CHECK(fxa_attn_bwd_run(plan, &h, ws, NULL) == FXA_ERR_UNSUPPORTED &&
              strstr(fxa_ctx_last_error(ctx), "without prescaling"),
          "huge q: %s", fxa_ctx_last_error(ctx));
    free(huge);
    fxa_attn_bwd_args odd = a;
    odd.grad_dtype = (fxa_dtype)7;
    CHECK(fxa_attn_bwd_run(plan, &odd, ws, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "grad_dtype 7 is not"),
          "grad_dtype 7: %s", fxa_ctx_last_error(ctx));
    CHECK(fxa_attn_bwd_run(NULL, &a, ws, NULL) == FXA_ERR_INVALID_ARG, "NULL plan");
    CHECK(fxa_attn_bwd_run(plan, NULL, ws, NULL) == FXA_ERR_INVALID_ARG, "NULL args");
    CHECK(fxa_attn_bwd_run(plan, &a, NULL, NULL) == FXA_ERR_INVALID_ARG, "NULL workspace");
    fxa_attn_bwd_plan_destroy(plan);
    /* Plans: bf16 compute on fp32 inputs refused (as the forward's), causal
     * with a mask, aliasing gradient strides, NULLs; causal with bf16
     * compute taken. */
    fxa_attn_desc d = t.d;
    d.compute = FXA_COMPUTE_BF16;
    CHECK(fxa_attn_bwd_plan_create(ctx, &d, &plan, &ws_bytes) == FXA_ERR_INVALID_ARG &&
              plan == NULL && strstr(fxa_ctx_last_error(ctx), "bf16 compute needs bf16 inputs"),
          "bf16 compute on f32: %s", fxa_ctx_last_error(ctx));
    d = t.d;
    d.causal = 1; /* with a mask: the forward's refusal (test_attn_bwd_mask: each alone) */
    d.mask_kind = FXA_MASK_BOOL;
    d.mask_strides = (fxa_mask_strides){0, 0, 0, 1};
    CHECK(fxa_attn_bwd_plan_create(ctx, &d, &plan, &ws_bytes) == FXA_ERR_INVALID_ARG &&
              plan == NULL && strstr(fxa_ctx_last_error(ctx), "causal and a mask"),
          "causal and mask: %s", fxa_ctx_last_error(ctx));
    d = t.d;
    d.dtype = FXA_BF16;
    d.compute = FXA_COMPUTE_BF16;
    d.causal = 1;
    CHECK(fxa_attn_bwd_plan_create(ctx, &d, &plan, &ws_bytes) == FXA_OK && plan != NULL,
          "causal with bf16 compute: %s", fxa_ctx_last_error(ctx));
    fxa_attn_bwd_plan_destroy(plan);
    d = t.d;
    d.k_strides = (fxa_attn_strides){0, (int64_t)s->d, 0}; /* batch 0, head 0: heads share rows */
    d.heads_kv = 2;
    d.heads_q = 2;
    CHECK(fxa_attn_bwd_plan_create(ctx, &d, &plan, &ws_bytes) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(ctx), "dk alias"),
          "aliasing k_strides: %s", fxa_ctx_last_error(ctx));
    CHECK(fxa_attn_bwd_plan_create(ctx, NULL, &plan, &ws_bytes) == FXA_ERR_INVALID_ARG,
          "NULL desc");
    CHECK(fxa_attn_bwd_plan_create(NULL, &t.d, &plan, &ws_bytes) == FXA_ERR_INVALID_ARG,
          "NULL ctx");
    CHECK(fxa_attn_bwd_flops(NULL) == 0.0 && fxa_attn_bwd_flops(&t.d) == 2.5 * fxa_attn_flops(&t.d),
          "flops");
    fxa_attn_bwd_plan_destroy(NULL);
    free(ws);
    fxa_ctx_destroy(ctx);
    tensors_free(&t);
}

/* An lse that is not the forward's: a row's lse lowered by 10 puts its
 * recomputed P above 2 (e^10 times a weight of at least 1 / Skv), finite;
 * lowered by 200, inf. Refused naming the row, in both computes, for a
 * row of a full bf16 row pair and for the odd last row of a block (13
 * query rows: its pair has one row), so the P check reads exactly the
 * tile's rows in either layout. */
static void test_foreign_lse(void)
{
    const bcase cases[2] = {
        {"foreign lse fp32",
         {1, 2, 1, 13, 30, 16, 0},
         FXA_LAYOUT_BHSD,
         FXA_F32,
         0,
         0,
         1,
         FXA_F32,
         FXA_COMPUTE_FP32},
        {"foreign lse bf16 compute",
         {1, 2, 1, 13, 30, 16, 0},
         FXA_LAYOUT_BHSD,
         FXA_BF16,
         0,
         0,
         1,
         FXA_F32,
         FXA_COMPUTE_BF16},
    };
    fxa_ctx *ctx = fxt_ctx(0);
    for (int c = 0; c < 2; c++) {
        const fxt_bwd_shape *s = &cases[c].s;
        tensors t;
        build(&cases[c], &t);
        fxa_attn_bwd_plan *plan = NULL;
        size_t ws_bytes = 0;
        CHECK(fxa_attn_bwd_plan_create(ctx, &t.d, &plan, &ws_bytes) == FXA_OK, "%s: plan: %s",
              cases[c].label, fxa_ctx_last_error(ctx));
        void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64 + 64);
        const fxa_attn_bwd_args a = args_of(&t);
        CHECK(fxa_attn_bwd_run(plan, &a, ws, NULL) == FXA_OK, "%s: the forward's lse: %s",
              cases[c].label, fxa_ctx_last_error(ctx));
        const struct {
            int64_t head, token;
            float by;
        } shift[4] = {{1, 12, 10.0f}, {0, 3, 10.0f}, {1, 12, 200.0f}, {0, 6, 200.0f}};
        for (int i = 0; i < 4; i++) {
            float *row = t.lse + shift[i].head * s->sq + shift[i].token;
            const float keep = *row;
            *row -= shift[i].by;
            char want[64];
            snprintf(want, sizeof want, "head %lld, token %lld;", (long long)shift[i].head,
                     (long long)shift[i].token);
            const fxa_status st = fxa_attn_bwd_run(plan, &a, ws, NULL);
            CHECK(st == FXA_ERR_INVALID_ARG &&
                      strstr(fxa_ctx_last_error(ctx), "not the forward's") &&
                      strstr(fxa_ctx_last_error(ctx), want),
                  "%s: lse of head %lld token %lld lowered by %g: status %d, '%s'", cases[c].label,
                  (long long)shift[i].head, (long long)shift[i].token, (double)shift[i].by, (int)st,
                  fxa_ctx_last_error(ctx));
            *row = keep;
        }
        fxa_attn_bwd_plan_destroy(plan);
        free(ws);
        tensors_free(&t);
    }
    fxa_ctx_destroy(ctx);
}

int main(void)
{
    test_require_isa("test_attn_bwd");
    test_finite_differences();
    const bcase cases[] = {
        {"random bhsd D40",
         {1, 2, 2, 70, 150, 40, 0},
         FXA_LAYOUT_BHSD,
         FXA_F32,
         0,
         0,
         1,
         FXA_F32,
         FXA_COMPUTE_FP32},
        {"gqa bshd D72",
         {2, 4, 2, 33, 200, 72, 0},
         FXA_LAYOUT_BSHD,
         FXA_F32,
         0,
         0,
         1,
         FXA_F32,
         FXA_COMPUTE_FP32},
        {"mqa padded D128",
         {1, 3, 1, 130, 97, 128, 0},
         FXA_LAYOUT_BSHD,
         FXA_F32,
         5,
         0,
         1,
         FXA_F32,
         FXA_COMPUTE_FP32},
        {"hot rows bhsd",
         {1, 2, 1, 64, 129, 64, 0},
         FXA_LAYOUT_BHSD,
         FXA_F32,
         0,
         8.0,
         2.0,
         FXA_F32,
         FXA_COMPUTE_FP32},
        {"bf16 inputs D16",
         {1, 2, 2, 40, 260, 16, 0.3},
         FXA_LAYOUT_BSHD,
         FXA_BF16,
         0,
         0,
         1,
         FXA_F32,
         FXA_COMPUTE_FP32},
        {"one pass, 6 kv heads",
         {1, 6, 6, 40, 90, 32, 0},
         FXA_LAYOUT_BSHD,
         FXA_F32,
         0,
         0,
         1,
         FXA_F32,
         FXA_COMPUTE_FP32},
        {"f16 inputs, bf16 out and dout",
         {1, 4, 2, 50, 70, 24, 0},
         FXA_LAYOUT_BHSD,
         FXA_F16,
         3,
         0,
         1,
         FXA_BF16,
         FXA_COMPUTE_FP32},
        /* bf16 compute: odd D, odd Sq and Skv (pad pairs), fp32 dout rounded */
        {"bf16 compute D37 odd",
         {1, 2, 2, 71, 151, 37, 0},
         FXA_LAYOUT_BHSD,
         FXA_BF16,
         0,
         0,
         1,
         FXA_F32,
         FXA_COMPUTE_BF16},
        {"bf16 compute gqa bshd D72, bf16 out, 2 key blocks",
         {2, 4, 2, 33, 520, 72, 0},
         FXA_LAYOUT_BSHD,
         FXA_BF16,
         0,
         0,
         1,
         FXA_BF16,
         FXA_COMPUTE_BF16},
        {"bf16 compute mqa padded D128",
         {1, 3, 1, 130, 97, 128, 0},
         FXA_LAYOUT_BSHD,
         FXA_BF16,
         5,
         0,
         1,
         FXA_BF16,
         FXA_COMPUTE_BF16},
        {"bf16 compute hot rows, 6 kv heads, 2 key blocks",
         {1, 6, 6, 64, 300, 64, 0},
         FXA_LAYOUT_BHSD,
         FXA_BF16,
         0,
         8.0,
         2.0,
         FXA_F32,
         FXA_COMPUTE_BF16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bcase c = cases[i];
        if (c.s.tau == 0)
            c.s.tau = 1.0 / sqrt((double)c.s.d);
        test_case(&c);
    }
    test_chunks();
    test_refusals();
    test_foreign_lse();
    return test_summary("test_attn_bwd");
}
