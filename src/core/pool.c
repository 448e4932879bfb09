/* Persistent thread pool with an atomic item counter (see pool.h). */
#include "pool.h"

#include <stdlib.h>

struct worker_start {
    fxa_pool *pool;
    int thread_id;
};

/* Take items until none are left. Relaxed ordering suffices for the counter:
 * it only partitions indices; the mutex hand-off in fxa_pool_run publishes the
 * task and, at the end, the results. */
static void drain_items(fxa_pool *pool, int thread_id)
{
    for (;;) {
        int64_t item = atomic_fetch_add_explicit(&pool->next_item, 1, memory_order_relaxed);
        if (item >= pool->n_items)
            return;
        pool->fn(pool->arg, item, thread_id);
    }
}

static void *worker_main(void *p)
{
    fxa_pool *pool = ((struct worker_start *)p)->pool;
    int thread_id = ((struct worker_start *)p)->thread_id;
    uint64_t seen = 0;
    free(p);
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->stop && pool->generation == seen)
            pthread_cond_wait(&pool->wake, &pool->lock);
        if (pool->stop)
            break;
        seen = pool->generation;
        pthread_mutex_unlock(&pool->lock);
        drain_items(pool, thread_id);
        pthread_mutex_lock(&pool->lock);
        if (--pool->running == 0)
            pthread_cond_signal(&pool->done);
    }
    pthread_mutex_unlock(&pool->lock);
    return NULL;
}

static void stop_workers(fxa_pool *pool, int n_started)
{
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < n_started; i++)
        pthread_join(pool->workers[i], NULL);
}

fxa_status fxa_pool_init(fxa_pool *pool, int n_threads)
{
    int started = 0;
    pool->n_threads = n_threads < 1 ? 1 : n_threads;
    pool->generation = 0;
    pool->running = 0;
    pool->stop = 0;
    pool->fn = NULL;
    pool->arg = NULL;
    pool->n_items = 0;
    atomic_init(&pool->next_item, 0);
    pool->workers = NULL;
    if (pthread_mutex_init(&pool->lock, NULL) != 0)
        return FXA_ERR_INTERNAL;
    if (pthread_cond_init(&pool->wake, NULL) != 0)
        goto out_lock;
    if (pthread_cond_init(&pool->done, NULL) != 0)
        goto out_wake;
    if (pool->n_threads == 1)
        return FXA_OK;
    pool->workers = calloc((size_t)pool->n_threads - 1, sizeof *pool->workers);
    if (!pool->workers)
        goto out_done;
    for (; started < pool->n_threads - 1; started++) {
        struct worker_start *ws = malloc(sizeof *ws);
        if (!ws)
            goto out_workers;
        ws->pool = pool;
        ws->thread_id = started + 1;
        if (pthread_create(&pool->workers[started], NULL, worker_main, ws) != 0) {
            free(ws);
            goto out_workers;
        }
    }
    return FXA_OK;
out_workers:
    stop_workers(pool, started);
    free(pool->workers);
out_done:
    pthread_cond_destroy(&pool->done);
out_wake:
    pthread_cond_destroy(&pool->wake);
out_lock:
    pthread_mutex_destroy(&pool->lock);
    return FXA_ERR_NO_MEMORY;
}

void fxa_pool_destroy(fxa_pool *pool)
{
    if (pool->n_threads > 1) {
        stop_workers(pool, pool->n_threads - 1);
        free(pool->workers);
    }
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
}

void fxa_pool_run(fxa_pool *pool, fxa_pool_task_fn *fn, void *arg, int64_t n_items)
{
    if (n_items <= 0)
        return;
    if (pool->n_threads == 1 || n_items == 1) {
        for (int64_t i = 0; i < n_items; i++)
            fn(arg, i, 0);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->n_items = n_items;
    atomic_store_explicit(&pool->next_item, 0, memory_order_relaxed);
    pool->running = pool->n_threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    drain_items(pool, 0);

    pthread_mutex_lock(&pool->lock);
    while (pool->running > 0)
        pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
}
