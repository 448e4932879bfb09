/*
 * Test support: CHECK macros (active regardless of NDEBUG), a seeded RNG,
 * and a harness that builds an attention problem, runs fxattn on it and
 * measures its error against the fp64 reference next to the error of an
 * independent fp32 online softmax on the same input.
 */
#ifndef FXA_TESTUTIL_H
#define FXA_TESTUTIL_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fxattn.h"
#include "fxattn_proj.h"
#include "rng.h" /* fxt_rng: the tools' generator (tools/common) */

extern int g_checks;
extern int g_failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        g_checks++;                                                                                \
        if (!(cond)) {                                                                             \
            g_failures++;                                                                          \
            fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond);               \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fprintf(stderr, "\n");                                                                 \
        }                                                                                          \
    } while (0)

/* Print the summary; returns the process exit status. */
int test_summary(const char *name);

/* Sanitizer builds (ASan, TSan) run the numerics 10-50x slower than the
 * plain build. There, and only there, the long shape sweeps skip the shapes
 * whose work (batch x heads x Sq x Skv) exceeds FXT_SANITIZED_MAX_WORK and
 * say so: the plain build runs every shape, and the sanitizers still see
 * every code path (tails, multi-tile rows, fallback) on the smaller ones.
 * Returns 1 (after printing the skip) when the shape is to be skipped. */
#define FXT_SANITIZED_MAX_WORK 4000000
int fxt_sanitized(void);
int fxt_skip_under_sanitizer(int64_t work, const char *label);

/* The bits of a float and back; a monotonic-enough wall clock for reports. */
static inline uint32_t test_f32_bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline float test_bits_f32(uint32_t b)
{
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static inline double test_now_seconds(void)
{
    struct timespec ts;
    timespec_get(&ts, TIME_UTC);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Exit status CTest reads as "skipped" (SKIP_RETURN_CODE). */
#define TEST_SKIPPED 77

/* When FXA_ISA names a kernel set this CPU or build lacks, print why and
 * exit with TEST_SKIPPED: CTest then reports the test as skipped, never as
 * passed. Call first in main of tests that run the kernels. */
void test_require_isa(const char *name);

/* A context of n_threads workers (0: the library's default); NULL, after
 * printing the library's message, when it cannot be made. */
fxa_ctx *fxt_ctx(int n_threads);

/* d initialised (fxa_attn_desc_init) with the given shape; every other
 * field keeps its default (bshd, fp32, scale 1/sqrt(head_dim)). */
void fxt_attn_desc(fxa_attn_desc *d, int64_t batch, int64_t heads_q, int64_t heads_kv,
                   int64_t seq_q, int64_t seq_kv, int64_t head_dim);

/* CHECKs that fxa_attn_plan_create refuses d on ctx with
 * FXA_ERR_INVALID_ARG and no plan, its message holding word (label names
 * the case in a failure). */
void fxt_expect_plan_refused(fxa_ctx *ctx, const fxa_attn_desc *d, const char *word,
                             const char *label);

/* The backward's arguments (struct_size set; mask and strides left 0). */
fxa_attn_bwd_args fxt_bwd_args(const void *q, const void *k, const void *v, const void *out,
                               const void *dout, const float *lse, void *dq, void *dk, void *dv);

/* An attention problem. q, k, v hold fp32 values exactly representable in
 * d.dtype; q16/k16/v16 hold the 16-bit encodings when d.dtype is not f32. */
typedef struct tcase {
    fxa_attn_desc d;
    int64_t nq;  /* elements of Q (and of the output) */
    int64_t nkv; /* elements of K and of V */
    float *q;
    float *k;
    float *v;
    uint16_t *q16;
    uint16_t *k16;
    uint16_t *v16;
} tcase;

void tcase_init(tcase *t, const fxa_attn_desc *d); /* allocates, zero-filled */
void tcase_free(tcase *t);
/* Round q, k, v to d.dtype in place (RNE) and fill the 16-bit copies. */
void tcase_round(tcase *t);
/* Element offsets of row (b, h, s). */
int64_t tcase_q_off(const tcase *t, int64_t b, int64_t h, int64_t s);
int64_t tcase_kv_off(const tcase *t, int64_t b, int64_t h, int64_t s);

/* Run fxattn with the case's descriptor (mode overridden) on ctx. lse, fb,
 * bound and stats may be NULL. Returns the status; on error prints the
 * context's message when verbose. */
fxa_status tcase_run(const tcase *t, fxa_ctx *ctx, fxa_mode mode, const fxa_attn_desc *override,
                     float *out, float *lse, uint8_t *fb, float *bound, fxa_attn_stats *st);
/* tcase_run with the case's mode, lse_parts ([rows][3]) written too. */
fxa_status tcase_run_parts(const tcase *t, fxa_ctx *ctx, float *out, float *lse, uint8_t *fb,
                           float *parts, fxa_attn_stats *st);

/* Errors against the fp64 reference over sampled rows (all rows of small
 * problems): max |x - ref| of the output and of the LSE. */
typedef struct terr {
    double out_fxa;  /* fxattn */
    double out_on32; /* independent fp32 online softmax */
    double lse_fxa;
    double lse_on32;
    double vmax;    /* max |v|: scale of the output */
    double lse_mag; /* max |lse| */
    int64_t rows;
} terr;
void tcase_errors(const tcase *t, const float *out, const float *lse, terr *e);

/*
 * The acceptance envelope (docs/numerics.md, "What correct means"): fxattn's error
 * is at most 1.5x that of fp32 online softmax on the same input, plus a floor
 * of 2^-22 * Vmax for the output (four fp32 roundings at the output's scale:
 * the final division, and p*v products that online softmax performs with
 * p = 1 exactly) and 2^-21 * max(1, |lse|) for the LSE.
 */
int terr_within_envelope(const terr *e);
void terr_print(const char *label, const terr *e);

/* One projection: plan d on ctx, run a on a fresh workspace, destroy the
 * plan; the first failing status (FXA_ERR_NO_MEMORY when the workspace
 * cannot be allocated). */
fxa_status fxt_proj_once(fxa_ctx *ctx, const fxa_proj_desc *d, const fxa_proj_args *a);

#endif
