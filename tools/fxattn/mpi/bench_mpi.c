/*
 * `fxattn bench` under mpirun: context-parallel efficiency on Wan-like
 * synthetic data, three ways in one run on the same data and threads per
 * rank:
 *   single   rank 0 alone on the whole problem (the others wait);
 *   fxattn   fxa_mpi_attn_run on the U x R grid (per ring step: compute,
 *            time blocked on transfers, overlap);
 *   gather   the plain alternative the seeds describe: MPI_Allgatherv of
 *            K and V, then local attention of each rank's queries.
 * Efficiency = T_single / (P * T_parallel). Results of fxattn and gather are
 * compared before timing. Medians of --repeats runs after a warm-up.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_opts.h"
#include "cli.h"
#include "fxattn_mpi.h"
#include "mpi_cli.h"
#include "runner.h"
#include "workload.h"
#include "stats.h"

#define MAX_REPEATS 101
#define MAX_STEPS 256 /* ring steps reported */

/* The timings of the timed repetitions (the slowest rank's, but t_single: rank 0's). */
typedef struct bench_times {
    double single[MAX_REPEATS];
    double dist[MAX_REPEATS];
    double gather[MAX_REPEATS];
    double gather_comm[MAX_REPEATS];
    double wait_share[MAX_REPEATS];
    int n_steps;
    double step_c[MAX_STEPS][MAX_REPEATS]; /* per ring step: compute */
    double step_w[MAX_STEPS][MAX_REPEATS]; /* and waiting on MPI */
} bench_times;

typedef struct dist_bench {
    fxt_world world; /* its waits: no progress for world.timeout ends the job */
    MPI_Comm comm;   /* the world in grid-rank order (fxa_mpi_grid_rank): shards follow it */
    int rank;
    int size;
    int threads;     /* per rank */
    fxt_workload w;  /* the whole problem, on every rank */
    fxa_attn_desc d; /* its descriptor with the bench's options */
    int64_t q0, qn;  /* this rank's shards (B = 1, BSHD: contiguous) */
    int64_t k0, kn;
    size_t es;
    int row;           /* elements per token: heads * dim */
    fxt_runner single; /* rank 0: the whole problem */
    fxt_runner local;  /* this rank's queries, every key (the all-gather form) */
    fxa_mpi_params mp; /* the grid */
    fxa_mpi *m;
    fxa_mpi_attn_plan *plan;
    void *k_all; /* the all-gathered K and V */
    void *v_all;
    float *out_single;
    float *out_dist;
    float *out_gather;
    bench_times t;
} dist_bench;

/* The largest t of all ranks (the slowest rank's time of a phase). */
static double slowest(dist_bench *b, double t)
{
    fxt_world_allreduce(&b->world, &t, 1, MPI_DOUBLE, MPI_MAX, "the timings");
    return t;
}

/* All-gather K/V, then this rank's queries against every key. */
static fxa_status gather_run(dist_bench *b, fxt_runner *r, void *k_all, void *v_all, float *out,
                             double *t_gather)
{
    int *counts = malloc((size_t)b->size * sizeof(int));
    int *displs = malloc((size_t)b->size * sizeof(int));
    for (int i = 0; i < b->size; i++) {
        int64_t s;
        int64_t n;
        fxa_mpi_shard(b->d.seq_kv, b->size, i, &s, &n);
        counts[i] = (int)(n * b->row);
        displs[i] = (int)(s * b->row);
    }
    const MPI_Datatype t = b->es == 4 ? MPI_FLOAT : MPI_UINT16_T;
    const double t0 = MPI_Wtime();
    MPI_Request req;
    MPI_Iallgatherv((const char *)b->w.k + (size_t)(b->k0 * b->row) * b->es, counts[b->rank], t,
                    k_all, counts, displs, t, b->comm, &req);
    fxt_world_spin(&b->world, &req, "the all-gather of K");
    MPI_Iallgatherv((const char *)b->w.v + (size_t)(b->k0 * b->row) * b->es, counts[b->rank], t,
                    v_all, counts, displs, t, b->comm, &req);
    fxt_world_spin(&b->world, &req, "the all-gather of V");
    *t_gather = MPI_Wtime() - t0;
    free(counts);
    free(displs);
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = (const char *)b->w.q + (size_t)(b->q0 * b->row) * b->es,
                             .k = k_all,
                             .v = v_all,
                             .out = out};
    fxa_attn_stats st = {.struct_size = sizeof st};
    return fxa_attn_run(r->plan, &a, r->workspace, &st);
}

/* Collective: every rank's options agree (fxt_world_agree_options over
 * the options bench_opts holds). 0 or the exit code, printed by rank 0. */
static int agree_options(fxt_world *w, const bench_opts *o)
{
    bench_opts v = *o;
    const char *dtype = fxt_dtype_name(o->dtype);
    int64_t compute = o->compute;
    const fxt_opt table[] = {
        {"--seq", NULL, FXT_OPT_INT, &v.seq, 0, 0},
        {"--heads", NULL, FXT_OPT_INT, &v.heads, 0, 0},
        {"--dim", NULL, FXT_OPT_INT, &v.dim, 0, 0},
        {"--dtype", NULL, FXT_OPT_STRING, &dtype, 0, 0},
        {"--compute", NULL, FXT_OPT_INT, &compute, 0, 0},
        {"--threads", NULL, FXT_OPT_INT, &v.threads, 0, 0},
        {"--repeats", NULL, FXT_OPT_INT, &v.repeats, 0, 0},
        {"--json", NULL, FXT_OPT_FLAG, &v.json, 0, 0},
        FXT_CP_OPTS_ROWS(v.cp),
        {0},
    };
    fxt_fail_capture(w->msg, sizeof w->msg);
    const int code = fxt_world_agree_options(w, table);
    fxt_fail_capture(NULL, 0);
    return code;
}

/* Collective: join the job and order the ranks by grid rank into b->comm. */
static int bench_join(dist_bench *b, fxt_world *world)
{
    int grid_rank = 0;
    fxt_world_guard("start-up");
    const fxa_status placed = fxa_mpi_grid_rank(MPI_COMM_WORLD, FXA_MPI_PLACE_HOSTS, &grid_rank);
    fxt_world_unguard();
    if (placed != FXA_OK)
        return fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_mpi_create_error());
    fxt_world_barrier(world, "start-up"); /* every rank has arrived before the split */
    fxt_world_guard("start-up");
    MPI_Comm_split(MPI_COMM_WORLD, 0, grid_rank, &b->comm);
    fxt_world_unguard();
    MPI_Comm_rank(b->comm, &b->rank);
    MPI_Comm_size(b->comm, &b->size);
    b->world = (fxt_world){b->rank, b->size, world->timeout, ""};
    return 0;
}

/* Collective: 0 when no rank failed, else this rank's code (or a failure). */
static int agree_errors(dist_bench *b, int code)
{
    int any = code != 0;
    fxt_world_allreduce(&b->world, &any, 1, MPI_INT, MPI_MAX, "agreeing on errors");
    return any ? (code ? code : FXT_EXIT_FAILURE) : 0;
}

/* The problem on every rank, this rank's shards, and the two local plans. */
static int bench_setup(dist_bench *b, const bench_opts *o)
{
    if (o->seq < b->size) {
        /* The same options on every rank (agreed): every rank stops here. */
        if (b->rank == 0)
            fxt_fail(FXT_EXIT_BAD_INPUT,
                     "bench: --seq %lld is shorter than the %d ranks (each times its own "
                     "query tokens, at least one)",
                     (long long)o->seq, b->size);
        return FXT_EXIT_BAD_INPUT;
    }
    b->threads = fxt_mpi_threads_per_rank(o->threads);
    /* Every rank makes the whole problem (fp32 q, k, v, out and, for 16-bit
     * runs, their copies), all-gathers K and V, and rank 0 keeps the
     * single-process output: about (16 + 2 es + 4 + 6) bytes per element. */
    const double n_elems = (double)o->seq * (double)o->heads * (double)o->dim;
    const double es = o->dtype == FXA_F32 ? 4.0 : 2.0;
    int code =
        fxt_check_memory(n_elems * (20.0 + 2.0 * es + (o->dtype == FXA_F32 ? 0.0 : 6.0)),
                         fxt_mpi_node_ranks(), "bench: this rank's copies of q, k, v and out");
    if (!code)
        code = fxt_workload_sequence(o->seq, o->heads, o->dim, o->dtype, &b->w);
    b->d = b->w.d;
    b->d.compute = o->compute;
    b->es = o->dtype == FXA_F32 ? 4 : 2;
    b->row = (int)(o->heads * o->dim);
    fxa_mpi_shard(b->d.seq_q, b->size, b->rank, &b->q0, &b->qn);
    fxa_mpi_shard(b->d.seq_kv, b->size, b->rank, &b->k0, &b->kn);
    fxa_attn_desc dl = b->d; /* this rank's queries, every key */
    dl.seq_q = b->qn;
    if (!code)
        code = fxt_runner_init(&b->local, b->threads, &dl);
    if (!code && b->rank == 0)
        code = fxt_runner_init(&b->single, b->threads, &b->d);
    /* Setup failures are local: agree before the first collective. */
    return agree_errors(b, code);
}

/* Collective: the grid (given or planned), the distributed plan and the buffers. */
static int bench_plan(dist_bench *b, const bench_opts *o)
{
    fxa_mpi_params_init(&b->mp);
    b->mp.ulysses = (int)o->cp.ulysses;
    b->mp.ring = (int)o->cp.ring;
    if (o->cp.grid) {
        /* Collective; its errors are the same on every rank. */
        fxt_fail_capture(b->world.msg, sizeof b->world.msg);
        const int code = fxt_mpi_grid_auto(&b->world, "--grid", o->cp.grid, &b->d, b->threads,
                                           &b->mp.ulysses, &b->mp.ring);
        fxt_fail_capture(NULL, 0);
        if (code)
            return code;
    }
    b->mp.ulysses = b->mp.ulysses > 0 ? b->mp.ulysses : 1;
    b->mp.prefetch = (int)o->cp.prefetch;
    b->mp.timeout_seconds = o->cp.timeout;
    fxt_world_guard("start-up");
    const fxa_status created = fxa_mpi_create(b->comm, b->local.ctx, &b->mp, &b->m);
    fxt_world_unguard();
    if (created != FXA_OK)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s", fxa_mpi_create_error());
    if (fxa_mpi_attn_plan_create(b->m, &b->d, &b->plan) != FXA_OK)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s", fxa_mpi_last_error(b->m));
    const size_t kv_bytes = (size_t)(b->d.seq_kv * b->row) * b->es;
    b->k_all = malloc(kv_bytes);
    b->v_all = malloc(kv_bytes);
    b->out_single = malloc((size_t)(b->d.seq_q * b->row) * sizeof(float));
    b->out_dist = malloc((size_t)(b->qn * b->row) * sizeof(float) + 1);
    b->out_gather = malloc((size_t)(b->qn * b->row) * sizeof(float) + 1);
    if (!b->k_all || !b->v_all || !b->out_single || !b->out_dist || !b->out_gather)
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory");
    return 0;
}

/* Collective: the three forms once each; their times in *ts (rank 0's), *td, *tg and *tg_comm
 * (the slowest rank's). */
static int bench_once(dist_bench *b, double *ts, double *td, double *tg, double *tg_comm)
{
    int code = 0;
    fxt_world_barrier(&b->world, "the single-rank run");
    double t0 = MPI_Wtime();
    if (b->rank == 0) {
        const fxa_attn_args a = {
            .struct_size = sizeof a, .q = b->w.q, .k = b->w.k, .v = b->w.v, .out = b->out_single};
        fxa_attn_stats st = {.struct_size = sizeof st};
        if (fxa_attn_run(b->single.plan, &a, b->single.workspace, &st) != FXA_OK)
            code = fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_last_error(b->single.ctx));
    }
    *ts = MPI_Wtime() - t0;
    const fxa_attn_args da = {.struct_size = sizeof da,
                              .q = (const char *)b->w.q + (size_t)(b->q0 * b->row) * b->es,
                              .k = (const char *)b->w.k + (size_t)(b->k0 * b->row) * b->es,
                              .v = (const char *)b->w.v + (size_t)(b->k0 * b->row) * b->es,
                              .out = b->out_dist};
    fxa_mpi_stats ms = {.struct_size = sizeof ms};
    fxt_world_barrier(&b->world, "the start of a run");
    t0 = MPI_Wtime();
    if (fxa_mpi_attn_run(b->plan, &da, &ms) != FXA_OK && !code)
        code = fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_mpi_last_error(b->m));
    *td = slowest(b, MPI_Wtime() - t0);
    fxt_world_barrier(&b->world, "the start of the all-gather run");
    *tg_comm = 0.0;
    t0 = MPI_Wtime();
    if (gather_run(b, &b->local, b->k_all, b->v_all, b->out_gather, tg_comm) != FXA_OK && !code)
        code = fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_last_error(b->local.ctx));
    *tg = slowest(b, MPI_Wtime() - t0);
    *tg_comm = slowest(b, *tg_comm);
    return agree_errors(b, code);
}

/* Collective: both distributed forms computed the same attention. */
static int bench_check(dist_bench *b)
{
    double diff = 0.0;
    double vmax = 0.0;
    for (int64_t i = 0; i < b->qn * b->row; i++) {
        const double e = fabs((double)b->out_dist[i] - (double)b->out_gather[i]);
        diff = e > diff ? e : diff;
    }
    for (int64_t i = 0; i < b->d.seq_kv * b->row; i++)
        vmax = fabs((double)b->w.v32[i]) > vmax ? fabs((double)b->w.v32[i]) : vmax;
    diff = slowest(b, diff);
    const double tol = (b->d.compute == FXA_COMPUTE_BF16 ? 0x1p-7 : 64 * 0x1p-24) * vmax;
    if (b->rank == 0)
        printf("check: fxattn vs all-gather max |diff| %.3g (tolerance %.3g)\n", diff, tol);
    if (!(diff <= tol))
        return fxt_fail(FXT_EXIT_FAILURE, "the distributed results differ by %g", diff);
    return 0;
}

/* Collective: repetition rep's times (rank 0's single time sent to all), and the slowest
 * rank's compute and wait per ring step. */
static void bench_record(dist_bench *b, int rep, double ts, double td, double tg, double tg_comm)
{
    bench_times *t = &b->t;
    t->single[rep] = ts;
    MPI_Request r;
    MPI_Ibcast(&t->single[rep], 1, MPI_DOUBLE, 0, b->comm, &r);
    fxt_world_wait(&b->world, &r, "the timings");
    t->dist[rep] = td;
    t->gather[rep] = tg;
    t->gather_comm[rep] = tg_comm;
    const double *step_c = NULL;
    const double *step_w = NULL;
    fxa_mpi_attn_step_times(b->plan, &t->n_steps, &step_c, &step_w);
    double c_sum = 0.0;
    double w_sum = 0.0;
    for (int s = 0; s < t->n_steps && s < MAX_STEPS; s++) {
        t->step_c[s][rep] = slowest(b, step_c[s]);
        t->step_w[s][rep] = slowest(b, step_w[s]);
        c_sum += step_c[s];
        w_sum += step_w[s];
    }
    t->wait_share[rep] = slowest(b, c_sum + w_sum > 0 ? w_sum / (c_sum + w_sum) : 0.0);
}

/* Rank 0: the medians of reps repetitions (sorting the times), as text and (--json) a JSON
 * line. */
static void bench_report(dist_bench *b, const bench_opts *o, int reps)
{
    bench_times *t = &b->t;
    const size_t n = (size_t)reps;
    const double gflop = fxa_attn_flops(&b->d) * 1e-9;
    const double ts = fxt_median(t->single, n);
    const double td = fxt_median(t->dist, n);
    const double tg = fxt_median(t->gather, n);
    const double tgc = fxt_median(t->gather_comm, n);
    const double ws = fxt_median(t->wait_share, n);
    const int ulysses = b->mp.ulysses;
    printf("fxattn bench (MPI): S=%lld heads=%lld D=%lld %s, %d ranks (Ulysses %d x ring %d), "
           "%d threads per rank, kernels %s, median of %d runs\n",
           (long long)o->seq, (long long)o->heads, (long long)o->dim, fxt_dtype_name(o->dtype),
           b->size, ulysses, b->size / ulysses, b->threads, fxa_ctx_isa(b->local.ctx), reps);
    for (int s = 0; s < t->n_steps && s < MAX_STEPS; s++) {
        const double c = fxt_median(t->step_c[s], n);
        const double w = fxt_median(t->step_w[s], n);
        printf("  ring step %d: compute %.4f s, waiting on MPI %.4f s (%.1f%% of the step)\n", s, c,
               w, 100.0 * w / (c + w));
    }
    printf("single rank : %8.3f s  %8.2f GFLOP/s\n", ts, gflop / ts);
    printf("fxattn      : %8.3f s  %8.2f GFLOP/s  efficiency %.3f  waiting %.1f%% of ring "
           "steps\n",
           td, gflop / td, ts / (b->size * td), 100.0 * ws);
    printf("all-gather  : %8.3f s  %8.2f GFLOP/s  efficiency %.3f  (all-gather %.3f s)\n", tg,
           gflop / tg, ts / (b->size * tg), tgc);
    printf("fxattn over all-gather: %.3fx\n", tg / td);
    if (o->json)
        fxt_json_printf("{\"seq\": %lld, \"heads\": %lld, \"dim\": %lld, \"dtype\": \"%s\", "
                        "\"ranks\": %d, \"ulysses\": %d, \"ring\": %d, \"threads_per_rank\": %d, "
                        "\"single_seconds\": %.6f, \"fxattn_seconds\": %.6f, "
                        "\"allgather_seconds\": %.6f, \"efficiency\": %.4f, "
                        "\"allgather_efficiency\": %.4f, \"wait_fraction\": %.4f}\n",
                        (long long)o->seq, (long long)o->heads, (long long)o->dim,
                        fxt_dtype_name(o->dtype), b->size, ulysses, b->size / ulysses, b->threads,
                        ts, td, tg, ts / (b->size * td), ts / (b->size * tg), ws);
}

static void bench_free(dist_bench *b)
{
    fxa_mpi_attn_plan_destroy(b->plan);
    fxa_mpi_destroy(b->m);
    fxt_runner_free(&b->single);
    fxt_runner_free(&b->local);
    free(b->k_all);
    free(b->v_all);
    free(b->out_single);
    free(b->out_dist);
    free(b->out_gather);
    fxt_workload_free(&b->w);
    if (b->comm != MPI_COMM_NULL)
        MPI_Comm_free(&b->comm);
}

/* Collective: warm-up with the result check (rep -1), then the timed repetitions. */
static int bench_runs(dist_bench *b, int reps)
{
    for (int rep = -1; rep < reps; rep++) {
        double ts, td, tg, tg_comm;
        int code = bench_once(b, &ts, &td, &tg, &tg_comm);
        if (!code && rep < 0)
            code = bench_check(b);
        if (code)
            return code;
        if (rep >= 0)
            bench_record(b, rep, ts, td, tg, tg_comm);
    }
    return 0;
}

int fxt_bench_mpi(const bench_opts *o)
{
    fxt_world world;
    int code = fxt_world_init(&world, o->cp.timeout);
    if (code)
        return code;
    fxt_fail_capture(NULL, 0); /* bench reports its errors on each rank */
    if ((code = agree_options(&world, o))) {
        fxt_world_finalize(&world);
        return code;
    }
    /* Large (the timings): not on the stack. */
    dist_bench *b = calloc(1, sizeof *b);
    if (!b) {
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory");
        fxt_world_finalize(&world);
        return code;
    }
    b->comm = MPI_COMM_NULL;
    code = bench_join(b, &world);
    if (!code)
        code = bench_setup(b, o);
    if (!code)
        code = bench_plan(b, o);
    if (!code)
        code = bench_runs(b, (int)o->repeats);
    if (!code && b->rank == 0)
        bench_report(b, o, (int)o->repeats);
    bench_free(b);
    free(b);
    fxt_world_finalize(&world);
    return code;
}
