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

#include "proj_fixtures.h"

#define ROUNDS 40
#define HOST_BLAS_THREADS 3

enum { TOKENS = 96, IN = 192, HEADS = 3, DIM = 32 };
#define N_OUT ((size_t)3 * TOKENS * HEADS * DIM)

static const qkv_shape SHAPE = {TOKENS, IN, HEADS, DIM};

typedef struct job {
    fxa_ctx *ctx;
    const float *x, *w;
    float *want; /* [3][TOKENS][HEADS * DIM]: a lone run's q, k, v */
    int failures;
} job;

static fxa_status project(fxa_ctx *ctx, const float *x, const float *w, float *out)
{
    return qkv_project(ctx, &SHAPE, 0, x, w, out);
}

static void *worker(void *arg)
{
    job *j = arg;
    float *got = malloc(N_OUT * sizeof *got);
    for (int r = 0; got && r < ROUNDS; r++) {
        memset(got, 0, N_OUT * sizeof *got);
        if (project(j->ctx, j->x, j->w, got) != FXA_OK || memcmp(got, j->want, N_OUT * sizeof *got))
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
    float *x, *w;
    qkv_operands(&SHAPE, 33, &x, &w);
    const int threads[2] = {1, 2};
    job jobs[2];
    for (int i = 0; i < 2; i++) {
        jobs[i] = (job){
            .ctx = fxt_ctx(threads[i]), .x = x, .w = w, .want = malloc(N_OUT * sizeof(float))};
        CHECK(jobs[i].ctx != NULL, "context of %d threads", threads[i]);
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
