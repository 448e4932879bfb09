/*
 * test_attn_strides: element strides (fxa_attn_desc q/k/v/o_strides) and
 * the bf16 output (out_dtype), once per kernel set (FXA_ISA).
 *
 *  - Strided views give bit-identical outputs, LSE and row diagnostics to
 *    the same values copied into contiguous BSHD tensors: heads sliced out of
 *    a fused QKV buffer [B, S, 3, H, D]; BSHD data described as BHSD-shaped
 *    strides; K head-major and V token-major with padding; K/V shared across
 *    the batch (batch stride 0); O into a padded, head-major buffer. For f32,
 *    bf16 and f16 inputs, fp32 and bf16 compute, auto and online modes, GQA,
 *    two kv tiles, decode (one query row, split keys).
 *  - Blockwise (fxa_attn_acc_*): strided K/V blocks and strided O equal the
 *    contiguous blocks bit for bit.
 *  - out_dtype FXA_BF16: every element equals fxa_f32_to_bf16 of the fp32
 *    output (fxa_attn_run and fxa_attn_acc_finish, contiguous and strided).
 *  - Validation: negative strides, O strides that alias (zero, or equal
 *    head and token strides), strides past the addressable range and an
 *    unknown out_dtype are refused by the plan; O overlapping Q, K or V is
 *    refused by the run before anything is written.
 */
#include <stdlib.h>
#include <string.h>

#include "fxattn.h"
#include "testutil.h"

static fxa_ctx *g_ctx;

/* The value of element (b, h, s, c) of tensor `which`, exact in bf16 and
 * f16 (8 significant bits, small exponent range). */
static float value(int which, int64_t b, int64_t h, int64_t s, int64_t c)
{
    const uint64_t k[5] = {UINT64_C(0x9e3779b97f4a7c15), UINT64_C(0xbf58476d1ce4e5b9),
                           UINT64_C(0x94d049bb133111eb), UINT64_C(0x2545f4914f6cdd1d),
                           UINT64_C(0x9e3779b1)};
    const uint64_t in[5] = {(uint64_t)which, (uint64_t)b, (uint64_t)h, (uint64_t)s, (uint64_t)c};
    uint64_t x = 0;
    for (int i = 0; i < 5; i++)
        x ^= in[i] * k[i];
    x ^= x >> 31;
    x *= UINT64_C(0xd6e8feb86659fd93);
    x ^= x >> 29;
    const int m = (int)(x & 0xff) - 128; /* -128..127 */
    const int e = (int)((x >> 8) % 4);   /* 2^-7 .. 2^-4 */
    return (float)m * (float)(1.0 / (double)(1 << (7 + e)));
}

static size_t esize(fxa_dtype t)
{
    return t == FXA_F32 ? 4 : 2;
}

static void put(void *buf, fxa_dtype t, int64_t at, float x)
{
    if (t == FXA_F32)
        ((float *)buf)[at] = x;
    else if (t == FXA_BF16)
        ((uint16_t *)buf)[at] = fxa_f32_to_bf16(x);
    else
        ((uint16_t *)buf)[at] = fxa_f32_to_f16(x);
}

/* Elements one past the last of [B, H, S, D] with strides s. */
static int64_t extent(fxa_attn_strides s, int64_t B, int64_t H, int64_t S, int64_t D)
{
    return (B - 1) * s.batch + (H - 1) * s.head + (S - 1) * s.token + D;
}

/* Write tensor `which` [B, H, S, D] (batch index taken modulo b_mod) into
 * buf with strides s. */
static void fill(void *buf, fxa_dtype t, fxa_attn_strides s, int which, int64_t B, int64_t H,
                 int64_t S, int64_t D, int64_t b_mod)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < S; j++)
                for (int64_t c = 0; c < D; c++)
                    put(buf, t, b * s.batch + h * s.head + j * s.token + c,
                        value(which, b % b_mod, h, j, c));
}

/* Gather [B, H, S, D] from a strided buffer of element size es into a
 * contiguous BSHD copy. */
static void gather(const void *buf, size_t es, fxa_attn_strides s, int64_t B, int64_t H, int64_t S,
                   int64_t D, void *dst)
{
    const fxa_attn_strides c = fxa_attn_layout_strides(FXA_LAYOUT_BSHD, H, S, D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t j = 0; j < S; j++)
                memcpy((char *)dst + (size_t)(b * c.batch + h * c.head + j * c.token) * es,
                       (const char *)buf + (size_t)(b * s.batch + h * s.head + j * s.token) * es,
                       (size_t)D * es);
}

typedef struct result {
    fxa_status st;
    void *out; /* contiguous BSHD copy of the output (out_dtype) */
    float *lse;
    uint8_t *fb;
    float *bound;
    fxa_attn_stats stats;
} result;

static void result_free(result *r)
{
    free(r->out);
    free(r->lse);
    free(r->fb);
    free(r->bound);
}

/* One layout of a problem: where Q, K, V and O live. */
typedef struct views {
    fxa_attn_strides q, k, v, o; /* all 0 for the contiguous preset */
    int fused;                   /* Q, K, V in one [B, S, 3, H, D] buffer */
    int64_t kv_batch_mod;        /* K/V values repeat every this many batches */
} views;

/* Run d (the shape and options) with the views; blockwise splits the keys
 * into n_blocks blocks through fxa_attn_acc_* instead of fxa_attn_run. */
static result run_views(fxa_attn_desc d, const views *w, int n_blocks)
{
    result r = {0};
    const int64_t B = d.batch, Hq = d.heads_q, Hkv = d.heads_kv, Sq = d.seq_q, Skv = d.seq_kv,
                  D = d.head_dim;
    d.q_strides = w->q;
    d.k_strides = w->k;
    d.v_strides = w->v;
    d.o_strides = w->o;
    const fxa_attn_strides qs =
        w->q.batch || w->q.token || w->q.head ? w->q : fxa_attn_layout_strides(d.layout, Hq, Sq, D);
    const fxa_attn_strides ks = w->k.batch || w->k.token || w->k.head
                                    ? w->k
                                    : fxa_attn_layout_strides(d.layout, Hkv, Skv, D);
    const fxa_attn_strides vs = w->v.batch || w->v.token || w->v.head
                                    ? w->v
                                    : fxa_attn_layout_strides(d.layout, Hkv, Skv, D);
    const fxa_attn_strides os =
        w->o.batch || w->o.token || w->o.head ? w->o : fxa_attn_layout_strides(d.layout, Hq, Sq, D);
    const size_t es = esize(d.dtype), oes = esize(d.out_dtype);
    char *qb, *kb, *vb, *fused = NULL;
    if (w->fused) {
        const int64_t n = extent(qs, B, Hq, Sq, D) + 2 * Hq * D;
        fused = calloc((size_t)n, es);
        qb = fused;
        kb = fused + (size_t)(Hq * D) * es;
        vb = fused + (size_t)(2 * Hq * D) * es;
    } else {
        qb = calloc((size_t)extent(qs, B, Hq, Sq, D), es);
        kb = calloc((size_t)extent(ks, B, Hkv, Skv, D), es);
        vb = calloc((size_t)extent(vs, B, Hkv, Skv, D), es);
    }
    fill(qb, d.dtype, qs, 0, B, Hq, Sq, D, B);
    fill(kb, d.dtype, ks, 1, B, Hkv, Skv, D, w->kv_batch_mod);
    fill(vb, d.dtype, vs, 2, B, Hkv, Skv, D, w->kv_batch_mod);
    const size_t o_n = (size_t)extent(os, B, Hq, Sq, D);
    void *ob = malloc(o_n * oes);
    memset(ob, 0x7f, o_n * oes);
    const size_t rows = (size_t)(B * Hq * Sq);
    r.out = malloc((size_t)(B * Hq * Sq * D) * oes);
    r.lse = malloc(rows * sizeof(float));
    r.fb = malloc(rows);
    r.bound = malloc(rows * sizeof(float));
    r.stats.struct_size = sizeof r.stats;
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    if (n_blocks > 1)
        d.seq_kv = (Skv + n_blocks - 1) / n_blocks;
    r.st = fxa_attn_plan_create(g_ctx, &d, &plan, &ws_bytes);
    void *ws = NULL;
    if (r.st == FXA_OK && ws_bytes)
        ws = aligned_alloc(64, (ws_bytes + 63) & ~(size_t)63);
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = qb,
                             .k = kb,
                             .v = vb,
                             .out = ob,
                             .lse = r.lse,
                             .row_fallback = r.fb,
                             .row_bound = r.bound};
    if (r.st == FXA_OK && n_blocks <= 1) {
        r.st = fxa_attn_run(plan, &a, ws, &r.stats);
    } else if (r.st == FXA_OK) {
        /* Blocks of the keys: pointers advance by the token stride (the
         * explicit strides), or each block is copied out contiguously in
         * the layout (the preset). */
        const int64_t per = d.seq_kv;
        const int preset_k = !(w->k.batch || w->k.token || w->k.head);
        const int preset_v = !(w->v.batch || w->v.token || w->v.head);
        const size_t len = fxa_kv_summary_len(plan);
        double *sum = malloc((size_t)n_blocks * len * sizeof(double));
        const void *kp[16], *vp[16];
        void *own[32] = {0};
        int64_t nb[16];
        for (int i = 0; i < n_blocks; i++) {
            const int64_t j0 = i * per;
            nb[i] = Skv - j0 < per ? Skv - j0 : per;
            if (preset_k) {
                const fxa_attn_strides bs = fxa_attn_layout_strides(d.layout, Hkv, nb[i], D);
                own[2 * i] = malloc((size_t)(B * Hkv * nb[i] * D) * es);
                for (int64_t b = 0; b < B; b++)
                    for (int64_t h = 0; h < Hkv; h++)
                        for (int64_t j = 0; j < nb[i]; j++)
                            memcpy((char *)own[2 * i] +
                                       (size_t)(b * bs.batch + h * bs.head + j * bs.token) * es,
                                   kb + (size_t)(b * ks.batch + h * ks.head + (j0 + j) * ks.token) *
                                            es,
                                   (size_t)D * es);
                kp[i] = own[2 * i];
            } else {
                kp[i] = kb + (size_t)(j0 * ks.token) * es;
            }
            if (preset_v) {
                const fxa_attn_strides bs = fxa_attn_layout_strides(d.layout, Hkv, nb[i], D);
                own[2 * i + 1] = malloc((size_t)(B * Hkv * nb[i] * D) * es);
                for (int64_t b = 0; b < B; b++)
                    for (int64_t h = 0; h < Hkv; h++)
                        for (int64_t j = 0; j < nb[i]; j++)
                            memcpy((char *)own[2 * i + 1] +
                                       (size_t)(b * bs.batch + h * bs.head + j * bs.token) * es,
                                   vb + (size_t)(b * vs.batch + h * vs.head + (j0 + j) * vs.token) *
                                            es,
                                   (size_t)D * es);
                vp[i] = own[2 * i + 1];
            } else {
                vp[i] = vb + (size_t)(j0 * vs.token) * es;
            }
            if (r.st == FXA_OK)
                r.st = fxa_kv_summarize(plan, kp[i], vp[i], nb[i], sum + (size_t)i * len);
        }
        fxa_attn_acc *acc = NULL;
        if (r.st == FXA_OK)
            r.st = fxa_attn_acc_create(plan, &acc);
        if (r.st == FXA_OK)
            r.st = fxa_attn_acc_begin(acc, qb, sum, n_blocks);
        for (int i = 0; r.st == FXA_OK && i < n_blocks; i++)
            r.st = fxa_attn_acc_add(acc, kp[i], vp[i], nb[i]);
        if (r.st == FXA_OK)
            r.st = fxa_attn_acc_finish(acc, &a, &r.stats);
        fxa_attn_acc_destroy(acc);
        for (int i = 0; i < 2 * n_blocks; i++)
            free(own[i]);
        free(sum);
    }
    if (r.st != FXA_OK)
        fprintf(stderr, "  run: %s\n", fxa_ctx_last_error(g_ctx));
    else
        gather(ob, oes, os, B, Hq, Sq, D, r.out);
    free(ws);
    fxa_attn_plan_destroy(plan);
    free(ob);
    if (fused) {
        free(fused);
    } else {
        free(qb);
        free(kb);
        free(vb);
    }
    return r;
}

static void expect_same(const char *what, const fxa_attn_desc *d, const result *ref,
                        const result *got)
{
    const size_t n = (size_t)(d->batch * d->heads_q * d->seq_q * d->head_dim);
    const size_t rows = (size_t)(d->batch * d->heads_q * d->seq_q);
    CHECK(ref->st == FXA_OK && got->st == FXA_OK, "[%s] runs failed (%d, %d)", what, ref->st,
          got->st);
    if (ref->st != FXA_OK || got->st != FXA_OK)
        return;
    CHECK(memcmp(ref->out, got->out, n * esize(d->out_dtype)) == 0,
          "[%s] output differs from the contiguous copy", what);
    CHECK(memcmp(ref->lse, got->lse, rows * sizeof(float)) == 0, "[%s] lse differs", what);
    CHECK(memcmp(ref->fb, got->fb, rows) == 0, "[%s] row_fallback differs", what);
    CHECK(memcmp(ref->bound, got->bound, rows * sizeof(float)) == 0, "[%s] row_bound differs",
          what);
    CHECK(ref->stats.fallback_rows == got->stats.fallback_rows &&
              ref->stats.keys == got->stats.keys && ref->stats.keys == d->seq_kv,
          "[%s] stats differ (fallback %lld/%lld, keys %lld/%lld)", what,
          (long long)ref->stats.fallback_rows, (long long)got->stats.fallback_rows,
          (long long)ref->stats.keys, (long long)got->stats.keys);
}

/* bf16 output == fxa_f32_to_bf16 of the fp32 output, element for element. */
static void expect_bf16_of(const char *what, const fxa_attn_desc *d, const result *f32,
                           const result *bf)
{
    const size_t n = (size_t)(d->batch * d->heads_q * d->seq_q * d->head_dim);
    CHECK(f32->st == FXA_OK && bf->st == FXA_OK, "[%s] runs failed", what);
    if (f32->st != FXA_OK || bf->st != FXA_OK)
        return;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += ((const uint16_t *)bf->out)[i] != fxa_f32_to_bf16(((const float *)f32->out)[i]);
    CHECK(bad == 0, "[%s] %zu of %zu bf16 outputs are not fxa_f32_to_bf16 of the fp32 output", what,
          bad, n);
}

static fxa_attn_desc base_desc(int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Skv,
                               int64_t D, fxa_dtype t, fxa_compute c, fxa_mode m)
{
    fxa_attn_desc d;
    fxt_attn_desc(&d, B, Hq, Hkv, Sq, Skv, D);
    d.dtype = t;
    d.compute = c;
    d.mode = m;
    return d;
}

/* A run of a descriptor on views, in n_blocks key blocks. */
typedef struct run_spec {
    const fxa_attn_desc *d;
    const views *w;
    int n_blocks;
} run_spec;

/* expect_same or expect_bf16_of. */
typedef void (*expect_fn)(const char *what, const fxa_attn_desc *d, const result *want,
                          const result *got);

/* Runs want and got, checks them with expect (on want's descriptor) under
 * the label what, frees both results. */
static void compare_runs(const char *what, expect_fn expect, run_spec want, run_spec got)
{
    result rw = run_views(*want.d, want.w, want.n_blocks);
    result rg = run_views(*got.d, got.w, got.n_blocks);
    expect(what, want.d, &rw, &rg);
    result_free(&rw);
    result_free(&rg);
}

/* D: head_dim (bf16 compute packs K pairs through pack_kt only for an even
 * one). */
static void test_views(fxa_dtype t, fxa_compute comp, fxa_mode mode, int64_t Sq, int64_t D)
{
    const int64_t B = 2, Hq = 4, Hkv = 2, Skv = 300;
    const char *tn = t == FXA_F32 ? "f32" : t == FXA_BF16 ? "bf16" : "f16";
    const char *cn = comp == FXA_COMPUTE_BF16 ? "bf16 compute" : "fp32 compute";
    const char *mn = mode == FXA_MODE_ONLINE ? "online" : "auto";
    const fxa_attn_desc d = base_desc(B, Hq, Hkv, Sq, Skv, D, t, comp, mode);
    const views contiguous = {.kv_batch_mod = B};

    /* BSHD data described by strides, on a descriptor whose layout says
     * BHSD (the strides win); K head-major, V token-major padded; O padded
     * and head-major. K's odd batch stride puts the second batch's bf16 keys
     * at odd offsets, so bf16 compute packs them value by value and the
     * first batch's through pack_kt: both must give the contiguous bits. */
    views w = {.kv_batch_mod = B};
    w.q = (fxa_attn_strides){.batch = Sq * Hq * D, .token = Hq * D, .head = D};
    w.k = (fxa_attn_strides){.batch = Hkv * Skv * D + 5, .token = D, .head = Skv * D};
    w.v = (fxa_attn_strides){.batch = Skv * (Hkv * D + 3), .token = Hkv * D + 3, .head = D};
    w.o = (fxa_attn_strides){.batch = Hq * Sq * (D + 7) + 2, .token = D + 7, .head = Sq * (D + 7)};
    fxa_attn_desc dv = d;
    dv.layout = FXA_LAYOUT_BHSD;

    /* K and V shared by both batches (batch stride 0) against a copy. */
    views sh = {.kv_batch_mod = 1};
    const views shc = {.kv_batch_mod = 1};
    sh.k = (fxa_attn_strides){.batch = 0, .token = Hkv * D, .head = D};
    sh.v = (fxa_attn_strides){.batch = 0, .token = D, .head = Skv * D};

    /* bf16 output, contiguous and strided. */
    fxa_attn_desc db = d;
    db.out_dtype = FXA_BF16;
    fxa_attn_desc dbv = dv;
    dbv.out_dtype = FXA_BF16;

    /* Each against its contiguous (or copied, or fp32) counterpart; the
     * blockwise ones (three blocks of strided pointers, two blocks to a
     * bf16 finish) against contiguous blocks. */
    const struct {
        const char *what;
        expect_fn expect;
        run_spec want, got;
    } checks[] = {
        {"strided Q/K/V/O", expect_same, {&d, &contiguous, 1}, {&dv, &w, 1}},
        {"blockwise strided K/V/O", expect_same, {&d, &contiguous, 3}, {&dv, &w, 3}},
        {"K/V batch stride 0", expect_same, {&d, &shc, 1}, {&d, &sh, 1}},
        {"bf16 output", expect_bf16_of, {&d, &contiguous, 1}, {&db, &contiguous, 1}},
        {"bf16 output, strided", expect_same, {&db, &contiguous, 1}, {&dbv, &w, 1}},
        {"bf16 output, blockwise finish",
         expect_bf16_of,
         {&d, &contiguous, 2},
         {&db, &contiguous, 2}},
    };
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++) {
        char what[160];
        snprintf(what, sizeof what, "%s %s %s Sq=%lld: %s", tn, cn, mn, (long long)Sq,
                 checks[i].what);
        compare_runs(what, checks[i].expect, checks[i].want, checks[i].got);
    }
}

/* Self-attention with heads sliced out of a fused QKV buffer [B, S, 3, H, D]
 * (a PyTorch qkv.view(B, S, 3, H, D)[:, :, i] with no copy). */
static void test_fused(fxa_dtype t)
{
    const int64_t B = 2, H = 3, S = 270, D = 64;
    const fxa_attn_desc d = base_desc(B, H, H, S, S, D, t, FXA_COMPUTE_FP32, FXA_MODE_AUTO);
    const views contiguous = {.kv_batch_mod = B};
    views w = {.fused = 1, .kv_batch_mod = B};
    w.q = (fxa_attn_strides){.batch = S * 3 * H * D, .token = 3 * H * D, .head = D};
    w.k = w.q;
    w.v = w.q;
    compare_runs(t == FXA_F32 ? "fused QKV [B,S,3,H,D] f32" : "fused QKV [B,S,3,H,D] bf16",
                 expect_same, (run_spec){&d, &contiguous, 1}, (run_spec){&d, &w, 1});
}

static void expect_plan_fail(const fxa_attn_desc *d, const char *needle, const char *what)
{
    fxa_attn_plan *plan = NULL;
    size_t ws = 0;
    const fxa_status st = fxa_attn_plan_create(g_ctx, d, &plan, &ws);
    CHECK(st == FXA_ERR_INVALID_ARG && !plan, "[%s] plan: status %d, expected invalid argument",
          what, st);
    CHECK(strstr(fxa_ctx_last_error(g_ctx), needle) != NULL, "[%s] message '%s' lacks '%s'", what,
          fxa_ctx_last_error(g_ctx), needle);
    fxa_attn_plan_destroy(plan);
}

static void test_validation(void)
{
    const int64_t B = 1, H = 2, S = 8, D = 16;
    fxa_attn_desc d = base_desc(B, H, H, S, S, D, FXA_F32, FXA_COMPUTE_FP32, FXA_MODE_AUTO);
    fxa_attn_desc e = d;
    e.q_strides = (fxa_attn_strides){.batch = 0, .token = -D, .head = D};
    expect_plan_fail(&e, "q_strides", "negative Q token stride");
    e = d;
    e.v_strides = (fxa_attn_strides){.batch = -1, .token = H * D, .head = D};
    expect_plan_fail(&e, "v_strides", "negative V batch stride");
    e = d;
    e.o_strides = (fxa_attn_strides){.batch = 0, .token = 0, .head = D};
    expect_plan_fail(&e, "o_strides", "O token stride 0");
    e = d;
    e.o_strides = (fxa_attn_strides){.batch = 0, .token = D, .head = D};
    expect_plan_fail(&e, "alias", "O head stride == token stride");
    e = d;
    e.o_strides = (fxa_attn_strides){.batch = 0, .token = 2 * D, .head = D / 2};
    expect_plan_fail(&e, "alias", "O head stride inside a row");
    e = d;
    e.k_strides = (fxa_attn_strides){.batch = 0, .token = INT64_MAX / 4, .head = D};
    expect_plan_fail(&e, "k_strides", "K strides past the addressable range");
    e = d;
    e.out_dtype = FXA_F16;
    expect_plan_fail(&e, "out_dtype", "out_dtype f16");
    /* Input strides may repeat rows (0) and need not be nested. */
    e = d;
    e.q_strides = (fxa_attn_strides){.batch = 0, .token = 0, .head = D};
    e.k_strides = (fxa_attn_strides){.batch = 0, .token = D, .head = D};
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    CHECK(fxa_attn_plan_create(g_ctx, &e, &plan, &ws_bytes) == FXA_OK,
          "input strides 0 / overlapping rows refused: %s", fxa_ctx_last_error(g_ctx));
    fxa_attn_plan_destroy(plan);

    /* O overlapping an input: refused by the run, nothing written. */
    plan = NULL;
    CHECK(fxa_attn_plan_create(g_ctx, &d, &plan, &ws_bytes) == FXA_OK, "plan");
    const size_t n = (size_t)(B * H * S * D);
    float *buf = calloc(4 * n, sizeof(float));
    for (size_t i = 0; i < 3 * n; i++)
        buf[i] = (float)(i % 7) * 0.125f;
    void *ws = ws_bytes ? aligned_alloc(64, (ws_bytes + 63) & ~(size_t)63) : NULL;
    const char *names[3] = {"Q", "K", "V"};
    for (int i = 0; i < 3; i++) {
        float *saved = malloc(4 * n * sizeof(float));
        memcpy(saved, buf, 4 * n * sizeof(float));
        fxa_attn_args a = {.struct_size = sizeof a,
                           .q = buf,
                           .k = buf + n,
                           .v = buf + 2 * n,
                           .out = buf + (size_t)i * n + n / 2};
        const fxa_status st = fxa_attn_run(plan, &a, ws, NULL);
        CHECK(st == FXA_ERR_INVALID_ARG, "out overlapping %s: status %d", names[i], st);
        CHECK(strstr(fxa_ctx_last_error(g_ctx), names[i]) != NULL,
              "out overlapping %s: message '%s'", names[i], fxa_ctx_last_error(g_ctx));
        CHECK(memcmp(saved, buf, 4 * n * sizeof(float)) == 0, "out overlapping %s: memory written",
              names[i]);
        free(saved);
    }
    fxa_attn_args a = {
        .struct_size = sizeof a, .q = buf, .k = buf + n, .v = buf + 2 * n, .out = buf + 3 * n};
    CHECK(fxa_attn_run(plan, &a, ws, NULL) == FXA_OK, "adjacent, non-overlapping out: %s",
          fxa_ctx_last_error(g_ctx));
    free(ws);
    free(buf);
    fxa_attn_plan_destroy(plan);
}

int main(void)
{
    test_require_isa("test_attn_strides");
    g_ctx = fxt_ctx(2);
    if (!g_ctx)
        return 1;
    const fxa_dtype types[3] = {FXA_F32, FXA_BF16, FXA_F16};
    for (int i = 0; i < 3; i++) {
        test_views(types[i], FXA_COMPUTE_FP32, FXA_MODE_AUTO, 37, types[i] == FXA_BF16 ? 33 : 40);
        test_views(types[i], FXA_COMPUTE_FP32, FXA_MODE_ONLINE, 1, types[i] == FXA_BF16 ? 33 : 40);
    }
    test_views(FXA_BF16, FXA_COMPUTE_BF16, FXA_MODE_AUTO, 37, 33);
    test_views(FXA_BF16, FXA_COMPUTE_BF16, FXA_MODE_AUTO, 1, 33);
    test_views(FXA_BF16, FXA_COMPUTE_BF16, FXA_MODE_AUTO, 37, 32);
    test_fused(FXA_F32);
    test_fused(FXA_BF16);
    test_validation();
    fxa_ctx_destroy(g_ctx);
    return test_summary("test_attn_strides");
}
