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

#include "fxattn_proj.h"
#include "testutil.h"

enum { TOKENS = 64, IN = 128, HEADS = 2, DIM = 32 };
#define OUT (3 * HEADS * DIM)
#define N_OUT ((size_t)3 * TOKENS * HEADS * DIM)

/* q, k, v of x [TOKENS][IN] times w [OUT][IN]^T into out [3][TOKENS][HEADS * DIM]. */
static fxa_status project(fxa_ctx *ctx, int bf16, const void *x, const void *w, float *out)
{
    fxa_proj_desc d;
    fxa_proj_desc_init(&d);
    d.tokens = TOKENS;
    d.in_features = IN;
    d.heads_q = HEADS;
    d.heads_kv = HEADS;
    d.head_dim = DIM;
    d.x_format = bf16 ? FXA_PROJ_X_BF16 : FXA_PROJ_X_F32;
    d.w_format = bf16 ? FXA_PROJ_W_BF16 : FXA_PROJ_W_F32;
    const size_t n = N_OUT / 3;
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

/* A context of 2 threads whose fp32 GEMMs go to `gemm`. */
static fxa_ctx *context(const char *gemm)
{
    setenv("FXA_PROJ_GEMM", gemm, 1);
    fxa_ctx_params p;
    fxa_ctx_params_init(&p);
    p.n_threads = 2;
    fxa_ctx *ctx = NULL;
    CHECK(fxa_ctx_create(&p, &ctx) == FXA_OK, "context (%s): %s", gemm, fxa_ctx_create_error());
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
    fxt_rng rng;
    fxt_rng_seed(&rng, 7);
    float *x = malloc((size_t)TOKENS * IN * sizeof *x);
    float *w = malloc((size_t)OUT * IN * sizeof *w);
    uint16_t *xb = malloc((size_t)TOKENS * IN * sizeof *xb);
    uint16_t *wb = malloc((size_t)OUT * IN * sizeof *wb);
    float *want_blas = malloc(N_OUT * sizeof(float));
    float *got = malloc(N_OUT * sizeof(float));
    for (size_t i = 0; i < (size_t)TOKENS * IN; i++)
        x[i] = (float)(2.0 * fxt_rng_uniform(&rng) - 1.0);
    for (size_t i = 0; i < (size_t)OUT * IN; i++)
        w[i] = (float)(0.2 * fxt_rng_uniform(&rng) - 0.1);
    CHECK(fxa_convert_f32(x, FXA_BF16, xb, (size_t)TOKENS * IN) == FXA_OK, "x to bf16");
    CHECK(fxa_convert_f32(w, FXA_BF16, wb, (size_t)OUT * IN) == FXA_OK, "w to bf16");
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
