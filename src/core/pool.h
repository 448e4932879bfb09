/*
 * A fixed-size persistent thread pool. The calling thread works too, so a
 * pool of n threads starts n - 1 workers. fxa_pool_run hands out items
 * 0..n_items-1 through one atomic counter (dynamic schedule: results must not
 * depend on which thread runs an item) and returns when all are done.
 *
 * One caller at a time: fxa_pool_enter / fxa_pool_leave bracket a caller's
 * whole use of the pool (a recursive lock, so fxa_pool_run inside it takes
 * it again); callers on other threads wait. fxa_pool_run takes it on its
 * own too, so concurrent runs never mix.
 *
 * Fork-safe: the pool records the process that started its workers. In a
 * forked child (which has none of them) the first fxa_pool_enter or
 * fxa_pool_run rebuilds it with new workers and fresh locks, leaving the
 * parent's untouched (the new workers get stacks of their own); a worker
 * that cannot start there leaves its items to the others (results do not
 * depend on the thread count).
 */
#ifndef FXA_POOL_H
#define FXA_POOL_H

#include "../base/internal_api.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "fxattn.h"

/* Runs one item; thread_id in [0, n_threads) identifies per-thread scratch. */
typedef void fxa_pool_task_fn(void *arg, int64_t item, int thread_id);

typedef struct fxa_pool {
    int n_threads;
    int n_workers;      /* workers running: n_threads - 1 (fewer in a child that lacked room) */
    pthread_t *workers; /* n_threads - 1 */
    /* Workers started in a forked child run on stacks of their own
     * (stack_bytes each, NULL: the default stacks), so that a new thread
     * never reuses the stack, and so the identity, of a parent thread that
     * the child's memory still holds. */
    void **stacks;
    size_t stack_bytes;
    pthread_mutex_t call; /* recursive: held by the one caller (fxa_pool_enter) */
    pthread_mutex_t lock; /* guards generation, running, stop */
    pthread_cond_t wake;  /* workers wait here for a new generation */
    pthread_cond_t done;  /* the caller waits here for running == 0 */
    uint64_t generation;  /* bumped once per fxa_pool_run */
    int running;          /* workers still inside the current generation */
    int stop;
    fxa_pool_task_fn *fn;
    void *arg;
    int64_t n_items;
    _Atomic pid_t pid; /* the process whose workers and locks these are */
    /* Hot counter on its own cache line: every thread fetch_adds it. */
    _Alignas(64) atomic_int_fast64_t next_item;
    char pad[64 - sizeof(atomic_int_fast64_t)];
} fxa_pool;

fxa_status fxa_pool_init(fxa_pool *pool, int n_threads);
void fxa_pool_destroy(fxa_pool *pool);
/* Become the pool's caller (waiting for another thread's turn to end),
 * rebuilding the pool first in a forked child. */
FXA_INTERNAL void fxa_pool_enter(fxa_pool *pool);
FXA_INTERNAL void fxa_pool_leave(fxa_pool *pool);
FXA_INTERNAL void fxa_pool_run(fxa_pool *pool, fxa_pool_task_fn *fn, void *arg, int64_t n_items);

#endif
