/* The planner's shared pieces (plan.h). */
#include "plan.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "runner.h"
#include "stats.h"
#include "workload.h"

#define MAX_GRIDS 128 /* divisors of at most 4096 ranks */

int fxt_plan_model_from_opts(const plan_opts *o, fxt_cost_model *m, fxt_plan_source *src)
{
    fxa_dtype dtype;
    if (fxt_parse_dtype(o->dtype, &dtype))
        return FXT_EXIT_BAD_INPUT;
    /* Each value times its unit (to bytes/s, FLOP/s or seconds) must stay
     * a finite double: the largest value taken is DBL_MAX / unit. */
    const struct {
        const char *name;
        double v;
        double min;  /* exclusive for rates, inclusive (0) for latencies */
        double unit; /* the factor to SI units */
    } num[] = {{"--link-gbps", o->link_gbps, 0.0, 1e9 / 8.0},
               {"--intra-gbps", o->intra_gbps, 0.0, 1e9 / 8.0},
               {"--gflops", o->gflops, 0.0, 1e9},
               {"--latency-us", o->latency_us, -1.0, 1e-6},
               {"--intra-latency-us", o->intra_latency_us, -1.0, 1e-6},
               {"--link-cpu-us-per-mb", o->link_cpu_us_per_mb, -1.0, 1e-12},
               {"--intra-cpu-us-per-mb", o->intra_cpu_us_per_mb, -1.0, 1e-12}};
    for (size_t i = 0; i < sizeof num / sizeof num[0]; i++) {
        const double v = num[i].v;
        const double max = num[i].unit > 1.0 ? DBL_MAX / num[i].unit : DBL_MAX;
        if (isnan(v))
            continue;
        if (num[i].min == 0.0 ? !(v > 0.0) : !(v >= 0.0))
            return fxt_fail(FXT_EXIT_BAD_INPUT, "plan %s %g: must be %s", num[i].name, v,
                            num[i].min == 0.0 ? "positive" : "non-negative");
        if (!isfinite(v * num[i].unit))
            return fxt_fail(FXT_EXIT_BAD_INPUT, "plan %s %g: out of range (at most %.4g)",
                            num[i].name, v, max);
    }
    const int given_inter = !isnan(o->link_gbps) || !isnan(o->latency_us);
    const int given_intra = !isnan(o->intra_gbps) || !isnan(o->intra_latency_us);
    src->inter = given_inter ? "given" : "assumed";
    src->intra = given_intra ? "given" : "assumed";
    const double gbps = isnan(o->link_gbps) ? FXT_PLAN_LINK_GBPS : o->link_gbps;
    const double lat = isnan(o->latency_us) ? FXT_PLAN_LATENCY_US : o->latency_us;
    const double igbps = isnan(o->intra_gbps) ? FXT_PLAN_INTRA_GBPS : o->intra_gbps;
    const double ilat =
        isnan(o->intra_latency_us) ? FXT_PLAN_INTRA_LATENCY_US : o->intra_latency_us;
    /* CPU time per byte: 0 unless given (or measured under mpirun). */
    const double cpu = isnan(o->link_cpu_us_per_mb) ? 0.0 : o->link_cpu_us_per_mb * 1e-12;
    const double icpu = isnan(o->intra_cpu_us_per_mb) ? 0.0 : o->intra_cpu_us_per_mb * 1e-12;
    *m = (fxt_cost_model){.seq = o->seq,
                          .heads = o->heads,
                          .dim = o->dim,
                          .elem_bytes = dtype == FXA_F32 ? 4.0 : 2.0,
                          .ranks = (int)o->ranks,
                          .hosts = o->hosts > 0 ? (int)o->hosts : 1,
                          .rank_flops = 0.0,
                          .inter = {lat * 1e-6, gbps * (1e9 / 8.0), cpu},
                          .intra = {ilat * 1e-6, igbps * (1e9 / 8.0), icpu},
                          .ulysses_groups = (int)o->ulysses_groups};
    return 0;
}

#define MEASURE_RUNS 5 /* timed runs of a compute rate, after a warm-up */

static int agree(const fxt_plan_sync *sync, int code)
{
    return sync ? sync->agree(sync->arg, code) : code;
}

/* The FLOP/s of `tokens` queries against kv keys (on the same synthetic
 * sequence as `bench`: its speed depends on the data), with as many of m's
 * heads as make about 1 GFLOP. */
static int measure_shape(const fxt_cost_model *m, fxa_dtype dtype, int threads,
                         const fxt_plan_sync *sync, int64_t tokens, int64_t kv, double *flops)
{
    const double per_head = 4.0 * (double)tokens * (double)kv * (double)m->dim;
    int64_t heads = (int64_t)ceil(1e9 / per_head);
    heads = heads < 1 ? 1 : heads > m->heads ? m->heads : heads;
    fxt_workload w = {0};
    fxt_runner r = {0};
    float *out = NULL;
    int code = fxt_workload_sequence(kv, heads, m->dim, dtype, &w);
    if (!code) {
        w.d.compute = dtype == FXA_BF16 ? FXA_COMPUTE_BF16 : FXA_COMPUTE_FP32;
        w.d.seq_q = tokens;
        code = fxt_runner_init(&r, threads, &w.d);
    }
    out = code ? NULL : malloc((size_t)(tokens * heads * m->dim) * sizeof(float));
    if (!code && !out)
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory measuring the compute rate");
    /* A warm-up, then 5 runs timed one by one, their median (ranks that
     * measure at once start each phase together, so that their runs
     * overlap). */
    const fxa_attn_args a = {.struct_size = sizeof a, .q = w.q, .k = w.k, .v = w.v, .out = out};
    fxa_attn_stats st = {.struct_size = sizeof st};
    double t[MEASURE_RUNS];
    code = agree(sync, code);
    if (!code)
        code = fxt_runner_run(&r, &a, &st, 0);
    code = agree(sync, code);
    for (int i = 0; !code && i < MEASURE_RUNS; i++) {
        const double t0 = fxt_now();
        code = fxt_runner_run(&r, &a, &st, 0);
        t[i] = fxt_now() - t0;
    }
    code = agree(sync, code);
    if (!code)
        *flops = fxa_attn_flops(&w.d) / fxt_median(t, MEASURE_RUNS);
    free(out);
    fxt_runner_free(&r);
    fxt_workload_free(&w);
    return code;
}

int fxt_plan_measure_flops(const fxt_cost_model *m, fxa_dtype dtype, int threads,
                           const fxt_plan_sync *sync, double *flops)
{
    /* Rank 0's queries against every key, as in all-gather + local. */
    const int64_t kv = m->seq < 8192 ? m->seq : 8192;
    const int64_t tokens = (m->seq + m->ranks - 1) / m->ranks;
    return measure_shape(m, dtype, threads, sync, tokens < kv ? tokens : kv, kv, flops);
}

int fxt_plan_measure_steps(fxt_cost_model *m, fxa_dtype dtype, int threads,
                           const fxt_plan_sync *sync)
{
    m->n_step_rates = 0;
    for (int r = 1; r <= m->ranks && m->n_step_rates < FXT_MAX_STEP_RATES; r++) {
        if (m->ranks % r)
            continue;
        int64_t block = (m->seq + r - 1) / r;
        block = block < 8192 ? block : 8192;
        double flops = 0.0;
        const int code = measure_shape(m, dtype, threads, sync, block, block, &flops);
        if (code)
            return code;
        m->step_ring[m->n_step_rates] = r;
        m->step_flops[m->n_step_rates++] = flops;
    }
    return 0;
}

static const char *kind_of(const fxt_grid_time *g)
{
    if (g->ulysses == 0)
        return "allgather";
    if (g->ulysses > 1 && g->ring > 1)
        return "2d";
    return g->ulysses > 1 ? "ulysses" : g->ring > 1 ? "ring" : "single";
}

int fxt_plan_print(const fxt_cost_model *m, const fxt_plan_source *src, int json)
{
    fxt_grid_time g[MAX_GRIDS + 1];
    int best = 0;
    const int n = fxt_grid_plan(m, g, MAX_GRIDS, &best);
    g[n] = fxt_allgather_cost(m);
    const int per_host = m->ranks / m->hosts;
    const int inside = fxt_grid_rows_in_host(m, g[best].ulysses);
    if (json) {
        printf("[\n");
        for (int i = 0; i <= n; i++)
            fxt_json_printf("{\"kind\": \"%s\", \"ulysses\": %d, \"ring\": %d, \"seconds\": %.6g, "
                            "\"compute_seconds\": %.6g, \"comm_seconds\": %.6g, "
                            "\"gflops\": %.6g, \"rows_in_host\": %s},\n",
                            kind_of(&g[i]), g[i].ulysses, g[i].ring, g[i].seconds,
                            g[i].compute_seconds, g[i].comm_seconds, g[i].flops * 1e-9,
                            i < n && fxt_grid_rows_in_host(m, g[i].ulysses) ? "true" : "false");
        fxt_json_printf(
            "{\"best\": {\"ulysses\": %d, \"ring\": %d}, \"seconds\": %.6g, \"seq\": %lld, "
            "\"heads\": %lld, \"dim\": %lld, \"ranks\": %d, \"hosts\": %d, \"ranks_per_host\": %d, "
            "\"rank_gflops\": %.6g, \"link_gbps\": %.6g, \"latency_us\": %.6g, "
            "\"intra_gbps\": %.6g, \"intra_latency_us\": %.6g, \"link_cpu_us_per_mb\": %.6g, "
            "\"intra_cpu_us_per_mb\": %.6g, \"ulysses_groups\": %d, \"call_ms\": %.6g, "
            "\"compute_source\": \"%s\", \"link_source\": \"%s\", \"intra_source\": \"%s\"}\n]\n",
            g[best].ulysses, g[best].ring, g[best].seconds, (long long)m->seq, (long long)m->heads,
            (long long)m->dim, m->ranks, m->hosts, per_host, m->rank_flops * 1e-9,
            m->inter.bandwidth * 8e-9, m->inter.latency * 1e6, m->intra.bandwidth * 8e-9,
            m->intra.latency * 1e6, m->inter.cpu_per_byte * 1e12, m->intra.cpu_per_byte * 1e12,
            m->ulysses_groups, m->call_seconds * 1e3, src->compute, src->inter, src->intra);
        return g[best].ulysses;
    }
    printf("fxattn plan: S=%lld heads=%lld D=%lld, %d ranks on %d hosts (%d per host)\n"
           "  compute %.2f GFLOP/s per rank (%s)\n"
           "  between hosts %.4g Gbit/s, %.3g us, %.3g CPU us per MB (%s); inside a host %.4g "
           "Gbit/s, %.3g us, %.3g CPU us per MB (%s)\n"
           "  pure Ulysses pipelined by %d head groups; %.3g ms per call\n",
           (long long)m->seq, (long long)m->heads, (long long)m->dim, m->ranks, m->hosts, per_host,
           m->rank_flops * 1e-9, src->compute, m->inter.bandwidth * 8e-9, m->inter.latency * 1e6,
           m->inter.cpu_per_byte * 1e12, src->inter, m->intra.bandwidth * 8e-9,
           m->intra.latency * 1e6, m->intra.cpu_per_byte * 1e12, src->intra, m->ulysses_groups,
           m->call_seconds * 1e3);
    if (m->n_step_rates > 0) {
        printf("  at each grid's step shape (ceil(S/R) queries and keys):");
        for (int i = 0; i < m->n_step_rates; i++)
            printf("%s R=%d %.2f", i ? "," : "", m->step_ring[i], m->step_flops[i] * 1e-9);
        printf(" GFLOP/s per rank\n");
    }
    printf("  %-22s %10s %10s %10s\n", "grid", "seconds", "compute", "comm");
    for (int i = 0; i <= n; i++) {
        char name[64];
        if (i < n)
            snprintf(name, sizeof name, "Ulysses %d x ring %d%s", g[i].ulysses, g[i].ring,
                     i == best ? " *" : "");
        else
            snprintf(name, sizeof name, "all-gather + local");
        printf("  %-22s %10.4f %10.4f %10.4f\n", name, g[i].seconds, g[i].compute_seconds,
               g[i].comm_seconds);
    }
    printf("best: Ulysses %d x ring %d (%.4f s): grid ranks grouped by host, %d per host, %s\n",
           g[best].ulysses, g[best].ring, g[best].seconds, per_host,
           inside ? "each Ulysses group inside one host" : "Ulysses groups span hosts");
    return g[best].ulysses;
}
