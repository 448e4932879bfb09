/*
 * The planner under MPI (fxa_mpi_grid_plan, fxattn_mpi.h): which host each
 * rank is on (MPI_COMM_TYPE_SHARED), a ping-pong between grid rank 0 and
 * the first rank on another host and on rank 0's host (latency from 8-byte
 * messages, bandwidth from 4 MiB ones, CPU time per byte from a 4 MiB
 * exchange both ways), every rank's compute rate measured by all ranks at
 * once (so ranks that share cores measure their share), and the fixed cost
 * of a call on the context's grid; then the cost model (fxattn_grid.h).
 * Every wait polls against the context's deadline.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/struct_size.h"
#include "fxattn_grid.h"
#include "mpi_internal.h"

#define PING_SMALL 8
#define PING_LARGE (4 << 20)
#define TAG_PING 7
#define TAG_PONG 8
#define TAG_SWAP 9

typedef struct host_map {
    int hosts;
    int other; /* first grid rank on another host than rank 0, or -1 */
    int peer;  /* first other grid rank on rank 0's host, or -1 */
    int even;  /* every host runs P / N ranks */
} host_map;

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x;
    const double b = *(const double *)y;
    return (a > b) - (a < b);
}

static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return t[n / 2];
}

/* Collective: ranks leave together (a spinning barrier). */
static fxa_status together(fxa_mpi *m, const char *what)
{
    MPI_Request r;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    if (MPI_Ibarrier(m->comm, &r) != MPI_SUCCESS)
        return fxa_mpi_fail(m, FXA_ERR_MPI, "MPI_Ibarrier failed (%s)", what);
    return fxa_mpi_spin(m, 1, &r, -1, what);
}

static fxa_status map_hosts(fxa_mpi *m, host_map *hm)
{
    MPI_Comm node;
    *hm = (host_map){1, -1, -1, 1};
    fxa_status st = fxa_mpi_arrive(m, m->comm, "the planner grouping the ranks by host");
    if (st != FXA_OK)
        return st;
    if (MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS)
        return fxa_mpi_fail(m, FXA_ERR_MPI, "cannot tell which ranks share a host");
    /* A host is named by its lowest grid rank. */
    int name = m->rank;
    st = fxa_mpi_allreduce(m, MPI_IN_PLACE, &name, 1, MPI_INT, MPI_MIN, node,
                           "the planner's host map");
    MPI_Comm_free(&node);
    int *host = malloc((size_t)m->size * sizeof *host);
    if (st == FXA_OK)
        st = fxa_mpi_agree(m, host ? FXA_OK : FXA_ERR_NO_MEMORY, "out of memory mapping hosts");
    if (st == FXA_OK)
        st = fxa_mpi_allgather(m, &name, 1, host, MPI_INT, m->comm, "the planner's host map");
    hm->hosts = 0;
    for (int r = 0; st == FXA_OK && r < m->size; r++) {
        hm->hosts += host[r] == r;
        if (host[r] != host[0] && hm->other < 0)
            hm->other = r;
        if (r > 0 && host[r] == host[0] && hm->peer < 0)
            hm->peer = r;
    }
    for (int h = 0; st == FXA_OK && h < m->size; h++) {
        int n = 0;
        for (int r = 0; r < m->size; r++)
            n += host[r] == h;
        hm->even &= n == 0 || n * hm->hosts == m->size;
    }
    free(host);
    return st;
}

/* One-way seconds of `bytes` between ranks a and b: the minimum (small) or
 * median (large) over reps round trips after a warm-up. Other ranks return
 * at once. */
static fxa_status ping_pong(fxa_mpi *m, int a, int b, int bytes, int reps, char *buf,
                            double *seconds)
{
    *seconds = 0.0;
    if (m->rank != a && m->rank != b)
        return FXA_OK;
    const int peer = m->rank == a ? b : a;
    double t[32];
    fxa_status st = FXA_OK;
    for (int i = -1; st == FXA_OK && i < reps; i++) {
        MPI_Request req;
        const double t0 = MPI_Wtime();
        if (m->rank == a) {
            MPI_Isend(buf, bytes, MPI_BYTE, peer, TAG_PING, m->comm, &req);
            st = fxa_mpi_spin(m, 1, &req, peer, "the planner's ping");
            MPI_Irecv(buf, bytes, MPI_BYTE, peer, TAG_PONG, m->comm, &req);
        } else {
            MPI_Irecv(buf, bytes, MPI_BYTE, peer, TAG_PING, m->comm, &req);
            st = fxa_mpi_spin(m, 1, &req, peer, "the planner's ping");
            MPI_Isend(buf, bytes, MPI_BYTE, peer, TAG_PONG, m->comm, &req);
        }
        if (st == FXA_OK)
            st = fxa_mpi_spin(m, 1, &req, peer, "the planner's pong");
        if (i >= 0)
            t[i] = (MPI_Wtime() - t0) / 2.0;
    }
    if (st != FXA_OK)
        return st;
    if (bytes > PING_SMALL) {
        *seconds = median(t, reps);
        return FXA_OK;
    }
    *seconds = t[0];
    for (int i = 1; i < reps; i++)
        *seconds = t[i] < *seconds ? t[i] : *seconds;
    return FXA_OK;
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
 * after a warm-up. buf holds 2 PING_LARGE bytes. Other ranks return at
 * once. */
static fxa_status exchange_cpu(fxa_mpi *m, int a, int b, char *buf, double *per_byte)
{
    *per_byte = 0.0;
    if (m->rank != a && m->rank != b)
        return FXA_OK;
    const int peer = m->rank == a ? b : a;
    double t[3];
    fxa_status st = FXA_OK;
    for (int i = -1; st == FXA_OK && i < 3; i++) {
        MPI_Request req[2];
        const double c0 = process_cpu_seconds();
        MPI_Irecv(buf + PING_LARGE, PING_LARGE, MPI_BYTE, peer, TAG_SWAP, m->comm, &req[0]);
        MPI_Isend(buf, PING_LARGE, MPI_BYTE, peer, TAG_SWAP, m->comm, &req[1]);
        st = fxa_mpi_wait(m, 2, req, peer, "the planner's exchange");
        if (i >= 0)
            t[i] = (process_cpu_seconds() - c0) / (2.0 * PING_LARGE);
    }
    if (st == FXA_OK)
        *per_byte = median(t, 3);
    return st;
}

/* Latency, bandwidth and CPU time per byte between a and b (a's
 * measurements), known on every rank. */
static fxa_status measure_link(fxa_mpi *m, int a, int b, char *buf, fxa_grid_link *l)
{
    double lat = 0.0, big = 0.0, cpu = 0.0;
    fxa_status st = ping_pong(m, a, b, PING_SMALL, 20, buf, &lat);
    if (st == FXA_OK)
        st = ping_pong(m, a, b, PING_LARGE, 3, buf, &big);
    if (st == FXA_OK)
        st = exchange_cpu(m, a, b, buf, &cpu);
    if (st != FXA_OK)
        return st;
    double v[3] = {lat, big > 2.0 * lat ? PING_LARGE / (big - lat) : PING_LARGE / big, cpu};
    st = fxa_mpi_bcast(m, v, 3, MPI_DOUBLE, a, m->comm, "the planner's link measurement");
    if (st == FXA_OK)
        *l = (fxa_grid_link){v[0], v[1], v[2]};
    return st;
}

/* The links the job has, where model->measure asks for them. */
static fxa_status measure_links(fxa_mpi *m, const host_map *hm, fxa_grid_model *model,
                                unsigned *done)
{
    const unsigned want = model->measure;
    char *buf = calloc(2, PING_LARGE);
    fxa_status st = fxa_mpi_agree(m, buf ? FXA_OK : FXA_ERR_NO_MEMORY,
                                  "out of memory for the planner's ping-pong");
    const struct {
        int peer;
        fxa_grid_link *link;
        unsigned bw, cpu;
    } links[2] = {{hm->peer, &model->intra, FXA_GRID_MEASURE_INTRA, FXA_GRID_MEASURE_INTRA_CPU},
                  {hm->other, &model->inter, FXA_GRID_MEASURE_INTER, FXA_GRID_MEASURE_INTER_CPU}};
    for (int i = 0; st == FXA_OK && i < 2; i++) {
        if (links[i].peer < 0 || !(want & (links[i].bw | links[i].cpu)))
            continue;
        fxa_grid_link l;
        st = measure_link(m, 0, links[i].peer, buf, &l);
        if (st == FXA_OK && (want & links[i].bw)) {
            links[i].link->latency_seconds = l.latency_seconds;
            links[i].link->bytes_per_second = l.bytes_per_second;
            *done |= links[i].bw;
        }
        if (st == FXA_OK && (want & links[i].cpu)) {
            links[i].link->cpu_seconds_per_byte = l.cpu_seconds_per_byte;
            *done |= links[i].cpu;
        }
    }
    free(buf);
    return st;
}

/* Every rank's compute rates, measured at once; the slowest rank's, shared
 * among per_host ranks of the model's hosts instead of job_per_host. */
static fxa_status measure_compute(fxa_mpi *m, fxa_grid_model *model, int job_per_host, int per_host)
{
    fxa_status st = together(m, "the planner's compute measurement");
    if (st != FXA_OK)
        return st;
    st = fxa_grid_measure(m->ctx, model);
    st = fxa_mpi_agree(m, st, st == FXA_OK ? NULL : fxa_ctx_last_error(m->ctx));
    if (st == FXA_OK)
        st = fxa_mpi_allreduce(m, MPI_IN_PLACE, &model->rank_flops, 1, MPI_DOUBLE, MPI_MIN, m->comm,
                               "the planner's compute rates");
    if (st == FXA_OK)
        st = fxa_mpi_allreduce(m, MPI_IN_PLACE, model->step_flops, model->n_step_rates, MPI_DOUBLE,
                               MPI_MIN, m->comm, "the planner's compute rates");
    const double share = (double)job_per_host / per_host;
    model->rank_flops *= share;
    for (int i = 0; i < model->n_step_rates; i++)
        model->step_flops[i] *= share;
    return st;
}

/* The fixed cost of one call on m's grid: fxa_mpi_attn_run on a small
 * problem (min(S, 256 P) tokens, one head), the median of 3 runs after a
 * warm-up (the slowest rank's), less what the model predicts for it
 * without that cost; at least 0. */
static fxa_status measure_call(fxa_mpi *m, fxa_grid_model *model)
{
    fxa_grid_model c = *model;
    c.seq = model->seq < 256 * (int64_t)m->size ? model->seq : 256 * (int64_t)m->size;
    c.heads = 1;
    c.ranks = m->size;
    c.hosts = model->hosts > 0 && m->size % model->hosts == 0 ? model->hosts : 1;
    c.call_seconds = 0.0;
    c.n_step_rates = 0;
    fxa_attn_desc d;
    fxa_attn_desc_init(&d);
    d.batch = d.heads_q = d.heads_kv = 1;
    d.seq_q = d.seq_kv = c.seq;
    d.head_dim = c.head_dim;
    d.dtype = c.dtype;
    d.compute = FXA_COMPUTE_AUTO;
    int64_t s0, n;
    fxa_mpi_shard(c.seq, m->size, m->rank, &s0, &n);
    const size_t count = (size_t)(n * c.head_dim);
    float *x = malloc((count + 1) * sizeof *x);
    uint16_t *h = c.dtype == FXA_F32 ? NULL : malloc((count + 1) * sizeof *h);
    float *out = malloc((count + 1) * sizeof *out);
    fxa_status st = x && out && (h || c.dtype == FXA_F32) ? FXA_OK : FXA_ERR_NO_MEMORY;
    for (size_t i = 0; st == FXA_OK && i < count; i++) /* small, varied, finite */
        x[i] = (float)((i * 2654435761u + (size_t)s0) % 997) / 498.5f - 1.0f;
    if (st == FXA_OK && h)
        st = fxa_convert_f32(x, c.dtype, h, count);
    fxa_mpi_attn_plan *plan = NULL;
    st = fxa_mpi_agree(m, st, "out of memory measuring the call");
    if (st == FXA_OK)
        st = fxa_mpi_attn_plan_create(m, &d, &plan);
    const void *in = h ? (const void *)h : (const void *)x;
    const fxa_attn_args a = {.struct_size = sizeof a, .q = in, .k = in, .v = in, .out = out};
    double t[4];
    for (int i = 0; st == FXA_OK && i < 4; i++) {
        st = together(m, "the planner's call measurement");
        const double t0 = MPI_Wtime();
        if (st == FXA_OK)
            st = fxa_mpi_attn_run(plan, &a, NULL);
        t[i] = MPI_Wtime() - t0;
        if (st == FXA_OK)
            st = fxa_mpi_allreduce(m, MPI_IN_PLACE, &t[i], 1, MPI_DOUBLE, MPI_MAX, m->comm,
                                   "the planner's call measurement");
    }
    fxa_grid_time pred = {.struct_size = sizeof pred};
    if (st == FXA_OK && fxa_grid_cost(&c, m->ulysses, m->ring, &pred, NULL, 0) == FXA_OK) {
        const double extra = median(t + 1, 3) - pred.seconds;
        model->call_seconds = extra > 0.0 ? extra : 0.0;
    }
    fxa_mpi_attn_plan_destroy(plan);
    free(x);
    free(h);
    free(out);
    return st;
}

/* Everything model->measure asks for; *done: what was measured. */
static fxa_status plan_measure(fxa_mpi *m, fxa_grid_model *model, unsigned *done)
{
    host_map hm;
    fxa_status st = map_hosts(m, &hm);
    if (st != FXA_OK)
        return st;
    *done = hm.even ? 0u : (unsigned)FXA_GRID_UNEVEN_HOSTS;
    st = measure_links(m, &hm, model, done);
    if (st != FXA_OK)
        return st;
    const int job_per_host = m->size / hm.hosts;
    model->ranks = model->ranks > 0 ? model->ranks : m->size;
    model->hosts = model->hosts > 0 ? model->hosts : hm.hosts;
    if (model->ranks < 1 || model->ranks > 4096 || model->hosts < 1 || model->ranks % model->hosts)
        return fxa_mpi_fail(m, FXA_ERR_INVALID_ARG,
                            "fxa_grid_model: %d hosts do not divide %d ranks (at most 4096)",
                            model->hosts, model->ranks);
    const int per_host = model->ranks / model->hosts;
    if (model->measure & FXA_GRID_MEASURE_COMPUTE) {
        if ((st = measure_compute(m, model, job_per_host, per_host)) != FXA_OK)
            return st;
        *done |= FXA_GRID_MEASURE_COMPUTE;
    }
    if ((model->measure & FXA_GRID_MEASURE_CALL) && m->size > 1) {
        if ((st = measure_call(m, model)) != FXA_OK)
            return st;
        *done |= FXA_GRID_MEASURE_CALL;
    }
    return FXA_OK;
}

/* A hash of the model's fields (not its padding). */
static uint64_t model_hash(const fxa_grid_model *g)
{
    const int64_t sizes[3] = {g->seq, g->heads, g->head_dim};
    const int ints[6] = {(int)g->dtype,     g->ranks,        g->hosts,
                         g->ulysses_groups, (int)g->measure, g->n_step_rates};
    const double reals[8] = {g->rank_flops,
                             g->call_seconds,
                             g->inter.latency_seconds,
                             g->inter.bytes_per_second,
                             g->inter.cpu_seconds_per_byte,
                             g->intra.latency_seconds,
                             g->intra.bytes_per_second,
                             g->intra.cpu_seconds_per_byte};
    uint64_t h = fxa_mpi_hash(0, sizes, sizeof sizes);
    h = fxa_mpi_hash(h, ints, sizeof ints);
    h = fxa_mpi_hash(h, reals, sizeof reals);
    const int n =
        g->n_step_rates > 0 && g->n_step_rates <= FXA_GRID_MAX_STEP_RATES ? g->n_step_rates : 0;
    h = fxa_mpi_hash(h, g->step_ring, (size_t)n * sizeof g->step_ring[0]);
    return fxa_mpi_hash(h, g->step_flops, (size_t)n * sizeof g->step_flops[0]);
}

fxa_status fxa_mpi_grid_plan(fxa_mpi *m, fxa_grid_model *model, fxa_grid_time *best)
{
    if (!m)
        return FXA_ERR_INVALID_ARG;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    m->last_error[0] = '\0';
    fxa_grid_model g;
    fxa_grid_model_init(&g);
    char msg[256] = "";
    fxa_status st = FXA_ERR_INVALID_ARG;
    if (!model || !best)
        snprintf(msg, sizeof msg, "fxa_mpi_grid_plan: the model and best must not be NULL");
    else if ((st = fxa_struct_in(&g, sizeof g, model, FXA_GRID_MODEL_SIZE_0_3, "fxa_grid_model",
                                 msg, sizeof msg)) == FXA_OK)
        st = fxa_struct_size_check(fxa_struct_size_of(best), FXA_GRID_TIME_SIZE_0_3, sizeof *best,
                                   "fxa_grid_time", msg, sizeof msg);
    /* Every rank must plan the same model: a hash of it is compared. */
    const uint64_t hash = model_hash(&g);
    st = fxa_mpi_agree(m, st, msg);
    if (st == FXA_OK)
        st = fxa_mpi_same_everywhere(m, hash, "the planner's model");
    unsigned done = 0;
    if (st == FXA_OK)
        st = plan_measure(m, &g, &done);
    fxa_grid_time t = {.struct_size = sizeof t};
    if (st == FXA_OK && (st = fxa_grid_best(&g, &t, msg, sizeof msg)) != FXA_OK)
        fxa_mpi_fail(m, st, "%s", msg);
    if (st != FXA_OK)
        return st;
    g.measure = done;
    fxa_struct_out(model, &g, sizeof g);
    fxa_struct_out(best, &t, sizeof t);
    return FXA_OK;
}
