/*
 * test_attn_bwd_mask: the attention backward with masks and causal against
 * the fp64 reference of tests/common/attn_bwd_ref.c on the same inputs (Q,
 * K, V, dO, the mask, and the forward's out and lse as fxattn returned
 * them), within the first-order fp32 envelope of docs/numerics.md
 * ("Backward", with the bias's rounding), per element. The reference is
 * checked against central finite differences of L = sum dO . O in fp64 on a
 * tiny shape with a boolean mask, an additive mask and causal, a row with
 * every key masked included (a constant: its gradients are 0). Cases: a
 * boolean mask [B, Hq, Sq, Skv] with GQA, one stored transposed (keys Sq
 * apart), an additive mask broadcast over heads (-inf entries included),
 * key padding [B, 1, 1, Skv] that masks whole key tiles, causal with Sq ==
 * Skv, Sq < Skv (keys no query sees: dK = dV = 0) and Sq > Skv, and rows
 * with every key masked (dQ exactly 0; their lse -inf accepted); the same
 * kinds with bf16 compute (bf16 inputs) within the reference's bf16
 * envelope (256-key tiles, odd D, odd Sq, causal cuts at an odd key). Each
 * case is bit-identical on 1, 2 and 3 threads (the one-pass and two-pass
 * schedules). Refusals: a masked plan without args->mask, a mask that
 * overlaps dq, a NaN in an additive mask, lse -inf without a mask. Runs
 * once per kernel set (FXA_ISA).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn_bwd_ref.h"
#include "bwd_fixtures.h"
#include "testutil.h"

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

/* The case's sizes for the fp64 reference (attn_bwd_ref.h). */
static fxt_bwd_shape shape_of(const mcase *c)
{
    return (fxt_bwd_shape){c->b, c->hq, c->hkv, c->sq, c->skv, c->d, 1.0 / sqrt((double)c->d)};
}

/* The reference against central differences of L = sum dO . O(q, k, v),
 * for a boolean mask with a dead row, an additive mask and causal (each a
 * bias matrix). */
static void test_finite_differences(void)
{
    enum { SQ = 4, SKV = 5, DD = 3, NQ = SQ * DD, NKV = SKV * DD };
    const mcase c = {"fd", 1, 1, 1, SQ, SKV, DD, M_NONE, 0, 0};
    const fxt_bwd_shape s = shape_of(&c);
    double q[NQ], k[NKV], v[NKV], dout[NQ], bias[SQ * SKV];
    double dq[NQ], dk[NKV], dv[NKV];
    double *grad[3] = {dq, dk, dv};
    fxt_rng r;
    fxt_rng_seed(&r, 17);
    normal_pairs(&r, 1.0, q, dout, NQ);
    normal_pairs(&r, 1.0, k, v, NKV);
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
        worst = fmax(worst, fxt_ref_fd_error(&s, q, k, v, bias, dout, grad));
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

/* Mask element (b, h, i, j) of a masked case as a bias (natural log):
 * -inf for a masked key, else 0 (boolean) or the additive value. */
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
    fxt_attn_desc(&pb->d, c->b, c->hq, c->hkv, c->sq, c->skv, c->d);
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
    pb->d.layout = FXA_LAYOUT_BHSD;
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
    for (int64_t b = 0; b < c->b && pb->mask; b++)
        for (int64_t h = 0; h < c->hq; h++)
            for (int64_t i = 0; i < c->sq; i++)
                for (int64_t j = 0; j < c->skv; j++) {
                    if ((ms.head == 0 && h > 0) || (ms.query == 0 && i > 0))
                        continue; /* a broadcast element: the one written first */
                    const int64_t at = b * ms.batch + h * ms.head + i * ms.query + j * ms.key;
                    const double x = mask_value(c, &r, b, h, i, j);
                    if (c->kind == M_ADD)
                        ((float *)pb->mask)[at] = (float)x;
                    else
                        ((uint8_t *)pb->mask)[at] = x == 0.0;
                }
    pb->bias = malloc(pb->nbias * sizeof(double));
    fxt_ref_bias(&pb->d, pb->mask, pb->bias);
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = c->bf16 ? (const void *)pb->q16 : pb->q,
                             .k = c->bf16 ? (const void *)pb->k16 : pb->k,
                             .v = c->bf16 ? (const void *)pb->v16 : pb->v,
                             .out = pb->out,
                             .lse = pb->lse,
                             .mask = pb->mask};
    fxt_fwd_checked(c->label, &pb->d, &a);
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

/* The backward's args on the problem's tensors (Q, K, V as given). */
static fxa_attn_bwd_args args_of(const problem *pb)
{
    const int bf = pb->c->bf16;
    fxa_attn_bwd_args a = fxt_bwd_args(
        bf ? (const void *)pb->q16 : pb->q, bf ? (const void *)pb->k16 : pb->k,
        bf ? (const void *)pb->v16 : pb->v, pb->out, pb->dout, pb->lse, pb->dq, pb->dk, pb->dv);
    a.mask = pb->mask;
    return a;
}

/* The backward on n_threads threads with args a (or the problem's own when
 * NULL); status, the context's last error into msg (when not NULL). */
static fxa_status run_bwd(problem *pb, int n_threads, const fxa_attn_bwd_args *a, char *msg,
                          size_t cap)
{
    const fxa_attn_bwd_args own = args_of(pb);
    return fxt_bwd_once(&pb->d, n_threads, a ? a : &own, NULL, msg, cap);
}

static fxa_status run_bwd_on(void *pb, int n_threads)
{
    return run_bwd(pb, n_threads, NULL, NULL, 0);
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
    const fxt_bwd_shape sh = shape_of(c);
    fxt_ref_attn_bwd(&sh, (fxt_bf16_rounding){c->bf16, c->bf16}, x[0], x[1], x[2], pb.bias, x[4],
                     x[3], lse, g, env);
    char msg[512];
    const fxa_status st = run_bwd(&pb, 2, NULL, msg, sizeof msg);
    CHECK(st == FXA_OK, "[%s] backward: %s", c->label, msg);
    float *const res[3] = {pb.dq, pb.dk, pb.dv};
    const char *names[3] = {"dq", "dk", "dv"};
    const size_t ng[3] = {pb.nq, pb.nkv, pb.nkv};
    double *got = malloc(pb.nq * 8 > pb.nkv * 8 ? pb.nq * 8 : pb.nkv * 8);
    for (int w = 0; w < 3; w++) {
        for (size_t e = 0; e < ng[w]; e++)
            got[e] = res[w][e];
        fxt_bwd_compare(c->label, names[w], got, g[w], env[w], ng[w]);
    }
    free(got);
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
    fxt_bwd_check_threads(c->label, run_bwd_on, &pb, res, keep, ng);
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
    fxa_attn_bwd_args a = args_of(&pb);
    a.mask = NULL;
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
    st = run_bwd(&pb, 1, NULL, msg, sizeof msg);
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
