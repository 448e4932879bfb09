/* Persistent thread pool with an atomic item counter (see pool.h). */
#include "pool.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct worker_start {
    fxa_pool *pool;
    int thread_id;
};

/* Held across fork (pthread_atfork) so that a child never inherits it
 * locked: it serialises the rebuilds of pools in a child. */
static pthread_mutex_t g_rebuild_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t g_atfork_once = PTHREAD_ONCE_INIT;

static void rebuild_lock(void)
{
    pthread_mutex_lock(&g_rebuild_lock);
}

static void rebuild_unlock(void)
{
    pthread_mutex_unlock(&g_rebuild_lock);
}

static void register_atfork(void)
{
    pthread_atfork(rebuild_lock, rebuild_unlock, rebuild_unlock);
}

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

static void stop_workers(fxa_pool *pool)
{
    pthread_mutex_lock(&pool->lock);
    pool->stop = 1;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);
    for (int i = 0; i < pool->n_workers; i++)
        pthread_join(pool->workers[i], NULL);
}

/* Fresh locks and an idle state; FXA_OK or FXA_ERR_INTERNAL (nothing left
 * to destroy on failure). */
static fxa_status init_sync(fxa_pool *pool)
{
    pthread_mutexattr_t attr;
    pool->generation = 0;
    pool->running = 0;
    pool->stop = 0;
    pool->n_workers = 0;
    if (pthread_mutexattr_init(&attr) != 0)
        return FXA_ERR_INTERNAL;
    const int rc = pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE) != 0 ||
                   pthread_mutex_init(&pool->call, &attr) != 0;
    pthread_mutexattr_destroy(&attr);
    if (rc)
        return FXA_ERR_INTERNAL;
    if (pthread_mutex_init(&pool->lock, NULL) != 0)
        goto out_call;
    if (pthread_cond_init(&pool->wake, NULL) != 0)
        goto out_lock;
    if (pthread_cond_init(&pool->done, NULL) != 0)
        goto out_wake;
    return FXA_OK;
out_wake:
    pthread_cond_destroy(&pool->wake);
out_lock:
    pthread_mutex_destroy(&pool->lock);
out_call:
    pthread_mutex_destroy(&pool->call);
    return FXA_ERR_INTERNAL;
}

static void destroy_sync(fxa_pool *pool)
{
    pthread_cond_destroy(&pool->done);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->call);
}

/* Map worker i's own stack (a guard page below it); 0 on failure. */
static int map_stack(fxa_pool *pool, int i)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char *m = mmap(NULL, pool->stack_bytes + page, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (m == MAP_FAILED)
        return 0;
    mprotect(m, page, PROT_NONE);
    pool->stacks[i] = m;
    return 1;
}

static void unmap_stacks(fxa_pool *pool)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; pool->stacks && i < pool->n_workers; i++)
        munmap(pool->stacks[i], pool->stack_bytes + page);
    free(pool->stacks);
    pool->stacks = NULL;
}

/* Start worker i (on its own stack when pool->stacks is set); 0 on failure. */
static int start_worker(fxa_pool *pool, int i)
{
    struct worker_start *ws = malloc(sizeof *ws);
    pthread_attr_t attr;
    int ok = 0;
    if (!ws || pthread_attr_init(&attr) != 0) {
        free(ws);
        return 0;
    }
    ws->pool = pool;
    ws->thread_id = i + 1;
    if (!pool->stacks || map_stack(pool, i)) {
        const size_t page = (size_t)sysconf(_SC_PAGESIZE);
        if (pool->stacks)
            pthread_attr_setstack(&attr, (unsigned char *)pool->stacks[i] + page,
                                  pool->stack_bytes);
        ok = pthread_create(&pool->workers[i], &attr, worker_main, ws) == 0;
        if (!ok && pool->stacks)
            munmap(pool->stacks[i], pool->stack_bytes + page);
    }
    pthread_attr_destroy(&attr);
    if (!ok)
        free(ws);
    return ok;
}

/* Start workers 1..n_threads-1 until one fails; n_workers counts them. */
static void start_workers(fxa_pool *pool)
{
    while (pool->n_workers < pool->n_threads - 1 && start_worker(pool, pool->n_workers))
        pool->n_workers++;
}

fxa_status fxa_pool_init(fxa_pool *pool, int n_threads)
{
    pthread_once(&g_atfork_once, register_atfork);
    pool->n_threads = n_threads < 1 ? 1 : n_threads;
    pool->fn = NULL;
    pool->arg = NULL;
    pool->n_items = 0;
    atomic_init(&pool->next_item, 0);
    atomic_init(&pool->pid, getpid());
    pool->workers = NULL;
    pool->stacks = NULL;
    pool->stack_bytes = 0;
    if (init_sync(pool) != FXA_OK)
        return FXA_ERR_INTERNAL;
    if (pool->n_threads == 1)
        return FXA_OK;
    pool->workers = calloc((size_t)pool->n_threads - 1, sizeof *pool->workers);
    if (pool->workers)
        start_workers(pool);
    if (pool->workers && pool->n_workers == pool->n_threads - 1)
        return FXA_OK;
    if (pool->workers)
        stop_workers(pool);
    free(pool->workers);
    destroy_sync(pool);
    return FXA_ERR_NO_MEMORY;
}

/* 1 when the workers and locks belong to the calling process. */
static int owned_here(const fxa_pool *pool)
{
    return atomic_load_explicit(&pool->pid, memory_order_acquire) == getpid();
}

/* The default thread stack size (what pthread_create gives). */
static size_t default_stack_bytes(void)
{
    pthread_attr_t attr;
    size_t bytes = 8u << 20;
    if (pthread_attr_init(&attr) == 0) {
        pthread_attr_getstacksize(&attr, &bytes);
        pthread_attr_destroy(&attr);
    }
    return bytes;
}

/* In a forked child: new locks and workers over the parent's copies, which
 * are neither joined nor destroyed (their threads do not exist here and a
 * lock may have been held when the parent forked). The workers get stacks
 * of their own; without room for them the caller runs every item. */
static void rebuild_in_child(fxa_pool *pool)
{
    rebuild_lock();
    if (!owned_here(pool) && init_sync(pool) == FXA_OK) {
        if (pool->workers) {
            pool->stack_bytes = default_stack_bytes();
            pool->stacks = calloc((size_t)pool->n_threads - 1, sizeof *pool->stacks);
            if (pool->stacks)
                start_workers(pool);
        }
        atomic_store_explicit(&pool->pid, getpid(), memory_order_release);
    }
    rebuild_unlock();
}

void fxa_pool_enter(fxa_pool *pool)
{
    if (!owned_here(pool))
        rebuild_in_child(pool);
    pthread_mutex_lock(&pool->call);
}

void fxa_pool_leave(fxa_pool *pool)
{
    pthread_mutex_unlock(&pool->call);
}

void fxa_pool_destroy(fxa_pool *pool)
{
    if (!owned_here(pool)) { /* a forked child's copy that never ran */
        free(pool->workers);
        free(pool->stacks);
        return;
    }
    if (pool->n_threads > 1) {
        stop_workers(pool);
        unmap_stacks(pool);
        free(pool->workers);
    }
    destroy_sync(pool);
}

void fxa_pool_run(fxa_pool *pool, fxa_pool_task_fn *fn, void *arg, int64_t n_items)
{
    if (n_items <= 0)
        return;
    fxa_pool_enter(pool);
    if (pool->n_workers == 0 || n_items == 1) {
        for (int64_t i = 0; i < n_items; i++)
            fn(arg, i, 0);
        fxa_pool_leave(pool);
        return;
    }
    pthread_mutex_lock(&pool->lock);
    pool->fn = fn;
    pool->arg = arg;
    pool->n_items = n_items;
    atomic_store_explicit(&pool->next_item, 0, memory_order_relaxed);
    pool->running = pool->n_workers;
    pool->generation++;
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->lock);

    drain_items(pool, 0);

    pthread_mutex_lock(&pool->lock);
    while (pool->running > 0)
        pthread_cond_wait(&pool->done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
    fxa_pool_leave(pool);
}
