/*
 * test_attn_bwd_mask: the attention backward with masks and causal against
 * an fp64 reference computed here from the same inputs (Q, K, V, dO, the
 * mask, and the forward's out and lse as fxattn returned them), within the
 * first-order fp32 envelope of docs/numerics.md ("Backward", with the
 * bias's rounding), per element. The reference is checked against central
 * finite differences of L = sum dO . O in fp64 on a tiny shape with a
 * boolean mask, an additive mask and causal, a row with every key masked
 * included (a constant: its gradients are 0). Cases: a boolean mask
 * [B, Hq, Sq, Skv] with GQA, one stored transposed (keys Sq apart), an
 * additive mask broadcast over heads (-inf
 * entries included), key padding [B, 1, 1, Skv] that masks whole key
 * tiles, causal with Sq == Skv, Sq < Skv (keys no query sees: dK = dV = 0)
 * and Sq > Skv, and rows with every key masked (dQ exactly 0; their lse
 * -inf accepted); the same kinds with bf16 compute (bf16 inputs) within
 * test_attn_bwd.c's bf16 envelope (256-key tiles, odd D, odd Sq, causal
 * cuts at an odd key). Each case is bit-identical on 1, 2 and 3 threads (the
 * one-pass and two-pass schedules). Refusals: a masked plan without
 * args->mask, a mask that overlaps dq, a NaN in an additive mask, lse -inf
 * without a mask. Runs once per kernel set (FXA_ISA).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"

#define LOG2E 1.4426950408889634

typedef enum mkind { M_NONE, M_BOOL, M_BOOL_T, M_ADD, M_PAD, M_CAUSAL } mkind;

typedef struct mcase {
    const char *label;
    int64_t b, hq, hkv, sq, skv, d;
    mkind kind;
    int dead_rows; /* every 9th query row (bool mask) has every key masked */
    int bf16;      /* bf16 inputs and bf16 compute (dO and out fp32) */
} mcase;

/* The problem: inputs in contiguous [B, H, S, D] fp32 (and their doubles),
 * the mask (uint8_t or float) and its natural-log bias in doubles [B, Hq,
 * Sq, Skv] (-inf masked, 0 where no mask). */
typedef struct problem {
    const mcase *c;
    fxa_attn_desc d;
    size_t nq, nkv, rows, nbias;
    float *q, *k, *v, *dout, *out, *lse, *dq, *dk, *dv;
    uint16_t *q16, *k16, *v16; /* bf16 cases: Q, K, V as given (q, k, v their values) */
    void *mask;
    double *bias;
} problem;

/* ---- fp64 reference ---- */

/* Attention in fp64 with bias [B, Hq, Sq, Skv] (natural log): out, lse;
 * a row with every key masked gets out 0 and lse -inf. */
static void ref_forward(const mcase *c, const double *q, const double *k, const double *v,
                        const double *bias, double *out, double *lse)
{
    const int64_t g = c->hq / c->hkv;
    double *z = malloc((size_t)c->skv * sizeof *z);
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t h = 0; h < c->hq; h++)
            for (int64_t i = 0; i < c->sq; i++) {
                const int64_t row = (b * c->hq + h) * c->sq + i;
                const double *qi = q + row * c->d;
                const double *kh = k + (b * c->hkv + h / g) * c->skv * c->d;
                const double *vh = v + (b * c->hkv + h / g) * c->skv * c->d;
                const double tau = 1.0 / sqrt((double)c->d);
                double m = -INFINITY, l = 0.0;
                for (int64_t j = 0; j < c->skv; j++) {
                    double dot = 0.0;
                    for (int64_t e = 0; e < c->d; e++)
                        dot += qi[e] * kh[j * c->d + e];
                    z[j] = tau * dot + bias[row * c->skv + j];
                    m = fmax(m, z[j]);
                }
                double *o = out + row * c->d;
                memset(o, 0, (size_t)c->d * sizeof *o);
                if (m == -INFINITY) {
                    lse[row] = -INFINITY;
                    continue;
                }
                for (int64_t j = 0; j < c->skv; j++) {
                    const double p = exp(z[j] - m);
                    l += p;
                    for (int64_t e = 0; e < c->d; e++)
                        o[e] += p * vh[j * c->d + e];
                }
                for (int64_t e = 0; e < c->d; e++)
                    o[e] /= l;
                lse[row] = m + log(l);
            }
    free(z);
}

/*
 * The gradients in fp64 from the given out and lse, P_ij = exp(tau s_ij +
 * bias_ij - lse_i) (0 for a masked key or a row with lse -inf), and with
 * env the first-order fp32 envelope of test_attn_bwd.c with the bias's
 * terms: fxattn rounds the base-2 bias (u |bias2|) and lse2 - bias2
 * (u |lse2 - bias2|) before the exp2's argument is formed. bf16 cases add
 * test_attn_bwd.c's bf16 terms (ub = 2^-8; the fp32 dO rounded): dp off
 * by ub B_ij, dS rounded (ub |ds_ij|), dV's terms by 2 ub (P and dO
 * rounded).
 */
static void ref_backward(const mcase *c, const double *q, const double *k, const double *v,
                         const double *bias, const double *out, const double *dout,
                         const double *lse, double *grad[3], double *env[3])
{
    const int64_t g = c->hq / c->hkv;
    const double u = 0x1p-24, tau = 1.0 / sqrt((double)c->d), lambda = tau * LOG2E;
    const double ub = c->bf16 ? 0x1p-8 : 0.0;
    const size_t n[3] = {(size_t)(c->b * c->hq * c->sq * c->d),
                         (size_t)(c->b * c->hkv * c->skv * c->d),
                         (size_t)(c->b * c->hkv * c->skv * c->d)};
    for (int w = 0; w < 3; w++) {
        memset(grad[w], 0, n[w] * sizeof(double));
        if (env)
            memset(env[w], 0, n[w] * sizeof(double));
    }
    const double n_kv_terms = (double)(g * c->sq), n_q_terms = (double)c->skv;
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t h = 0; h < c->hq; h++)
            for (int64_t i = 0; i < c->sq; i++) {
                const int64_t row = (b * c->hq + h) * c->sq + i;
                if (lse[row] == -INFINITY)
                    continue; /* every key masked: a constant row */
                const double *qi = q + row * c->d, *oi = out + row * c->d;
                const double *doi = dout + row * c->d;
                double delta = 0.0;
                for (int64_t e = 0; e < c->d; e++)
                    delta += doi[e] * oi[e];
                const double lse2 = lse[row] * LOG2E;
                for (int64_t j = 0; j < c->skv; j++) {
                    const double bij = bias[row * c->skv + j];
                    if (bij == -INFINITY)
                        continue;
                    const int64_t krow = (b * c->hkv + h / g) * c->skv + j;
                    const double *kj = k + krow * c->d, *vj = v + krow * c->d;
                    double dot = 0.0, dp = 0.0, A = 0.0, B = 0.0;
                    for (int64_t e = 0; e < c->d; e++) {
                        dot += qi[e] * kj[e];
                        dp += doi[e] * vj[e];
                        A += fabs(qi[e] * kj[e]);
                        B += fabs(doi[e] * vj[e]);
                    }
                    const double p = exp(tau * dot + bij - lse[row]);
                    const double ds = p * (dp - delta);
                    for (int64_t e = 0; e < c->d; e++) {
                        grad[2][krow * c->d + e] += p * doi[e];
                        grad[1][krow * c->d + e] += tau * ds * qi[e];
                        grad[0][row * c->d + e] += tau * ds * kj[e];
                    }
                    if (!env)
                        continue;
                    const double b2 = bij * LOG2E;
                    const double x = lambda * dot + b2 - lse2;
                    const double a = lambda * (double)(c->d + 2) * u * A + u * fabs(lse2) +
                                     u * fabs(b2) + u * fabs(lse2 - b2) + u * fabs(x);
                    const double eps = 0.6931471805599453 * a + 3 * u;
                    const double e_ds = p * ((eps + 2 * u) * fabs(dp - delta) +
                                             ((double)c->d * u + ub) * B + u * fabs(delta)) +
                                        ub * fabs(ds);
                    for (int64_t e = 0; e < c->d; e++) {
                        env[2][krow * c->d + e] +=
                            (eps + u + 2 * ub + n_kv_terms * u) * p * fabs(doi[e]);
                        env[1][krow * c->d + e] +=
                            tau * (e_ds + (1 + n_kv_terms) * u * fabs(ds)) * fabs(qi[e]);
                        env[0][row * c->d + e] +=
                            tau * (e_ds + (1 + n_q_terms) * u * fabs(ds)) * fabs(kj[e]);
                    }
                }
            }
    if (env)
        for (int w = 0; w < 2; w++)
            for (size_t x = 0; x < n[w]; x++)
                env[w][x] += 2 * u * fabs(grad[w][x]);
}

/* The reference against central differences of L = sum dO . O(q, k, v),
 * for a boolean mask with a dead row, an additive mask and causal (each a
 * bias matrix). */
static void test_finite_differences(void)
{
    enum { SQ = 4, SKV = 5, DD = 3, NQ = SQ * DD, NKV = SKV * DD };
    const mcase c = {"fd", 1, 1, 1, SQ, SKV, DD, M_NONE, 0, 0};
    double q[NQ], k[NKV], v[NKV], dout[NQ], out[NQ], lse[SQ], bias[SQ * SKV];
    double dq[NQ], dk[NKV], dv[NKV];
    double *grad[3] = {dq, dk, dv};
    fxt_rng r;
    fxt_rng_seed(&r, 17);
    for (int x = 0; x < NQ; x++) {
        q[x] = fxt_rng_normal(&r);
        dout[x] = fxt_rng_normal(&r);
    }
    for (int x = 0; x < NKV; x++) {
        k[x] = fxt_rng_normal(&r);
        v[x] = fxt_rng_normal(&r);
    }
    double worst = 0.0, dead = 0.0;
    for (int kind = 0; kind < 3; kind++) {
        for (int i = 0; i < SQ; i++)
            for (int j = 0; j < SKV; j++) {
                double x = 0.0;
                if (kind == 0) /* boolean, row 2 all masked */
                    x = (i == 2 || (i + 2 * j) % 3 == 0) ? -INFINITY : 0.0;
                else if (kind == 1) /* additive */
                    x = (i + j) % 4 == 1 ? -INFINITY : 2.0 * fxt_rng_normal(&r);
                else /* causal */
                    x = j <= i ? 0.0 : -INFINITY;
                bias[i * SKV + j] = x;
            }
        ref_forward(&c, q, k, v, bias, out, lse);
        ref_backward(&c, q, k, v, bias, out, dout, lse, grad, NULL);
        double *const xs[3] = {q, k, v};
        const int ns[3] = {NQ, NKV, NKV};
        const double hstep = 1e-5;
        for (int t = 0; t < 3; t++)
            for (int x = 0; x < ns[t]; x++) {
                double lo = 0.0, hi = 0.0, o2[NQ], l2[SQ];
                const double keep = xs[t][x];
                xs[t][x] = keep + hstep;
                ref_forward(&c, q, k, v, bias, o2, l2);
                for (int y = 0; y < NQ; y++)
                    hi += dout[y] * o2[y];
                xs[t][x] = keep - hstep;
                ref_forward(&c, q, k, v, bias, o2, l2);
                for (int y = 0; y < NQ; y++)
                    lo += dout[y] * o2[y];
                xs[t][x] = keep;
                worst = fmax(worst, fabs((hi - lo) / (2 * hstep) - grad[t][x]));
            }
        if (kind == 0)
            for (int e = 0; e < DD; e++)
                dead = fmax(dead, fabs(dq[2 * DD + e]));
    }
    /* central differences err by ~h^2 |L'''| + eps/h: ~1e-10 here */
    CHECK(worst < 1e-7, "masked reference gradients differ from finite differences by %.3g", worst);
    CHECK(dead == 0.0, "the dead row's reference dq is %.3g, not 0", dead);
    printf("finite differences (bool, additive, causal): max |fd - ref| = %.3g\n", worst);
}

/* ---- fxattn on one case ---- */

/* Mask element (b, h, i, j) of the case: its bias (natural log), writing
 * the case's mask value at its place (mask strides of build()). */
static double mask_value(const mcase *c, fxt_rng *r, int64_t b, int64_t h, int64_t i, int64_t j)
{
    switch (c->kind) {
    case M_BOOL:
    case M_BOOL_T:
        return (c->dead_rows && i % 9 == 4) || fxt_rng_uniform24(r) < 0.3 ? -INFINITY : 0.0;
    case M_ADD: {
        (void)h;
        const double x = 3.0 * fxt_rng_normal(r);
        return fxt_rng_uniform24(r) < 0.15 ? -INFINITY : x;
    }
    case M_PAD: /* batch 0 keeps 100 keys, batch 1 keeps 7 (whole key tiles masked) */
        (void)i;
        return j < (b == 0 ? 100 : 7) ? 0.0 : -INFINITY;
    case M_CAUSAL: return j <= i ? 0.0 : -INFINITY;
    default: return 0.0;
    }
}

static void build(const mcase *c, problem *pb)
{
    memset(pb, 0, sizeof *pb);
    pb->c = c;
    pb->nq = (size_t)(c->b * c->hq * c->sq * c->d);
    pb->nkv = (size_t)(c->b * c->hkv * c->skv * c->d);
    pb->rows = (size_t)(c->b * c->hq * c->sq);
    pb->nbias = pb->rows * (size_t)c->skv;
    float **f[9] = {&pb->q,   &pb->k,  &pb->v,  &pb->dout, &pb->out,
                    &pb->lse, &pb->dq, &pb->dk, &pb->dv};
    const size_t n[9] = {pb->nq,   pb->nkv, pb->nkv, pb->nq, pb->nq,
                         pb->rows, pb->nq,  pb->nkv, pb->nkv};
    for (int x = 0; x < 9; x++)
        *f[x] = calloc(n[x], sizeof(float));
    fxt_rng r;
    fxt_rng_seed(&r, (uint64_t)(c->sq * 131 + c->skv * 7 + c->kind));
    for (size_t x = 0; x < pb->nq; x++) {
        pb->q[x] = (float)fxt_rng_normal(&r);
        pb->dout[x] = (float)fxt_rng_normal(&r);
    }
    for (size_t x = 0; x < pb->nkv; x++) {
        pb->k[x] = (float)fxt_rng_normal(&r);
        pb->v[x] = (float)fxt_rng_normal(&r);
    }
    fxa_attn_desc_init(&pb->d);
    if (c->bf16) {
        uint16_t **h[3] = {&pb->q16, &pb->k16, &pb->v16};
        float *x[3] = {pb->q, pb->k, pb->v};
        for (int t = 0; t < 3; t++) {
            const size_t nt = t == 0 ? pb->nq : pb->nkv;
            *h[t] = malloc(nt * sizeof(uint16_t));
            for (size_t e = 0; e < nt; e++) {
                (*h[t])[e] = fxa_f32_to_bf16(x[t][e]);
                x[t][e] = fxa_bf16_to_f32((*h[t])[e]);
            }
        }
        pb->d.dtype = FXA_BF16;
        pb->d.compute = FXA_COMPUTE_BF16;
    }
    pb->d.batch = c->b;
    pb->d.heads_q = c->hq;
    pb->d.heads_kv = c->hkv;
    pb->d.seq_q = c->sq;
    pb->d.seq_kv = c->skv;
    pb->d.head_dim = c->d;
    pb->d.layout = FXA_LAYOUT_BHSD;
    pb->bias = malloc(pb->nbias * sizeof(double));
    fxa_mask_strides ms = {c->hq * c->sq * c->skv, c->sq * c->skv, c->skv, 1};
    if (c->kind == M_ADD) /* broadcast over heads */
        ms = (fxa_mask_strides){c->sq * c->skv, 0, c->skv, 1};
    else if (c->kind == M_PAD)
        ms = (fxa_mask_strides){c->skv, 0, 0, 1};
    else if (c->kind == M_BOOL_T) /* stored [B, Hq, Skv, Sq]: keys sq apart */
        ms = (fxa_mask_strides){c->hq * c->sq * c->skv, c->sq * c->skv, 1, c->sq};
    pb->d.causal = c->kind == M_CAUSAL;
    pb->d.mask_kind = c->kind == M_ADD ? FXA_MASK_ADD
                      : c->kind == M_BOOL || c->kind == M_BOOL_T || c->kind == M_PAD
                          ? FXA_MASK_BOOL
                          : FXA_MASK_NONE;
    pb->d.mask_strides = ms;
    if (pb->d.mask_kind != FXA_MASK_NONE)
        pb->mask = calloc(pb->nbias, 4);
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t h = 0; h < c->hq; h++)
            for (int64_t i = 0; i < c->sq; i++)
                for (int64_t j = 0; j < c->skv; j++) {
                    const int64_t at = b * ms.batch + h * ms.head + i * ms.query + j * ms.key;
                    double x;
                    if ((ms.head == 0 && h > 0) || (ms.query == 0 && i > 0)) {
                        /* a broadcast element: the one written first */
                        x = c->kind == M_ADD ? (double)((float *)pb->mask)[at]
                                             : (((uint8_t *)pb->mask)[at] ? 0.0 : -INFINITY);
                    } else {
                        x = mask_value(c, &r, b, h, i, j);
                        if (c->kind == M_ADD) {
                            ((float *)pb->mask)[at] = (float)x;
                            x = (float)x;
                        } else if (pb->mask) {
                            ((uint8_t *)pb->mask)[at] = x == 0.0;
                        }
                    }
                    pb->bias[((b * c->hq + h) * c->sq + i) * c->skv + j] = x;
                }
    fxa_ctx *ctx = NULL;
    fxa_ctx_create(NULL, &ctx);
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    fxa_status st = fxa_attn_plan_create(ctx, &pb->d, &plan, &ws_bytes);
    void *ws = aligned_alloc(64, (ws_bytes + 127) / 64 * 64);
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = c->bf16 ? (const void *)pb->q16 : pb->q,
                             .k = c->bf16 ? (const void *)pb->k16 : pb->k,
                             .v = c->bf16 ? (const void *)pb->v16 : pb->v,
                             .out = pb->out,
                             .lse = pb->lse,
                             .mask = pb->mask};
    if (st == FXA_OK)
        st = fxa_attn_run(plan, &a, ws, NULL);
    CHECK(st == FXA_OK, "[%s] forward: %s", c->label, fxa_ctx_last_error(ctx));
    free(ws);
    fxa_attn_plan_destroy(plan);
    fxa_ctx_destroy(ctx);
}

static void problem_free(problem *pb)
{
    float *f[9] = {pb->q, pb->k, pb->v, pb->dout, pb->out, pb->lse, pb->dq, pb->dk, pb->dv};
    for (int x = 0; x < 9; x++)
        free(f[x]);
    free(pb->q16);
    free(pb->k16);
    free(pb->v16);
    free(pb->mask);
    free(pb->bias);
}

/* The backward on n_threads threads with args a (or the problem's own when
 * NULL); status, the message printed on failure into msg (when not NULL). */
static fxa_status run_bwd(problem *pb, int n_threads, const fxa_attn_bwd_args *a, char *msg,
                          size_t cap)
{
    fxa_ctx_params cp;
    fxa_ctx_params_init(&cp);
    cp.n_threads = n_threads;
    fxa_ctx *ctx = NULL;
    if (fxa_ctx_create(&cp, &ctx) != FXA_OK)
        return FXA_ERR_INTERNAL;
    fxa_attn_bwd_plan *plan = NULL;
    size_t ws_bytes = 0;
    fxa_status st = fxa_attn_bwd_plan_create(ctx, &pb->d, &plan, &ws_bytes);
    if (st == FXA_OK) {
        void *ws = aligned_alloc(64, (ws_bytes + 63) / 64 * 64);
        const int bf = pb->c->bf16;
        const fxa_attn_bwd_args own = {.struct_size = sizeof own,
                                       .q = bf ? (const void *)pb->q16 : pb->q,
                                       .k = bf ? (const void *)pb->k16 : pb->k,
                                       .v = bf ? (const void *)pb->v16 : pb->v,
                                       .out = pb->out,
                                       .dout = pb->dout,
                                       .lse = pb->lse,
                                       .dq = pb->dq,
                                       .dk = pb->dk,
                                       .dv = pb->dv,
                                       .mask = pb->mask};
        st = fxa_attn_bwd_run(plan, a ? a : &own, ws, NULL);
        free(ws);
    }
    if (msg)
        snprintf(msg, cap, "%s", fxa_ctx_last_error(ctx));
    fxa_attn_bwd_plan_destroy(plan);
    fxa_ctx_destroy(ctx);
    return st;
}

static void test_case(const mcase *c)
{
    problem pb;
    build(c, &pb);
    double *x[5] = {malloc(pb.nq * 8), malloc(pb.nkv * 8), malloc(pb.nkv * 8), malloc(pb.nq * 8),
                    malloc(pb.nq * 8)};
    const float *src[5] = {pb.q, pb.k, pb.v, pb.dout, pb.out};
    const size_t nx[5] = {pb.nq, pb.nkv, pb.nkv, pb.nq, pb.nq};
    for (int t = 0; t < 5; t++)
        for (size_t e = 0; e < nx[t]; e++)
            x[t][e] = src[t][e];
    double *lse = malloc(pb.rows * 8);
    size_t dead = 0;
    for (size_t e = 0; e < pb.rows; e++) {
        lse[e] = pb.lse[e];
        dead += pb.lse[e] == -INFINITY;
    }
    double *g[3] = {malloc(pb.nq * 8), malloc(pb.nkv * 8), malloc(pb.nkv * 8)};
    double *env[3] = {malloc(pb.nq * 8), malloc(pb.nkv * 8), malloc(pb.nkv * 8)};
    ref_backward(c, x[0], x[1], x[2], pb.bias, x[4], x[3], lse, g, env);
    char msg[512];
    const fxa_status st = run_bwd(&pb, 2, NULL, msg, sizeof msg);
    CHECK(st == FXA_OK, "[%s] backward: %s", c->label, msg);
    const float *res[3] = {pb.dq, pb.dk, pb.dv};
    const char *names[3] = {"dq", "dk", "dv"};
    for (int w = 0; w < 3; w++) {
        const size_t n = w == 0 ? pb.nq : pb.nkv;
        double worst = 0.0, err_max = 0.0, mag = 0.0;
        size_t worst_at = 0, zero_env_nonzero = 0;
        for (size_t e = 0; e < n; e++) {
            const double err = fabs(res[w][e] - g[w][e]);
            const double ratio = err / (2.0 * env[w][e] + 1e-300);
            if (ratio > worst || !(err == err)) {
                worst = ratio;
                worst_at = e;
            }
            zero_env_nonzero += env[w][e] == 0.0 && res[w][e] != 0.0f;
            err_max = fmax(err_max, err);
            mag = fmax(mag, fabs(g[w][e]));
        }
        CHECK(worst <= 1.0, "[%s] %s[%zu] = %.9g, fp64 %.9g: error %.3g over 2x the envelope %.3g",
              c->label, names[w], worst_at, (double)res[w][worst_at], g[w][worst_at],
              fabs(res[w][worst_at] - g[w][worst_at]), env[w][worst_at]);
        CHECK(zero_env_nonzero == 0, "[%s] %s: %zu elements nonzero where no term reaches them",
              c->label, names[w], zero_env_nonzero);
        printf("[%s] %s: max err %.3g (max |g| %.3g), at most %.3f of 2x the envelope\n", c->label,
               names[w], err_max, mag, worst);
    }
    if (c->dead_rows) {
        size_t nonzero = 0;
        for (size_t e = 0; e < pb.rows; e++)
            if (pb.lse[e] == -INFINITY)
                for (int64_t col = 0; col < c->d; col++)
                    nonzero += pb.dq[e * (size_t)c->d + (size_t)col] != 0.0f;
        CHECK(dead > 0 && nonzero == 0, "[%s] %zu dead rows, %zu nonzero dq elements in them",
              c->label, dead, nonzero);
    }
    /* Bit-identical on 1 and 3 threads (one pass and two passes). */
    float *keep[3] = {malloc(pb.nq * 4), malloc(pb.nkv * 4), malloc(pb.nkv * 4)};
    float *out[3] = {pb.dq, pb.dk, pb.dv};
    for (int w = 0; w < 3; w++)
        memcpy(keep[w], out[w], (w == 0 ? pb.nq : pb.nkv) * 4);
    for (int threads = 1; threads <= 3; threads += 2) {
        for (int w = 0; w < 3; w++)
            memset(out[w], 0xff, (w == 0 ? pb.nq : pb.nkv) * 4);
        CHECK(run_bwd(&pb, threads, NULL, NULL, 0) == FXA_OK, "[%s] %d threads", c->label, threads);
        int same = 1;
        for (int w = 0; w < 3; w++)
            same &= memcmp(keep[w], out[w], (w == 0 ? pb.nq : pb.nkv) * 4) == 0;
        CHECK(same, "[%s] gradients on %d threads differ from 2 threads'", c->label, threads);
    }
    for (int w = 0; w < 3; w++) {
        free(keep[w]);
        free(g[w]);
        free(env[w]);
    }
    for (int t = 0; t < 5; t++)
        free(x[t]);
    free(lse);
    problem_free(&pb);
}

/* Refused with FXA_ERR_INVALID_ARG and a message naming the cause. */
static void test_refusals(void)
{
    const mcase cb = {"refusals", 1, 2, 1, 20, 30, 8, M_BOOL, 1, 0};
    problem pb;
    build(&cb, &pb);
    char msg[512];
    fxa_attn_bwd_args a = {.struct_size = sizeof a,
                           .q = pb.q,
                           .k = pb.k,
                           .v = pb.v,
                           .out = pb.out,
                           .dout = pb.dout,
                           .lse = pb.lse,
                           .dq = pb.dq,
                           .dk = pb.dk,
                           .dv = pb.dv,
                           .mask = NULL};
    fxa_status st = run_bwd(&pb, 1, &a, msg, sizeof msg);
    CHECK(st == FXA_ERR_INVALID_ARG && strstr(msg, "mask"), "no mask: %d %s", (int)st, msg);
    /* The first form of the args (ending at dv) has no mask. */
    a.struct_size = offsetof(fxa_attn_bwd_args, mask);
    a.mask = pb.mask;
    st = run_bwd(&pb, 1, &a, msg, sizeof msg);
    CHECK(st == FXA_ERR_INVALID_ARG && strstr(msg, "args->mask is NULL"), "old args: %d %s",
          (int)st, msg);
    a.struct_size = sizeof a;
    a.mask = pb.dq; /* dq overlaps the mask */
    st = run_bwd(&pb, 1, &a, msg, sizeof msg);
    CHECK(st == FXA_ERR_INVALID_ARG && strstr(msg, "mask") && strstr(msg, "dq"), "overlap: %d %s",
          (int)st, msg);
    /* lse -inf where the plan has no mask */
    pb.d.mask_kind = FXA_MASK_NONE;
    a.mask = NULL;
    st = run_bwd(&pb, 1, &a, msg, sizeof msg);
    CHECK(st == FXA_ERR_INVALID_ARG && strstr(msg, "lse has a non-finite"), "lse -inf: %d %s",
          (int)st, msg);
    problem_free(&pb);
    const mcase ca = {"refusals add", 1, 1, 1, 10, 12, 8, M_ADD, 0, 0};
    build(&ca, &pb);
    ((float *)pb.mask)[5 * 12 + 3] = NAN;
    a = (fxa_attn_bwd_args){.struct_size = sizeof a,
                            .q = pb.q,
                            .k = pb.k,
                            .v = pb.v,
                            .out = pb.out,
                            .dout = pb.dout,
                            .lse = pb.lse,
                            .dq = pb.dq,
                            .dk = pb.dk,
                            .dv = pb.dv,
                            .mask = pb.mask};
    st = run_bwd(&pb, 1, &a, msg, sizeof msg);
    CHECK(st == FXA_ERR_INVALID_ARG && strstr(msg, "query 5, key 3"), "NaN mask: %d %s", (int)st,
          msg);
    problem_free(&pb);
}

int main(void)
{
    test_require_isa("test_attn_bwd_mask");
    test_finite_differences();
    const mcase cases[] = {
        {"bool mask, gqa, D40", 1, 4, 2, 70, 150, 40, M_BOOL, 0, 0},
        {"bool mask stored transposed", 1, 2, 1, 40, 70, 16, M_BOOL_T, 0, 0},
        {"additive mask over heads, D24", 2, 2, 1, 65, 140, 24, M_ADD, 0, 0},
        {"key padding, 2 batches", 2, 2, 2, 40, 300, 16, M_PAD, 0, 0},
        {"causal Sq = Skv, 2 kv heads", 1, 2, 2, 200, 200, 32, M_CAUSAL, 0, 0},
        {"causal Sq < Skv", 1, 2, 1, 150, 300, 16, M_CAUSAL, 0, 0},
        {"causal Sq > Skv, gqa", 1, 4, 2, 300, 100, 16, M_CAUSAL, 0, 0},
        {"dead rows", 1, 2, 1, 50, 90, 16, M_BOOL, 1, 0},
        /* bf16 compute: 256-key tiles, odd D, odd causal cuts (Sq 201) */
        {"bf16 bool mask, gqa, D40", 1, 4, 2, 70, 300, 40, M_BOOL, 0, 1},
        {"bf16 additive mask over heads, D23", 2, 2, 1, 65, 140, 23, M_ADD, 0, 1},
        {"bf16 key padding, 2 batches", 2, 2, 2, 40, 300, 16, M_PAD, 0, 1},
        {"bf16 causal Sq = Skv odd", 1, 2, 2, 201, 201, 32, M_CAUSAL, 0, 1},
        {"bf16 causal Sq < Skv", 1, 2, 1, 150, 300, 16, M_CAUSAL, 0, 1},
        {"bf16 causal Sq > Skv, gqa", 1, 4, 2, 301, 100, 16, M_CAUSAL, 0, 1},
        {"bf16 dead rows", 1, 2, 1, 51, 91, 16, M_BOOL, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        test_case(&cases[i]);
    test_refusals();
    return test_summary("test_attn_bwd_mask");
}
