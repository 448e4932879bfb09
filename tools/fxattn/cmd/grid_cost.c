/* The cost model of context-parallel attention (grid_cost.h, docs/cluster.md). */
#include "grid_cost.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_RANKS 4096

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static int host_of(const fxt_cost_model *m, int rank)
{
    return rank / (m->ranks / m->hosts);
}

int fxt_cost_model_check(const fxt_cost_model *m, char *err, size_t cap)
{
    const char *why = NULL;
    if (m->seq < 1 || m->heads < 1 || m->dim < 1)
        why = "the sequence, heads and head dim must be positive";
    else if (m->ranks < 1 || m->ranks > MAX_RANKS)
        why = "--ranks must be in [1, 4096]";
    else if (m->hosts < 1 || m->ranks % m->hosts)
        why = "--hosts must be positive and divide --ranks";
    else if (!(m->rank_flops > 0.0) || !isfinite(m->rank_flops))
        why = "the compute rate must be a positive, finite number of GFLOP/s";
    else if (!(m->inter.bandwidth > 0.0) || !(m->intra.bandwidth > 0.0) ||
             !isfinite(m->inter.bandwidth) || !isfinite(m->intra.bandwidth))
        why = "link bandwidths must be positive and finite";
    else if (!(m->inter.latency >= 0.0) || !(m->intra.latency >= 0.0) ||
             !isfinite(m->inter.latency) || !isfinite(m->intra.latency))
        why = "link latencies must be non-negative and finite";
    else if (!(m->inter.cpu_per_byte >= 0.0) || !(m->intra.cpu_per_byte >= 0.0) ||
             !isfinite(m->inter.cpu_per_byte) || !isfinite(m->intra.cpu_per_byte))
        why = "the links' CPU time per byte must be non-negative and finite";
    else if (!(m->call_seconds >= 0.0) || !isfinite(m->call_seconds))
        why = "the call overhead must be non-negative and finite";
    else if (m->ulysses_groups < 1 || m->ulysses_groups > 64)
        why = "the Ulysses head groups must be in [1, 64]";
    else if (m->n_step_rates < 0 || m->n_step_rates > FXT_MAX_STEP_RATES)
        why = "too many ring step rates";
    for (int i = 0; !why && i < m->n_step_rates; i++)
        if (!(m->step_flops[i] > 0.0) || !isfinite(m->step_flops[i]))
            why = "the compute rate must be a positive, finite number of GFLOP/s";
    if (why)
        snprintf(err, cap, "%s", why);
    return why != NULL;
}

int fxt_grid_rows_in_host(const fxt_cost_model *m, int ulysses)
{
    for (int r = 0; r < m->ranks; r += ulysses)
        if (host_of(m, r) != host_of(m, r + ulysses - 1))
            return 0;
    return 1;
}

/* CPU seconds per byte of a transfer that crosses hosts (the slower of the
 * two links) or stays inside one. */
static double link_cpu(const fxt_cost_model *m, int crosses)
{
    const double x = m->inter.cpu_per_byte, i = m->intra.cpu_per_byte;
    return crosses && x > i ? x : i;
}

/* One all-to-all inside every row of U ranks at once, each rank sending
 * `bytes` split evenly over the row: the latency of U - 1 messages, then
 * the busiest host's outgoing bytes over the inter-host link or the
 * busiest rank's bytes over the intra-host link, whichever is slower.
 * *cpu: the CPU seconds per byte of the slowest link a row uses. */
static double alltoall_seconds(const fxt_cost_model *m, int u, double bytes, double *cpu)
{
    *cpu = 0.0;
    if (u == 1)
        return 0.0;
    double *egress = calloc((size_t)m->hosts, sizeof *egress);
    double intra = 0.0;
    int crosses = 0;
    const double chunk = bytes / u;
    for (int a = 0; a < m->ranks; a++) {
        const int row0 = a / u * u;
        double local = 0.0;
        for (int b = row0; b < row0 + u; b++) {
            if (b == a)
                continue;
            if (host_of(m, a) != host_of(m, b)) {
                if (egress)
                    egress[host_of(m, a)] += chunk;
                crosses = 1;
            } else {
                local += chunk;
            }
        }
        intra = local > intra ? local : intra;
    }
    double out = 0.0;
    for (int h = 0; egress && h < m->hosts; h++)
        out = egress[h] > out ? egress[h] : out;
    free(egress);
    const double lat = (u - 1) * (crosses ? m->inter.latency : m->intra.latency);
    *cpu = link_cpu(m, crosses);
    const double t_out = out / m->inter.bandwidth;
    const double t_in = intra / m->intra.bandwidth;
    return lat + (t_out > t_in ? t_out : t_in);
}

/* One ring step on every column at once: each rank sends its K/V block
 * (`bytes`) to the next rank of its column; hops between hosts share the
 * sending host's link. *cpu: the CPU seconds per byte of the slowest hop. */
static double ring_step_seconds(const fxt_cost_model *m, int u, int r, double bytes, double *cpu)
{
    double *egress = calloc((size_t)m->hosts, sizeof *egress);
    int crosses = 0;
    for (int ri = 0; ri < r; ri++)
        for (int v = 0; v < u; v++) {
            const int src = ri * u + v;
            const int dst = (ri + 1) % r * u + v;
            if (host_of(m, src) != host_of(m, dst)) {
                if (egress)
                    egress[host_of(m, src)] += bytes;
                crosses = 1;
            }
        }
    double out = 0.0;
    for (int h = 0; egress && h < m->hosts; h++)
        out = egress[h] > out ? egress[h] : out;
    free(egress);
    const double t_out = crosses ? m->inter.latency + out / m->inter.bandwidth : 0.0;
    const double t_in = m->intra.latency + bytes / m->intra.bandwidth;
    *cpu = link_cpu(m, crosses);
    return t_out > t_in ? t_out : t_in;
}

/* The bound's one small all-gather per call: a latency per doubling. */
static double sync_seconds(const fxt_cost_model *m)
{
    const double lat = m->hosts > 1 ? m->inter.latency : m->intra.latency;
    return m->ranks > 1 ? ceil(log2((double)m->ranks)) * lat : 0.0;
}

/* The rate of a ring step of R: measured at its shape, else rank_flops. */
static double ring_step_rate(const fxt_cost_model *m, int r)
{
    for (int i = 0; i < m->n_step_rates; i++)
        if (m->step_ring[i] == r)
            return m->step_flops[i];
    return m->rank_flops;
}

fxt_grid_time fxt_grid_cost(const fxt_cost_model *m, int u, int r)
{
    const double d = (double)m->dim, h = (double)m->heads;
    /* The slowest rank: the longer token shard, the larger head share. */
    const double tokens = (double)ceil_div(m->seq, m->ranks);
    const double block = (double)ceil_div(m->seq, r);
    const double my_heads = (double)ceil_div(m->heads, u);
    const double flops = ring_step_rate(m, r);
    const double step_compute = 4.0 * my_heads * block * block * d / flops;
    double ring = step_compute;
    if (r > 1) {
        /* A step computes while its block goes out and the next comes in:
         * their CPU work adds to the compute. */
        const double kv_bytes = 2.0 * block * my_heads * d * m->elem_bytes;
        double cpu;
        const double step = ring_step_seconds(m, u, r, kv_bytes, &cpu);
        const double busy = step_compute + 2.0 * kv_bytes * cpu;
        ring += (r - 1) * (step > busy ? step : busy);
    }
    /* Ulysses: Q, K, V shards in; o (fp32) and 3 floats of row data back,
     * by G groups of heads. Compute-bound: the first group in, all the
     * compute, the last group back; link-bound: every group in and back,
     * and the last group's compute. */
    const int g =
        r == 1 && u > 1 ? (int)(my_heads < m->ulysses_groups ? my_heads : m->ulysses_groups) : 1;
    const double in_bytes = 3.0 * tokens * h * d * m->elem_bytes / g;
    const double back_bytes = tokens * h * (4.0 * d + 12.0) / g;
    double cpu;
    const double in = alltoall_seconds(m, u, in_bytes, &cpu);
    const double back = alltoall_seconds(m, u, back_bytes, &cpu);
    /* The g - 1 groups that travel during compute: a rank sends and
     * receives (U - 1) / U of each exchange. */
    const double overlapped = 2.0 * (g - 1) * (in_bytes + back_bytes) * (u - 1) / u;
    const double by_compute = in + ring + overlapped * cpu + back;
    const double by_link = g * (in + back) + ring / g;
    fxt_grid_time t = {u, r, 0.0, r * step_compute, 0.0, flops};
    t.seconds = (by_compute > by_link ? by_compute : by_link) + sync_seconds(m) + m->call_seconds;
    t.comm_seconds = t.seconds - t.compute_seconds;
    return t;
}

fxt_grid_time fxt_allgather_cost(const fxt_cost_model *m)
{
    /* All-gather K, then V, by recursive doubling (Open MPI's choice at
     * these sizes): ceil(log2 P) rounds; each host sends its n ranks'
     * shards to each of the P - n ranks elsewhere, and a rank takes in
     * P - 1 shards. */
    const double tokens = (double)ceil_div(m->seq, m->ranks);
    const double shard = tokens * (double)m->heads * (double)m->dim * m->elem_bytes;
    const int n = m->ranks / m->hosts;
    const double rounds = m->ranks > 1 ? ceil(log2((double)m->ranks)) : 0.0;
    const double lat = m->hosts > 1 ? m->inter.latency : m->intra.latency;
    const double t_out = (double)n * (m->ranks - n) * shard / m->inter.bandwidth;
    const double t_in = (m->ranks - 1) * shard / m->intra.bandwidth;
    const double gather = 2.0 * (rounds * lat + (t_out > t_in ? t_out : t_in));
    const double compute =
        4.0 * (double)m->heads * tokens * (double)m->seq * (double)m->dim / m->rank_flops;
    fxt_grid_time t = {0, 0, compute + gather, compute, gather, m->rank_flops};
    return t;
}

int fxt_grid_plan(const fxt_cost_model *m, fxt_grid_time *out, int cap, int *best)
{
    int n = 0;
    *best = 0;
    for (int u = 1; u <= m->ranks && n < cap; u++) {
        if (m->ranks % u)
            continue;
        out[n] = fxt_grid_cost(m, u, m->ranks / u);
        if (out[n].seconds < out[*best].seconds)
            *best = n;
        n++;
    }
    return n;
}
