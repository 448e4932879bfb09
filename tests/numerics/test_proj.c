/*
 * The QKV projection (fxattn_proj.h) against an fp64 evaluation of the same
 * math, with tolerances derived per element: the fp32 GEMM error is at most
 * gamma_H = H u (u = 2^-24) times sum_k |x_k w_k| for any summation order or
 * blocking (Higham), plus a few roundings of the epilogue; RMSNorm and RoPE
 * propagate it to first order. Also: the RMSNorm association order bit for
 * bit, interleaved-checkpoint conversion (scores unchanged), FP8 and bf16
 * operands, single-segment calls, head-major output, errors.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_proj.h"
#include "testutil.h"

#include <cblas.h>

#define U 0x1p-24

static fxa_ctx *g_ctx;

/* The q, k and v outputs of one run (k and v with room for one head more
 * than d has). */
typedef struct outs {
    float *q, *k, *v;
} outs;

static void outs_alloc(outs *o, const fxa_proj_desc *d)
{
    const size_t s = (size_t)d->tokens * (size_t)d->head_dim;
    o->q = malloc(s * (size_t)d->heads_q * sizeof(float));
    o->k = malloc(s * (size_t)(d->heads_kv + 1) * sizeof(float));
    o->v = malloc(s * (size_t)(d->heads_kv + 1) * sizeof(float));
}

static void outs_free(outs *o)
{
    free(o->q);
    free(o->k);
    free(o->v);
}

/* Every element of d's q, k and v outputs set to value. */
static void outs_fill(outs *o, const fxa_proj_desc *d, float value)
{
    const int64_t s = d->tokens * d->head_dim;
    for (int64_t i = 0; i < s * d->heads_q; i++)
        o->q[i] = value;
    for (int64_t i = 0; i < s * d->heads_kv; i++)
        o->k[i] = o->v[i] = value;
}

typedef struct prob {
    fxa_proj_desc d;
    int64_t n_out;
    float *x;  /* [S][H] fp32 values (exact in the operand format) */
    float *w;  /* [I][H] */
    float *xs; /* [S] x scales (1 unless FP8) */
    float *ws; /* [I] */
    float *bias;
    float *gq;
    float *gk;
    float *cs;
    float *sn;
    outs o; /* the outputs for d */
} prob;

/* prob_init's epilogue flags: d.norm and d.rope. */
enum { NORM = 1, ROPE = 2 };

/* A random problem of the given shape with norm and rope as flags say, and
 * its outputs allocated. */
static void prob_init(prob *p, int64_t tokens, int64_t hin, int64_t hq, int64_t hkv, int64_t dim,
                      uint64_t seed, double bias_scale, unsigned flags)
{
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    fxa_proj_desc_init(&p->d);
    p->d.tokens = tokens;
    p->d.in_features = hin;
    p->d.heads_q = hq;
    p->d.heads_kv = hkv;
    p->d.head_dim = dim;
    p->d.norm = (flags & NORM) != 0;
    p->d.rope = (flags & ROPE) != 0;
    p->n_out = (hq + 2 * hkv) * dim;
    p->x = malloc((size_t)(tokens * hin) * sizeof(float));
    p->w = malloc((size_t)(p->n_out * hin) * sizeof(float));
    p->xs = malloc((size_t)tokens * sizeof(float));
    p->ws = malloc((size_t)p->n_out * sizeof(float));
    p->bias = malloc((size_t)p->n_out * sizeof(float));
    p->gq = malloc((size_t)(hq * dim) * sizeof(float));
    p->gk = malloc((size_t)(hkv * dim + 1) * sizeof(float));
    p->cs = malloc((size_t)(tokens * dim) * sizeof(float));
    p->sn = malloc((size_t)(tokens * dim) * sizeof(float));
    outs_alloc(&p->o, &p->d);
    for (int64_t i = 0; i < tokens * hin; i++)
        p->x[i] = (float)fxt_rng_normal(&r);
    for (int64_t i = 0; i < p->n_out * hin; i++)
        p->w[i] = (float)(fxt_rng_normal(&r) / sqrt((double)hin));
    for (int64_t i = 0; i < tokens; i++)
        p->xs[i] = 1.0f;
    for (int64_t i = 0; i < p->n_out; i++) {
        p->ws[i] = 1.0f;
        p->bias[i] = (float)(bias_scale * fxt_rng_normal(&r));
    }
    for (int64_t i = 0; i < hq * dim; i++)
        p->gq[i] = (float)(0.5 + fxt_rng_uniform(&r));
    for (int64_t i = 0; i < hkv * dim; i++)
        p->gk[i] = (float)(0.5 + fxt_rng_uniform(&r));
    /* A 1 x 1 x tokens grid gives distinct angles on every band but t. */
    CHECK(fxa_wan_rope_tables(1, 1, tokens, dim, 1e4, p->cs, p->sn) == FXA_OK, "rope tables");
}

static void prob_free(prob *p)
{
    float *const f[] = {p->x, p->w, p->xs, p->ws, p->bias, p->gq, p->gk, p->cs, p->sn};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        free(f[i]);
    outs_free(&p->o);
}

/* p's x and w rounded to bf16 in place; their bf16 encodings (malloc'd)
 * into *x16 and *w16. */
static void round_to_bf16(prob *p, uint16_t **x16, uint16_t **w16)
{
    const int64_t nx = p->d.tokens * p->d.in_features, nw = p->n_out * p->d.in_features;
    *x16 = malloc((size_t)nx * 2);
    *w16 = malloc((size_t)nw * 2);
    for (int64_t i = 0; i < nx; i++) {
        (*x16)[i] = fxa_f32_to_bf16(p->x[i]);
        p->x[i] = fxa_bf16_to_f32((*x16)[i]);
    }
    for (int64_t i = 0; i < nw; i++) {
        (*w16)[i] = fxa_f32_to_bf16(p->w[i]);
        p->w[i] = fxa_bf16_to_f32((*w16)[i]);
    }
}

/* fp64 reference of one token: y (pre-norm) and its error bound ey, then
 * the finished outputs and their bounds, for the whole fused row. */
static void reference_token(const prob *p, int64_t s, double *y, double *ey, double *out,
                            double *eout)
{
    const fxa_proj_desc *d = &p->d;
    const int64_t hin = d->in_features;
    for (int64_t i = 0; i < p->n_out; i++) {
        double acc = 0.0;
        double mag = 0.0;
        for (int64_t k = 0; k < hin; k++) {
            const double t = (double)p->x[s * hin + k] * (double)p->w[i * hin + k];
            acc += t;
            mag += fabs(t);
        }
        const double sc = (double)p->xs[s] * (double)p->ws[i];
        y[i] = acc * sc + (double)p->bias[i];
        ey[i] = (1.01 * (double)hin * U * mag + 2 * U * fabs(acc)) * sc + 2 * U * fabs(y[i]);
    }
    const int64_t dim = d->head_dim;
    const int64_t half = dim / 2;
    const int64_t seg_heads[3] = {d->heads_q, d->heads_kv, d->heads_kv};
    int64_t at = 0;
    for (int seg = 0; seg < (d->heads_kv > 0 ? 3 : 1); seg++) {
        const int64_t n = seg_heads[seg] * dim;
        const int shaped = seg < 2; /* Q and K */
        const float *g = seg == 0 ? p->gq : p->gk;
        double r = 1.0;
        double er = 0.0;
        if (shaped && d->norm) {
            double ss = 0.0;
            double dss = 0.0;
            for (int64_t i = 0; i < n; i++) {
                ss += y[at + i] * y[at + i];
                dss += 2.0 * fabs(y[at + i]) * ey[at + i];
            }
            r = 1.0 / sqrt(ss / (double)n + d->eps);
            er = 0.5 * dss / ss + 6 * U; /* relative */
        }
        for (int64_t h = 0; h < seg_heads[seg]; h++) {
            for (int64_t i = 0; i < dim; i++) {
                const int64_t li = at + h * dim + i;
                const double gi = shaped && d->norm ? (double)g[h * dim + i] : 1.0;
                if (!shaped || (!d->norm && !d->rope)) {
                    out[li] = y[li];
                    eout[li] = ey[li];
                    continue;
                }
                if (!d->rope) {
                    out[li] = y[li] * r * gi;
                    eout[li] = r * gi * ey[li] + fabs(out[li]) * (er + 3 * U);
                    continue;
                }
                const int64_t j = i < half ? i + half : i - half;
                const int64_t lj = at + h * dim + j;
                const double gj = shaped && d->norm ? (double)g[h * dim + j] : 1.0;
                const double c = p->cs[s * dim + i];
                const double sn = p->sn[s * dim + i];
                const double a = y[li] * gi * r * c;
                const double b = y[lj] * gj * r * sn;
                out[li] = i < half ? a - b : a + b;
                eout[li] = r * (gi * fabs(c) * ey[li] + gj * fabs(sn) * ey[lj]) +
                           (fabs(a) + fabs(b)) * (er + 6 * U);
            }
        }
        at += n;
    }
}

/* Compare outputs o (any layout) with the reference; returns the worst
 * error / bound ratio. */
static double compare(const prob *p, const outs *o, const char *label)
{
    const fxa_proj_desc *d = &p->d;
    double *y = malloc((size_t)p->n_out * sizeof(double));
    double *ey = malloc((size_t)p->n_out * sizeof(double));
    double *out = malloc((size_t)p->n_out * sizeof(double));
    double *eout = malloc((size_t)p->n_out * sizeof(double));
    double worst = 0.0;
    int ok = 1;
    const int64_t seg_heads[3] = {d->heads_q, d->heads_kv, d->heads_kv};
    const float *const seg_out[3] = {o->q, o->k, o->v};
    for (int64_t s = 0; s < d->tokens; s++) {
        reference_token(p, s, y, ey, out, eout);
        int64_t at = 0;
        for (int seg = 0; seg < (d->heads_kv > 0 ? 3 : 1); seg++) {
            for (int64_t h = 0; h < seg_heads[seg]; h++)
                for (int64_t i = 0; i < d->head_dim; i++) {
                    const int64_t off = d->out_layout == FXA_PROJ_TOKEN_MAJOR
                                            ? (s * seg_heads[seg] + h) * d->head_dim + i
                                            : (h * d->tokens + s) * d->head_dim + i;
                    const int64_t li = at + h * d->head_dim + i;
                    const double err = fabs((double)seg_out[seg][off] - out[li]);
                    const double bound = eout[li] + 1e-30;
                    worst = err / bound > worst ? err / bound : worst;
                    ok &= err <= bound;
                }
            at += seg_heads[seg] * d->head_dim;
        }
    }
    printf("  %-44s worst error / bound %.3f\n", label, worst);
    CHECK(ok, "%s: an output is outside its derived bound (worst ratio %.3f)", label, worst);
    free(y);
    free(ey);
    free(out);
    free(eout);
    return worst;
}

/* Bytes of the workspace of d's plan, 0 when the plan is refused. */
static size_t plan_bytes(const fxa_proj_desc *d)
{
    fxa_proj_plan *plan = NULL;
    size_t bytes = 0;
    if (fxa_proj_plan_create(g_ctx, d, &plan, &bytes) != FXA_OK)
        return 0;
    fxa_proj_plan_destroy(plan);
    return bytes;
}

/* d's plan on g_ctx (CHECKed) into *plan and *bytes, and a 64-byte aligned
 * workspace of *bytes plus 64 spare bytes. */
static unsigned char *plan_and_workspace(const fxa_proj_desc *d, fxa_proj_plan **plan,
                                         size_t *bytes)
{
    *plan = NULL;
    *bytes = 0;
    CHECK(fxa_proj_plan_create(g_ctx, d, plan, bytes) == FXA_OK, "plan: %s",
          fxa_ctx_last_error(g_ctx));
    return aligned_alloc(64, (*bytes + 64 + 63) / 64 * 64);
}

/* Plan d, run a on a fresh workspace, destroy the plan. */
static fxa_status run_args(const fxa_proj_desc *d, const fxa_proj_args *a)
{
    return fxt_proj_once(g_ctx, d, a);
}

/* The args of p with operands x and w into outputs o. */
static fxa_proj_args args_of(const prob *p, const void *x, const void *w, const outs *o)
{
    return (fxa_proj_args){.struct_size = sizeof(fxa_proj_args),
                           .x = x,
                           .w = w,
                           .w_scales = p->ws,
                           .bias = p->bias,
                           .gamma_q = p->gq,
                           .gamma_k = p->gk,
                           .rope_cos = p->cs,
                           .rope_sin = p->sn,
                           .q_out = o->q,
                           .k_out = o->k,
                           .v_out = o->v};
}

static fxa_status run(const prob *p, const void *x, const void *w, const outs *o)
{
    const fxa_proj_args a = args_of(p, x, w, o);
    return run_args(&p->d, &a);
}

/* p on its own fp32 operands into its own outputs. */
static fxa_status run_own(prob *p)
{
    return run(p, p->x, p->w, &p->o);
}

/* fp32 operands, every combination of norm, rope and layout. */
static void test_f32(void)
{
    for (int mode = 0; mode < 8; mode++) {
        prob p;
        prob_init(&p, 37, 96, 3, 2, 16, 10 + (uint64_t)mode, 0.3, (unsigned)mode & (NORM | ROPE));
        p.d.out_layout = (mode >> 2) ? FXA_PROJ_HEAD_MAJOR : FXA_PROJ_TOKEN_MAJOR;
        CHECK(run_own(&p) == FXA_OK, "f32 run: %s", fxa_ctx_last_error(g_ctx));
        char label[80];
        snprintf(label, sizeof label, "f32 norm %d rope %d %s", p.d.norm, p.d.rope,
                 p.d.out_layout ? "head-major" : "token-major");
        compare(&p, &p.o, label);
        prob_free(&p);
    }
}

/* x as FP8 rows ([S][H+4], malloc'd): p's x and xs become the decoded codes
 * and the row scales, the operands the reference then sees. */
static uint8_t *quantize_x(prob *p)
{
    const int64_t hin = p->d.in_features;
    uint8_t *x8 = malloc((size_t)(p->d.tokens * (hin + 4)));
    CHECK(fxa_e4m3_quantize_rows(p->x, p->d.tokens, hin, x8) == FXA_OK, "quantize x");
    for (int64_t s = 0; s < p->d.tokens; s++) {
        memcpy(&p->xs[s], x8 + s * (hin + 4) + hin, sizeof(float));
        for (int64_t k = 0; k < hin; k++)
            p->x[s * hin + k] = fxa_e4m3_to_f32(x8[s * (hin + 4) + k]);
    }
    return x8;
}

/* W as FP8 with per-output-channel scales (malloc'd): p's w and ws become
 * the decoded codes and the scales. */
static uint8_t *quantize_w(prob *p)
{
    const int64_t n = p->n_out * p->d.in_features;
    uint8_t *w8 = malloc((size_t)n);
    CHECK(fxa_e4m3_quantize_weights(p->w, p->n_out, p->d.in_features, w8, p->ws) == FXA_OK,
          "quantize w");
    for (int64_t i = 0; i < n; i++)
        p->w[i] = fxa_e4m3_to_f32(w8[i]);
    return w8;
}

/* bf16 and FP8 operands: the reference uses the decoded values and scales. */
static void test_formats(void)
{
    prob p;
    prob_init(&p, 29, 128, 2, 1, 32, 77, 0.1, NORM | ROPE);
    /* bf16: round the fp32 values, then they are the operands. */
    uint16_t *x16, *w16;
    round_to_bf16(&p, &x16, &w16);
    p.d.x_format = FXA_PROJ_X_BF16;
    p.d.w_format = FXA_PROJ_W_F32; /* mixed: the fp32 path */
    CHECK(run(&p, x16, p.w, &p.o) == FXA_OK, "bf16/f32 run: %s", fxa_ctx_last_error(g_ctx));
    compare(&p, &p.o, "bf16 x, f32 w (fp32 GEMM)");
    p.d.w_format = FXA_PROJ_W_BF16; /* both 16-bit: the bf16 GEMM */
    CHECK(run(&p, x16, w16, &p.o) == FXA_OK, "bf16 run: %s", fxa_ctx_last_error(g_ctx));
    compare(&p, &p.o, "bf16 x, bf16 w (bf16 GEMM), norm, rope");
    x16[3 * p.d.in_features + 5] = 0x7fc0; /* NaN, read in place by the bf16 GEMM */
    CHECK(run(&p, x16, w16, &p.o) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "x has a non-finite value at token 3, feature 5"),
          "bf16 NaN: %s", fxa_ctx_last_error(g_ctx));
    x16[3 * p.d.in_features + 5] = 0;
    p.x[3 * p.d.in_features + 5] = 0.0f;
    /* FP8 rows and FP8 weights. */
    const int64_t hin = p.d.in_features;
    uint8_t *x8 = quantize_x(&p);
    uint8_t *w8 = quantize_w(&p);
    p.d.x_format = FXA_PROJ_X_E4M3_ROWS;
    p.d.w_format = FXA_PROJ_W_E4M3;
    CHECK(run(&p, x8, w8, &p.o) == FXA_OK, "fp8 run: %s", fxa_ctx_last_error(g_ctx));
    compare(&p, &p.o, "FP8 rows x, FP8 w (bf16 GEMM, per-channel scales)");
    w8[2 * hin + 7] = 0x7f; /* a NaN code */
    CHECK(run(&p, x8, w8, &p.o) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "w has a non-finite value at output 2, input 7"),
          "FP8 NaN code: %s", fxa_ctx_last_error(g_ctx));
    free(x16);
    free(w16);
    free(x8);
    free(w8);
    prob_free(&p);
}

/* With W = identity the GEMM is exact, so the library's pre-norm y is the
 * test's: the output must equal x * (r * g) bit for bit, and (x * r) * g is
 * shown to round differently somewhere. */
static void test_rmsnorm_association(void)
{
    prob p;
    const int64_t dim = 64;
    const int64_t heads = 4;
    prob_init(&p, 64, heads * dim, heads, 0, dim, 5, 0.0, NORM);
    for (int64_t i = 0; i < p.n_out * p.d.in_features; i++)
        p.w[i] = (i / p.d.in_features == i % p.d.in_features) ? 1.0f : 0.0f;
    memset(p.bias, 0, (size_t)p.n_out * sizeof(float));
    CHECK(run_own(&p) == FXA_OK, "identity run: %s", fxa_ctx_last_error(g_ctx));
    int same = 1;
    int64_t differ = 0;
    const int64_t n = heads * dim;
    for (int64_t s = 0; s < p.d.tokens; s++) {
        const float *x = p.x + s * n;
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++)
            sum += (double)x[i] * (double)x[i];
        const float mean = (float)(sum / (double)n);
        const float r = 1.0f / sqrtf(mean + (float)1e-6);
        for (int64_t i = 0; i < n; i++) {
            const float want = x[i] * (r * p.gq[i]);
            const float other = (x[i] * r) * p.gq[i];
            same &= test_f32_bits(p.o.q[s * n + i]) == test_f32_bits(want);
            differ += test_f32_bits(other) != test_f32_bits(want);
        }
    }
    printf("  RMSNorm: x*(r*g) bit-identical; (x*r)*g differs in %lld of %lld elements\n",
           (long long)differ, (long long)(p.d.tokens * n));
    CHECK(same, "RMSNorm is x * (r * gamma), bit for bit");
    CHECK(differ > 0, "(x * r) * gamma must round differently somewhere");
    prob_free(&p);
}

/* Interleaved RoPE on the original checkpoint vs rotate-half on the
 * converted one: every head's q.k score agrees. */
static void test_interleaved_conversion(void)
{
    prob p;
    const int64_t dim = 16;
    const int64_t heads = 2;
    prob_init(&p, 24, 64, heads, heads, dim, 9, 0.2, NORM | ROPE);
    const int64_t n = heads * dim;
    /* Reference: original weights, norm, interleaved rope, in double. */
    double *qr = malloc((size_t)(p.d.tokens * n) * sizeof(double));
    double *kr = malloc((size_t)(p.d.tokens * n) * sizeof(double));
    int64_t nb[3];
    fxa_wan_rope_bands(dim, &nb[0], &nb[1], &nb[2]);
    for (int64_t s = 0; s < p.d.tokens; s++) {
        for (int seg = 0; seg < 2; seg++) {
            double y[64];
            double ss = 0.0;
            for (int64_t i = 0; i < n; i++) {
                const int64_t row = seg * n + i;
                double acc = p.bias[row];
                for (int64_t c = 0; c < p.d.in_features; c++)
                    acc += (double)p.x[s * p.d.in_features + c] * p.w[row * p.d.in_features + c];
                y[i] = acc;
                ss += acc * acc;
            }
            const double r = 1.0 / sqrt(ss / (double)n + 1e-6);
            const float *g = seg ? p.gk : p.gq;
            double *dst = (seg ? kr : qr) + s * n;
            for (int64_t h = 0; h < heads; h++) {
                int64_t pair = 0;
                const int64_t pos[3] = {0, 0, s};
                for (int b = 0; b < 3; b++)
                    for (int64_t j = 0; j < nb[b]; j++, pair++) {
                        const double ang = (double)pos[b] * pow(1e4, -(double)j / (double)nb[b]);
                        const double c = cos(ang);
                        const double sn = sin(ang);
                        const int64_t i0 = h * dim + 2 * pair;
                        const double x0 = y[i0] * r * g[i0];
                        const double x1 = y[i0 + 1] * r * g[i0 + 1];
                        dst[i0] = x0 * c - x1 * sn;
                        dst[i0 + 1] = x0 * sn + x1 * c;
                    }
            }
        }
    }
    CHECK(fxa_rope_interleaved_to_half(&p.d, p.w, NULL, p.bias, p.gq, p.gk) == FXA_OK, "convert");
    CHECK(run_own(&p) == FXA_OK, "converted run: %s", fxa_ctx_last_error(g_ctx));
    double worst = 0.0;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t a = 0; a < p.d.tokens; a++)
            for (int64_t b = 0; b < p.d.tokens; b++) {
                double ref = 0.0;
                double got = 0.0;
                double mag = 0.0;
                for (int64_t i = 0; i < dim; i++) {
                    ref += qr[a * n + h * dim + i] * kr[b * n + h * dim + i];
                    got += (double)p.o.q[a * n + h * dim + i] * (double)p.o.k[b * n + h * dim + i];
                    mag += fabs(qr[a * n + h * dim + i] * kr[b * n + h * dim + i]);
                }
                const double e = fabs(got - ref) / mag;
                worst = e > worst ? e : worst;
            }
    printf("  interleaved checkpoint -> rotate-half: scores agree to %.2e of sum|q_i k_i|\n",
           worst);
    /* fp32 projection (H = 64 terms) and epilogue: well below 2^-14. */
    CHECK(worst < 0x1p-14, "scores change after the conversion (%.3g)", worst);
    free(qr);
    free(kr);
    prob_free(&p);
}

/* A cross-attention call (one segment) matches the fused call's Q. */
/* FP8 weights wide enough to be decoded and multiplied in blocks (32 MiB:
 * at H 40960, 384 channels per bf16 block, 192 per fp32 block) with a last
 * partial block: each GEMM path against the reference, a NaN code in the
 * last block named by its global channel, and a workspace that holds
 * fewer than 400 of the 448 channels decoded. */
static void test_blocked_weights(void)
{
    prob p;
    const int64_t hin = 40960;
    prob_init(&p, 4, hin, 7, 0, 64, 91, 0.1, NORM | ROPE); /* 448 output channels */
    uint8_t *w8 = quantize_w(&p);
    p.d.w_format = FXA_PROJ_W_E4M3;
    /* fp32 x: the fp32 GEMM, W decoded to fp32 block by block. */
    CHECK(run(&p, p.x, w8, &p.o) == FXA_OK, "f32 x, fp8 w: %s", fxa_ctx_last_error(g_ctx));
    compare(&p, &p.o, "f32 x, FP8 w in fp32 blocks (fp32 GEMM)");
    CHECK(plan_bytes(&p.d) < (size_t)(p.d.tokens * (p.n_out + 2)) * 8 + (size_t)(400 * hin) * 4,
          "the fp32 copy of W is a block, not the whole weight");
    /* FP8 x: the bf16 GEMM, W decoded to bf16 block by block. */
    uint8_t *x8 = quantize_x(&p);
    p.d.x_format = FXA_PROJ_X_E4M3_ROWS;
    CHECK(run(&p, x8, w8, &p.o) == FXA_OK, "fp8 x, fp8 w: %s", fxa_ctx_last_error(g_ctx));
    compare(&p, &p.o, "FP8 x, FP8 w in bf16 blocks (bf16 GEMM)");
    CHECK(plan_bytes(&p.d) <
              (size_t)(p.d.tokens * (hin + p.n_out + 2)) * 8 + (size_t)(400 * hin) * 2,
          "the bf16 copy of W is a block, not the whole weight");
    outs_fill(&p.o, &p.d, -9.0f);
    w8[420 * hin + 30000] = 0xff; /* -NaN, in the last block */
    CHECK(run(&p, x8, w8, &p.o) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx),
                     "w has a non-finite value at output 420, input 30000"),
          "NaN code in the last block: %s", fxa_ctx_last_error(g_ctx));
    CHECK(p.o.q[0] == -9.0f, "outputs untouched when a later block fails");
    free(x8);
    free(w8);
    prob_free(&p);
}

static void test_single_segment(void)
{
    prob p;
    prob_init(&p, 40, 64, 3, 0, 16, 21, 0.5, NORM);
    CHECK(run_own(&p) == FXA_OK, "single segment: %s", fxa_ctx_last_error(g_ctx));
    compare(&p, &p.o, "single segment (cross-attention Q), norm");
    prob_free(&p);
}

/* out_dtype FXA_BF16 writes each fp32 output rounded once to bf16: the
 * bits of fxa_f32_to_bf16 of the FXA_F32 call's outputs, in both layouts;
 * an output dtype other than FXA_F32 / FXA_BF16 is refused. */
static void test_out_bf16(void)
{
    for (int mode = 0; mode < 4; mode++) {
        prob p;
        prob_init(&p, 29, 80, 3, 2, 16, 40 + (uint64_t)mode, 0.3, mode & 1 ? NORM | ROPE : 0);
        p.d.out_layout = (mode >> 1) ? FXA_PROJ_HEAD_MAJOR : FXA_PROJ_TOKEN_MAJOR;
        const outs o32 = p.o;
        outs o16;
        outs_alloc(&o16, &p.d);
        CHECK(run(&p, p.x, p.w, &o32) == FXA_OK, "f32 out: %s", fxa_ctx_last_error(g_ctx));
        p.d.out_dtype = FXA_BF16;
        CHECK(run(&p, p.x, p.w, &o16) == FXA_OK, "bf16 out: %s", fxa_ctx_last_error(g_ctx));
        const size_t s = (size_t)p.d.tokens * (size_t)p.d.head_dim;
        const struct {
            const float *f;
            const uint16_t *h;
            size_t n;
        } seg[3] = {{o32.q, (const uint16_t *)o16.q, s * (size_t)p.d.heads_q},
                    {o32.k, (const uint16_t *)o16.k, s * (size_t)p.d.heads_kv},
                    {o32.v, (const uint16_t *)o16.v, s * (size_t)p.d.heads_kv}};
        size_t bad = 0;
        for (int g = 0; g < 3; g++)
            for (size_t i = 0; i < seg[g].n; i++)
                bad += seg[g].h[i] != fxa_f32_to_bf16(seg[g].f[i]);
        CHECK(bad == 0, "bf16 outputs (mode %d): %zu differ from the rounded fp32 outputs", mode,
              bad);
        p.d.out_dtype = FXA_F16;
        o16.q[0] = -9.0f;
        CHECK(run(&p, p.x, p.w, &o16) == FXA_ERR_INVALID_ARG &&
                  strstr(fxa_ctx_last_error(g_ctx), "output dtype") && o16.q[0] == -9.0f,
              "out_dtype FXA_F16 is refused, outputs untouched: %s", fxa_ctx_last_error(g_ctx));
        outs_free(&o16);
        prob_free(&p);
    }
}

/* A fresh g_ctx (2 threads), which reads FXA_PROJ_GEMM as it is now. */
static void reopen_ctx(void)
{
    fxa_ctx_destroy(g_ctx);
    g_ctx = fxt_ctx(2);
    CHECK(g_ctx != NULL, "context");
}

/* FXA_PROJ_GEMM (read when the context is created) forces the fp32 GEMM's
 * library: OpenBLAS and oneDNN both within the derived bounds; an unknown
 * name is refused, outputs untouched; a change after the context's creation
 * does not reach its runs. */
static void test_gemm_choice(void)
{
    static const char *const names[2] = {"openblas", "onednn"};
    for (int i = 0; i < 2; i++) {
        prob p;
        prob_init(&p, 37, 96, 3, 2, 16, 50 + (uint64_t)i, 0.3, NORM | ROPE);
        setenv("FXA_PROJ_GEMM", names[i], 1);
        reopen_ctx();
        CHECK(run_own(&p) == FXA_OK, "FXA_PROJ_GEMM=%s: %s", names[i], fxa_ctx_last_error(g_ctx));
        char label[80];
        snprintf(label, sizeof label, "f32 GEMM on %s", names[i]);
        compare(&p, &p.o, label);
        setenv("FXA_PROJ_GEMM", "blis", 1);
        CHECK(run_own(&p) == FXA_OK,
              "FXA_PROJ_GEMM changed after the context's creation reached a run: %s",
              fxa_ctx_last_error(g_ctx));
        reopen_ctx();
        p.o.q[0] = -9.0f;
        CHECK(run_own(&p) == FXA_ERR_INVALID_ARG &&
                  strstr(fxa_ctx_last_error(g_ctx), "FXA_PROJ_GEMM=blis") && p.o.q[0] == -9.0f,
              "an unknown FXA_PROJ_GEMM is refused: %s", fxa_ctx_last_error(g_ctx));
        unsetenv("FXA_PROJ_GEMM");
        reopen_ctx();
        prob_free(&p);
    }
}

/* The bf16 GEMM: on the `amx` kernel set it runs on AMX tiles (gemm_amx.c,
 * items of 256 columns, row blocks of 32, 16 and 1-15), elsewhere on
 * oneDNN. 77 tokens and 768 outputs (three items, the last rows in both
 * tail blocks): within the derived bounds, identical bytes for 1, 2 and 3
 * threads, and a context held to FXA_ISA=avx512 (oneDNN) within the same
 * bounds. Where the CPU lacks AMX every context runs oneDNN. */
static void test_bf16_gemm_threads(void)
{
    prob p;
    prob_init(&p, 77, 96, 8, 8, 32, 91, 0.2, NORM | ROPE);
    p.d.x_format = FXA_PROJ_X_BF16;
    p.d.w_format = FXA_PROJ_W_BF16;
    uint16_t *x16, *w16;
    round_to_bf16(&p, &x16, &w16);
    const outs first = p.o; /* the run on 1 thread */
    outs o;
    outs_alloc(&o, &p.d);
    fxa_ctx *const saved = g_ctx;
    static const int threads[] = {1, 2, 3};
    for (int t = 0; t < 3; t++) {
        g_ctx = fxt_ctx(threads[t]);
        CHECK(g_ctx != NULL, "context of %d threads", threads[t]);
        const outs *mine = t ? &o : &first;
        CHECK(run(&p, x16, w16, mine) == FXA_OK, "bf16 GEMM, %d threads: %s", threads[t],
              fxa_ctx_last_error(g_ctx));
        char label[80];
        snprintf(label, sizeof label, "bf16 GEMM (kernels %s), %d threads", fxa_ctx_isa(g_ctx),
                 threads[t]);
        compare(&p, mine, label);
        if (t)
            CHECK(memcmp(o.q, first.q, (size_t)(p.d.tokens * 8 * 32) * sizeof(float)) == 0 &&
                      memcmp(o.k, first.k, (size_t)(p.d.tokens * 8 * 32) * sizeof(float)) == 0 &&
                      memcmp(o.v, first.v, (size_t)(p.d.tokens * 8 * 32) * sizeof(float)) == 0,
                  "bf16 GEMM: %d threads differ from 1", threads[t]);
        fxa_ctx_destroy(g_ctx);
    }
    setenv("FXA_ISA", "avx512", 1);
    g_ctx = fxt_ctx(0);
    if (g_ctx) {
        CHECK(run(&p, x16, w16, &o) == FXA_OK, "bf16 GEMM on avx512: %s",
              fxa_ctx_last_error(g_ctx));
        compare(&p, &o, "bf16 GEMM, kernels avx512 (oneDNN)");
        fxa_ctx_destroy(g_ctx);
    } else {
        printf("bf16 GEMM: no avx512 kernel set on this CPU, oneDNN comparison not run\n");
    }
    unsetenv("FXA_ISA");
    g_ctx = saved;
    free(x16);
    free(w16);
    outs_free(&o);
    prob_free(&p);
}

/* The projection runs OpenBLAS on the context's threads but leaves the host
 * program's OpenBLAS thread setting as it found it. */
static void test_blas_threads_restored(void)
{
    prob p;
    prob_init(&p, 40, 64, 3, 0, 16, 21, 0.5, 0);
    setenv("FXA_PROJ_GEMM", "openblas", 1); /* OpenBLAS even where auto picks oneDNN */
    reopen_ctx();
    openblas_set_num_threads(1);
    CHECK(run_own(&p) == FXA_OK, "blas threads: %s", fxa_ctx_last_error(g_ctx));
    CHECK(openblas_get_num_threads() == 1,
          "the projection left OpenBLAS on %d threads; the host set 1", openblas_get_num_threads());
    unsetenv("FXA_PROJ_GEMM");
    reopen_ctx();
    prob_free(&p);
}

/* Wan's cross-attention shape: 512 context tokens through three separate
 * single-segment calls: Q (normalised with gamma_q), K (normalised with
 * its own gamma, passed as the segment's gamma_q), V (no norm). */
static void test_cross_attention(void)
{
    const int64_t ctx_tokens = 512, hin = 64, heads = 2, dim = 16;
    for (int which = 0; which < 3; which++) {
        prob p;
        prob_init(&p, ctx_tokens, hin, heads, 0, dim, 40 + (uint64_t)which, 0.2,
                  which < 2 ? NORM : 0);
        CHECK(run_own(&p) == FXA_OK, "cross-attention call: %s", fxa_ctx_last_error(g_ctx));
        static const char *const names[3] = {"cross-attention Q (512 tokens), norm",
                                             "cross-attention K (512 tokens), norm",
                                             "cross-attention V (512 tokens), no norm"};
        compare(&p, &p.o, names[which]);
        prob_free(&p);
    }
}

/* A workspace reused with other contents gives the same bits; a missing or
 * misaligned one is refused. */
static void test_workspace(void)
{
    prob p;
    prob_init(&p, 21, 64, 2, 1, 16, 55, 0.1, NORM | ROPE);
    const outs a = p.o; /* on a fresh workspace */
    outs b;             /* on the caller's */
    outs_alloc(&b, &p.d);
    CHECK(run_own(&p) == FXA_OK, "fresh workspace");
    fxa_proj_plan *plan;
    size_t bytes;
    unsigned char *ws = plan_and_workspace(&p.d, &plan, &bytes);
    memset(ws, 0xa5, bytes + 64);
    const fxa_proj_args args = args_of(&p, p.x, p.w, &b);
    CHECK(bytes > 0 && fxa_proj_run(plan, &args, ws) == FXA_OK, "caller's workspace: %s",
          fxa_ctx_last_error(g_ctx));
    const size_t n = (size_t)(p.d.tokens * p.d.head_dim);
    CHECK(memcmp(a.q, b.q, n * (size_t)p.d.heads_q * 4) == 0 &&
              memcmp(a.k, b.k, n * (size_t)p.d.heads_kv * 4) == 0 &&
              memcmp(a.v, b.v, n * (size_t)p.d.heads_kv * 4) == 0,
          "the same bits with the caller's workspace");
    CHECK(fxa_proj_run(plan, &args, NULL) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "workspace"),
          "a missing workspace is refused: %s", fxa_ctx_last_error(g_ctx));
    CHECK(fxa_proj_run(plan, &args, ws + 8) == FXA_ERR_INVALID_ARG, "a misaligned one too");
    fxa_proj_plan_destroy(plan);
    free(ws);
    outs_free(&b);
    prob_free(&p);
}

static void test_errors(void)
{
    prob p;
    prob_init(&p, 4, 8, 1, 1, 6, 3, 0.0, 0);
    outs_fill(&p.o, &p.d, -9.0f);
    p.x[5] = NAN;
    CHECK(run_own(&p) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "x has a non-finite value at token 0, feature 5"),
          "NaN in x: %s", fxa_ctx_last_error(g_ctx));
    CHECK(p.o.q[0] == -9.0f, "outputs untouched on error");
    p.x[5] = 0.0f;
    p.w[9] = -INFINITY; /* output 1, input 1 (in_features 8) */
    CHECK(run_own(&p) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "w has a non-finite value at output 1, input 1"),
          "Inf in w: %s", fxa_ctx_last_error(g_ctx));
    p.w[9] = 1e30f;
    p.x[1] = 1e30f; /* finite operands whose product overflows fp32 */
    CHECK(run_own(&p) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "token 0 overflows fp32"),
          "overflow: %s", fxa_ctx_last_error(g_ctx));
    CHECK(p.o.q[0] == -9.0f, "outputs untouched on overflow");
    p.w[9] = 0.5f;
    p.x[1] = 0.5f;
    p.d.head_dim = 5;
    CHECK(run_own(&p) == FXA_ERR_INVALID_ARG, "odd head_dim");
    p.d.head_dim = 6;
    p.d.norm = 1;
    p.gq[1] = INFINITY;
    CHECK(run_own(&p) == FXA_ERR_INVALID_ARG && strstr(fxa_ctx_last_error(g_ctx), "gamma_q[1]"),
          "Inf gamma: %s", fxa_ctx_last_error(g_ctx));
    p.gq[1] = 1.0f;
    const fxa_proj_args a = {.struct_size = sizeof a, .x = p.x, .w = p.w, .q_out = p.o.q};
    CHECK(run_args(&p.d, &a) == FXA_ERR_INVALID_ARG, "missing k/v outputs and gamma");
    p.d.w_format = FXA_PROJ_W_E4M3;
    const fxa_proj_args a2 = {.struct_size = sizeof a2,
                              .x = p.x,
                              .w = p.w,
                              .gamma_q = p.gq,
                              .gamma_k = p.gk,
                              .q_out = p.o.q,
                              .k_out = p.o.k,
                              .v_out = p.o.v};
    CHECK(run_args(&p.d, &a2) == FXA_ERR_INVALID_ARG, "FP8 without scales");
    prob_free(&p);
}

/* Values that are finite in the inputs but not in the result after the
 * norm and the rotation (a huge gamma or RoPE table, a bf16 output past
 * bf16's range), and an eps that fp32 cannot hold (0 there turns an
 * all-zero token into 0 * Inf = NaN): refused, outputs untouched. */
static void test_output_range(void)
{
    prob p;
    prob_init(&p, 4, 8, 1, 1, 6, 5, 0.0, NORM);
    outs_fill(&p.o, &p.d, -9.0f);
    for (int64_t i = 0; i < 8; i++)
        p.x[2 * 8 + i] = 0.0f; /* token 2 projects to y = 0 */
    const double tiny_eps[] = {1e-50, 1e-300, 1e300};
    for (int i = 0; i < 3; i++) {
        p.d.eps = tiny_eps[i];
        CHECK(run_own(&p) == FXA_ERR_INVALID_ARG && strstr(fxa_ctx_last_error(g_ctx), "eps"),
              "eps %g: %s", p.d.eps, fxa_ctx_last_error(g_ctx));
    }
    p.d.eps = 1e-6;
    CHECK(run_own(&p) == FXA_OK && p.o.q[2 * 6] == 0.0f, "zero token, eps 1e-6: %s %g",
          fxa_ctx_last_error(g_ctx), (double)p.o.q[2 * 6]);
    outs_fill(&p.o, &p.d, -9.0f);
    p.gk[3] = 1e38f; /* |y r| is up to sqrt(6) */
    CHECK(run_own(&p) == FXA_ERR_INVALID_ARG && strstr(fxa_ctx_last_error(g_ctx), "overflows fp32"),
          "gamma 1e38: %s", fxa_ctx_last_error(g_ctx));
    p.gk[3] = 1.0f;
    p.d.norm = 0;
    p.d.rope = 1;
    p.cs[6 + 1] = 3e38f; /* token 1's table */
    CHECK(run_own(&p) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "token 1 overflows fp32"),
          "RoPE table 3e38: %s", fxa_ctx_last_error(g_ctx));
    p.cs[6 + 1] = 1.0f;
    p.d.rope = 0;
    p.d.out_dtype = FXA_BF16;
    p.bias[p.n_out - 1] = 3.4e38f; /* V: finite in fp32, Inf in bf16 */
    CHECK(run_own(&p) == FXA_ERR_INVALID_ARG && strstr(fxa_ctx_last_error(g_ctx), "overflows bf16"),
          "bf16 V past its range: %s", fxa_ctx_last_error(g_ctx));
    int untouched = 1;
    for (int64_t i = 0; i < 4 * 6; i++)
        untouched &= p.o.q[i] == -9.0f && p.o.k[i] == -9.0f && p.o.v[i] == -9.0f;
    CHECK(untouched, "outputs written by a refused projection");
    prob_free(&p);
}

/* Outputs that overlap each other or the workspace are refused; an input
 * given as an output is read whole before any output is stored. */
static void test_output_overlap(void)
{
    prob p;
    prob_init(&p, 5, 12, 1, 1, 6, 9, 0.5, NORM | ROPE);
    CHECK(run_own(&p) == FXA_OK, "projection: %s", fxa_ctx_last_error(g_ctx));
    float *k_ref = malloc(5 * 6 * sizeof(float));
    memcpy(k_ref, p.o.k, 5 * 6 * sizeof(float));
    float *const k = p.o.k;
    p.o.k = p.o.q; /* k_out over q_out */
    CHECK(run_own(&p) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "q_out and k_out overlap"),
          "k_out over q_out: %s", fxa_ctx_last_error(g_ctx));
    p.o.k = k;
    fxa_proj_plan *plan;
    size_t bytes;
    unsigned char *ws = plan_and_workspace(&p.d, &plan, &bytes);
    fxa_proj_args a = args_of(&p, p.x, p.w, &p.o);
    a.v_out = ws + bytes - 64; /* the workspace's end */
    CHECK(fxa_proj_run(plan, &a, ws) == FXA_ERR_INVALID_ARG &&
              strstr(fxa_ctx_last_error(g_ctx), "v_out and workspace overlap"),
          "v_out inside the workspace: %s", fxa_ctx_last_error(g_ctx));
    fxa_proj_plan_destroy(plan);
    free(ws);
    /* K written over the RoPE tables it reads: the same K. */
    float *cs = malloc(5 * 6 * sizeof(float));
    memcpy(cs, p.cs, 5 * 6 * sizeof(float));
    p.o.k = p.cs;
    CHECK(run_own(&p) == FXA_OK && memcmp(p.cs, k_ref, 5 * 6 * sizeof(float)) == 0,
          "k_out over rope_cos: %s", fxa_ctx_last_error(g_ctx));
    memcpy(p.cs, cs, 5 * 6 * sizeof(float));
    p.o.k = k;
    free(cs);
    free(k_ref);
    prob_free(&p);
}

/* Descriptors past the address space or int64, and bad shapes: refused by
 * the run, 0 workspace bytes, and nothing moved by the RoPE conversion
 * (the sanitizer builds see any overflow on the way). */
static void test_hostile_desc(void)
{
    prob p;
    prob_init(&p, 4, 8, 1, 1, 6, 11, 0.0, 0);
    const fxa_proj_desc good = p.d;
    const int64_t huge[] = {(int64_t)1 << 40, (int64_t)1 << 62, INT64_MAX};
    for (int i = 0; i < 3; i++) {
        p.d = good;
        p.d.heads_q = huge[i];
        CHECK(run_own(&p) == FXA_ERR_INVALID_ARG, "heads_q %lld accepted", (long long)huge[i]);
        CHECK(plan_bytes(&p.d) == 0, "heads_q %lld: %zu workspace bytes", (long long)huge[i],
              plan_bytes(&p.d));
        /* (2^40 heads of w would be addressable: a caller's matter) */
        CHECK(i == 0 || fxa_rope_interleaved_to_half(&p.d, p.w, NULL, p.bias, p.gq, p.gk) ==
                            FXA_ERR_INVALID_ARG,
              "RoPE conversion with heads_q %lld", (long long)huge[i]);
        p.d = good;
        p.d.heads_kv = huge[i];
        CHECK(run_own(&p) == FXA_ERR_INVALID_ARG, "heads_kv %lld accepted", (long long)huge[i]);
        CHECK(i == 0 || fxa_rope_interleaved_to_half(&p.d, p.w, NULL, p.bias, p.gq, p.gk) ==
                            FXA_ERR_INVALID_ARG,
              "RoPE conversion with heads_kv %lld", (long long)huge[i]);
    }
    p.d = good;
    p.d.head_dim = 5;
    CHECK(plan_bytes(&p.d) == 0, "odd head_dim: %zu workspace bytes", plan_bytes(&p.d));
    p.d.head_dim = FXA_MAX_HEAD_DIM + 2;
    CHECK(fxa_rope_interleaved_to_half(&p.d, p.w, NULL, NULL, NULL, NULL) == FXA_ERR_INVALID_ARG,
          "RoPE conversion with head_dim past FXA_MAX_HEAD_DIM");
    p.d = good;
    p.d.w_format = (fxa_proj_w)9;
    CHECK(plan_bytes(&p.d) == 0, "unknown w_format: %zu workspace bytes", plan_bytes(&p.d));
    CHECK(fxa_rope_interleaved_to_half(&p.d, p.w, NULL, NULL, NULL, NULL) == FXA_ERR_INVALID_ARG,
          "RoPE conversion with an unknown w_format");
    p.d = good;
    prob_free(&p);
}

/* Versioned structs: a descriptor of 0.1's size (before out_dtype, the
 * bytes past it poisoned) plans an fp32-output projection with the current
 * descriptor's bits, and converts RoPE weights the same; sizes outside
 * [first, current] of fxa_proj_desc, fxa_proj_args and fxa_proj_tp are
 * refused with a message. */
static fxa_status reduce_none(double *sums, int64_t n, void *arg)
{
    (void)sums;
    (void)n;
    (void)arg;
    return FXA_OK;
}

static void test_struct_sizes(void)
{
    prob p;
    prob_init(&p, 9, 16, 2, 1, 8, 77, 0.1, NORM | ROPE);
    const outs a = p.o; /* with the current descriptor */
    outs b;             /* with the others */
    outs_alloc(&b, &p.d);
    CHECK(run_own(&p) == FXA_OK, "current desc: %s", fxa_ctx_last_error(g_ctx));
    const fxa_proj_desc cur = p.d;
    memset((char *)&p.d + FXA_PROJ_DESC_SIZE_0_1, 0x5a, sizeof p.d - FXA_PROJ_DESC_SIZE_0_1);
    p.d.struct_size = FXA_PROJ_DESC_SIZE_0_1;
    CHECK(run(&p, p.x, p.w, &b) == FXA_OK, "0.1 desc: %s", fxa_ctx_last_error(g_ctx));
    const size_t n = (size_t)(p.d.tokens * p.d.head_dim);
    CHECK(memcmp(a.q, b.q, n * 2 * 4) == 0 && memcmp(a.k, b.k, n * 4) == 0 &&
              memcmp(a.v, b.v, n * 4) == 0,
          "the 0.1 desc's outputs differ from the current one's fp32 outputs");
    /* The RoPE conversion reads the same fields. */
    float g0[16], g1[16];
    memcpy(g0, p.gq, sizeof g0);
    memcpy(g1, p.gq, sizeof g1);
    CHECK(fxa_rope_interleaved_to_half(&cur, NULL, NULL, NULL, g0, NULL) == FXA_OK &&
              fxa_rope_interleaved_to_half(&p.d, NULL, NULL, NULL, g1, NULL) == FXA_OK &&
              memcmp(g0, g1, sizeof g0) == 0,
          "RoPE conversion with a 0.1 desc");
    const size_t bad_desc[] = {FXA_PROJ_DESC_SIZE_0_1 - 4, sizeof(fxa_proj_desc) + 8, 0};
    for (int i = 0; i < 3; i++) {
        p.d = cur;
        p.d.struct_size = bad_desc[i];
        CHECK(run(&p, p.x, p.w, &b) == FXA_ERR_INVALID_ARG &&
                  strstr(fxa_ctx_last_error(g_ctx), "fxa_proj_desc.struct_size"),
              "desc of %zu bytes: '%s'", bad_desc[i], fxa_ctx_last_error(g_ctx));
        CHECK(fxa_rope_interleaved_to_half(&p.d, NULL, NULL, NULL, g1, NULL) == FXA_ERR_INVALID_ARG,
              "RoPE conversion with a desc of %zu bytes", bad_desc[i]);
    }
    p.d = cur;
    fxa_proj_args args = args_of(&p, p.x, p.w, &b);
    const size_t bad_args[] = {FXA_PROJ_ARGS_SIZE_0_3 - 8, sizeof(fxa_proj_args) + 8};
    for (int i = 0; i < 2; i++) {
        args.struct_size = bad_args[i];
        CHECK(run_args(&p.d, &args) == FXA_ERR_INVALID_ARG &&
                  strstr(fxa_ctx_last_error(g_ctx), "fxa_proj_args.struct_size"),
              "args of %zu bytes: '%s'", bad_args[i], fxa_ctx_last_error(g_ctx));
    }
    fxa_proj_tp tp = {.struct_size = FXA_PROJ_TP_SIZE_0_1,
                      .norm_features_q = 16,
                      .norm_features_k = 8,
                      .reduce = reduce_none};
    fxa_proj_plan *plan = NULL;
    size_t bytes = 0;
    CHECK(fxa_proj_plan_create_tp(g_ctx, &p.d, &tp, &plan, &bytes) == FXA_OK, "tp plan: %s",
          fxa_ctx_last_error(g_ctx));
    fxa_proj_plan_destroy(plan);
    tp.struct_size = FXA_PROJ_TP_SIZE_0_1 - 8;
    plan = NULL;
    CHECK(fxa_proj_plan_create_tp(g_ctx, &p.d, &tp, &plan, &bytes) == FXA_ERR_INVALID_ARG &&
              plan == NULL && strstr(fxa_ctx_last_error(g_ctx), "fxa_proj_tp.struct_size"),
          "tp of %zu bytes: '%s'", tp.struct_size, fxa_ctx_last_error(g_ctx));
    outs_free(&b);
    prob_free(&p);
}

int main(void)
{
    g_ctx = fxt_ctx(2);
    if (!g_ctx)
        return 1;
    test_f32();
    test_formats();
    test_rmsnorm_association();
    test_interleaved_conversion();
    test_blocked_weights();
    test_single_segment();
    test_blas_threads_restored();
    test_out_bf16();
    test_gemm_choice();
    test_bf16_gemm_threads();
    test_cross_attention();
    test_workspace();
    test_errors();
    test_output_range();
    test_output_overlap();
    test_hostile_desc();
    test_struct_sizes();
    fxa_ctx_destroy(g_ctx);
    return test_summary("test_proj");
}
