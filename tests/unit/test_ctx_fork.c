/*
 * A context used after fork(): the child has none of the parent's pool
 * workers, and a lock may have been held by another parent thread when it
 * forked. The child's calls rebuild the pool and give the parent's bits
 * (plain runs and a blockwise pass); destroying the context in the child
 * (used or not) returns. Each child runs under alarm(); the parent waits
 * for it with a bound and kills it past that.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "unit_fixtures.h"

#define SEQ 192
#define HEADS 2
#define DIM 32
#define N_Q (SEQ * HEADS * DIM)
#define CHILD_SECONDS 30

static fxa_ctx *g_ctx;
static fxa_attn_plan *g_plan;
static void *g_ws;
static float g_q[N_Q], g_k[N_Q], g_v[N_Q], g_want[N_Q], g_want_blocks[N_Q];

static fxa_status run_plain(float *out)
{
    const fxa_attn_args a = {.struct_size = sizeof a, .q = g_q, .k = g_k, .v = g_v, .out = out};
    return fxa_attn_run(g_plan, &a, g_ws, NULL);
}

/* One blockwise pass over two blocks of SEQ / 2 keys (BSHD: contiguous). */
static fxa_status run_blocks(float *out)
{
    const size_t len = fxa_kv_summary_len(g_plan);
    const size_t half = (size_t)(SEQ / 2 * HEADS * DIM);
    double *sums = malloc(2 * len * sizeof(double));
    fxa_attn_acc *acc = NULL;
    fxa_status st = fxa_kv_summarize(g_plan, g_k, g_v, SEQ / 2, sums);
    if (st == FXA_OK)
        st = fxa_kv_summarize(g_plan, g_k + half, g_v + half, SEQ / 2, sums + len);
    if (st == FXA_OK)
        st = fxa_attn_acc_create(g_plan, &acc);
    if (st == FXA_OK)
        st = fxa_attn_acc_begin(acc, g_q, sums, 2);
    if (st == FXA_OK)
        st = fxa_attn_acc_add(acc, g_k + half, g_v + half, SEQ / 2);
    if (st == FXA_OK)
        st = fxa_attn_acc_add(acc, g_k, g_v, SEQ / 2);
    const fxa_attn_args a = {.struct_size = sizeof a, .out = out};
    if (st == FXA_OK)
        st = fxa_attn_acc_finish(acc, &a, NULL);
    fxa_attn_acc_destroy(acc);
    free(sums);
    return st;
}

/* In the child: 0 when runs give the parent's bits, 1 when not. */
static int child_runs(void)
{
    static float out[N_Q];
    int bad = 0;
    for (int r = 0; r < 2; r++) {
        memset(out, 0, sizeof out);
        bad |= run_plain(out) != FXA_OK || memcmp(out, g_want, sizeof out) != 0;
        memset(out, 0, sizeof out);
        bad |= run_blocks(out) != FXA_OK || memcmp(out, g_want_blocks, sizeof out) != 0;
    }
    return bad;
}

/* Fork; the child runs (use_context; else only destroys the context)
 * under alarm and exits with its result. 0 when the child passed. */
static int in_child(int use_context, const char *what)
{
    fflush(NULL);
    const pid_t pid = fork();
    if (pid < 0) {
        CHECK(0, "%s: fork failed", what);
        return 1;
    }
    if (pid == 0) {
        alarm(CHILD_SECONDS);
        const int bad = use_context ? child_runs() : 0;
        fxa_attn_plan_destroy(g_plan);
        fxa_ctx_destroy(g_ctx);
        _exit(bad);
    }
    int status = 0;
    const double deadline = test_now_seconds() + CHILD_SECONDS + 10;
    pid_t done = 0;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 && test_now_seconds() < deadline) {
        const struct timespec ms10 = {0, 10000000};
        nanosleep(&ms10, NULL);
    }
    if (done == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        CHECK(0, "%s: the child did not finish in %d s", what, CHILD_SECONDS + 10);
        return 1;
    }
    const int passed = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    CHECK(passed, "%s: the child %s %d (a hang ends in SIGALRM, 14; 1: results differ or failed)",
          what, WIFEXITED(status) ? "exited with" : "was killed by signal",
          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
    return !passed;
}

static atomic_int g_stop;

/* A parent thread that keeps running on the context (so that a fork may
 * find its locks held). */
static void *busy_parent(void *arg)
{
    static float out[N_Q];
    (void)arg;
    while (!atomic_load(&g_stop))
        (void)run_plain(out);
    return NULL;
}

int main(void)
{
    g_ctx = fxt_ctx(3);
    if (!g_ctx)
        return 1;
    fxa_attn_desc d;
    fxt_attn_desc(&d, 1, HEADS, HEADS, SEQ, SEQ, DIM);
    size_t ws_bytes = 0;
    CHECK(fxa_attn_plan_create(g_ctx, &d, &g_plan, &ws_bytes) == FXA_OK, "plan");
    g_ws = unit_ws_alloc(ws_bytes);
    fxt_rng r;
    fxt_rng_seed(&r, 7);
    for (int i = 0; i < N_Q; i++) {
        g_q[i] = (float)fxt_rng_normal(&r);
        g_k[i] = (float)fxt_rng_normal(&r);
        g_v[i] = (float)fxt_rng_normal(&r);
    }
    CHECK(run_plain(g_want) == FXA_OK, "parent run: %s", fxa_ctx_last_error(g_ctx));
    CHECK(run_blocks(g_want_blocks) == FXA_OK, "parent pass: %s", fxa_ctx_last_error(g_ctx));

    int failed = in_child(1, "child of an idle parent");
    failed = failed || in_child(0, "child that only destroys the context");
    pthread_t busy;
    CHECK(pthread_create(&busy, NULL, busy_parent, NULL) == 0, "parent thread");
    for (int i = 0; i < 3 && !failed; i++)
        failed = in_child(1, "child of a parent running on the context");
    atomic_store(&g_stop, 1);
    pthread_join(busy, NULL);

    static float again[N_Q];
    CHECK(run_plain(again) == FXA_OK && memcmp(again, g_want, sizeof again) == 0,
          "the parent's context after the forks");
    fxa_attn_plan_destroy(g_plan);
    fxa_ctx_destroy(g_ctx);
    free(g_ws);
    return test_summary("test_ctx_fork");
}
