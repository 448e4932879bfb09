/* The compute rates of the cost model, timed on a context
 * (fxa_grid_measure, fxattn_grid.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/alloc.h"
#include "core/ctx_internal.h"
#include "base/struct_size.h"
#include "fxattn_grid.h"

#define MEASURE_RUNS 5 /* timed runs of a rate, after a warm-up */
#define MAX_KEYS 8192  /* the measured shapes' longest sequence */

static double now_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x;
    const double b = *(const double *)y;
    return (a > b) - (a < b);
}

/* n values, approximately N(0, 1) (the sum of 4 uniforms, scaled), from a
 * fixed splitmix64 stream: the same inputs on every rank and run. */
static void gaussian_fill(float *x, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        double sum = 0.0;
        for (int j = 0; j < 4; j++) {
            uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
            z ^= z >> 31;
            sum += (double)(z >> 11) * 0x1.0p-53;
        }
        x[i] = (float)((sum - 2.0) * 1.7320508075688772); /* variance 4/12 -> 1 */
    }
}

/* The tensors and plan of one measured shape. */
typedef struct shape_run {
    fxa_attn_plan *plan;
    void *ws;
    void *q, *k, *v; /* in the model's dtype */
    float *out;
    double flop;
} shape_run;

static void shape_free(shape_run *r)
{
    fxa_attn_plan_destroy(r->plan);
    fxa_free_aligned(r->ws);
    free(r->q);
    free(r->k);
    free(r->v);
    free(r->out);
}

/* A [rows, heads, D] tensor of Gaussian values in dtype (owned), or NULL. */
static void *tensor(fxa_dtype dtype, size_t n, uint64_t seed)
{
    float *x = malloc(n * sizeof *x);
    if (!x || dtype == FXA_F32) {
        if (x)
            gaussian_fill(x, n, seed);
        return x;
    }
    gaussian_fill(x, n, seed);
    uint16_t *h = malloc(n * sizeof *h);
    if (h && fxa_convert_f32(x, dtype, h, n) != FXA_OK) {
        free(h);
        h = NULL;
    }
    free(x);
    return h;
}

static fxa_status shape_init(fxa_ctx *ctx, const fxa_grid_model *m, int64_t tokens, int64_t kv,
                             shape_run *r)
{
    memset(r, 0, sizeof *r);
    const double per_head = 4.0 * (double)tokens * (double)kv * (double)m->head_dim;
    int64_t heads = (int64_t)ceil(1e9 / per_head);
    heads = heads < 1 ? 1 : heads > m->heads ? m->heads : heads;
    fxa_attn_desc d;
    fxa_attn_desc_init(&d);
    d.batch = 1;
    d.heads_q = d.heads_kv = heads;
    d.seq_q = tokens;
    d.seq_kv = kv;
    d.head_dim = m->head_dim;
    d.dtype = m->dtype;
    d.compute = FXA_COMPUTE_AUTO; /* what a run on this context computes in */
    size_t ws = 0;
    fxa_status st = fxa_attn_plan_create(ctx, &d, &r->plan, &ws);
    if (st != FXA_OK)
        return st;
    const size_t nq = (size_t)(tokens * heads * m->head_dim);
    const size_t nk = (size_t)(kv * heads * m->head_dim);
    r->ws = ws ? fxa_malloc_aligned(ws) : NULL;
    r->q = tensor(m->dtype, nq, 1);
    r->k = tensor(m->dtype, nk, 2);
    r->v = tensor(m->dtype, nk, 3);
    r->out = malloc(nq * sizeof *r->out);
    if ((ws && !r->ws) || !r->q || !r->k || !r->v || !r->out) {
        shape_free(r);
        return fxa_ctx_fail(ctx, FXA_ERR_NO_MEMORY, "out of memory measuring the compute rate");
    }
    r->flop = fxa_attn_flops(&d);
    return FXA_OK;
}

/* The FLOP/s of `tokens` queries against kv keys: the median of
 * MEASURE_RUNS runs after a warm-up. */
static fxa_status measure_shape(fxa_ctx *ctx, const fxa_grid_model *m, int64_t tokens, int64_t kv,
                                double *flops)
{
    shape_run r;
    fxa_status st = shape_init(ctx, m, tokens, kv, &r);
    if (st != FXA_OK)
        return st;
    const fxa_attn_args a = {.struct_size = sizeof a, .q = r.q, .k = r.k, .v = r.v, .out = r.out};
    double t[MEASURE_RUNS];
    st = fxa_attn_run(r.plan, &a, r.ws, NULL);
    for (int i = 0; st == FXA_OK && i < MEASURE_RUNS; i++) {
        const double t0 = now_seconds();
        st = fxa_attn_run(r.plan, &a, r.ws, NULL);
        t[i] = now_seconds() - t0;
    }
    if (st == FXA_OK) {
        qsort(t, MEASURE_RUNS, sizeof t[0], cmp_double);
        *flops = r.flop / (t[MEASURE_RUNS / 2] > 0.0 ? t[MEASURE_RUNS / 2] : 1e-9);
    }
    shape_free(&r);
    return st;
}

static fxa_status measure(fxa_ctx *ctx, fxa_grid_model *m)
{
    if (m->seq < 1 || m->heads < 1 || m->head_dim < 1 || m->ranks < 1 || m->ranks > 4096)
        return fxa_ctx_fail(ctx, FXA_ERR_INVALID_ARG,
                            "fxa_grid_measure: seq, heads, head_dim must be positive and ranks "
                            "in [1, 4096]");
    /* Rank 0's queries against every key, as in all-gather + local. */
    const int64_t kv = m->seq < MAX_KEYS ? m->seq : MAX_KEYS;
    const int64_t tokens = (m->seq + m->ranks - 1) / m->ranks;
    fxa_status st = measure_shape(ctx, m, tokens < kv ? tokens : kv, kv, &m->rank_flops);
    m->n_step_rates = 0;
    for (int r = 1; st == FXA_OK && r <= m->ranks && m->n_step_rates < FXA_GRID_MAX_STEP_RATES;
         r++) {
        if (m->ranks % r)
            continue;
        int64_t block = (m->seq + r - 1) / r;
        block = block < MAX_KEYS ? block : MAX_KEYS;
        double flops = 0.0;
        st = measure_shape(ctx, m, block, block, &flops);
        m->step_ring[m->n_step_rates] = r;
        m->step_flops[m->n_step_rates++] = flops;
    }
    return st;
}

fxa_status fxa_grid_measure(fxa_ctx *ctx, fxa_grid_model *model)
{
    if (!ctx)
        return FXA_ERR_INVALID_ARG;
    fxa_ctx_begin(ctx);
    fxa_grid_model m;
    fxa_grid_model_init(&m);
    fxa_status st = FXA_ERR_INVALID_ARG;
    if (!model)
        fxa_ctx_fail(ctx, st, "fxa_grid_measure: the model must not be NULL");
    else if ((st = fxa_struct_in(&m, sizeof m, model, FXA_GRID_MODEL_SIZE_0_3, "fxa_grid_model",
                                 ctx->last_error, sizeof ctx->last_error)) == FXA_OK &&
             (st = measure(ctx, &m)) == FXA_OK)
        fxa_struct_out(model, &m, sizeof m);
    fxa_ctx_end(ctx);
    return st;
}
