/*
 * One context, several threads: calls on a context run one at a time (a
 * caller on another thread waits), so two threads running plans and
 * blockwise passes on one context both finish, with the bits a lone run
 * gives. Bounded by alarm(): a deadlock kills the test.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "unit_fixtures.h"

#define ROUNDS 200

typedef struct job {
    fxa_ctx *ctx;
    fxa_attn_desc d;
    float *q, *k, *v;
    float *want; /* a lone run's output */
    int blockwise;
    int failures;
} job;

static size_t q_elems(const fxa_attn_desc *d)
{
    return (size_t)(d->batch * d->seq_q * d->heads_q * d->head_dim);
}

static size_t kv_elems(const fxa_attn_desc *d)
{
    return (size_t)(d->batch * d->seq_kv * d->heads_kv * d->head_dim);
}

/* The plan's output for the job's inputs: a plain run, or one blockwise
 * pass over a single block. */
static fxa_status compute(job *j, float *out)
{
    fxa_attn_plan *plan = NULL;
    size_t ws_bytes = 0;
    fxa_status st = fxa_attn_plan_create(j->ctx, &j->d, &plan, &ws_bytes);
    if (st != FXA_OK)
        return st;
    const fxa_attn_args a = {.struct_size = sizeof a, .q = j->q, .k = j->k, .v = j->v, .out = out};
    if (!j->blockwise) {
        void *ws = unit_ws_alloc(ws_bytes);
        st = fxa_attn_run(plan, &a, ws, NULL);
        free(ws);
    } else {
        double *sums = malloc(fxa_kv_summary_len(plan) * sizeof(double));
        fxa_attn_acc *acc = NULL;
        st = fxa_kv_summarize(plan, j->k, j->v, j->d.seq_kv, sums);
        if (st == FXA_OK)
            st = fxa_attn_acc_create(plan, &acc);
        if (st == FXA_OK)
            st = fxa_attn_acc_begin(acc, j->q, sums, 1);
        if (st == FXA_OK)
            st = fxa_attn_acc_add(acc, j->k, j->v, j->d.seq_kv);
        if (st == FXA_OK)
            st = fxa_attn_acc_finish(acc, &a, NULL);
        fxa_attn_acc_destroy(acc);
        free(sums);
    }
    fxa_attn_plan_destroy(plan);
    return st;
}

static void *worker(void *arg)
{
    job *j = arg;
    float *out = malloc(q_elems(&j->d) * sizeof(float));
    for (int r = 0; r < ROUNDS; r++) {
        const fxa_status st = compute(j, out);
        if (st != FXA_OK || memcmp(out, j->want, q_elems(&j->d) * sizeof(float)) != 0 ||
            fxa_ctx_last_error(j->ctx)[0] != '\0')
            j->failures++;
    }
    free(out);
    return NULL;
}

static void job_init(job *j, fxa_ctx *ctx, int64_t seq, int64_t heads, int blockwise, uint64_t seed)
{
    memset(j, 0, sizeof *j);
    j->ctx = ctx;
    j->blockwise = blockwise;
    fxt_attn_desc(&j->d, 1, heads, heads, seq, seq, 32);
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    j->q = malloc(q_elems(&j->d) * sizeof(float));
    j->k = malloc(kv_elems(&j->d) * sizeof(float));
    j->v = malloc(kv_elems(&j->d) * sizeof(float));
    j->want = malloc(q_elems(&j->d) * sizeof(float));
    for (size_t i = 0; i < q_elems(&j->d); i++)
        j->q[i] = (float)fxt_rng_normal(&r);
    for (size_t i = 0; i < kv_elems(&j->d); i++) {
        j->k[i] = (float)fxt_rng_normal(&r);
        j->v[i] = (float)fxt_rng_normal(&r);
    }
    CHECK(compute(j, j->want) == FXA_OK, "lone run: %s", fxa_ctx_last_error(ctx));
}

static void job_free(job *j)
{
    free(j->q);
    free(j->k);
    free(j->v);
    free(j->want);
}

int main(void)
{
    alarm(60); /* a deadlock ends here (SIGALRM) */
    fxa_ctx *ctx = fxt_ctx(3);
    if (!ctx)
        return 1;
    job jobs[3];
    /* Many kv heads: many pool runs per call, so the calls interleave. */
    job_init(&jobs[0], ctx, 96, 8, 0, 1);
    job_init(&jobs[1], ctx, 64, 6, 0, 2);
    job_init(&jobs[2], ctx, 80, 5, 1, 3);
    pthread_t t[3];
    for (int i = 0; i < 3; i++)
        CHECK(pthread_create(&t[i], NULL, worker, &jobs[i]) == 0, "thread %d", i);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK(jobs[i].failures == 0, "thread %d: %d of %d rounds failed or differ from a lone run",
              i, jobs[i].failures, ROUNDS);
    }
    for (int i = 0; i < 3; i++)
        job_free(&jobs[i]);
    fxa_ctx_destroy(ctx);
    return test_summary("test_ctx_threads");
}
