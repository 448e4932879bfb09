/*
 * peak: dispatch, threads and timing of the peak microbenchmark (contract in peak.h).
 *
 * The loop is chosen at run time (__builtin_cpu_supports, which also checks that the OS
 * saves the wide registers): bf16 needs avx512bf16, AMX its own check (peak_amx.c); fp32
 * takes avx512f, else avx2+fma, else the portable scalar loop here. Worker threads wait on a start gate, then each runs
 * PEAK_CHUNK-iteration calls until PEAK_SECONDS have passed on its own CLOCK_MONOTONIC
 * clock; the rates add up. Results go to a volatile sink so no loop can be dropped.
 */
#define _POSIX_C_SOURCE 200809L

#include "peak.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#define PEAK_SECONDS 0.2
#define PEAK_REPS 6      /* best of: a noisy neighbour can hold a core for a second */
#define PEAK_CHUNK 16384 /* iterations between clock reads: tens of microseconds */
#define PEAK_A 0.999999f
#define PEAK_B 1e-6f
#define SCALAR_ACC 8

static volatile float peak_sink;

static float scalar_run(uint64_t iters, float a, float b)
{
    float c[SCALAR_ACC];
    for (int j = 0; j < SCALAR_ACC; j++)
        c[j] = b * (float)(j + 1);
    for (uint64_t i = 0; i < iters; i++) {
#pragma GCC unroll 8
        for (int j = 0; j < SCALAR_ACC; j++)
            c[j] = c[j] * a + b;
    }
    float s = 0.0f;
    for (int j = 0; j < SCALAR_ACC; j++)
        s += c[j];
    return s;
}

static const fxt_peak_loop scalar_loop = {scalar_run, SCALAR_ACC * 2.0, "scalar"};

static const fxt_peak_loop *pick_loop(fxt_peak_kind kind)
{
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
    __builtin_cpu_init();
    if (kind == FXT_PEAK_BF16_AMX)
#if defined(FXT_HAVE_AMX_PEAK)
        return fxt_peak_amx_ready() ? &fxt_peak_loop_amx_bf16 : NULL;
#else
        return NULL;
#endif
    if (kind == FXT_PEAK_BF16_DOT)
        return __builtin_cpu_supports("avx512bf16") ? &fxt_peak_loop_avx512_bf16 : NULL;
    if (__builtin_cpu_supports("avx512f"))
        return &fxt_peak_loop_avx512_f32;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return &fxt_peak_loop_avx2_f32;
#endif
    return kind == FXT_PEAK_F32_FMA ? &scalar_loop : NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

enum { GATE_WAIT, GATE_GO, GATE_ABORT };

typedef struct peak_gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int state;
} peak_gate;

typedef struct peak_worker {
    const fxt_peak_loop *loop;
    peak_gate *gate;
    double gflops; /* out */
    float sum;     /* out: accumulator sums, for the sink */
} peak_worker;

static void *worker_main(void *arg)
{
    peak_worker *w = arg;
    pthread_mutex_lock(&w->gate->mu);
    while (w->gate->state == GATE_WAIT)
        pthread_cond_wait(&w->gate->cv, &w->gate->mu);
    int state = w->gate->state;
    pthread_mutex_unlock(&w->gate->mu);
    if (state != GATE_GO)
        return NULL;

    double t0 = now_s(), dt;
    uint64_t iters = 0;
    float sum = 0.0f;
    do {
        sum += w->loop->run(PEAK_CHUNK, PEAK_A, PEAK_B);
        iters += PEAK_CHUNK;
        dt = now_s() - t0;
    } while (dt < PEAK_SECONDS);
    w->gflops = (double)iters * w->loop->flops_per_iter / dt * 1e-9;
    w->sum = sum;
    return NULL;
}

/* One repetition: summed GFLOP/s of all threads, or 0.0 if a thread could not start. */
static double run_once(const fxt_peak_loop *loop, int threads, peak_worker *w, pthread_t *tid)
{
    peak_gate gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, GATE_WAIT};
    int started = 0;
    for (; started < threads; started++) {
        w[started] = (peak_worker){loop, &gate, 0.0, 0.0f};
        if (pthread_create(&tid[started], NULL, worker_main, &w[started]) != 0)
            break;
    }
    pthread_mutex_lock(&gate.mu);
    gate.state = started == threads ? GATE_GO : GATE_ABORT;
    pthread_cond_broadcast(&gate.cv);
    pthread_mutex_unlock(&gate.mu);
    double total = 0.0;
    float sum = 0.0f;
    for (int i = 0; i < started; i++) {
        pthread_join(tid[i], NULL);
        total += w[i].gflops;
        sum += w[i].sum;
    }
    peak_sink = sum;
    pthread_mutex_destroy(&gate.mu);
    pthread_cond_destroy(&gate.cv);
    return started == threads ? total : 0.0;
}

double fxt_peak_gflops(fxt_peak_kind kind, int threads, const char **isa_out)
{
    const fxt_peak_loop *loop = pick_loop(kind);
    if (isa_out)
        *isa_out = loop ? loop->isa : "none";
    if (!loop)
        return 0.0;
    if (threads < 1)
        threads = 1;
    peak_worker *w = malloc((size_t)threads * sizeof *w);
    pthread_t *tid = malloc((size_t)threads * sizeof *tid);
    double best = 0.0;
    if (w && tid) {
        for (int r = 0; r < PEAK_REPS; r++) {
            double g = run_once(loop, threads, w, tid);
            if (g == 0.0) {
                best = 0.0;
                break;
            }
            best = g > best ? g : best;
        }
    }
    free(w);
    free(tid);
    return best;
}
