/*
 * Error handling: bad user input gets a status, never an abort or a print,
 * with a clear message (fxa_ctx_last_error, or fxa_ctx_create_error for a
 * context that could not be made), and a run refused for bad input writes
 * nothing the caller can see (out, lse, row_fallback, row_bound, stats).
 *
 *  1. plan-time descriptor validation, one bad field at a time;
 *  2. non-finite Q/K/V values for every dtype and layout: the message names
 *     the tensor and the exact (batch, token, head, dim), the buffers are
 *     untouched, and with several bad values the reported one does not
 *     depend on the thread count;
 *  3. argument checks of fxa_attn_run / fxa_attn_bounds;
 *  4. context creation: thread counts, FXA_ISA, fxa_status_str;
 *  5. a plan that refused bad input still computes good input bit for bit
 *     like a fresh plan.
 *
 * Library output on stdout/stderr during the failing calls is captured and
 * counts as a failure (skipped under AddressSanitizer, whose reports must
 * reach the terminal; set FXA_TEST_NO_CAPTURE to skip it otherwise).
 */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/struct_size.h" /* FXA_ATTN_ARGS_SIZE_0_1 */
#include "fxattn_diag.h"
#include "testutil.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FXA_TEST_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define FXA_TEST_ASAN 1
#endif

#define MSG_LEN 512

/* Non-NULL values that must be replaced by NULL on failure (never freed). */
static unsigned char g_not_a_plan[64];
static unsigned char g_not_a_ctx[64];
#define PLAN_SENTINEL ((fxa_attn_plan *)(void *)g_not_a_plan)
#define CTX_SENTINEL ((fxa_ctx *)(void *)g_not_a_ctx)

/* ------------------------------------------------------------------------ */
/* Output capture: the library must not print on bad input                   */
/* ------------------------------------------------------------------------ */

typedef struct quiet {
    int active;
    int saved_out;
    int saved_err;
    FILE *file;
    int failures_before;
} quiet;

static void quiet_begin(quiet *q)
{
    memset(q, 0, sizeof *q);
#ifdef FXA_TEST_ASAN
    return;
#else
    if (getenv("FXA_TEST_NO_CAPTURE"))
        return;
    fflush(stdout);
    fflush(stderr);
    q->file = tmpfile();
    if (!q->file)
        return;
    q->saved_out = dup(1);
    q->saved_err = dup(2);
    if (q->saved_out < 0 || q->saved_err < 0) {
        if (q->saved_out >= 0)
            close(q->saved_out);
        if (q->saved_err >= 0)
            close(q->saved_err);
        fclose(q->file);
        q->file = NULL;
        return;
    }
    dup2(fileno(q->file), 1);
    dup2(fileno(q->file), 2);
    q->failures_before = g_failures;
    q->active = 1;
#endif
}

static void quiet_end(quiet *q, const char *what)
{
    if (!q->active)
        return;
    fflush(stdout);
    fflush(stderr);
    dup2(q->saved_out, 1);
    dup2(q->saved_err, 2);
    close(q->saved_out);
    close(q->saved_err);
    q->active = 0;
    long n = fseek(q->file, 0, SEEK_END) == 0 ? ftell(q->file) : -1;
    if (n > 0) {
        char buf[1024];
        size_t got;
        rewind(q->file);
        fprintf(stderr, "---- output captured during %s ----\n", what);
        while ((got = fread(buf, 1, sizeof buf, q->file)) > 0)
            fwrite(buf, 1, got, stderr);
        fprintf(stderr, "---- end of captured output ----\n");
    }
    /* CHECK failures inside the window print too; only judge clean windows. */
    if (g_failures == q->failures_before)
        CHECK(n == 0, "%s: the library printed %ld bytes", what, n);
    fclose(q->file);
    q->file = NULL;
}

/* ------------------------------------------------------------------------ */
/* Helpers                                                                    */
/* ------------------------------------------------------------------------ */

static const char *dtype_name(fxa_dtype t)
{
    return t == FXA_F32 ? "f32" : t == FXA_BF16 ? "bf16" : "f16";
}

static const char *layout_name(fxa_layout l)
{
    return l == FXA_LAYOUT_BSHD ? "bshd" : "bhsd";
}

/* A context of n_threads workers; exits (status 2) when there is none. */
static fxa_ctx *make_ctx(int n_threads)
{
    fxa_ctx *ctx = fxt_ctx(n_threads);
    if (!ctx)
        exit(2);
    return ctx;
}

static void copy_msg(char *dst, const char *src)
{
    if (!src) {
        dst[0] = '\0';
        return;
    }
    strncpy(dst, src, MSG_LEN - 1);
    dst[MSG_LEN - 1] = '\0';
}

static int ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s);
    const size_t m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The descriptor of the brief: batch 2, heads 4/2, seq 9/11, D 16. */
static void desc_small(fxa_attn_desc *d, fxa_dtype dtype, fxa_layout layout)
{
    fxt_attn_desc(d, 2, 4, 2, 9, 11, 16);
    d->dtype = dtype;
    d->layout = layout;
}

static void fill_case(tcase *t, const fxa_attn_desc *d, uint64_t seed)
{
    fxt_rng r;
    tcase_init(t, d);
    fxt_rng_seed(&r, seed);
    for (int64_t i = 0; i < t->nq; i++)
        t->q[i] = (float)fxt_rng_normal(&r);
    for (int64_t i = 0; i < t->nkv; i++) {
        t->k[i] = (float)(fxt_rng_normal(&r) + 0.5);
        t->v[i] = (float)fxt_rng_normal(&r);
    }
    tcase_round(t);
}

static size_t case_rows(const tcase *t)
{
    return (size_t)(t->d.batch * t->d.heads_q * t->d.seq_q);
}

/* 64-byte aligned workspace with 64 spare bytes (room for misaligned views). */
static void *ws_alloc(size_t bytes)
{
    void *p = aligned_alloc(64, ((bytes + 63) & ~(size_t)63) + 64);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        exit(2);
    }
    return p;
}

/* ------------------------------------------------------------------------ */
/* 1. Plan-time validation                                                    */
/* ------------------------------------------------------------------------ */

static void expect_plan_fail(fxa_ctx *ctx, const fxa_attn_desc *d, const char *word,
                             const char *what)
{
    fxa_attn_plan *plan = PLAN_SENTINEL;
    size_t ws = 12345;
    char msg[MSG_LEN];
    quiet q;
    quiet_begin(&q);
    fxa_status st = fxa_attn_plan_create(ctx, d, &plan, &ws);
    copy_msg(msg, fxa_ctx_last_error(ctx));
    quiet_end(&q, what);
    CHECK(st == FXA_ERR_INVALID_ARG, "plan with %s: status %d (%s), expected invalid argument",
          what, (int)st, fxa_status_str(st));
    CHECK(plan == NULL, "plan with %s: *plan_out is %p, expected NULL", what, (void *)plan);
    CHECK(msg[0] != '\0', "plan with %s: empty error message", what);
    CHECK(strstr(msg, word) != NULL, "plan with %s: message '%s' does not mention '%s'", what, msg,
          word);
    if (plan && plan != PLAN_SENTINEL)
        fxa_attn_plan_destroy(plan);
}

#define BAD_DESC(stmt, word)                                                                       \
    do {                                                                                           \
        fxa_attn_desc d = good;                                                                    \
        stmt;                                                                                      \
        expect_plan_fail(ctx, &d, word, #stmt);                                                    \
    } while (0)

static void test_plan_validation(fxa_ctx *ctx)
{
    fxa_attn_desc good;
    desc_small(&good, FXA_F32, FXA_LAYOUT_BSHD);
    const int64_t big = (int64_t)1 << 40;

    /* The valid descriptor itself, for every dtype and layout. */
    for (int dt = 0; dt < 3; dt++) {
        for (int lay = 0; lay < 2; lay++) {
            fxa_attn_desc d;
            fxa_attn_plan *plan = NULL;
            size_t ws = 0;
            desc_small(&d, (fxa_dtype)dt, (fxa_layout)lay);
            fxa_status st = fxa_attn_plan_create(ctx, &d, &plan, &ws);
            CHECK(st == FXA_OK, "valid plan %s/%s: %s (%s)", dtype_name((fxa_dtype)dt),
                  layout_name((fxa_layout)lay), fxa_status_str(st), fxa_ctx_last_error(ctx));
            CHECK(plan != NULL, "valid plan: NULL handle");
            CHECK(ws > 0, "valid plan: workspace size %zu", ws);
            CHECK(fxa_ctx_last_error(ctx)[0] == '\0', "valid plan: last error not cleared: '%s'",
                  fxa_ctx_last_error(ctx));
            fxa_attn_plan_destroy(plan);
        }
    }

    BAD_DESC(d.batch = 0, "batch");
    BAD_DESC(d.batch = -3, "batch");
    BAD_DESC(d.heads_q = -4, "heads");
    BAD_DESC(d.heads_kv = 0, "heads");
    BAD_DESC(d.seq_q = 0, "seq");
    BAD_DESC(d.seq_kv = -1, "seq");
    BAD_DESC((d.heads_q = 6, d.heads_kv = 4), "multiple");
    BAD_DESC((d.heads_q = 2, d.heads_kv = 4), "multiple");
    BAD_DESC(d.head_dim = 0, "head_dim");
    BAD_DESC(d.head_dim = 257, "257");
    BAD_DESC(d.head_dim = -16, "head_dim");
    BAD_DESC(d.layout = (fxa_layout)7, "layout");
    BAD_DESC(d.layout = (fxa_layout)-1, "layout");
    BAD_DESC(d.dtype = (fxa_dtype)9, "dtype");
    BAD_DESC(d.mode = (fxa_mode)5, "mode");
    BAD_DESC(d.center = 2, "center");
    BAD_DESC(d.center = -1, "center");
    BAD_DESC(d.scale = NAN, "scale");
    BAD_DESC(d.scale = INFINITY, "scale");
    BAD_DESC(d.scale = -INFINITY, "scale");
    BAD_DESC(d.heads_per_tile = 3, "heads_per_tile");
    BAD_DESC(d.heads_per_tile = 8, "heads_per_tile");
    BAD_DESC(d.heads_per_tile = -1, "heads_per_tile");
    BAD_DESC(d.block_q = -1, "block_q");
    BAD_DESC(d.block_q = 4097, "block_q");
    BAD_DESC(d.block_q = 1 << 30, "block_q");
    BAD_DESC(d.struct_size = offsetof(fxa_attn_desc, q_strides) - 1, "struct_size");
    BAD_DESC(d.struct_size = sizeof(fxa_attn_desc) + 1, "struct_size");
    BAD_DESC(d.struct_size = 0, "struct_size");
    BAD_DESC((d.batch = big, d.seq_q = big), "overflow");
    BAD_DESC((d.batch = big, d.seq_kv = big), "overflow");
    BAD_DESC((d.batch = INT64_MAX, d.seq_q = INT64_MAX, d.seq_kv = INT64_MAX), "overflow");
    BAD_DESC((d.batch = 1, d.heads_q = d.heads_kv = d.seq_q = (int64_t)1 << 31), "overflow");
    BAD_DESC((d.heads_q = d.heads_kv = (int64_t)1 << 30, d.seq_kv = (int64_t)1 << 30), "overflow");

    /* NULL arguments. */
    {
        fxa_attn_plan *plan = PLAN_SENTINEL;
        size_t ws = 0;
        quiet q;
        quiet_begin(&q);
        fxa_status st = fxa_attn_plan_create(ctx, NULL, &plan, &ws);
        char msg[MSG_LEN];
        copy_msg(msg, fxa_ctx_last_error(ctx));
        quiet_end(&q, "plan with NULL desc");
        CHECK(st == FXA_ERR_INVALID_ARG, "NULL desc: status %s", fxa_status_str(st));
        CHECK(plan == NULL, "NULL desc: *plan_out is %p, expected NULL", (void *)plan);
        CHECK(strstr(msg, "NULL") != NULL, "NULL desc: message '%s'", msg);
    }
    {
        size_t ws = 0;
        quiet q;
        quiet_begin(&q);
        fxa_status st = fxa_attn_plan_create(ctx, &good, NULL, &ws);
        char msg[MSG_LEN];
        copy_msg(msg, fxa_ctx_last_error(ctx));
        quiet_end(&q, "plan with NULL plan_out");
        CHECK(st == FXA_ERR_INVALID_ARG, "NULL plan_out: status %s", fxa_status_str(st));
        CHECK(strstr(msg, "NULL") != NULL, "NULL plan_out: message '%s'", msg);
    }
    {
        fxa_attn_plan *plan = PLAN_SENTINEL;
        quiet q;
        quiet_begin(&q);
        fxa_status st = fxa_attn_plan_create(ctx, &good, &plan, NULL);
        char msg[MSG_LEN];
        copy_msg(msg, fxa_ctx_last_error(ctx));
        quiet_end(&q, "plan with NULL workspace_bytes_out");
        CHECK(st == FXA_ERR_INVALID_ARG, "NULL workspace_bytes_out: status %s", fxa_status_str(st));
        CHECK(plan == NULL, "NULL workspace_bytes_out: *plan_out is %p, expected NULL",
              (void *)plan);
        CHECK(strstr(msg, "NULL") != NULL, "NULL workspace_bytes_out: message '%s'", msg);
        if (plan && plan != PLAN_SENTINEL)
            fxa_attn_plan_destroy(plan);
    }
    {
        fxa_attn_plan *plan = PLAN_SENTINEL;
        size_t ws = 0;
        quiet q;
        quiet_begin(&q);
        fxa_status st = fxa_attn_plan_create(NULL, &good, &plan, &ws);
        quiet_end(&q, "plan with NULL ctx");
        CHECK(st == FXA_ERR_INVALID_ARG, "NULL ctx: status %s", fxa_status_str(st));
        CHECK(plan == NULL, "NULL ctx: *plan_out is %p, expected NULL", (void *)plan);
    }

    /* A failure does not stick: the next good plan clears the message. */
    {
        fxa_attn_desc d = good;
        fxa_attn_plan *plan = NULL;
        size_t ws = 0;
        d.head_dim = 0;
        (void)fxa_attn_plan_create(ctx, &d, &plan, &ws);
        CHECK(fxa_ctx_last_error(ctx)[0] != '\0', "no message after a bad plan");
        fxa_status st = fxa_attn_plan_create(ctx, &good, &plan, &ws);
        CHECK(st == FXA_OK && plan != NULL, "good plan after a bad one: %s", fxa_status_str(st));
        CHECK(fxa_ctx_last_error(ctx)[0] == '\0', "stale message after a good plan: '%s'",
              fxa_ctx_last_error(ctx));
        fxa_attn_plan_destroy(plan);
    }

    /* The diagnostics' gates at the ends of int (no overflow on the way). */
    CHECK(fxa_fixed_m_gate_strict(INT_MAX) == (int)(((int64_t)INT_MAX + 125) / 2) &&
              fxa_fixed_m_gate_strict(INT_MIN) == -(int)((-((int64_t)INT_MIN + 125) + 1) / 2),
          "strict gate at INT_MAX / INT_MIN: %d / %d", fxa_fixed_m_gate_strict(INT_MAX),
          fxa_fixed_m_gate_strict(INT_MIN));
    CHECK(fxa_fixed_m_gate_centered(INT_MAX, 1) == INT_MAX,
          "centred gate at INT_MAX: %d, expected INT_MAX", fxa_fixed_m_gate_centered(INT_MAX, 1));
    CHECK(fxa_fixed_m_gate_centered(1, 1) == 102, "centred gate C = 1, N = 1: %d",
          fxa_fixed_m_gate_centered(1, 1));

    /* Layout strides past int64 are -1 (refused), not a wrapped product. */
    {
        const int64_t e = (int64_t)1 << 40;
        const fxa_attn_strides a = fxa_attn_layout_strides(FXA_LAYOUT_BSHD, e, e, 256);
        const fxa_attn_strides b = fxa_attn_layout_strides(FXA_LAYOUT_BHSD, e, e, 256);
        const fxa_attn_strides c = fxa_attn_layout_strides(FXA_LAYOUT_BHSD, 3, 5, 7);
        CHECK(a.batch == -1 && a.token == e * 256 && a.head == 256,
              "BSHD strides of 2^40 heads and tokens: {%lld, %lld, %lld}", (long long)a.batch,
              (long long)a.token, (long long)a.head);
        CHECK(b.batch == -1 && b.head == e * 256 && b.token == 256,
              "BHSD strides of 2^40 heads and tokens: {%lld, %lld, %lld}", (long long)b.batch,
              (long long)b.token, (long long)b.head);
        CHECK(c.batch == 105 && c.head == 35 && c.token == 7, "BHSD strides of 3 x 5 x 7");
    }

    /* A workspace beyond the memory available is refused with its size
     * (read before the plan is freed: ASan sees any read after). */
    {
        fxa_attn_desc d = good;
        d.seq_kv = big;
        fxa_attn_plan *plan = PLAN_SENTINEL;
        size_t ws = 12345;
        const fxa_status st = fxa_attn_plan_create(ctx, &d, &plan, &ws);
        double need = 0.0, avail = 0.0;
        const int got =
            sscanf(fxa_ctx_last_error(ctx), "needs %lf GiB, %lf GiB available", &need, &avail);
        CHECK(st == FXA_ERR_NO_MEMORY, "plan of seq_kv 2^40: status %s, expected no memory (%s)",
              fxa_status_str(st), fxa_ctx_last_error(ctx));
        CHECK(plan == NULL, "plan of seq_kv 2^40: *plan_out is %p, expected NULL", (void *)plan);
        CHECK(got == 2 && need > avail && need >= 1024.0,
              "plan of seq_kv 2^40: message '%s' does not give the workspace's size",
              fxa_ctx_last_error(ctx));
    }

    /* Destroying NULL is a no-op. */
    fxa_attn_plan_destroy(NULL);
    fxa_ctx_destroy(NULL);
}

/* ------------------------------------------------------------------------ */
/* 2. Non-finite inputs                                                       */
/* ------------------------------------------------------------------------ */

typedef enum bad_kind { BAD_NAN, BAD_PINF, BAD_NINF, BAD_SNAN_NEG, N_BAD_KINDS } bad_kind;

static const char *bad_name(bad_kind k)
{
    switch (k) {
    case BAD_NAN: return "NaN";
    case BAD_PINF: return "+Inf";
    case BAD_NINF: return "-Inf";
    default: return "-sNaN";
    }
}

/* What the message shows for the value ("%g"). */
static const char *bad_text(bad_kind k)
{
    switch (k) {
    case BAD_PINF: return "(inf)";
    case BAD_NINF: return "(-inf)";
    default: return "nan";
    }
}

static float f32_from_bits(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* A poked element and what it held, to undo the poke. */
typedef struct poke {
    char tensor;
    int64_t off;
    float f;
    uint16_t h;
} poke;

static float *tensor_f32(tcase *t, char tensor)
{
    return tensor == 'Q' ? t->q : tensor == 'K' ? t->k : t->v;
}

static uint16_t *tensor_16(tcase *t, char tensor)
{
    return tensor == 'Q' ? t->q16 : tensor == 'K' ? t->k16 : t->v16;
}

/* Write a non-finite value, with the dtype's own encoding, at (b, h, s, c)
 * of the tensor; h is a q head for Q and a kv head for K and V. */
static poke poke_bad(tcase *t, char tensor, int64_t b, int64_t h, int64_t s, int64_t c,
                     bad_kind kind)
{
    poke p;
    p.tensor = tensor;
    p.off = (tensor == 'Q' ? tcase_q_off(t, b, h, s) : tcase_kv_off(t, b, h, s)) + c;
    p.f = tensor_f32(t, tensor)[p.off];
    p.h = tensor_16(t, tensor)[p.off];
    if (t->d.dtype == FXA_F32) {
        static const uint32_t bits[N_BAD_KINDS] = {0x7fc00000u, 0x7f800000u, 0xff800000u,
                                                   0xff800001u};
        tensor_f32(t, tensor)[p.off] = f32_from_bits(bits[kind]);
    } else if (t->d.dtype == FXA_BF16) {
        static const uint16_t bits[N_BAD_KINDS] = {0x7fc0u, 0x7f80u, 0xff80u, 0xff81u};
        tensor_16(t, tensor)[p.off] = bits[kind];
    } else {
        static const uint16_t bits[N_BAD_KINDS] = {0x7e00u, 0x7c00u, 0xfc00u, 0xfc01u};
        tensor_16(t, tensor)[p.off] = bits[kind];
    }
    return p;
}

static void unpoke(tcase *t, const poke *p)
{
    tensor_f32(t, p->tensor)[p->off] = p->f;
    tensor_16(t, p->tensor)[p->off] = p->h;
}

/* Buffers a run may write, pre-filled with a pattern and a saved copy. */
typedef struct outbufs {
    size_t n_out;
    size_t rows;
    float *out;
    float *lse;
    uint8_t *fb;
    float *bound;
    fxa_attn_stats stats;
    unsigned char *saved; /* out | lse | fb | bound | stats */
} outbufs;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory\n");
        exit(2);
    }
    return p;
}

static void pattern(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)((i * 37u + seed * 101u + 11u) & 0xffu);
}

static void outbufs_init(outbufs *o, const tcase *t)
{
    o->n_out = (size_t)t->nq;
    o->rows = case_rows(t);
    o->out = xmalloc(o->n_out * sizeof(float));
    o->lse = xmalloc(o->rows * sizeof(float));
    o->fb = xmalloc(o->rows);
    o->bound = xmalloc(o->rows * sizeof(float));
    o->saved = xmalloc(o->n_out * sizeof(float) + 2 * o->rows * sizeof(float) + o->rows +
                       sizeof(fxa_attn_stats));
}

static void outbufs_free(outbufs *o)
{
    free(o->out);
    free(o->lse);
    free(o->fb);
    free(o->bound);
    free(o->saved);
}

/* Fill with a pattern that no run produces and save a copy. */
static void outbufs_poison(outbufs *o, unsigned seed)
{
    unsigned char *s = o->saved;
    pattern(o->out, o->n_out * sizeof(float), seed);
    pattern(o->lse, o->rows * sizeof(float), seed + 1);
    pattern(o->fb, o->rows, seed + 2);
    pattern(o->bound, o->rows * sizeof(float), seed + 3);
    pattern(&o->stats, sizeof o->stats, seed + 4);
    o->stats.struct_size = sizeof o->stats; /* the rest stays poisoned */
    memcpy(s, o->out, o->n_out * sizeof(float));
    s += o->n_out * sizeof(float);
    memcpy(s, o->lse, o->rows * sizeof(float));
    s += o->rows * sizeof(float);
    memcpy(s, o->fb, o->rows);
    s += o->rows;
    memcpy(s, o->bound, o->rows * sizeof(float));
    s += o->rows * sizeof(float);
    memcpy(s, &o->stats, sizeof o->stats);
}

/* Bit mask of the buffers that changed: 1 out, 2 lse, 4 fb, 8 bound, 16 stats. */
static int outbufs_changed(const outbufs *o)
{
    const unsigned char *s = o->saved;
    int m = 0;
    m |= memcmp(s, o->out, o->n_out * sizeof(float)) ? 1 : 0;
    s += o->n_out * sizeof(float);
    m |= memcmp(s, o->lse, o->rows * sizeof(float)) ? 2 : 0;
    s += o->rows * sizeof(float);
    m |= memcmp(s, o->fb, o->rows) ? 4 : 0;
    s += o->rows;
    m |= memcmp(s, o->bound, o->rows * sizeof(float)) ? 8 : 0;
    s += o->rows * sizeof(float);
    m |= memcmp(s, &o->stats, sizeof o->stats) ? 16 : 0;
    return m;
}

static fxa_attn_args args_for(const tcase *t, const outbufs *o)
{
    const int wide = t->d.dtype != FXA_F32;
    fxa_attn_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.q = wide ? (const void *)t->q16 : (const void *)t->q;
    a.k = wide ? (const void *)t->k16 : (const void *)t->k;
    a.v = wide ? (const void *)t->v16 : (const void *)t->v;
    a.out = o->out;
    a.lse = o->lse;
    a.row_fallback = o->fb;
    a.row_bound = o->bound;
    return a;
}

/* A plan and its workspace for a case. */
typedef struct planned {
    fxa_attn_plan *plan;
    void *ws;
    size_t ws_bytes;
} planned;

static void plan_make(planned *p, fxa_ctx *ctx, const fxa_attn_desc *d)
{
    p->plan = NULL;
    p->ws_bytes = 0;
    fxa_status st = fxa_attn_plan_create(ctx, d, &p->plan, &p->ws_bytes);
    if (st != FXA_OK) {
        fprintf(stderr, "cannot plan: %s\n", fxa_ctx_last_error(ctx));
        exit(2);
    }
    p->ws = ws_alloc(p->ws_bytes);
}

static void plan_free(planned *p)
{
    fxa_attn_plan_destroy(p->plan);
    free(p->ws);
}

/* Run (bounds_only 0) or bound pass (1) on poisoned buffers, expecting an
 * input error; msg receives the message. Checks nothing was written. */
static fxa_status run_expect_refused(fxa_ctx *ctx, const planned *pl, const tcase *t, outbufs *o,
                                     int bounds_only, char *msg, const char *what)
{
    fxa_attn_args a = args_for(t, o);
    outbufs_poison(o, (unsigned)bounds_only + 3u);
    quiet q;
    quiet_begin(&q);
    fxa_status st = bounds_only ? fxa_attn_bounds(pl->plan, &a, pl->ws, &o->stats)
                                : fxa_attn_run(pl->plan, &a, pl->ws, &o->stats);
    copy_msg(msg, fxa_ctx_last_error(ctx));
    quiet_end(&q, what);
    CHECK(st == FXA_ERR_INVALID_ARG, "%s: status %d (%s), expected invalid argument", what, (int)st,
          fxa_status_str(st));
    const int changed = outbufs_changed(o);
    CHECK(changed == 0,
          "%s: refused run wrote its buffers (mask %d: 1 out, 2 lse, 4 row_fallback, "
          "8 row_bound, 16 stats)",
          what, changed);
    return st;
}

static void expect_position_msg(const char *msg, char tensor, int64_t b, int64_t s, int64_t h,
                                int64_t c, bad_kind kind, const char *what)
{
    char head[64];
    char pos[128];
    snprintf(head, sizeof head, "%c has a non-finite value", tensor);
    snprintf(pos, sizeof pos, "at batch %lld, token %lld, head %lld, dim %lld", (long long)b,
             (long long)s, (long long)h, (long long)c);
    CHECK(strncmp(msg, head, strlen(head)) == 0, "%s: message '%s' does not start with '%s'", what,
          msg, head);
    CHECK(ends_with(msg, pos), "%s: message '%s' does not end with '%s'", what, msg, pos);
    CHECK(strstr(msg, bad_text(kind)) != NULL, "%s: message '%s' does not show the value %s", what,
          msg, bad_text(kind));
}

typedef struct bad_site {
    char tensor;
    int64_t b, h, s, c; /* h: q head for Q, kv head for K and V */
} bad_site;

static void test_nonfinite_inputs(fxa_ctx *ctx1, fxa_ctx *ctx3)
{
    static const bad_site sites[] = {
        {'Q', 1, 3, 5, 7},  {'K', 1, 1, 5, 7},  {'V', 1, 1, 5, 7},
        {'Q', 0, 0, 0, 0},  {'Q', 0, 2, 8, 15}, {'K', 0, 0, 10, 0},
        {'V', 0, 1, 0, 15}, {'K', 1, 0, 3, 12}, {'V', 1, 0, 10, 1},
    };
    const size_t n_sites = sizeof sites / sizeof sites[0];
    for (int dt = 0; dt < 3; dt++) {
        for (int lay = 0; lay < 2; lay++) {
            fxa_attn_desc d;
            tcase t;
            outbufs o;
            planned pl1, pl3;
            desc_small(&d, (fxa_dtype)dt, (fxa_layout)lay);
            fill_case(&t, &d, 1000u + (uint64_t)(dt * 2 + lay));
            outbufs_init(&o, &t);
            plan_make(&pl1, ctx1, &d);
            plan_make(&pl3, ctx3, &d);
            for (size_t si = 0; si < n_sites; si++) {
                const bad_site *bs = &sites[si];
                for (int k = 0; k < N_BAD_KINDS; k++) {
                    for (int bounds_only = 0; bounds_only < 2; bounds_only++) {
                        const int threads3 = (int)((si + (size_t)k + (size_t)bounds_only) % 2);
                        fxa_ctx *ctx = threads3 ? ctx3 : ctx1;
                        const planned *pl = threads3 ? &pl3 : &pl1;
                        char what[160];
                        char msg[MSG_LEN];
                        snprintf(what, sizeof what,
                                 "%s %s %s %s at b%lld h%lld s%lld c%lld (%d threads)",
                                 bounds_only ? "bounds" : "run", dtype_name(d.dtype),
                                 layout_name(d.layout), bad_name((bad_kind)k), (long long)bs->b,
                                 (long long)bs->h, (long long)bs->s, (long long)bs->c,
                                 threads3 ? 3 : 1);
                        poke p = poke_bad(&t, bs->tensor, bs->b, bs->h, bs->s, bs->c, (bad_kind)k);
                        run_expect_refused(ctx, pl, &t, &o, bounds_only, msg, what);
                        expect_position_msg(msg, bs->tensor, bs->b, bs->s, bs->h, bs->c,
                                            (bad_kind)k, what);
                        unpoke(&t, &p);
                    }
                }
            }
            /* The restored input runs (the pokes were undone exactly). */
            {
                fxa_attn_args a = args_for(&t, &o);
                fxa_status st = fxa_attn_run(pl3.plan, &a, pl3.ws, NULL);
                CHECK(st == FXA_OK, "%s/%s: restored input refused: %s", dtype_name(d.dtype),
                      layout_name(d.layout), fxa_ctx_last_error(ctx3));
            }
            plan_free(&pl1);
            plan_free(&pl3);
            outbufs_free(&o);
            tcase_free(&t);
        }
    }
}

/* Several bad values: the reported one is the same for 1 and 3 threads and
 * over repeated runs, and it is one of them, reported exactly. */
static void check_deterministic(fxa_ctx *ctx1, fxa_ctx *ctx3, const fxa_attn_desc *d,
                                const bad_site *bad, size_t n_bad, const char *label)
{
    tcase t;
    outbufs o;
    planned pl1, pl3;
    char first[MSG_LEN];
    char msg[MSG_LEN];
    char what[160];
    poke *pokes = xmalloc(n_bad * sizeof *pokes);
    fill_case(&t, d, 77u);
    outbufs_init(&o, &t);
    plan_make(&pl1, ctx1, d);
    plan_make(&pl3, ctx3, d);
    for (size_t i = 0; i < n_bad; i++)
        pokes[i] = poke_bad(&t, bad[i].tensor, bad[i].b, bad[i].h, bad[i].s, bad[i].c,
                            (bad_kind)(i % N_BAD_KINDS));
    snprintf(what, sizeof what, "%s %s/%s 1 thread", label, dtype_name(d->dtype),
             layout_name(d->layout));
    run_expect_refused(ctx1, &pl1, &t, &o, 0, first, what);
    /* It names one of the bad elements, completely. */
    int matches = 0;
    for (size_t i = 0; i < n_bad; i++) {
        char head[64];
        char pos[128];
        snprintf(head, sizeof head, "%c has a non-finite value", bad[i].tensor);
        snprintf(pos, sizeof pos, "at batch %lld, token %lld, head %lld, dim %lld",
                 (long long)bad[i].b, (long long)bad[i].s, (long long)bad[i].h,
                 (long long)bad[i].c);
        matches += strncmp(first, head, strlen(head)) == 0 && ends_with(first, pos);
    }
    CHECK(matches == 1, "%s: message '%s' names none of the bad elements", what, first);
    for (int rep = 0; rep < 12; rep++) {
        const int bounds_only = rep % 3 == 2;
        snprintf(what, sizeof what, "%s %s/%s 3 threads rep %d%s", label, dtype_name(d->dtype),
                 layout_name(d->layout), rep, bounds_only ? " (bounds)" : "");
        run_expect_refused(ctx3, &pl3, &t, &o, bounds_only, msg, what);
        CHECK(strcmp(msg, first) == 0, "%s: message '%s' differs from 1 thread's '%s'", what, msg,
              first);
    }
    snprintf(what, sizeof what, "%s %s/%s 1 thread again", label, dtype_name(d->dtype),
             layout_name(d->layout));
    run_expect_refused(ctx1, &pl1, &t, &o, 1, msg, what);
    CHECK(strcmp(msg, first) == 0, "%s: message '%s' differs from '%s'", what, msg, first);
    for (size_t i = n_bad; i-- > 0;)
        unpoke(&t, &pokes[i]);
    free(pokes);
    plan_free(&pl1);
    plan_free(&pl3);
    outbufs_free(&o);
    tcase_free(&t);
}

static void test_deterministic_report(fxa_ctx *ctx1, fxa_ctx *ctx3)
{
    /* K at a later (batch, head), V at an earlier one. */
    static const bad_site kv_cross[] = {{'K', 1, 1, 2, 3}, {'V', 0, 0, 7, 1}};
    /* K and V in the same kv head, V at the earlier token. */
    static const bad_site same_head[] = {{'V', 0, 1, 0, 0}, {'K', 0, 1, 9, 4}};
    /* Q early, K late. */
    static const bad_site q_and_k[] = {{'Q', 0, 2, 1, 9}, {'K', 1, 1, 3, 2}};
    /* Two Q values: later batch first in memory order of BHSD heads. */
    static const bad_site two_q[] = {{'Q', 1, 0, 0, 0}, {'Q', 0, 3, 8, 15}};
    /* Every input poisoned in many places. */
    static const bad_site many[] = {
        {'V', 1, 1, 10, 15}, {'Q', 1, 3, 8, 0}, {'K', 1, 0, 0, 5}, {'V', 0, 1, 4, 4},
        {'Q', 0, 1, 2, 3},   {'K', 0, 1, 6, 9}, {'Q', 1, 0, 0, 1}, {'V', 1, 0, 1, 2},
    };
    for (int dt = 0; dt < 3; dt++) {
        for (int lay = 0; lay < 2; lay++) {
            fxa_attn_desc d;
            desc_small(&d, (fxa_dtype)dt, (fxa_layout)lay);
            check_deterministic(ctx1, ctx3, &d, kv_cross, 2, "K late + V early");
            check_deterministic(ctx1, ctx3, &d, same_head, 2, "K + V same head");
            check_deterministic(ctx1, ctx3, &d, q_and_k, 2, "Q + K");
            check_deterministic(ctx1, ctx3, &d, two_q, 2, "two Q");
            check_deterministic(ctx1, ctx3, &d, many, sizeof many / sizeof many[0], "many");
        }
    }
    /* A larger problem (more items than threads, uneven work): a bad value in
     * every kv head's V and every q head's Q. */
    {
        fxa_attn_desc d;
        bad_site bad[3 * 4 + 3 * 8];
        size_t n = 0;
        fxt_attn_desc(&d, 3, 8, 4, 33, 257, 32);
        d.dtype = FXA_BF16;
        for (int64_t b = 2; b >= 0; b--) {
            for (int64_t h = 3; h >= 0; h--)
                bad[n++] = (bad_site){'V', b, h, (b * 71 + h * 37 + 5) % 257, (b + h) % 32};
            for (int64_t h = 7; h >= 0; h--)
                bad[n++] = (bad_site){'Q', b, h, (b * 5 + h * 3 + 1) % 33, (b * 7 + h) % 32};
        }
        check_deterministic(ctx1, ctx3, &d, bad, n, "every head");
        d.layout = FXA_LAYOUT_BHSD;
        d.dtype = FXA_F32;
        check_deterministic(ctx1, ctx3, &d, bad, n, "every head");
    }
    /* The first kv head's bad value is found last (end of V, after full K
     * passes over long heads), the others' at once: a report that depends on
     * which thread finds one first shows here. */
    {
        fxa_attn_desc d;
        fxt_attn_desc(&d, 1, 8, 8, 4, 2051, 256);
        const bad_site bad[] = {
            {'V', 0, 0, 2050, 255}, {'K', 0, 3, 0, 0}, {'K', 0, 5, 0, 1},
            {'V', 0, 7, 0, 2},      {'Q', 0, 0, 0, 0},
        };
        check_deterministic(ctx1, ctx3, &d, bad, sizeof bad / sizeof bad[0], "slow first head");
        d.dtype = FXA_F16;
        d.layout = FXA_LAYOUT_BHSD;
        check_deterministic(ctx1, ctx3, &d, bad, sizeof bad / sizeof bad[0], "slow first head");
    }
}

/* ------------------------------------------------------------------------ */
/* 3. Run argument checks                                                     */
/* ------------------------------------------------------------------------ */

static void expect_args_refused(fxa_ctx *ctx, const fxa_attn_plan *plan, const fxa_attn_args *a,
                                void *ws, outbufs *o, int bounds_only, const char *word,
                                const char *what)
{
    char msg[MSG_LEN];
    quiet q;
    outbufs_poison(o, 9);
    quiet_begin(&q);
    fxa_status st = bounds_only ? fxa_attn_bounds(plan, a, ws, &o->stats)
                                : fxa_attn_run(plan, a, ws, &o->stats);
    copy_msg(msg, fxa_ctx_last_error(ctx));
    quiet_end(&q, what);
    CHECK(st == FXA_ERR_INVALID_ARG, "%s: status %d (%s), expected invalid argument", what, (int)st,
          fxa_status_str(st));
    CHECK(msg[0] != '\0', "%s: empty error message", what);
    CHECK(strstr(msg, word) != NULL, "%s: message '%s' does not mention '%s'", what, msg, word);
    const int changed = outbufs_changed(o);
    CHECK(changed == 0, "%s: refused run wrote its buffers (mask %d)", what, changed);
}

static void test_run_args(fxa_ctx *ctx)
{
    fxa_attn_desc d;
    tcase t;
    outbufs o;
    planned pl;
    desc_small(&d, FXA_F32, FXA_LAYOUT_BSHD);
    fill_case(&t, &d, 5u);
    outbufs_init(&o, &t);
    plan_make(&pl, ctx, &d);
    CHECK(pl.ws_bytes > 0, "the test needs a plan with a workspace");

    for (int bo = 0; bo < 2; bo++) {
        const char *fn = bo ? "bounds" : "run";
        char what[96];
        fxa_attn_args good = args_for(&t, &o);
        fxa_attn_args a;

        snprintf(what, sizeof what, "%s with NULL args", fn);
        expect_args_refused(ctx, pl.plan, NULL, pl.ws, &o, bo, "args", what);

        a = good;
        a.struct_size = FXA_ATTN_ARGS_SIZE_0_1 - 1;
        snprintf(what, sizeof what, "%s with short args.struct_size", fn);
        expect_args_refused(ctx, pl.plan, &a, pl.ws, &o, bo, "args", what);
        a.struct_size = 0;
        snprintf(what, sizeof what, "%s with args.struct_size 0", fn);
        expect_args_refused(ctx, pl.plan, &a, pl.ws, &o, bo, "args", what);

        /* q, k, v and (for the run: the bound pass ignores it) out NULL. */
        static const char *const pointers[4] = {"q", "k", "v", "out"};
        for (int f = 0; f < (bo ? 3 : 4); f++) {
            a = good;
            switch (f) {
            case 0: a.q = NULL; break;
            case 1: a.k = NULL; break;
            case 2: a.v = NULL; break;
            default: a.out = NULL; break;
            }
            snprintf(what, sizeof what, "%s with NULL %s", fn, pointers[f]);
            expect_args_refused(ctx, pl.plan, &a, pl.ws, &o, bo, "NULL", what);
        }

        snprintf(what, sizeof what, "%s with NULL workspace", fn);
        expect_args_refused(ctx, pl.plan, &good, NULL, &o, bo, "workspace", what);
        for (size_t mis = 8; mis < 64; mis += 24) {
            snprintf(what, sizeof what, "%s with workspace + %zu", fn, mis);
            expect_args_refused(ctx, pl.plan, &good, (unsigned char *)pl.ws + mis, &o, bo, "align",
                                what);
        }

        /* Outputs that share memory with an input or with each other. */
        {
            const size_t q_bytes = (size_t)t.nq * sizeof(float);
            float *q_copy = xmalloc(q_bytes);
            memcpy(q_copy, t.q, q_bytes);
            struct alias {
                const char *what;
                const char *word;
                int out_only; /* out and lse: fxa_attn_bounds ignores them */
                float *lse;
                uint8_t *fb;
                float *bound;
            } aliases[] = {
                {"lse into q", "lse overlaps Q", 1, (float *)t.q + 3, o.fb, o.bound},
                {"lse at out", "out overlaps lse", 1, o.out, o.fb, o.bound},
                {"lse in the workspace", "workspace overlaps lse", 1, (float *)pl.ws + 16, o.fb,
                 o.bound},
                {"row_bound into k", "row_bound overlaps K", 0, o.lse, o.fb, t.k + 1},
                {"row_fallback into v", "row_fallback overlaps V", 0, o.lse, (uint8_t *)t.v + 5,
                 o.bound},
                {"row_fallback at row_bound", "row_fallback overlaps row_bound", 0, o.lse,
                 (uint8_t *)o.bound, o.bound},
            };
            for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
                if (bo && aliases[i].out_only)
                    continue;
                a = good;
                a.lse = aliases[i].lse;
                a.row_fallback = aliases[i].fb;
                a.row_bound = aliases[i].bound;
                snprintf(what, sizeof what, "%s with %s", fn, aliases[i].what);
                expect_args_refused(ctx, pl.plan, &a, pl.ws, &o, bo, aliases[i].word, what);
                CHECK(memcmp(q_copy, t.q, q_bytes) == 0, "%s: Q was written", what);
            }
            free(q_copy);
            if (bo) { /* lse and out are ignored by the bound pass */
                a = good;
                a.lse = (float *)t.q;
                a.out = (float *)t.k;
                CHECK(fxa_attn_bounds(pl.plan, &a, pl.ws, NULL) == FXA_OK,
                      "bounds with lse and out aliasing inputs: %s", fxa_ctx_last_error(ctx));
            }
        }

        /* No plan: nothing to hold a message, but the status is right. */
        {
            quiet q;
            quiet_begin(&q);
            fxa_status st = bo ? fxa_attn_bounds(NULL, &good, pl.ws, NULL)
                               : fxa_attn_run(NULL, &good, pl.ws, NULL);
            snprintf(what, sizeof what, "%s with NULL plan", fn);
            quiet_end(&q, what);
            CHECK(st == FXA_ERR_INVALID_ARG, "%s: status %s", what, fxa_status_str(st));
        }
    }

    /* fxa_attn_bounds ignores out (NULL is fine) and lse, fills the
     * diagnostics and clears the last error. */
    {
        fxa_attn_args a = args_for(&t, &o);
        a.out = NULL;
        outbufs_poison(&o, 21);
        (void)fxa_attn_plan_create(ctx, NULL, NULL, NULL); /* leave a message behind */
        fxa_status st = fxa_attn_bounds(pl.plan, &a, pl.ws, &o.stats);
        CHECK(st == FXA_OK, "bounds with out NULL: %s (%s)", fxa_status_str(st),
              fxa_ctx_last_error(ctx));
        CHECK(fxa_ctx_last_error(ctx)[0] == '\0', "bounds: stale message '%s'",
              fxa_ctx_last_error(ctx));
        const int changed = outbufs_changed(&o);
        CHECK((changed & 1) == 0, "bounds wrote out");
        CHECK((changed & 2) == 0, "bounds wrote lse, which it must ignore");
        CHECK((changed & 4) != 0 && (changed & 8) != 0, "bounds did not fill the diagnostics");
        int flags_ok = 1;
        for (size_t i = 0; i < o.rows; i++)
            flags_ok &= o.fb[i] <= 1;
        CHECK(flags_ok, "bounds: row_fallback holds values other than 0/1");
        CHECK(o.stats.rows == (int64_t)o.rows, "bounds: stats.rows %lld, expected %zu",
              (long long)o.stats.rows, o.rows);
    }
    /* And a plain run on the same plan works and clears the message. */
    {
        fxa_attn_args a = args_for(&t, &o);
        (void)fxa_attn_plan_create(ctx, NULL, NULL, NULL);
        fxa_status st = fxa_attn_run(pl.plan, &a, pl.ws, NULL);
        CHECK(st == FXA_OK, "good run after argument errors: %s (%s)", fxa_status_str(st),
              fxa_ctx_last_error(ctx));
        CHECK(fxa_ctx_last_error(ctx)[0] == '\0', "run: stale message '%s'",
              fxa_ctx_last_error(ctx));
    }
    plan_free(&pl);
    outbufs_free(&o);
    tcase_free(&t);
}

/* ------------------------------------------------------------------------ */
/* 4. Context creation and status strings                                     */
/* ------------------------------------------------------------------------ */

static void expect_ctx_fail(const fxa_ctx_params *p, fxa_status want, const char *word,
                            const char *what)
{
    fxa_ctx *ctx = CTX_SENTINEL;
    char msg[MSG_LEN];
    quiet q;
    quiet_begin(&q);
    fxa_status st = fxa_ctx_create(p, &ctx);
    copy_msg(msg, fxa_ctx_create_error());
    quiet_end(&q, what);
    CHECK(st == want, "%s: status %d (%s), expected %s", what, (int)st, fxa_status_str(st),
          fxa_status_str(want));
    CHECK(ctx == NULL, "%s: *ctx_out is %p, expected NULL", what, (void *)ctx);
    if (ctx && ctx != CTX_SENTINEL)
        fxa_ctx_destroy(ctx);
    CHECK(msg[0] != '\0', "%s: fxa_ctx_create_error() is empty", what);
    if (word)
        CHECK(strstr(msg, word) != NULL, "%s: fxa_ctx_create_error() '%s' does not mention '%s'",
              what, msg, word);
}

/* Whether this CPU can run a kernel set, by the compiler's own detection. */
static int cpu_can(const char *isa)
{
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (strcmp(isa, "avx2") == 0)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (strcmp(isa, "avx512") == 0)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl");
    return 0;
#else
    (void)isa;
    return 0;
#endif
}

static void test_ctx(void)
{
    fxa_ctx_params p;
    char *saved_isa = NULL;
    if (getenv("FXA_ISA")) {
        saved_isa = strdup(getenv("FXA_ISA"));
        unsetenv("FXA_ISA");
    }

    /* FXA_ISA. */
    {
        fxa_ctx *ctx = NULL;
        setenv("FXA_ISA", "ref", 1);
        fxa_status st = fxa_ctx_create(NULL, &ctx);
        unsetenv("FXA_ISA");
        CHECK(st == FXA_OK && ctx != NULL, "FXA_ISA=ref: %s (%s)", fxa_status_str(st),
              fxa_ctx_create_error());
        if (ctx) {
            CHECK(strcmp(fxa_ctx_isa(ctx), "ref") == 0, "FXA_ISA=ref: context uses '%s'",
                  fxa_ctx_isa(ctx));
            CHECK(fxa_ctx_threads(ctx) >= 1, "default context has %d threads",
                  fxa_ctx_threads(ctx));
            fxa_ctx_destroy(ctx);
        }
    }
    fxa_ctx_params_init(&p);
    p.n_threads = 1;
    setenv("FXA_ISA", "bogus", 1);
    expect_ctx_fail(&p, FXA_ERR_INVALID_ARG, "bogus", "FXA_ISA=bogus");
    unsetenv("FXA_ISA");
    for (int i = 0; i < 2; i++) {
        const char *isa = i ? "avx512" : "avx2";
        char what[64];
        fxa_ctx *ctx = CTX_SENTINEL;
        char msg[MSG_LEN];
        quiet q;
        snprintf(what, sizeof what, "FXA_ISA=%s", isa);
        setenv("FXA_ISA", isa, 1);
        quiet_begin(&q);
        fxa_status st = fxa_ctx_create(&p, &ctx);
        copy_msg(msg, fxa_ctx_create_error());
        quiet_end(&q, what);
        unsetenv("FXA_ISA");
        if (st == FXA_OK && cpu_can(isa)) {
            /* The set has been built since this test was written: fine if it
             * is really the one in use. */
            CHECK(ctx && ctx != CTX_SENTINEL && strcmp(fxa_ctx_isa(ctx), isa) == 0,
                  "%s: accepted but the context uses '%s'", what,
                  ctx && ctx != CTX_SENTINEL ? fxa_ctx_isa(ctx) : "(none)");
            if (ctx && ctx != CTX_SENTINEL)
                fxa_ctx_destroy(ctx);
        } else {
            CHECK(st == FXA_ERR_UNSUPPORTED, "%s: status %d (%s), expected unsupported%s", what,
                  (int)st, fxa_status_str(st), cpu_can(isa) ? "" : " (the CPU lacks it)");
            CHECK(ctx == NULL, "%s: *ctx_out is %p, expected NULL", what, (void *)ctx);
            if (ctx && ctx != CTX_SENTINEL)
                fxa_ctx_destroy(ctx);
            CHECK(msg[0] != '\0', "%s: fxa_ctx_create_error() is empty", what);
            CHECK(strstr(msg, isa) != NULL, "%s: fxa_ctx_create_error() '%s' does not name it",
                  what, msg);
        }
    }
    /* Empty FXA_ISA means automatic. */
    {
        fxa_ctx *ctx = NULL;
        setenv("FXA_ISA", "", 1);
        fxa_status st = fxa_ctx_create(&p, &ctx);
        unsetenv("FXA_ISA");
        CHECK(st == FXA_OK && ctx != NULL, "FXA_ISA='': %s (%s)", fxa_status_str(st),
              fxa_ctx_create_error());
        if (ctx) {
            CHECK(fxa_ctx_isa(ctx) && fxa_ctx_isa(ctx)[0] != '\0', "automatic ISA has no name");
            fxa_ctx_destroy(ctx);
        }
    }

    /* Thread counts and struct_size. These run after the FXA_ISA=bogus
     * failure, so a stale message from it would show. */
    setenv("FXA_ISA", "bogus", 1);
    expect_ctx_fail(&p, FXA_ERR_INVALID_ARG, "bogus", "FXA_ISA=bogus again");
    unsetenv("FXA_ISA");
    p.n_threads = -1;
    expect_ctx_fail(&p, FXA_ERR_INVALID_ARG, "thread", "n_threads -1");
    CHECK(strstr(fxa_ctx_create_error(), "bogus") == NULL,
          "n_threads -1: fxa_ctx_create_error() still reports an earlier failure: '%s'",
          fxa_ctx_create_error());
    p.n_threads = 5000;
    expect_ctx_fail(&p, FXA_ERR_INVALID_ARG, "thread", "n_threads 5000");
    p.n_threads = INT32_MIN;
    expect_ctx_fail(&p, FXA_ERR_INVALID_ARG, "thread", "n_threads INT_MIN");
    p.n_threads = 1;
    p.struct_size = sizeof p - 1;
    expect_ctx_fail(&p, FXA_ERR_INVALID_ARG, "struct_size", "ctx params struct_size too small");
    {
        quiet q;
        quiet_begin(&q);
        fxa_status st = fxa_ctx_create(NULL, NULL);
        quiet_end(&q, "ctx_create with NULL ctx_out");
        CHECK(st == FXA_ERR_INVALID_ARG, "NULL ctx_out: status %s", fxa_status_str(st));
    }
    /* A good create after the failures. */
    {
        fxa_ctx *ctx = NULL;
        fxa_ctx_params_init(&p);
        p.n_threads = 3;
        fxa_status st = fxa_ctx_create(&p, &ctx);
        CHECK(st == FXA_OK && ctx != NULL, "3-thread context: %s (%s)", fxa_status_str(st),
              fxa_ctx_create_error());
        if (ctx) {
            CHECK(fxa_ctx_threads(ctx) == 3, "3-thread context runs %d threads",
                  fxa_ctx_threads(ctx));
            CHECK(fxa_ctx_last_error(ctx)[0] == '\0', "new context has a message '%s'",
                  fxa_ctx_last_error(ctx));
            fxa_ctx_destroy(ctx);
        }
    }

    if (saved_isa) {
        setenv("FXA_ISA", saved_isa, 1);
        free(saved_isa);
    }

    /* Status strings: non-empty and distinct for 0..6, and for unknowns. */
    const char *names[7];
    for (int s = 0; s <= 6; s++) {
        names[s] = fxa_status_str((fxa_status)s);
        CHECK(names[s] != NULL && names[s][0] != '\0', "fxa_status_str(%d) is empty", s);
    }
    for (int s = 0; s <= 6; s++)
        for (int u = 0; u < s; u++)
            CHECK(!names[s] || !names[u] || strcmp(names[s], names[u]) != 0,
                  "fxa_status_str(%d) == fxa_status_str(%d) == '%s'", s, u, names[s]);
    static const int unknown[] = {7, 42, -1, 1000000};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        const char *s = fxa_status_str((fxa_status)unknown[i]);
        CHECK(s != NULL && s[0] != '\0', "fxa_status_str(%d) is empty", unknown[i]);
        int distinct = 1;
        for (int k = 0; k <= 6 && s; k++)
            distinct &= !names[k] || strcmp(s, names[k]) != 0;
        CHECK(distinct, "fxa_status_str(%d) = '%s' names a real status", unknown[i],
              s ? s : "(null)");
    }
}

/* ------------------------------------------------------------------------ */
/* 5. Recovery after refused runs                                             */
/* ------------------------------------------------------------------------ */

typedef struct result {
    float *out;
    float *lse;
    uint8_t *fb;
    float *bound;
} result;

static void result_run(result *r, const fxa_attn_plan *plan, void *ws, const tcase *t, fxa_ctx *ctx,
                       const char *what)
{
    const size_t rows = case_rows(t);
    r->out = xmalloc((size_t)t->nq * sizeof(float));
    r->lse = xmalloc(rows * sizeof(float));
    r->fb = xmalloc(rows);
    r->bound = xmalloc(rows * sizeof(float));
    memset(r->out, 0xff, (size_t)t->nq * sizeof(float));
    memset(r->lse, 0xff, rows * sizeof(float));
    memset(r->fb, 0xff, rows);
    memset(r->bound, 0xff, rows * sizeof(float));
    const int wide = t->d.dtype != FXA_F32;
    fxa_attn_args a = {
        .struct_size = sizeof a,
        .q = wide ? (const void *)t->q16 : (const void *)t->q,
        .k = wide ? (const void *)t->k16 : (const void *)t->k,
        .v = wide ? (const void *)t->v16 : (const void *)t->v,
        .out = r->out,
        .lse = r->lse,
        .row_fallback = r->fb,
        .row_bound = r->bound,
    };
    fxa_status st = fxa_attn_run(plan, &a, ws, NULL);
    CHECK(st == FXA_OK, "%s: %s (%s)", what, fxa_status_str(st), fxa_ctx_last_error(ctx));
    int finite = 1;
    for (int64_t i = 0; i < t->nq; i++)
        finite &= isfinite(r->out[i]) != 0;
    CHECK(finite, "%s: non-finite output", what);
}

static int result_equal(const result *a, const result *b, const tcase *t)
{
    const size_t rows = case_rows(t);
    return memcmp(a->out, b->out, (size_t)t->nq * sizeof(float)) == 0 &&
           memcmp(a->lse, b->lse, rows * sizeof(float)) == 0 && memcmp(a->fb, b->fb, rows) == 0 &&
           memcmp(a->bound, b->bound, rows * sizeof(float)) == 0;
}

static void result_free(result *r)
{
    free(r->out);
    free(r->lse);
    free(r->fb);
    free(r->bound);
}

static void test_recovery(fxa_ctx *ctx3)
{
    for (int dt = 0; dt < 3; dt++) {
        for (int lay = 0; lay < 2; lay++) {
            for (int mode = 0; mode < 2; mode++) {
                fxa_attn_desc d;
                tcase t;
                outbufs o;
                planned pl;
                result fresh, again;
                char what[128];
                char msg[MSG_LEN];
                desc_small(&d, (fxa_dtype)dt, (fxa_layout)lay);
                d.mode = (fxa_mode)mode;
                /* Hot queries on head 1 make some rows fall back in auto mode. */
                fill_case(&t, &d, 4242u + (uint64_t)(dt * 4 + lay * 2 + mode));
                for (int64_t b = 0; b < d.batch; b++)
                    for (int64_t s = 0; s < d.seq_q; s++)
                        for (int64_t c = 0; c < d.head_dim; c++)
                            t.q[tcase_q_off(&t, b, 1, s) + c] *= 40.0f;
                tcase_round(&t);
                outbufs_init(&o, &t);
                snprintf(what, sizeof what, "recovery %s/%s/%s", dtype_name(d.dtype),
                         layout_name(d.layout), mode ? "online" : "auto");

                /* Reference: a fresh context, plan and workspace, 1 thread. */
                {
                    fxa_ctx *c1 = make_ctx(1);
                    planned fr;
                    plan_make(&fr, c1, &d);
                    result_run(&fresh, fr.plan, fr.ws, &t, c1, what);
                    plan_free(&fr);
                    fxa_ctx_destroy(c1);
                }

                /* Refusals of every kind on one plan and workspace... */
                plan_make(&pl, ctx3, &d);
                {
                    poke pk = poke_bad(&t, 'K', 1, 1, 10, 15, BAD_PINF);
                    run_expect_refused(ctx3, &pl, &t, &o, 0, msg, what);
                    unpoke(&t, &pk);
                    pk = poke_bad(&t, 'V', 0, 0, 0, 0, BAD_NAN);
                    run_expect_refused(ctx3, &pl, &t, &o, 0, msg, what);
                    unpoke(&t, &pk);
                    pk = poke_bad(&t, 'Q', 1, 3, 8, 15, BAD_NINF);
                    run_expect_refused(ctx3, &pl, &t, &o, 1, msg, what);
                    run_expect_refused(ctx3, &pl, &t, &o, 0, msg, what);
                    unpoke(&t, &pk);
                    fxa_attn_args a = args_for(&t, &o);
                    expect_args_refused(ctx3, pl.plan, &a, (unsigned char *)pl.ws + 8, &o, 0,
                                        "align", what);
                    a.k = NULL;
                    expect_args_refused(ctx3, pl.plan, &a, pl.ws, &o, 0, "NULL", what);
                }
                /* ...then good input on the same plan matches the fresh run. */
                result_run(&again, pl.plan, pl.ws, &t, ctx3, what);
                CHECK(result_equal(&fresh, &again, &t),
                      "%s: run after refused runs differs from a fresh run", what);
                CHECK(fxa_ctx_last_error(ctx3)[0] == '\0', "%s: stale message '%s'", what,
                      fxa_ctx_last_error(ctx3));
                result_free(&again);

                /* Once more with a partial K poisoning at the last kv item,
                 * which aborts the scan after the other heads' bounds. */
                {
                    poke pk = poke_bad(&t, 'K', 1, 1, 0, 0, BAD_NAN);
                    run_expect_refused(ctx3, &pl, &t, &o, 0, msg, what);
                    unpoke(&t, &pk);
                }
                result_run(&again, pl.plan, pl.ws, &t, ctx3, what);
                CHECK(result_equal(&fresh, &again, &t),
                      "%s: second run after refusal differs from a fresh run", what);
                result_free(&again);

                result_free(&fresh);
                plan_free(&pl);
                outbufs_free(&o);
                tcase_free(&t);
            }
        }
    }
}

/* A bf16 output of a V past bf16's range would be Inf: refused by the run
 * and by the blockwise finish, nothing written; bf16's largest finite
 * value itself passes. */
static void test_bf16_out_range(fxa_ctx *ctx)
{
    fxa_attn_desc d;
    fxt_attn_desc(&d, 1, 1, 1, 2, 3, 4);
    d.out_dtype = FXA_BF16;
    float q[8] = {0}, k[12] = {0}, v[12];
    uint16_t out[8];
    fxa_attn_plan *plan = NULL;
    size_t bytes = 0;
    CHECK(fxa_attn_plan_create(ctx, &d, &plan, &bytes) == FXA_OK, "plan: %s",
          fxa_ctx_last_error(ctx));
    void *ws = ws_alloc(bytes);
    fxa_attn_acc *acc = NULL;
    CHECK(fxa_attn_acc_create(plan, &acc) == FXA_OK, "acc: %s", fxa_ctx_last_error(ctx));
    double summary[64];
    const fxa_attn_args a = {.struct_size = sizeof a, .q = q, .k = k, .v = v, .out = out};
    const float vals[2] = {3.4e38f, 0x1.fep127f}; /* past bf16's range; its largest value */
    for (int c = 0; c < 2; c++) {
        for (int i = 0; i < 12; i++)
            v[i] = (i & 1) ? -vals[c] : vals[c];
        memset(out, 0x55, sizeof out);
        const fxa_status st = fxa_attn_run(plan, &a, ws, NULL);
        fxa_status acc_st = fxa_kv_summarize(plan, k, v, 3, summary);
        if (acc_st == FXA_OK)
            acc_st = fxa_attn_acc_begin(acc, q, summary, 1);
        if (acc_st == FXA_OK)
            acc_st = fxa_attn_acc_add(acc, k, v, 3);
        if (acc_st == FXA_OK)
            acc_st = fxa_attn_acc_finish(acc, &a, NULL);
        if (c == 0) {
            CHECK(st == FXA_ERR_INVALID_ARG && strstr(fxa_ctx_last_error(ctx), "bf16") != NULL,
                  "bf16 output of |v| 3.4e38: %s (%s)", fxa_status_str(st),
                  fxa_ctx_last_error(ctx));
            CHECK(acc_st == FXA_ERR_INVALID_ARG, "blockwise bf16 output of |v| 3.4e38: %s (%s)",
                  fxa_status_str(acc_st), fxa_ctx_last_error(ctx));
            CHECK(out[0] == 0x5555 && out[7] == 0x5555, "a refused bf16 output was written");
        } else {
            CHECK(st == FXA_OK && acc_st == FXA_OK && (out[0] & 0x7f80) != 0x7f80,
                  "bf16 output of bf16's largest value: %s / %s, out[0] 0x%04x", fxa_status_str(st),
                  fxa_status_str(acc_st), out[0]);
        }
    }
    fxa_attn_acc_destroy(acc);
    free(ws);
    fxa_attn_plan_destroy(plan);
}

int main(void)
{
    test_ctx();
    fxa_ctx *ctx1 = make_ctx(1);
    fxa_ctx *ctx3 = make_ctx(3);
    CHECK(fxa_ctx_threads(ctx3) == 3, "context asked for 3 threads runs %d", fxa_ctx_threads(ctx3));
    test_plan_validation(ctx1);
    test_plan_validation(ctx3);
    test_bf16_out_range(ctx1);
    test_nonfinite_inputs(ctx1, ctx3);
    test_deterministic_report(ctx1, ctx3);
    test_run_args(ctx3);
    test_run_args(ctx1);
    test_recovery(ctx3);
    fxa_ctx_destroy(ctx3);
    fxa_ctx_destroy(ctx1);
    return test_summary("test_attn_errors");
}
