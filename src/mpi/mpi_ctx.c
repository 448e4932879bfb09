/* The distributed context: communicators, grid, errors that every rank
 * agrees on. */
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/struct_size.h"
#include "mpi_internal.h"

static _Thread_local char g_create_error[512];

const char *fxa_mpi_create_error(void)
{
    return g_create_error;
}

void fxa_mpi_params_init(fxa_mpi_params *p)
{
    *p = (fxa_mpi_params){.struct_size = sizeof *p,
                          .ulysses = 1,
                          .ring = 0,
                          .prefetch = 0,
                          .timeout_seconds = 0.0,
                          .placement = FXA_MPI_PLACE_HOSTS};
}

/* The deadline in seconds from the params or fxa_mpi_default_timeout(); 0
 * with a reason in msg when it is not a positive number of seconds. */
static double pick_timeout(double param, char *msg, size_t cap)
{
    if (param != 0.0) {
        if (param > 0.0 && param <= 1e9)
            return param;
        snprintf(msg, cap,
                 param > 1e9 ? "timeout_seconds %g is longer than the longest deadline, 1e9 s"
                             : "timeout_seconds %g is not a positive number of seconds",
                 param);
        return 0.0;
    }
    const double t = fxa_mpi_default_timeout();
    if (t == 0.0)
        snprintf(msg, cap, "FXA_MPI_TIMEOUT=%s is not a number of seconds in (0, 1e9]",
                 getenv("FXA_MPI_TIMEOUT"));
    return t;
}

const char *fxa_mpi_last_error(const fxa_mpi *m)
{
    return m ? m->last_error : "";
}

void fxa_mpi_report(fxa_mpi *m, const char *msg)
{
    if (m && msg)
        snprintf(m->last_error, sizeof m->last_error, "%s", msg);
}

int fxa_mpi_rank(const fxa_mpi *m)
{
    return m->rank;
}

int fxa_mpi_size(const fxa_mpi *m)
{
    return m->size;
}

MPI_Comm fxa_mpi_comm(const fxa_mpi *m)
{
    return m->comm;
}

fxa_ctx *fxa_mpi_ctx(const fxa_mpi *m)
{
    return m->ctx;
}

fxa_status fxa_mpi_wait_on(fxa_mpi *m, int n, MPI_Request *reqs, const char *what)
{
    return fxa_mpi_wait(m, n, reqs, -1, what);
}

fxa_status fxa_mpi_check_same(fxa_mpi *m, const void *data, size_t n, const char *what)
{
    return fxa_mpi_same_everywhere(m, fxa_mpi_hash(0xcbf29ce484222325ull, data, n), what);
}

void fxa_mpi_split(int64_t n, int parts, int i, int64_t *lo, int64_t *hi)
{
    const int64_t base = n / parts;
    const int64_t extra = n % parts;
    *lo = (int64_t)i * base + (i < extra ? i : extra);
    *hi = *lo + base + (i < extra ? 1 : 0);
}

void fxa_mpi_shard(int64_t seq, int n_ranks, int rank, int64_t *start, int64_t *len)
{
    int64_t hi;
    fxa_mpi_split(seq, n_ranks, rank, start, &hi);
    *len = hi - *start;
}

void fxa_mpi_shard_of(const fxa_attn_desc *d, int64_t seq, int n_ranks, int rank, int64_t *start,
                      int64_t *len)
{
    if (d->reproducible)
        fxa_canonical_shard(seq, n_ranks, rank, start, len);
    else
        fxa_mpi_shard(seq, n_ranks, rank, start, len);
}

uint64_t fxa_mpi_hash(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

fxa_status fxa_mpi_agree_call(fxa_mpi *m, fxa_status local, const char *local_msg, uint64_t call)
{
    if (!m)
        return FXA_ERR_INVALID_ARG;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    /* One MAX over {P - the rank if it failed, else 0; call; ~call}: the
     * first picks the lowest failing rank, the others are equal exactly
     * when every rank passed the same call (max(c) == min(c) = ~max(~c)). */
    uint64_t in[3] = {local != FXA_OK ? (uint64_t)(m->size - m->rank) : 0, call, ~call};
    uint64_t mx[3] = {0, 0, 0};
    const fxa_status st =
        fxa_mpi_allreduce(m, in, mx, 3, MPI_UINT64_T, MPI_MAX, m->comm, "agreeing on errors");
    if (st != FXA_OK)
        return st;
    if (mx[1] != ~mx[2])
        return fxa_mpi_fail(m, FXA_ERR_INVALID_ARG,
                            "the ranks are in different calls or run different plans (every "
                            "rank must make the same collective calls, in the same order)");
    if (!mx[0])
        return FXA_OK;
    const int root = m->size - (int)mx[0];
    struct {
        int status;
        char msg[sizeof m->last_error - 16];
    } e;
    memset(&e, 0, sizeof e);
    if (m->rank == root) {
        e.status = (int)local;
        snprintf(e.msg, sizeof e.msg, "%s",
                 local_msg && *local_msg ? local_msg : fxa_status_str(local));
    }
    const fxa_status sb =
        fxa_mpi_bcast(m, &e, (int)sizeof e, MPI_BYTE, root, m->comm, "the failing rank's error");
    if (sb != FXA_OK)
        return sb;
    e.msg[sizeof e.msg - 1] = '\0';
    return fxa_mpi_fail(m, (fxa_status)e.status, "rank %d: %s", fxa_mpi_name(m, root), e.msg);
}

fxa_status fxa_mpi_agree(fxa_mpi *m, fxa_status local, const char *local_msg)
{
    return fxa_mpi_agree_call(m, local, local_msg, 0);
}

fxa_status fxa_mpi_name_ranks(fxa_mpi *m, int name)
{
    int *names = malloc((size_t)m->size * sizeof *names);
    if (!names)
        return fxa_mpi_fail(m, FXA_ERR_NO_MEMORY, "out of memory naming the ranks");
    const fxa_status st =
        fxa_mpi_allgather(m, &name, 1, names, MPI_INT, m->comm, "the ranks' names");
    if (st != FXA_OK) {
        free(names);
        return st;
    }
    free(m->names);
    m->names = names;
    return FXA_OK;
}

fxa_status fxa_mpi_same_everywhere(fxa_mpi *m, uint64_t hash, const char *what)
{
    uint64_t in[2] = {hash, ~hash};
    uint64_t mx[2];
    const fxa_status st = fxa_mpi_allreduce(m, in, mx, 2, MPI_UINT64_T, MPI_MAX, m->comm, what);
    if (st != FXA_OK)
        return st;
    /* max(h) == min(h) exactly when all ranks agree; min(h) = ~max(~h). */
    if (mx[0] != ~mx[1])
        return fxa_mpi_fail(m, FXA_ERR_INVALID_ARG, "ranks disagree on %s", what);
    return FXA_OK;
}

/* A positive integer from the environment variable name, else 0. */
static int64_t env_count(const char *name)
{
    const char *s = getenv(name);
    char *end = NULL;
    const long long x = s ? strtoll(s, &end, 10) : 0;
    return s && end != s && *end == '\0' && x > 0 ? (int64_t)x : 0;
}

/* Test only: FXA_MPI_TEST_HOSTS="L0,L1,..." gives each MPI_COMM_WORLD rank
 * r the host label Lr (an integer >= 0) in place of its shared-memory
 * group, so that one machine can test placement by hosts (give it to every
 * rank). -1 when unset; a rank past the list (or with a bad entry) is a
 * host of its own. */
static int test_host_label(void)
{
    const char *s = getenv("FXA_MPI_TEST_HOSTS");
    if (!s || !*s)
        return -1;
    int world_rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    for (int i = 0; i < world_rank && s; i++)
        if ((s = strchr(s, ',')))
            s++;
    const long label = s ? strtol(s, NULL, 10) : -1;
    const int own = 1 << 20; /* labels of ranks with a host of their own */
    return label >= 0 && label < own ? (int)label : own + world_rank % own;
}

/* Collective over m->comm: the grid rank of every rank under placement by
 * hosts (see fxa_mpi_placement), into grid[m->size]: ranks sorted by (the
 * lowest rank of their host, rank). The same array on every rank. */
static fxa_status place_by_hosts(fxa_mpi *m, int *grid)
{
    MPI_Comm host = MPI_COMM_NULL;
    const fxa_status sa = fxa_mpi_arrive(m, m->comm, "the ranks grouping by host");
    if (sa != FXA_OK)
        return sa;
    if (MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, m->rank, MPI_INFO_NULL, &host) !=
        MPI_SUCCESS)
        return fxa_mpi_fail(m, FXA_ERR_MPI, "cannot group the ranks by host (MPI_Comm_split_type)");
    MPI_Comm_set_errhandler(host, MPI_ERRORS_RETURN);
    /* mine = {the lowest rank of this host, the test's host label or -1} */
    int mine[2] = {m->rank, test_host_label()};
    fxa_status st =
        fxa_mpi_allreduce(m, &m->rank, &mine[0], 1, MPI_INT, MPI_MIN, host, "the ranks' hosts");
    MPI_Comm_free(&host);
    int *all = malloc(2 * (size_t)m->size * sizeof(int));
    int *key = malloc((size_t)m->size * sizeof(int));
    if (st == FXA_OK && (!all || !key))
        st = fxa_mpi_fail(m, FXA_ERR_NO_MEMORY, "out of memory placing the ranks");
    st = fxa_mpi_agree(m, st, m->last_error);
    if (st == FXA_OK)
        st = fxa_mpi_allgather(m, mine, 2, all, MPI_INT, m->comm, "the ranks' hosts");
    /* A host's key: its lowest rank (by the test's labels where given). */
    for (int r = 0; st == FXA_OK && r < m->size; r++) {
        key[r] = all[2 * r];
        for (int o = 0; all[2 * r + 1] >= 0 && o < m->size; o++)
            if (all[2 * o + 1] == all[2 * r + 1]) {
                key[r] = o;
                break;
            }
    }
    for (int r = 0; st == FXA_OK && r < m->size; r++) {
        grid[r] = 0;
        for (int o = 0; o < m->size; o++)
            grid[r] += key[o] < key[r] || (key[o] == key[r] && o < r);
    }
    free(all);
    free(key);
    return st;
}

/* Collective over m->comm: reorder m->comm to the placement's grid ranks
 * (nothing to do when they are already in rank order). */
static fxa_status place(fxa_mpi *m, int placement)
{
    if (placement == FXA_MPI_PLACE_RANKS || m->size == 1)
        return FXA_OK;
    int *grid = malloc((size_t)m->size * sizeof(int));
    fxa_status st =
        fxa_mpi_agree(m, grid ? FXA_OK : FXA_ERR_NO_MEMORY, "out of memory placing the ranks");
    if (st == FXA_OK)
        st = place_by_hosts(m, grid);
    int identity = 1;
    for (int r = 0; st == FXA_OK && r < m->size; r++)
        identity &= grid[r] == r;
    MPI_Comm placed = MPI_COMM_NULL;
    if (st == FXA_OK && !identity)
        st = fxa_mpi_arrive(m, m->comm, "the ranks placing themselves");
    if (st == FXA_OK && !identity) {
        if (MPI_Comm_split(m->comm, 0, grid[m->rank], &placed) != MPI_SUCCESS)
            st = fxa_mpi_fail(m, FXA_ERR_MPI, "MPI_Comm_split failed placing the ranks");
        else {
            MPI_Comm_free(&m->comm);
            m->comm = placed;
            MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
            MPI_Comm_rank(m->comm, &m->rank);
        }
    }
    free(grid);
    return st;
}

fxa_status fxa_mpi_check_comm(MPI_Comm comm, char *msg, size_t cap)
{
    int inter = 0;
    if (comm == MPI_COMM_NULL)
        snprintf(msg, cap, "the communicator is MPI_COMM_NULL");
    else if (MPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter)
        snprintf(msg, cap, "the communicator is an intercommunicator: pass an intracommunicator");
    else
        return FXA_OK;
    return FXA_ERR_INVALID_ARG;
}

static int placement_known(int placement)
{
    return placement == FXA_MPI_PLACE_HOSTS || placement == FXA_MPI_PLACE_RANKS;
}

fxa_status fxa_mpi_grid_rank(MPI_Comm comm, fxa_mpi_placement placement, int *grid_rank)
{
    g_create_error[0] = '\0';
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited || !grid_rank || !placement_known(placement)) {
        snprintf(g_create_error, sizeof g_create_error, "%s",
                 !inited      ? "MPI is not initialised"
                 : !grid_rank ? "NULL output"
                              : "placement is not FXA_MPI_PLACE_HOSTS or FXA_MPI_PLACE_RANKS");
        return inited ? FXA_ERR_INVALID_ARG : FXA_ERR_MPI;
    }
    if (fxa_mpi_check_comm(comm, g_create_error, sizeof g_create_error) != FXA_OK)
        return FXA_ERR_INVALID_ARG;
    fxa_mpi m;
    memset(&m, 0, sizeof m);
    MPI_Comm_rank(comm, &m.rank);
    MPI_Comm_size(comm, &m.size);
    m.timeout = fxa_mpi_default_timeout();
    m.timeout = m.timeout > 0.0 ? m.timeout : 60.0;
    if (fxa_mpi_dup(&m, comm) != FXA_OK) {
        snprintf(g_create_error, sizeof g_create_error, "%s", m.last_error);
        return m.broken ? FXA_ERR_TIMEOUT : FXA_ERR_MPI;
    }
    MPI_Comm_set_errhandler(m.comm, MPI_ERRORS_RETURN);
    const fxa_status st = place(&m, placement);
    if (st != FXA_OK)
        snprintf(g_create_error, sizeof g_create_error, "%s", m.last_error);
    else
        *grid_rank = m.rank;
    MPI_Comm_free(&m.comm);
    return st;
}

/* Collective over m->comm: *out = MPI_Comm_split(m->comm, color, key),
 * once every rank has arrived (fxa_mpi_arrive). */
static fxa_status split(fxa_mpi *m, int color, int key, MPI_Comm *out)
{
    fxa_status st = fxa_mpi_arrive(m, m->comm, "the ranks forming the grid");
    if (st == FXA_OK && MPI_Comm_split(m->comm, color, key, out) != MPI_SUCCESS)
        st = fxa_mpi_fail(m, FXA_ERR_MPI, "MPI_Comm_split failed");
    return st;
}

/* A handle on comm's ranks with nothing created yet (no duplicate, no
 * grid); NULL when out of memory. */
static fxa_mpi *new_handle(MPI_Comm comm, fxa_ctx *ctx)
{
    fxa_mpi *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->comm = m->row_comm = m->col_comm = MPI_COMM_NULL;
    MPI_Comm_rank(comm, &m->rank);
    MPI_Comm_size(comm, &m->size);
    m->ctx = ctx;
    m->test_max_elements = env_count("FXA_MPI_TEST_MAX_ELEMENTS");
    m->test_ulysses_groups = env_count("FXA_TEST_ULYSSES_GROUPS");
    m->test_ulysses_piece = env_count("FXA_TEST_ULYSSES_PIECE");
    return m;
}

/* This rank's checks of the arguments, before any rank is waited for:
 * *prm the parameters (p, or the defaults, with an older struct's missing
 * fields defaulted and ring settled), m->timeout the deadline (60 s when
 * the asked one is bad, so that the agreement still has one). */
static fxa_status check_params(fxa_mpi *m, const fxa_ctx *ctx, fxa_mpi **out,
                               const fxa_mpi_params *p, fxa_mpi_params *prm, char *msg,
                               size_t msglen)
{
    fxa_status st = FXA_OK;
    fxa_mpi_params_init(prm);
    if (!ctx || !out) {
        st = FXA_ERR_INVALID_ARG;
        snprintf(msg, msglen, "NULL context or output");
    } else if (p) {
        /* An older, smaller struct: its fields, the defaults for the rest. */
        st = fxa_struct_in(prm, sizeof *prm, p, FXA_MPI_PARAMS_SIZE_0_1, "fxa_mpi_params", msg,
                           msglen);
    }
    m->timeout = pick_timeout(prm->timeout_seconds, msg, msglen);
    if (m->timeout == 0.0) {
        st = FXA_ERR_INVALID_ARG;
        m->timeout = 60.0;
    }
    if (st != FXA_OK)
        return st;
    if (prm->ring == 0 && prm->ulysses >= 1)
        prm->ring = m->size / prm->ulysses;
    if (prm->ulysses < 1 || prm->ring < 1 || (int64_t)prm->ulysses * prm->ring != m->size) {
        snprintf(msg, msglen, "Ulysses %d x ring %d does not match %d ranks", prm->ulysses,
                 prm->ring, m->size);
        return FXA_ERR_INVALID_ARG;
    }
    if (prm->prefetch < 0) {
        snprintf(msg, msglen, "prefetch %d is negative", prm->prefetch);
        return FXA_ERR_INVALID_ARG;
    }
    if (!placement_known(prm->placement)) {
        snprintf(msg, msglen,
                 "placement %d is not FXA_MPI_PLACE_HOSTS (0) or FXA_MPI_PLACE_RANKS (1)",
                 prm->placement);
        return FXA_ERR_INVALID_ARG;
    }
    return FXA_OK;
}

/* Collective over the duplicate: every rank's verdict st (msg when it
 * failed) agreed, then the same grid, prefetch, placement and timeout on
 * every rank. */
static fxa_status agree_params(fxa_mpi *m, fxa_status st, const char *msg,
                               const fxa_mpi_params *prm)
{
    st = fxa_mpi_agree(m, st, msg);
    if (st != FXA_OK)
        return st;
    int grid[4] = {prm->ulysses, prm->ring, prm->prefetch, prm->placement};
    const uint64_t h = fxa_mpi_hash(0xcbf29ce484222325ull, grid, sizeof grid);
    return fxa_mpi_same_everywhere(m, fxa_mpi_hash(h, &m->timeout, sizeof m->timeout),
                                   "the Ulysses x ring grid, prefetch, placement or timeout");
}

/* Collective: the grid ranks by placement, this rank's (u, c), the ring's
 * prefetch depth (1 to min(R - 1, 64)), and the row (Ulysses) and column
 * (ring) communicators. */
static fxa_status lay_out_grid(fxa_mpi *m, const fxa_mpi_params *prm)
{
    fxa_status st = place(m, prm->placement);
    if (st != FXA_OK)
        return st;
    m->ulysses = prm->ulysses;
    m->ring = prm->ring;
    m->u = m->rank % m->ulysses;
    m->c = m->rank / m->ulysses;
    m->prefetch = prm->prefetch < 1 ? 1 : prm->prefetch;
    if (m->prefetch > m->ring - 1)
        m->prefetch = m->ring > 1 ? m->ring - 1 : 1;
    if (m->prefetch > 64)
        m->prefetch = 64; /* deeper buys nothing and costs a block of memory each */
    if ((st = split(m, m->c, m->u, &m->row_comm)) != FXA_OK ||
        (st = split(m, m->u, m->c, &m->col_comm)) != FXA_OK)
        return st;
    MPI_Comm_set_errhandler(m->row_comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(m->col_comm, MPI_ERRORS_RETURN);
    return FXA_OK;
}

fxa_status fxa_mpi_create(MPI_Comm comm, fxa_ctx *ctx, const fxa_mpi_params *p, fxa_mpi **out)
{
    g_create_error[0] = '\0';
    if (out)
        *out = NULL;
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        snprintf(g_create_error, sizeof g_create_error, "MPI is not initialised");
        return FXA_ERR_MPI;
    }
    if (fxa_mpi_check_comm(comm, g_create_error, sizeof g_create_error) != FXA_OK)
        return FXA_ERR_INVALID_ARG;
    fxa_mpi *m = new_handle(comm, ctx);
    if (!m) {
        snprintf(g_create_error, sizeof g_create_error, "out of memory");
        return FXA_ERR_NO_MEMORY;
    }
    /* Local checks first; the verdict is agreed so every rank fails alike. */
    char msg[256] = "";
    fxa_mpi_params prm;
    fxa_status st = check_params(m, ctx, out, p, &prm, msg, sizeof msg);
    /* The duplicate, waited for under the deadline just settled. */
    const fxa_status sd = fxa_mpi_dup(m, comm);
    if (sd == FXA_OK) {
        MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
        st = agree_params(m, st, msg, &prm);
        if (st == FXA_OK)
            st = lay_out_grid(m, &prm);
    } else {
        st = sd;
    }
    if (st != FXA_OK) {
        snprintf(g_create_error, sizeof g_create_error, "%s", m->last_error);
        fxa_mpi_destroy(m);
        return st;
    }
    *out = m;
    return FXA_OK;
}

void fxa_mpi_destroy(fxa_mpi *m)
{
    if (!m)
        return;
    if (m->row_comm != MPI_COMM_NULL)
        MPI_Comm_free(&m->row_comm);
    if (m->col_comm != MPI_COMM_NULL)
        MPI_Comm_free(&m->col_comm);
    if (m->comm != MPI_COMM_NULL)
        MPI_Comm_free(&m->comm);
    free(m->names);
    free(m);
}
