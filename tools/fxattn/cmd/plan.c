/* The planner's shared pieces (plan.h). */
#include "plan.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

#define MAX_GRIDS 128 /* divisors of at most 4096 ranks */

int fxt_plan_model_from_opts(const plan_opts *o, fxa_grid_model *m, fxt_plan_source *src)
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
    fxa_grid_model_init(m);
    /* Given figures replace the library's defaults; CPU time per byte is 0
     * unless given (or measured under mpirun). */
    if (!isnan(o->link_gbps))
        m->inter.bytes_per_second = o->link_gbps * (1e9 / 8.0);
    if (!isnan(o->latency_us))
        m->inter.latency_seconds = o->latency_us * 1e-6;
    if (!isnan(o->intra_gbps))
        m->intra.bytes_per_second = o->intra_gbps * (1e9 / 8.0);
    if (!isnan(o->intra_latency_us))
        m->intra.latency_seconds = o->intra_latency_us * 1e-6;
    if (!isnan(o->link_cpu_us_per_mb))
        m->inter.cpu_seconds_per_byte = o->link_cpu_us_per_mb * 1e-12;
    if (!isnan(o->intra_cpu_us_per_mb))
        m->intra.cpu_seconds_per_byte = o->intra_cpu_us_per_mb * 1e-12;
    m->seq = o->seq;
    m->heads = o->heads;
    m->head_dim = o->dim;
    m->dtype = dtype;
    m->ranks = (int)o->ranks;
    m->hosts = (int)o->hosts;
    m->ulysses_groups = (int)o->ulysses_groups;
    m->measure = (given_inter ? 0u : FXA_GRID_MEASURE_INTER) |
                 (given_intra ? 0u : FXA_GRID_MEASURE_INTRA) |
                 (isnan(o->link_cpu_us_per_mb) ? FXA_GRID_MEASURE_INTER_CPU : 0u) |
                 (isnan(o->intra_cpu_us_per_mb) ? FXA_GRID_MEASURE_INTRA_CPU : 0u) |
                 (isnan(o->gflops) ? FXA_GRID_MEASURE_COMPUTE : 0u) | FXA_GRID_MEASURE_CALL;
    return 0;
}

static const char *kind_of(const fxa_grid_time *g)
{
    if (g->ulysses == 0)
        return "allgather";
    if (g->ulysses > 1 && g->ring > 1)
        return "2d";
    return g->ulysses > 1 ? "ulysses" : g->ring > 1 ? "ring" : "single";
}

/* Every grid of m (U ascending, then all-gather) into g (MAX_GRIDS + 1);
 * returns how many U x R grids and *best the fastest (the smaller U on
 * ties). 0 when m is out of range (why in err). */
static int all_grids(const fxa_grid_model *m, fxa_grid_time *g, int *best, char *err, size_t cap)
{
    int n = 0;
    *best = 0;
    for (int u = 1; u <= m->ranks && n < MAX_GRIDS; u++) {
        if (m->ranks % u)
            continue;
        g[n] = (fxa_grid_time){.struct_size = sizeof g[n]};
        if (fxa_grid_cost(m, u, m->ranks / u, &g[n], err, cap) != FXA_OK)
            return 0;
        if (g[n].seconds < g[*best].seconds)
            *best = n;
        n++;
    }
    g[n] = (fxa_grid_time){.struct_size = sizeof g[n]};
    return fxa_grid_cost(m, 0, 0, &g[n], err, cap) == FXA_OK ? n : 0;
}

/* 1 when every Ulysses row of U adjacent ranks lies on one host. */
static int rows_in_host(const fxa_grid_model *m, int ulysses)
{
    return ulysses > 0 && (m->ranks / m->hosts) % ulysses == 0;
}

int fxt_plan_print(const fxa_grid_model *m, const fxt_plan_source *src, int json, const char *what)
{
    fxa_grid_time g[MAX_GRIDS + 1];
    int best = 0;
    char err[200] = "";
    const int n = all_grids(m, g, &best, err, sizeof err);
    if (!n)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: %s", what, err);
    const int per_host = m->ranks / m->hosts;
    const int inside = rows_in_host(m, g[best].ulysses);
    if (json) {
        printf("[\n");
        for (int i = 0; i <= n; i++)
            fxt_json_printf("{\"kind\": \"%s\", \"ulysses\": %d, \"ring\": %d, \"seconds\": %.6g, "
                            "\"compute_seconds\": %.6g, \"comm_seconds\": %.6g, "
                            "\"gflops\": %.6g, \"rows_in_host\": %s},\n",
                            kind_of(&g[i]), g[i].ulysses, g[i].ring, g[i].seconds,
                            g[i].compute_seconds, g[i].comm_seconds, g[i].flops * 1e-9,
                            i < n && rows_in_host(m, g[i].ulysses) ? "true" : "false");
        fxt_json_printf(
            "{\"best\": {\"ulysses\": %d, \"ring\": %d}, \"seconds\": %.6g, \"seq\": %lld, "
            "\"heads\": %lld, \"dim\": %lld, \"ranks\": %d, \"hosts\": %d, \"ranks_per_host\": %d, "
            "\"rank_gflops\": %.6g, \"link_gbps\": %.6g, \"latency_us\": %.6g, "
            "\"intra_gbps\": %.6g, \"intra_latency_us\": %.6g, \"link_cpu_us_per_mb\": %.6g, "
            "\"intra_cpu_us_per_mb\": %.6g, \"ulysses_groups\": %d, \"call_ms\": %.6g, "
            "\"compute_source\": \"%s\", \"link_source\": \"%s\", \"intra_source\": \"%s\"}\n]\n",
            g[best].ulysses, g[best].ring, g[best].seconds, (long long)m->seq, (long long)m->heads,
            (long long)m->head_dim, m->ranks, m->hosts, per_host, m->rank_flops * 1e-9,
            m->inter.bytes_per_second * 8e-9, m->inter.latency_seconds * 1e6,
            m->intra.bytes_per_second * 8e-9, m->intra.latency_seconds * 1e6,
            m->inter.cpu_seconds_per_byte * 1e12, m->intra.cpu_seconds_per_byte * 1e12,
            m->ulysses_groups, m->call_seconds * 1e3, src->compute, src->inter, src->intra);
        return 0;
    }
    printf("fxattn plan: S=%lld heads=%lld D=%lld, %d ranks on %d hosts (%d per host)\n"
           "  compute %.2f GFLOP/s per rank (%s)\n"
           "  between hosts %.4g Gbit/s, %.3g us, %.3g CPU us per MB (%s); inside a host %.4g "
           "Gbit/s, %.3g us, %.3g CPU us per MB (%s)\n"
           "  pure Ulysses pipelined by %d head groups; %.3g ms per call\n",
           (long long)m->seq, (long long)m->heads, (long long)m->head_dim, m->ranks, m->hosts,
           per_host, m->rank_flops * 1e-9, src->compute, m->inter.bytes_per_second * 8e-9,
           m->inter.latency_seconds * 1e6, m->inter.cpu_seconds_per_byte * 1e12, src->inter,
           m->intra.bytes_per_second * 8e-9, m->intra.latency_seconds * 1e6,
           m->intra.cpu_seconds_per_byte * 1e12, src->intra, m->ulysses_groups,
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
    return 0;
}
