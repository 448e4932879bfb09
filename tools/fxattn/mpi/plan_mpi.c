/*
 * The planner's measurements under mpirun (docs/cluster.md), over the
 * job's own MPI_COMM_WORLD: which host each rank is on
 * (MPI_COMM_TYPE_SHARED), a ping-pong between rank 0 and the first rank
 * on another host and on rank 0's host (latency from 8-byte messages,
 * bandwidth from 4 MiB ones, CPU time per byte from a 4 MiB exchange both
 * ways), every rank's compute rate measured by all ranks at once (so ranks
 * that share cores measure their share) and the fixed cost of a call. Every
 * wait polls against the job's deadline (--timeout). Used by
 * `fxattn plan --measure` and by `--grid auto` of attn and bench.
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "fxattn_mpi.h"
#include "mpi_cli.h"
#include "plan.h"
#include "runner.h"
#include "stats.h"
#include "workload.h"

#define PING_SMALL 8
#define PING_LARGE (4 << 20)

typedef struct host_map {
    int hosts;
    int host0_other; /* first rank on another host than rank 0, or -1 */
    int host0_peer;  /* first other rank on rank 0's host, or -1 */
    int even;        /* every host runs P / N ranks */
} host_map;

static int map_hosts(fxt_world *w, host_map *hm)
{
    MPI_Comm node;
    fxt_world_barrier(w, "start-up"); /* every rank has arrived before the split */
    fxt_world_guard("start-up");
    const int split =
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    fxt_world_unguard();
    if (split != MPI_SUCCESS)
        return fxt_fail(FXT_EXIT_FAILURE, "plan: cannot tell which ranks share a host");
    int local = 0;
    MPI_Comm_rank(node, &local);
    int leader = local == 0;
    int index = 0;
    MPI_Request req;
    MPI_Iexscan(&leader, &index, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &req);
    fxt_world_wait(w, &req, "numbering the hosts");
    if (w->rank == 0)
        index = 0;
    MPI_Ibcast(&index, 1, MPI_INT, 0, node, &req);
    fxt_world_wait(w, &req, "numbering the hosts");
    MPI_Comm_free(&node);
    int *host = malloc((size_t)w->size * sizeof *host);
    int code = host ? 0 : fxt_fail(FXT_EXIT_FAILURE, "out of memory");
    if ((code = fxt_world_agree(w, code))) {
        free(host);
        return code;
    }
    MPI_Iallgather(&index, 1, MPI_INT, host, 1, MPI_INT, MPI_COMM_WORLD, &req);
    fxt_world_wait(w, &req, "numbering the hosts");
    hm->hosts = leader;
    fxt_world_allreduce(w, &hm->hosts, 1, MPI_INT, MPI_SUM, "numbering the hosts");
    hm->host0_other = hm->host0_peer = -1;
    hm->even = w->size % hm->hosts == 0;
    for (int r = 1; r < w->size; r++) {
        if (host[r] != host[0] && hm->host0_other < 0)
            hm->host0_other = r;
        if (host[r] == host[0] && hm->host0_peer < 0)
            hm->host0_peer = r;
    }
    for (int h = 0; hm->even && h < hm->hosts; h++) {
        int n = 0;
        for (int r = 0; r < w->size; r++)
            n += host[r] == h;
        hm->even = n == w->size / hm->hosts;
    }
    free(host);
    return 0;
}

/* One-way seconds of `bytes` between ranks a and b: the minimum (small)
 * or median (large) over reps round trips after a warm-up. Other ranks
 * return 0 at once. */
static double ping_pong(fxt_world *w, int a, int b, int bytes, int reps, char *buf)
{
    if (w->rank != a && w->rank != b)
        return 0.0;
    const int peer = w->rank == a ? b : a;
    double t[32];
    for (int i = -1; i < reps; i++) {
        MPI_Request req;
        const double t0 = MPI_Wtime();
        if (w->rank == a) {
            MPI_Isend(buf, bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &req);
            fxt_world_spin(w, &req, "the planner's ping");
            MPI_Irecv(buf, bytes, MPI_BYTE, peer, 8, MPI_COMM_WORLD, &req);
            fxt_world_spin(w, &req, "the planner's pong");
        } else {
            MPI_Irecv(buf, bytes, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &req);
            fxt_world_spin(w, &req, "the planner's ping");
            MPI_Isend(buf, bytes, MPI_BYTE, peer, 8, MPI_COMM_WORLD, &req);
            fxt_world_spin(w, &req, "the planner's pong");
        }
        if (i >= 0)
            t[i] = (MPI_Wtime() - t0) / 2.0;
    }
    if (bytes <= PING_SMALL) {
        double lo = t[0];
        for (int i = 1; i < reps; i++)
            lo = t[i] < lo ? t[i] : lo;
        return lo;
    }
    return fxt_median(t, (size_t)reps);
}

static double process_cpu_seconds(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* CPU seconds per byte a rank spends while a and b send each other
 * PING_LARGE bytes at once (as a ring step sends and receives), waiting
 * asleep so that only the transfer's own work counts: the median of 3
 * after a warm-up on a and b; other ranks return 0 at once. buf holds
 * 2 PING_LARGE bytes. */
static double exchange_cpu(fxt_world *w, int a, int b, char *buf)
{
    if (w->rank != a && w->rank != b)
        return 0.0;
    const int peer = w->rank == a ? b : a;
    double t[3];
    for (int i = -1; i < 3; i++) {
        MPI_Request req[2];
        const double c0 = process_cpu_seconds();
        MPI_Irecv(buf + PING_LARGE, PING_LARGE, MPI_BYTE, peer, 9, MPI_COMM_WORLD, &req[0]);
        MPI_Isend(buf, PING_LARGE, MPI_BYTE, peer, 9, MPI_COMM_WORLD, &req[1]);
        fxt_world_wait(w, &req[0], "the planner's exchange");
        fxt_world_wait(w, &req[1], "the planner's exchange");
        if (i >= 0)
            t[i] = (process_cpu_seconds() - c0) / (2.0 * PING_LARGE);
    }
    return fxt_median(t, 3);
}

/* Latency, bandwidth and CPU time per byte between a and b (a's
 * measurements), known on every rank. */
static void measure_link(fxt_world *w, int a, int b, char *buf, fxt_link *l)
{
    const double lat = ping_pong(w, a, b, PING_SMALL, 20, buf);
    const double big = ping_pong(w, a, b, PING_LARGE, 3, buf);
    const double cpu = exchange_cpu(w, a, b, buf);
    double v[3] = {lat, big > 2.0 * lat ? PING_LARGE / (big - lat) : PING_LARGE / big, cpu};
    MPI_Request req;
    MPI_Ibcast(v, 3, MPI_DOUBLE, a, MPI_COMM_WORLD, &req);
    fxt_world_wait(w, &req, "the planner's link measurement");
    l->latency = v[0];
    l->bandwidth = v[1];
    l->cpu_per_byte = v[2];
}

/* The compute measurements' agreement (fxt_plan_sync): errors agreed,
 * then a spinning barrier so that every rank's runs start together. */
static int measure_agree(void *arg, int code)
{
    fxt_world *w = arg;
    if ((code = fxt_world_agree(w, code)))
        return code;
    fxt_world_barrier(w, "the planner's compute measurement");
    return 0;
}

/* The fixed cost of one distributed call: fxa_mpi_attn_run on the ring of
 * P ranks on a small problem (min(S, 256 P) tokens, one head), the median
 * of 3 runs after a warm-up (the slowest rank's), less what the model
 * predicts for it without that cost; at least 0. */
static int measure_call(fxt_world *w, fxa_dtype dtype, int threads, fxt_cost_model *m)
{
    fxt_cost_model c = *m;
    c.seq = m->seq < 256 * (int64_t)w->size ? m->seq : 256 * (int64_t)w->size;
    c.heads = 1;
    c.call_seconds = 0.0;
    c.n_step_rates = 0; /* the small problem at the one rate, as before */
    fxt_wan_synth p;
    fxt_wan_synth_defaults(&p);
    p.frames = 1;
    p.height = 1;
    p.width = (int)c.seq;
    p.heads = 1;
    p.head_dim = (int)c.dim;
    fxt_workload wl;
    fxa_ctx *ctx = NULL;
    fxa_mpi *mpi = NULL;
    fxa_mpi_attn_plan *plan = NULL;
    float *out = NULL;
    int code = fxt_workload_make(&p, dtype, &wl);
    if (!code)
        code = fxt_context(threads, &ctx);
    if ((code = fxt_world_agree(w, code)))
        goto done;
    fxa_mpi_params mp;
    fxa_mpi_params_init(&mp);
    mp.timeout_seconds = w->timeout;
    fxt_world_guard("start-up");
    fxa_status st = fxa_mpi_create(MPI_COMM_WORLD, ctx, &mp, &mpi);
    fxt_world_unguard();
    if ((code = fxt_world_lib_fail(w, st, fxa_mpi_create_error())))
        goto done;
    wl.d.compute = dtype == FXA_BF16 ? FXA_COMPUTE_BF16 : FXA_COMPUTE_FP32;
    st = fxa_mpi_attn_plan_create(mpi, &wl.d, &plan);
    if ((code = fxt_world_lib_fail(w, st, fxa_mpi_last_error(mpi))))
        goto done;
    int64_t s0;
    int64_t n;
    fxa_mpi_shard(c.seq, w->size, fxa_mpi_rank(mpi), &s0, &n);
    const size_t es = dtype == FXA_F32 ? 4 : 2;
    const size_t off = (size_t)(s0 * c.dim) * es;
    out = malloc((size_t)(n * c.dim) * sizeof(float) + 1);
    code = out ? 0 : fxt_fail(FXT_EXIT_FAILURE, "out of memory");
    if ((code = fxt_world_agree(w, code)))
        goto done;
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = (const char *)wl.q + off,
                             .k = (const char *)wl.k + off,
                             .v = (const char *)wl.v + off,
                             .out = out};
    double t[4];
    for (int i = 0; i < 4; i++) {
        fxt_world_barrier(w, "the planner's call measurement");
        const double t0 = MPI_Wtime();
        st = fxa_mpi_attn_run(plan, &a, NULL);
        if ((code = fxt_world_lib_fail(w, st, fxa_mpi_last_error(mpi))))
            goto done;
        t[i] = MPI_Wtime() - t0;
        fxt_world_allreduce(w, &t[i], 1, MPI_DOUBLE, MPI_MAX, "the planner's call measurement");
    }
    const double extra = fxt_median(t + 1, 3) - fxt_grid_cost(&c, 1, w->size).seconds;
    m->call_seconds = extra > 0.0 ? extra : 0.0;
done:
    fxa_mpi_attn_plan_destroy(plan);
    fxa_mpi_destroy(mpi);
    fxa_ctx_destroy(ctx);
    free(out);
    fxt_workload_free(&wl);
    return code;
}

/* Collective: measure what m's ranks, hosts, rank rate and links need and
 * fill them (given options, when not NaN, win over measurements). */
static int plan_measure(fxt_world *w, const plan_opts *o, fxa_dtype dtype, int threads,
                        fxt_cost_model *m, fxt_plan_source *src, int *even)
{
    host_map hm;
    int code = map_hosts(w, &hm);
    if ((code = fxt_world_agree(w, code)))
        return code;
    *even = hm.even;
    char *buf = calloc(2, PING_LARGE);
    code = buf ? 0 : fxt_fail(FXT_EXIT_FAILURE, "out of memory for the ping-pong");
    if ((code = fxt_world_agree(w, code))) {
        free(buf);
        return code;
    }
    fxt_link inter = m->inter;
    fxt_link intra = m->intra;
    if (hm.host0_peer > 0)
        measure_link(w, 0, hm.host0_peer, buf, &intra);
    if (hm.host0_other > 0)
        measure_link(w, 0, hm.host0_other, buf, &inter);
    free(buf);
    if (isnan(o->link_gbps) && isnan(o->latency_us) && hm.host0_other > 0) {
        m->inter.latency = inter.latency;
        m->inter.bandwidth = inter.bandwidth;
        src->inter = "measured";
    }
    if (isnan(o->intra_gbps) && isnan(o->intra_latency_us) && hm.host0_peer > 0) {
        m->intra.latency = intra.latency;
        m->intra.bandwidth = intra.bandwidth;
        src->intra = "measured";
    }
    /* CPU time per byte: given, else measured (links this job has). */
    if (isnan(o->link_cpu_us_per_mb) && hm.host0_other > 0)
        m->inter.cpu_per_byte = inter.cpu_per_byte;
    if (isnan(o->intra_cpu_us_per_mb) && hm.host0_peer > 0)
        m->intra.cpu_per_byte = intra.cpu_per_byte;
    const int job_per_host = w->size / hm.hosts;
    m->ranks = o->ranks > 0 ? (int)o->ranks : w->size;
    m->hosts = o->hosts > 0 ? (int)o->hosts : hm.hosts;
    const int per_host = m->hosts > 0 && m->ranks % m->hosts == 0 ? m->ranks / m->hosts : 1;
    if (!isnan(o->gflops)) {
        m->rank_flops = o->gflops * 1e9 / per_host;
        src->compute = "--gflops split among a host's ranks";
        return w->size > 1 ? measure_call(w, dtype, threads, m) : 0;
    }
    double flops = 0.0;
    const fxt_plan_sync sync = {measure_agree, w};
    code = fxt_plan_measure_flops(m, dtype, threads, &sync, &flops);
    if (!code)
        code = fxt_plan_measure_steps(m, dtype, threads, &sync);
    if (code) /* agreed: every rank fails here */
        return code;
    fxt_world_allreduce(w, &flops, 1, MPI_DOUBLE, MPI_MIN, "the planner's compute rates");
    fxt_world_allreduce(w, m->step_flops, m->n_step_rates, MPI_DOUBLE, MPI_MIN,
                        "the planner's compute rates");
    /* Measured with job_per_host ranks computing on each host; a plan for
     * another count shares the host's rate among its own. */
    m->rank_flops = flops * job_per_host / per_host;
    for (int i = 0; i < m->n_step_rates; i++)
        m->step_flops[i] = m->step_flops[i] * job_per_host / per_host;
    src->compute = "measured per rank, all ranks at once (the slowest)";
    return w->size > 1 ? measure_call(w, dtype, threads, m) : 0;
}

int fxt_plan_mpi(const plan_opts *o)
{
    fxa_dtype dtype;
    if (fxt_parse_dtype(o->dtype, &dtype))
        return FXT_EXIT_BAD_INPUT;
    fxt_world w;
    int code = fxt_world_init(&w, 0.0);
    if (code)
        return code;
    plan_opts mine = *o;
    fxt_opt table[FXT_MAX_OPTS];
    fxt_plan_opts_table(&mine, table);
    if ((code = fxt_world_agree_options(&w, table))) {
        fxt_world_finalize(&w);
        return code;
    }
    fxt_cost_model m;
    fxt_plan_source src;
    int even = 1;
    code = fxt_plan_model_from_opts(o, &m, &src);
    if ((code = fxt_world_agree(&w, code)))
        goto done;
    const int threads = fxt_mpi_threads_per_rank(o->threads);
    if ((code = plan_measure(&w, o, dtype, threads, &m, &src, &even)))
        goto done;
    char err[200];
    if (fxt_cost_model_check(&m, err, sizeof err))
        code = fxt_fail(FXT_EXIT_BAD_INPUT, "plan: %s", err);
    if ((code = fxt_world_agree(&w, code)))
        goto done;
    if (w.rank == 0) {
        fxt_fail_capture(NULL, 0);
        fxt_plan_print(&m, &src, o->json);
        if (!even)
            fprintf(stderr, "fxattn: warning: this job's hosts run different numbers of ranks; "
                            "the plan assumes P / N on each\n");
    }
done:
    fxt_world_finalize(&w);
    return code;
}

int fxt_mpi_grid_auto(fxt_world *w, const char *opt, const char *grid, const fxa_attn_desc *d,
                      int threads, int *ulysses, int *ring)
{
    if (!grid)
        return 0;
    int code = 0;
    if (strcmp(grid, "auto") != 0)
        code =
            fxt_fail(FXT_EXIT_BAD_INPUT, "%s '%s': only 'auto' (the planner's choice)", opt, grid);
    else if (*ulysses > 0 || *ring > 0)
        code = fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s auto picks --ulysses and --ring: give one or the other", opt);
    plan_opts o;
    fxt_plan_opts_defaults(&o);
    o.seq = d->seq_kv;
    o.heads = d->heads_q;
    o.dim = d->head_dim;
    o.dtype = fxt_dtype_name(d->dtype);
    fxt_cost_model m;
    fxt_plan_source src;
    int even = 1;
    if (!code)
        code = fxt_plan_model_from_opts(&o, &m, &src);
    if ((code = fxt_world_agree(w, code)) ||
        (code = plan_measure(w, &o, d->dtype, threads, &m, &src, &even)))
        return code;
    fxt_grid_time g[128];
    int best = 0;
    char err[200];
    if (fxt_cost_model_check(&m, err, sizeof err))
        code = fxt_fail(FXT_EXIT_BAD_INPUT, "%s auto: %s", opt, err);
    if ((code = fxt_world_agree(w, code)))
        return code;
    /* Every rank holds the same model (measurements shared): the same pick. */
    fxt_grid_plan(&m, g, 128, &best);
    *ulysses = g[best].ulysses;
    *ring = g[best].ring;
    if (w->rank == 0)
        printf("grid auto: Ulysses %d x ring %d (predicted %.4f s; %d ranks on %d hosts, "
               "%.2f GFLOP/s per rank, between hosts %.4g Gbit/s %.3g us)\n",
               *ulysses, *ring, g[best].seconds, m.ranks, m.hosts, m.rank_flops * 1e-9,
               m.inter.bandwidth * 8e-9, m.inter.latency * 1e6);
    return 0;
}
