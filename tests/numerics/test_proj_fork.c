/*
 * A process forked after its parent ran a projection on oneDNN (OpenMP,
 * whose thread team does not survive fork()) must not wait forever: the
 * child's fp32 projection runs on OpenBLAS and gives the bits of the
 * parent's OpenBLAS run on the same thread count; a bf16 projection either
 * runs (CPUs without AVX512-BF16 decode it to fp32) or is refused with a
 * message that names fork. The child is bounded by alarm(); the parent
 * fails on a child killed by it.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proj_fixtures.h"

enum { TOKENS = 64, IN = 128, HEADS = 2, DIM = 32 };
#define N_OUT ((size_t)3 * TOKENS * HEADS * DIM)

static const qkv_shape SHAPE = {TOKENS, IN, HEADS, DIM};

/* q, k, v of x [TOKENS][IN] times w [3 * HEADS * DIM][IN]^T into out [3][TOKENS][HEADS * DIM]. */
static fxa_status project(fxa_ctx *ctx, int bf16, const void *x, const void *w, float *out)
{
    return qkv_project(ctx, &SHAPE, bf16, x, w, out);
}

/* A context of 2 threads whose fp32 GEMMs go to `gemm`. */
static fxa_ctx *context(const char *gemm)
{
    setenv("FXA_PROJ_GEMM", gemm, 1);
    fxa_ctx *ctx = fxt_ctx(2);
    CHECK(ctx != NULL, "context (%s)", gemm);
    return ctx;
}

/* The child's checks; its exit status is its failure count. */
static int child(fxa_ctx *onednn, const float *x, const float *w, const uint16_t *xb,
                 const uint16_t *wb, const float *want_blas, float *got)
{
    alarm(60);
    int fails = 0;
    memset(got, 0, N_OUT * sizeof *got);
    if (project(onednn, 0, x, w, got) != FXA_OK || memcmp(got, want_blas, N_OUT * sizeof *got))
        fails++;
    const fxa_status st = project(onednn, 1, xb, wb, got);
    if (st != FXA_OK && !(st == FXA_ERR_UNSUPPORTED && strstr(fxa_ctx_last_error(onednn), "fork")))
        fails++;
    return fails;
}

int main(void)
{
    alarm(300);
    const size_t nx = (size_t)TOKENS * IN, nw = (size_t)3 * HEADS * DIM * IN;
    float *x, *w;
    qkv_operands(&SHAPE, 7, &x, &w);
    uint16_t *xb = malloc(nx * sizeof *xb);
    uint16_t *wb = malloc(nw * sizeof *wb);
    float *want_blas = malloc(N_OUT * sizeof(float));
    float *got = malloc(N_OUT * sizeof(float));
    CHECK(fxa_convert_f32(x, FXA_BF16, xb, nx) == FXA_OK, "x to bf16");
    CHECK(fxa_convert_f32(w, FXA_BF16, wb, nw) == FXA_OK, "w to bf16");
    fxa_ctx *onednn = context("onednn");
    fxa_ctx *blas = context("openblas");
    CHECK(onednn && blas, "contexts");
    if (!onednn || !blas)
        return test_summary("test_proj_fork");
    CHECK(project(blas, 0, x, w, want_blas) == FXA_OK, "fp32 on OpenBLAS: %s",
          fxa_ctx_last_error(blas));
    CHECK(project(onednn, 0, x, w, got) == FXA_OK, "fp32 on oneDNN: %s",
          fxa_ctx_last_error(onednn));
    CHECK(project(onednn, 1, xb, wb, got) == FXA_OK, "bf16: %s", fxa_ctx_last_error(onednn));
    const pid_t pid = fork();
    if (pid == 0)
        _exit(child(onednn, x, w, xb, wb, want_blas, got));
    CHECK(pid > 0, "fork");
    int status = 0;
    if (pid > 0) {
        CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
        CHECK(!WIFSIGNALED(status), "the child was killed by signal %d (a hang ends in SIGALRM)",
              WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "the child's projections failed %d checks (fp32 bits as OpenBLAS's, bf16 run or "
              "refused naming fork)",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    /* The parent's oneDNN still runs. */
    CHECK(project(onednn, 0, x, w, got) == FXA_OK, "fp32 on oneDNN after the fork");
    fxa_ctx_destroy(onednn);
    fxa_ctx_destroy(blas);
    free(x);
    free(w);
    free(xb);
    free(wb);
    free(want_blas);
    free(got);
    return test_summary("test_proj_fork");
}
