/* The cost model of context-parallel attention (fxattn_grid.h,
 * docs/cluster.md): pure arithmetic on a copied-in model. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/struct_size.h"
#include "fxattn_grid.h"

#define MAX_RANKS 4096

void fxa_grid_model_init(fxa_grid_model *m)
{
    if (!m)
        return;
    *m = (fxa_grid_model){.struct_size = sizeof *m,
                          .dtype = FXA_F32,
                          .inter = {20e-6, 10e9 / 8.0, 0.0},
                          .intra = {1e-6, 100e9 / 8.0, 0.0},
                          .ulysses_groups = 4,
                          .measure = FXA_GRID_MEASURE_ALL};
}

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static int host_of(const fxa_grid_model *m, int rank)
{
    return rank / (m->ranks / m->hosts);
}

static double elem_bytes(const fxa_grid_model *m)
{
    return m->dtype == FXA_F32 ? 4.0 : 2.0;
}

static int bad_link(const fxa_grid_link *l)
{
    return !(l->bytes_per_second > 0.0) || !isfinite(l->bytes_per_second);
}

/* NULL when m is usable, else why. */
static const char *model_error(const fxa_grid_model *m)
{
    if (m->seq < 1 || m->heads < 1 || m->head_dim < 1)
        return "the sequence, heads and head dim must be positive";
    if (m->dtype != FXA_F32 && m->dtype != FXA_BF16 && m->dtype != FXA_F16)
        return "unknown dtype";
    if (m->ranks < 1 || m->ranks > MAX_RANKS)
        return "the ranks must be in [1, 4096]";
    if (m->hosts < 1 || m->ranks % m->hosts)
        return "the hosts must be positive and divide the ranks";
    if (!(m->rank_flops > 0.0) || !isfinite(m->rank_flops))
        return "the compute rate must be a positive, finite number of FLOP/s";
    if (bad_link(&m->inter) || bad_link(&m->intra))
        return "link bandwidths must be positive and finite";
    if (!(m->inter.latency_seconds >= 0.0) || !(m->intra.latency_seconds >= 0.0) ||
        !isfinite(m->inter.latency_seconds) || !isfinite(m->intra.latency_seconds))
        return "link latencies must be non-negative and finite";
    if (!(m->inter.cpu_seconds_per_byte >= 0.0) || !(m->intra.cpu_seconds_per_byte >= 0.0) ||
        !isfinite(m->inter.cpu_seconds_per_byte) || !isfinite(m->intra.cpu_seconds_per_byte))
        return "the links' CPU time per byte must be non-negative and finite";
    if (!(m->call_seconds >= 0.0) || !isfinite(m->call_seconds))
        return "the call overhead must be non-negative and finite";
    if (m->ulysses_groups < 1 || m->ulysses_groups > 64)
        return "the Ulysses head groups must be in [1, 64]";
    if (m->n_step_rates < 0 || m->n_step_rates > FXA_GRID_MAX_STEP_RATES)
        return "too many ring step rates";
    for (int i = 0; i < m->n_step_rates; i++)
        if (!(m->step_flops[i] > 0.0) || !isfinite(m->step_flops[i]))
            return "the compute rate must be a positive, finite number of FLOP/s";
    return NULL;
}

/* CPU seconds per byte of a transfer that crosses hosts (the slower of the
 * two links) or stays inside one. */
static double link_cpu(const fxa_grid_model *m, int crosses)
{
    const double x = m->inter.cpu_seconds_per_byte, i = m->intra.cpu_seconds_per_byte;
    return crosses && x > i ? x : i;
}

/* The largest of the hosts' outgoing bytes. egress: one double per host, or
 * NULL when it could not be allocated (0 then). */
static double busiest(const double *egress, int hosts)
{
    double out = 0.0;
    for (int h = 0; egress && h < hosts; h++)
        out = egress[h] > out ? egress[h] : out;
    return out;
}

/* One all-to-all inside every row of U ranks at once, each rank sending
 * `bytes` split evenly over the row: the latency of U - 1 messages, then
 * the busiest host's outgoing bytes over the inter-host link or the
 * busiest rank's bytes over the intra-host link, whichever is slower.
 * *cpu: the CPU seconds per byte of the slowest link a row uses. */
static double alltoall_seconds(const fxa_grid_model *m, int u, double bytes, double *cpu)
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
    const double out = busiest(egress, m->hosts);
    free(egress);
    const double lat = (u - 1) * (crosses ? m->inter.latency_seconds : m->intra.latency_seconds);
    *cpu = link_cpu(m, crosses);
    const double t_out = out / m->inter.bytes_per_second;
    const double t_in = intra / m->intra.bytes_per_second;
    return lat + (t_out > t_in ? t_out : t_in);
}

/* One ring step on every column at once: each rank sends its K/V block
 * (`bytes`) to the next rank of its column; hops between hosts share the
 * sending host's link. *cpu: the CPU seconds per byte of the slowest hop. */
static double ring_step_seconds(const fxa_grid_model *m, int u, int r, double bytes, double *cpu)
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
    const double out = busiest(egress, m->hosts);
    free(egress);
    const double t_out = crosses ? m->inter.latency_seconds + out / m->inter.bytes_per_second : 0.0;
    const double t_in = m->intra.latency_seconds + bytes / m->intra.bytes_per_second;
    *cpu = link_cpu(m, crosses);
    return t_out > t_in ? t_out : t_in;
}

/* The bound's one small all-gather per call: a latency per doubling. */
static double sync_seconds(const fxa_grid_model *m)
{
    const double lat = m->hosts > 1 ? m->inter.latency_seconds : m->intra.latency_seconds;
    return m->ranks > 1 ? ceil(log2((double)m->ranks)) * lat : 0.0;
}

/* The rate of a ring step of R: measured at its shape, else rank_flops. */
static double ring_step_rate(const fxa_grid_model *m, int r)
{
    for (int i = 0; i < m->n_step_rates; i++)
        if (m->step_ring[i] == r)
            return m->step_flops[i];
    return m->rank_flops;
}

static fxa_grid_time grid_time(const fxa_grid_model *m, int u, int r)
{
    const double d = (double)m->head_dim, h = (double)m->heads, eb = elem_bytes(m);
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
        const double kv_bytes = 2.0 * block * my_heads * d * eb;
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
    const double in_bytes = 3.0 * tokens * h * d * eb / g;
    const double back_bytes = tokens * h * (4.0 * d + 12.0) / g;
    double cpu;
    const double in = alltoall_seconds(m, u, in_bytes, &cpu);
    const double back = alltoall_seconds(m, u, back_bytes, &cpu);
    /* The g - 1 groups that travel during compute: a rank sends and
     * receives (U - 1) / U of each exchange. */
    const double overlapped = 2.0 * (g - 1) * (in_bytes + back_bytes) * (u - 1) / u;
    const double by_compute = in + ring + overlapped * cpu + back;
    const double by_link = g * (in + back) + ring / g;
    fxa_grid_time t = {sizeof t, u, r, 0.0, r * step_compute, 0.0, flops};
    t.seconds = (by_compute > by_link ? by_compute : by_link) + sync_seconds(m) + m->call_seconds;
    t.comm_seconds = t.seconds - t.compute_seconds;
    return t;
}

static fxa_grid_time allgather_time(const fxa_grid_model *m)
{
    /* All-gather K, then V, by recursive doubling (Open MPI's choice at
     * these sizes): ceil(log2 P) rounds; each host sends its n ranks'
     * shards to each of the P - n ranks elsewhere, and a rank takes in
     * P - 1 shards. */
    const double tokens = (double)ceil_div(m->seq, m->ranks);
    const double shard = tokens * (double)m->heads * (double)m->head_dim * elem_bytes(m);
    const int n = m->ranks / m->hosts;
    const double rounds = m->ranks > 1 ? ceil(log2((double)m->ranks)) : 0.0;
    const double lat = m->hosts > 1 ? m->inter.latency_seconds : m->intra.latency_seconds;
    const double t_out = (double)n * (m->ranks - n) * shard / m->inter.bytes_per_second;
    const double t_in = (m->ranks - 1) * shard / m->intra.bytes_per_second;
    const double gather = 2.0 * (rounds * lat + (t_out > t_in ? t_out : t_in));
    const double compute =
        4.0 * (double)m->heads * tokens * (double)m->seq * (double)m->head_dim / m->rank_flops;
    fxa_grid_time t = {sizeof t, 0, 0, compute + gather, compute, gather, m->rank_flops};
    return t;
}

/* Copy the caller's model in over the defaults and check it, and check
 * out's struct_size; FXA_OK or FXA_ERR_INVALID_ARG with why in err. */
static fxa_status take(const fxa_grid_model *in, fxa_grid_model *m, const fxa_grid_time *out,
                       char *err, size_t cap)
{
    char msg[200] = "";
    fxa_status st = FXA_ERR_INVALID_ARG;
    if (!in || !out)
        snprintf(msg, sizeof msg, "the model and the output must not be NULL");
    else {
        fxa_grid_model_init(m);
        st = fxa_struct_in(m, sizeof *m, in, FXA_GRID_MODEL_SIZE_0_3, "fxa_grid_model", msg,
                           sizeof msg);
        if (st == FXA_OK)
            st = fxa_struct_size_check(fxa_struct_size_of(out), FXA_GRID_TIME_SIZE_0_3,
                                       sizeof(fxa_grid_time), "fxa_grid_time", msg, sizeof msg);
        const char *why = st == FXA_OK ? model_error(m) : NULL;
        if (why) {
            snprintf(msg, sizeof msg, "%s", why);
            st = FXA_ERR_INVALID_ARG;
        }
    }
    if (st != FXA_OK && err && cap)
        snprintf(err, cap, "%s", msg);
    return st;
}

fxa_status fxa_grid_cost(const fxa_grid_model *model, int ulysses, int ring, fxa_grid_time *out,
                         char *err, size_t cap)
{
    fxa_grid_model m;
    fxa_status st = take(model, &m, out, err, cap);
    if (st != FXA_OK)
        return st;
    fxa_grid_time t;
    if (ulysses == 0 && ring == 0) {
        t = allgather_time(&m);
    } else if (ulysses < 1 || ring < 1 || (int64_t)ulysses * ring != m.ranks) {
        if (err && cap)
            snprintf(err, cap, "the grid %d x %d is not one of %d ranks", ulysses, ring, m.ranks);
        return FXA_ERR_INVALID_ARG;
    } else {
        t = grid_time(&m, ulysses, ring);
    }
    fxa_struct_out(out, &t, sizeof t);
    return FXA_OK;
}

fxa_status fxa_grid_best(const fxa_grid_model *model, fxa_grid_time *out, char *err, size_t cap)
{
    fxa_grid_model m;
    fxa_status st = take(model, &m, out, err, cap);
    if (st != FXA_OK)
        return st;
    fxa_grid_time best = grid_time(&m, 1, m.ranks);
    for (int u = 2; u <= m.ranks; u++) {
        if (m.ranks % u)
            continue;
        const fxa_grid_time t = grid_time(&m, u, m.ranks / u);
        if (t.seconds < best.seconds)
            best = t;
    }
    fxa_struct_out(out, &best, sizeof best);
    return FXA_OK;
}
