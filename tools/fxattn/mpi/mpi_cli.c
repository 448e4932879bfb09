/* Shared pieces of the distributed subcommands (mpi_cli.h). */
#include "mpi_cli.h"

#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cmd_opts.h"
#include "fxattn_mpi.h"
#include "input_hash.h"

/* The guard of the blocking MPI calls (fxt_world_guard): a thread that
 * ends the process when one outlasts the deadline. */
static struct guard {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    pthread_t thread;
    int running;
    int stop;
    int armed;
    struct timespec deadline;
    int rank;       /* for the message: the launcher's rank before MPI_Init */
    double timeout; /* seconds */
    char line[300]; /* printed when the deadline passes */
} g_guard = {.mu = PTHREAD_MUTEX_INITIALIZER};

static int past(const struct timespec *t)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return now.tv_sec > t->tv_sec || (now.tv_sec == t->tv_sec && now.tv_nsec >= t->tv_nsec);
}

static void *guard_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g_guard.mu);
    while (!g_guard.stop) {
        if (g_guard.armed && past(&g_guard.deadline)) {
            /* One write, then end: mpirun ends the other ranks. */
            const ssize_t n = write(STDERR_FILENO, g_guard.line, strlen(g_guard.line));
            (void)n;
            _exit(FXT_EXIT_FAILURE);
        }
        if (g_guard.armed)
            pthread_cond_timedwait(&g_guard.cv, &g_guard.mu, &g_guard.deadline);
        else
            pthread_cond_wait(&g_guard.cv, &g_guard.mu);
    }
    pthread_mutex_unlock(&g_guard.mu);
    return NULL;
}

/* This process's rank as the launcher gives it (before MPI_Init), or -1. */
static int launcher_rank(void)
{
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (int i = 0; i < 3; i++) {
        const char *v = getenv(names[i]);
        if (v && *v)
            return atoi(v);
    }
    return -1;
}

/* Start the guard's thread (disarmed). 0 or an exit code. */
static int guard_start(double timeout)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    const int bad = pthread_cond_init(&g_guard.cv, &a);
    pthread_condattr_destroy(&a);
    g_guard.rank = launcher_rank();
    g_guard.timeout = timeout;
    g_guard.stop = g_guard.armed = 0;
    if (bad || pthread_create(&g_guard.thread, NULL, guard_main, NULL) != 0) {
        if (!bad)
            pthread_cond_destroy(&g_guard.cv);
        return fxt_fail(FXT_EXIT_FAILURE, "cannot start the thread that bounds MPI's start-up");
    }
    g_guard.running = 1;
    return 0;
}

static void guard_stop(void)
{
    if (!g_guard.running)
        return;
    pthread_mutex_lock(&g_guard.mu);
    g_guard.stop = 1;
    pthread_cond_signal(&g_guard.cv);
    pthread_mutex_unlock(&g_guard.mu);
    pthread_join(g_guard.thread, NULL);
    pthread_cond_destroy(&g_guard.cv);
    g_guard.running = 0;
}

/* Under the guard's lock, arm it (arm 1: the line it would print for `what` and the deadline
 * from now) or disarm it; then wake its thread. */
static void guard_set(int arm, const char *what)
{
    if (!g_guard.running)
        return;
    pthread_mutex_lock(&g_guard.mu);
    if (arm) {
        snprintf(g_guard.line, sizeof g_guard.line,
                 "fxattn: error: rank %d: no progress from the other ranks for %g s (%s)\n",
                 g_guard.rank, g_guard.timeout, what);
        clock_gettime(CLOCK_MONOTONIC, &g_guard.deadline);
        const double whole = floor(g_guard.timeout);
        g_guard.deadline.tv_sec += (time_t)whole;
        g_guard.deadline.tv_nsec += (long)((g_guard.timeout - whole) * 1e9);
        if (g_guard.deadline.tv_nsec >= 1000000000L) {
            g_guard.deadline.tv_sec++;
            g_guard.deadline.tv_nsec -= 1000000000L;
        }
    }
    g_guard.armed = arm;
    pthread_cond_signal(&g_guard.cv);
    pthread_mutex_unlock(&g_guard.mu);
}

void fxt_world_guard(const char *what)
{
    guard_set(1, what);
}

void fxt_world_unguard(void)
{
    guard_set(0, NULL);
}

int fxt_world_init(fxt_world *w, double timeout)
{
    /* Every rank sees the same options and environment: each fails alike,
     * before MPI starts. */
    if (timeout > 1e9)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "--timeout %g is longer than the longest deadline, 1e9 s", timeout);
    if (!(timeout >= 0.0))
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--timeout %g is not a positive number of seconds",
                        timeout);
    const double t = timeout > 0.0 ? timeout : fxa_mpi_default_timeout();
    if (t == 0.0)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "FXA_MPI_TIMEOUT=%s is not a number of seconds in (0, 1e9]",
                        getenv("FXA_MPI_TIMEOUT"));
    int provided = 0;
    if (guard_start(t))
        return FXT_EXIT_FAILURE;
    fxt_world_guard("start-up");
    const int inited = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided);
    fxt_world_unguard();
    if (inited != MPI_SUCCESS) {
        guard_stop();
        return fxt_fail(FXT_EXIT_FAILURE, "MPI_Init_thread failed");
    }
    *w = (fxt_world){0, 1, t, ""};
    MPI_Comm_rank(MPI_COMM_WORLD, &w->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &w->size);
    g_guard.rank = w->rank; /* for fxt_world_guard's messages */
    fxt_fail_capture(w->msg, sizeof w->msg);
    return 0;
}

void fxt_world_finalize(fxt_world *w)
{
    (void)w;
    fxt_fail_capture(NULL, 0);
    fflush(stdout);
    fxt_world_guard("finishing");
    MPI_Finalize();
    fxt_world_unguard();
    guard_stop();
}

_Noreturn void fxt_world_abort(fxt_world *w, const char *msg)
{
    (void)w;
    fxt_fail_capture(NULL, 0);
    fxt_fail(FXT_EXIT_FAILURE, "%s", msg);
    fflush(stdout);
    fflush(stderr);
    const struct timespec linger = {2, 0};
    nanosleep(&linger, NULL);
    MPI_Abort(MPI_COMM_WORLD, FXT_EXIT_FAILURE);
    _exit(FXT_EXIT_FAILURE);
}

/* Wait with libfxattn_mpi's polling (fxa_mpi_wait_all); no progress for
 * w->timeout seconds: end the job. An MPI error shows up in what the
 * caller does next. */
static void wait_or_abort(fxt_world *w, MPI_Request *r, const char *what, int spin)
{
    if (fxa_mpi_wait_all(1, r, w->timeout, spin) != FXA_ERR_TIMEOUT)
        return;
    char msg[300];
    snprintf(msg, sizeof msg, "rank %d: no progress from the other ranks for %g s (%s)", w->rank,
             w->timeout, what);
    fxt_world_abort(w, msg);
}

void fxt_world_wait(fxt_world *w, MPI_Request *r, const char *what)
{
    wait_or_abort(w, r, what, 0);
}

void fxt_world_spin(fxt_world *w, MPI_Request *r, const char *what)
{
    wait_or_abort(w, r, what, 1);
}

void fxt_world_barrier(fxt_world *w, const char *what)
{
    MPI_Request r;
    MPI_Ibarrier(MPI_COMM_WORLD, &r);
    fxt_world_spin(w, &r, what);
}

void fxt_world_allreduce(fxt_world *w, void *buf, int count, MPI_Datatype type, MPI_Op op,
                         const char *what)
{
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, buf, count, type, op, MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, what);
}

int fxt_world_agree(fxt_world *w, int code)
{
    int in[2] = {code != 0, w->rank};
    int out[2];
    MPI_Request r;
    MPI_Iallreduce(in, out, 1, MPI_2INT, MPI_MAXLOC, MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, "agreeing on errors");
    if (!out[0])
        return 0;
    const int root = out[1];
    struct {
        int code;
        char msg[600];
    } e = {code, ""};
    snprintf(e.msg, sizeof e.msg, "%s", w->msg);
    MPI_Ibcast(&e, (int)sizeof e, MPI_BYTE, root, MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, "the failing rank's error");
    e.msg[sizeof e.msg - 1] = '\0';
    if (!e.msg[0]) /* a failure that set no message still names itself */
        snprintf(e.msg, sizeof e.msg, "failed with exit code %d", e.code);
    fxt_fail_capture(NULL, 0);
    if (w->rank == 0)
        fxt_fail(e.code, "rank %d: %s", root, e.msg);
    fxt_fail_capture(w->msg, sizeof w->msg);
    return e.code ? e.code : FXT_EXIT_FAILURE;
}

/* Rank 0 prints msg ("fxattn: error: ...") while the others stay quiet;
 * returns code. */
static int print_on_rank0(fxt_world *w, int code, const char *msg)
{
    if (w->rank == 0) {
        fxt_fail_capture(NULL, 0);
        fxt_fail(code, "%s", msg);
        fxt_fail_capture(w->msg, sizeof w->msg);
    }
    return code;
}

/* Where n hashes of this rank (mine) first differ from rank 0's, agreed
 * over the world: *index the lowest i (among those with skip[i] == 0) at
 * which some rank differs (n when none does), *first the lowest such rank
 * and *count how many ranks differ there. Collective. */
static void first_difference(fxt_world *w, const uint64_t *mine, const char *skip, int n,
                             int *index, int *first, int *count)
{
    uint64_t root[FXT_MAX_OPTS];
    memcpy(root, mine, (size_t)n * sizeof *mine);
    MPI_Request r;
    MPI_Ibcast(root, n, MPI_UINT64_T, 0, MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, "rank 0's options and inputs");
    int i = 0;
    while (i < n && (skip[i] || mine[i] == root[i]))
        i++;
    *index = i;
    fxt_world_allreduce(w, index, 1, MPI_INT, MPI_MIN, "comparing the options and inputs");
    *count = 0;
    *first = w->size;
    if (*index == n)
        return;
    const int differs = mine[*index] != root[*index];
    *first = differs ? w->rank : w->size;
    fxt_world_allreduce(w, first, 1, MPI_INT, MPI_MIN, "the ranks that differ");
    *count = differs;
    fxt_world_allreduce(w, count, 1, MPI_INT, MPI_SUM, "the ranks that differ");
}

/* The canonical text of option o's value (also what its hash covers). */
static void option_text(const fxt_opt *o, char *buf, size_t cap)
{
    switch (o->kind) {
    case FXT_OPT_FLAG:
        snprintf(buf, cap, "%s", *(const int *)o->dest ? "given" : "not given");
        break;
    case FXT_OPT_STRING: {
        const char *v = *(const char *const *)o->dest;
        if (v)
            snprintf(buf, cap, "'%s'", v);
        else
            snprintf(buf, cap, "not given");
        break;
    }
    case FXT_OPT_INT: snprintf(buf, cap, "%lld", (long long)*(const int64_t *)o->dest); break;
    default: snprintf(buf, cap, "%.17g", *(const double *)o->dest); break;
    }
}

static uint64_t option_hash(const fxt_opt *o)
{
    char text[64];
    option_text(o, text, sizeof text);
    uint64_t h = fxt_hash_bytes(FXT_HASH_SEED, o->name, strlen(o->name) + 1);
    h = fxt_hash_bytes(h, text, strlen(text) + 1);
    if (o->kind == FXT_OPT_STRING && *(const char *const *)o->dest) {
        const char *v = *(const char *const *)o->dest; /* all of it, past the text's cap */
        h = fxt_hash_bytes(h, v, strlen(v));
    }
    return h;
}

/* The options each rank may set for itself (mpi_cli.h). */
static const char *const per_rank_options[] = {"--threads", NULL};

int fxt_world_agree_options(fxt_world *w, const fxt_opt *opts)
{
    uint64_t mine[FXT_MAX_OPTS];
    char skip[FXT_MAX_OPTS];
    int n = 0;
    for (; n < FXT_MAX_OPTS && opts[n].name; n++) {
        mine[n] = option_hash(&opts[n]);
        skip[n] = 0;
        for (int k = 0; per_rank_options[k]; k++)
            skip[n] |= !strcmp(per_rank_options[k], opts[n].name);
    }
    int index, first, count;
    first_difference(w, mine, skip, n, &index, &first, &count);
    if (index == n)
        return 0;
    /* Rank 0's value and the first differing rank's. */
    char mine_text[64], theirs[64];
    option_text(&opts[index], mine_text, sizeof mine_text);
    memcpy(theirs, mine_text, sizeof theirs);
    MPI_Request r;
    MPI_Ibcast(theirs, (int)sizeof theirs, MPI_CHAR, first, MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, "the differing option");
    theirs[sizeof theirs - 1] = '\0';
    char more[64] = "";
    if (count > 1)
        snprintf(more, sizeof more, " (%d ranks differ from rank 0)", count);
    char msg[400];
    snprintf(msg, sizeof msg, "ranks disagree on %s: %s on rank 0, %s on rank %d%s",
             opts[index].name, mine_text, theirs, first, more);
    return print_on_rank0(w, FXT_EXIT_BAD_INPUT, msg);
}

int fxt_world_agree_hashes(fxt_world *w, const uint64_t *hashes, const char *const *what, int count)
{
    const char skip[FXT_WORLD_MAX_HASHES] = {0};
    int index, first, ranks;
    first_difference(w, hashes, skip, count, &index, &first, &ranks);
    if (index == count)
        return 0;
    char more[64] = "";
    if (ranks > 1)
        snprintf(more, sizeof more, " (%d ranks differ from rank 0)", ranks);
    char msg[600];
    snprintf(msg, sizeof msg, "ranks read different %s: rank %d differs from rank 0%s", what[index],
             first, more);
    return print_on_rank0(w, FXT_EXIT_BAD_INPUT, msg);
}

int fxt_world_lib_fail(fxt_world *w, fxa_status st, const char *msg)
{
    if (st == FXA_OK)
        return 0;
    if (!msg || !msg[0])
        msg = fxa_status_str(st);
    if (st == FXA_ERR_TIMEOUT)
        fxt_world_abort(w, msg);
    if (w->rank == 0) {
        char keep[sizeof w->msg];
        snprintf(keep, sizeof keep, "%s", msg);
        fxt_fail_capture(NULL, 0);
        fxt_fail(fxt_exit_code(st), "%s", keep);
        fxt_fail_capture(w->msg, sizeof w->msg);
    }
    return fxt_exit_code(st);
}

int fxt_mpi_threads_per_rank(int64_t threads)
{
    /* Collective whatever `threads` is, so that ranks stay in step. */
    fxt_world_guard("start-up");
    const int share = fxa_mpi_default_threads(MPI_COMM_WORLD);
    fxt_world_unguard();
    return threads > 0 ? (int)threads : share;
}

int fxt_mpi_node_ranks(void)
{
    MPI_Comm node;
    int n = 1;
    fxt_world_guard("start-up");
    const int split =
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    fxt_world_unguard();
    if (split != MPI_SUCCESS)
        return 1;
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    return n;
}
