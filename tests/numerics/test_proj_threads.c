/*
 * Two contexts with different thread counts run fp32 projections on
 * OpenBLAS from two threads at once: each gets the bits of a lone run on
 * its context, and the host program's OpenBLAS thread setting survives
 * (OpenBLAS has one process-wide thread count: the projection sets it for
 * its GEMMs and restores it under a process-wide lock, so two calls never
 * read each other's setting as the host's). Bounded by alarm(): a deadlock
 * kills the test.
 */
#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fxattn_proj.h"
#include "testutil.h"

#define ROUNDS 40
#define HOST_BLAS_THREADS 3

enum { TOKENS = 96, IN = 192, HEADS = 3, DIM = 32 };
#define OUT (3 * HEADS * DIM)

typedef struct job {
    fxa_ctx *ctx;
    const float *x, *w;
    float *want; /* [3][TOKENS][HEADS * DIM]: a lone run's q, k, v */
    int failures;
} job;

static fxa_status project(fxa_ctx *ctx, const float *x, const float *w, float *out)
{
    fxa_proj_desc d;
    fxa_proj_desc_init(&d);
    d.tokens = TOKENS;
    d.in_features = IN;
    d.heads_q = HEADS;
    d.heads_kv = HEADS;
    d.head_dim = DIM;
    const size_t n = (size_t)TOKENS * HEADS * DIM;
    fxa_proj_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.x = x;
    a.w = w;
    a.q_out = out;
    a.k_out = out + n;
    a.v_out = out + 2 * n;
    return fxt_proj_once(ctx, &d, &a);
}

static void *worker(void *arg)
{
    job *j = arg;
    const size_t n = 3 * (size_t)TOKENS * HEADS * DIM;
    float *got = malloc(n * sizeof *got);
    for (int r = 0; got && r < ROUNDS; r++) {
        memset(got, 0, n * sizeof *got);
        if (project(j->ctx, j->x, j->w, got) != FXA_OK || memcmp(got, j->want, n * sizeof *got))
            j->failures++;
    }
    if (!got)
        j->failures++;
    free(got);
    return NULL;
}

int main(void)
{
    alarm(300);
    /* OpenBLAS even where the automatic choice would pick oneDNN. */
    setenv("FXA_PROJ_GEMM", "openblas", 1);
    fxt_rng rng;
    fxt_rng_seed(&rng, 33);
    float *x = malloc((size_t)TOKENS * IN * sizeof *x);
    float *w = malloc((size_t)OUT * IN * sizeof *w);
    for (size_t i = 0; i < (size_t)TOKENS * IN; i++)
        x[i] = (float)(2.0 * fxt_rng_uniform(&rng) - 1.0);
    for (size_t i = 0; i < (size_t)OUT * IN; i++)
        w[i] = (float)(0.2 * fxt_rng_uniform(&rng) - 0.1);
    const int threads[2] = {1, 2};
    job jobs[2];
    const size_t n = 3 * (size_t)TOKENS * HEADS * DIM;
    for (int i = 0; i < 2; i++) {
        fxa_ctx_params p;
        fxa_ctx_params_init(&p);
        p.n_threads = threads[i];
        jobs[i] = (job){.x = x, .w = w, .want = malloc(n * sizeof(float))};
        CHECK(fxa_ctx_create(&p, &jobs[i].ctx) == FXA_OK, "context of %d threads: %s", threads[i],
              fxa_ctx_create_error());
        CHECK(jobs[i].ctx && project(jobs[i].ctx, x, w, jobs[i].want) == FXA_OK,
              "lone run on %d threads", threads[i]);
    }
    openblas_set_num_threads(HOST_BLAS_THREADS);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        CHECK(pthread_create(&t[i], NULL, worker, &jobs[i]) == 0, "thread %d", i);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
        CHECK(jobs[i].failures == 0, "%d of %d concurrent runs on %d threads failed or differ",
              jobs[i].failures, ROUNDS, threads[i]);
    CHECK(openblas_get_num_threads() == HOST_BLAS_THREADS,
          "OpenBLAS left on %d threads after concurrent projections; the host set %d",
          openblas_get_num_threads(), HOST_BLAS_THREADS);
    for (int i = 0; i < 2; i++) {
        fxa_ctx_destroy(jobs[i].ctx);
        free(jobs[i].want);
    }
    free(x);
    free(w);
    return test_summary("test_proj_threads");
}
