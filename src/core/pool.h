/*
 * A fixed-size persistent thread pool. The calling thread works too, so a
 * pool of n threads starts n - 1 workers. fxa_pool_run hands out items
 * 0..n_items-1 through one atomic counter (dynamic schedule: results must not
 * depend on which thread runs an item) and returns when all are done.
 * One fxa_pool_run at a time per pool.
 */
#ifndef FXA_POOL_H
#define FXA_POOL_H

#include "internal_api.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "fxattn.h"

/* Runs one item; thread_id in [0, n_threads) identifies per-thread scratch. */
typedef void fxa_pool_task_fn(void *arg, int64_t item, int thread_id);

typedef struct fxa_pool {
    int n_threads;
    pthread_t *workers;   /* n_threads - 1 */
    pthread_mutex_t lock; /* guards generation, running, stop */
    pthread_cond_t wake;  /* workers wait here for a new generation */
    pthread_cond_t done;  /* the caller waits here for running == 0 */
    uint64_t generation;  /* bumped once per fxa_pool_run */
    int running;          /* workers still inside the current generation */
    int stop;
    fxa_pool_task_fn *fn;
    void *arg;
    int64_t n_items;
    /* Hot counter on its own cache line: every thread fetch_adds it. */
    _Alignas(64) atomic_int_fast64_t next_item;
    char pad[64 - sizeof(atomic_int_fast64_t)];
} fxa_pool;

fxa_status fxa_pool_init(fxa_pool *pool, int n_threads);
void fxa_pool_destroy(fxa_pool *pool);
FXA_INTERNAL void fxa_pool_run(fxa_pool *pool, fxa_pool_task_fn *fn, void *arg, int64_t n_items);

#endif
