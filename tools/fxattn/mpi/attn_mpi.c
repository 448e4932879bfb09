/*
 * `fxattn attn` under mpirun: every rank reads its own shard of the same
 * .npy files (the shard of its grid rank, fxa_mpi_rank: placed by hosts
 * unless --placement ranks; with --inputs-on rank0 only rank 0 reads and
 * sends the shards), libfxattn_mpi computes, rank 0 gathers the output and
 * writes it (staged, committed all or nothing). Every failure, on any
 * rank, is agreed on: all ranks exit with the same status, and rank 0
 * prints the failing rank's message once.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attn_opts.h"
#include "cli.h"
#include "fxattn_mpi.h"
#include "input_hash.h"
#include "inputs_mpi.h"
#include "mpi_cli.h"

/* Rank 0 receives every rank's output shard (rows of D floats, the
 * layout's order; world rank r holds shard grid_of[r]) and places it into
 * the global output. */
static int gather_rows(fxt_world *w, const int *grid_of, const fxa_attn_desc *d, const float *mine,
                       int64_t rows_per_token, float *full, int64_t row_len, int lse)
{
    const int64_t seq = d->seq_q;
    int *counts = NULL;
    int *displs = NULL;
    float *stage = NULL;
    MPI_Datatype row;
    MPI_Type_contiguous((int)row_len, MPI_FLOAT, &row);
    MPI_Type_commit(&row);
    int64_t start;
    int64_t len;
    fxt_shard(d, seq, w->size, grid_of[w->rank], &start, &len);
    const int my_rows = (int)(rows_per_token * len);
    if (w->rank == 0) {
        counts = malloc((size_t)w->size * sizeof(int));
        displs = malloc((size_t)w->size * sizeof(int));
        stage = malloc((size_t)(rows_per_token * seq * row_len) * sizeof(float) + 1);
        if (counts && displs)
            for (int r = 0; r < w->size; r++) {
                fxt_shard(d, seq, w->size, grid_of[r], &start, &len);
                counts[r] = (int)(rows_per_token * len);
                displs[r] = (int)(rows_per_token * start);
            }
    }
    int code = w->rank == 0 && (!counts || !displs || !stage) ? FXT_EXIT_FAILURE : 0;
    if (code)
        snprintf(w->msg, sizeof w->msg, "out of memory gathering the output");
    code = fxt_world_agree(w, code);
    if (!code) {
        MPI_Request req;
        MPI_Igatherv(mine, my_rows, row, stage, counts, displs, row, 0, MPI_COMM_WORLD, &req);
        fxt_world_wait(w, &req, "gathering the output");
    }
    if (!code && w->rank == 0) {
        /* stage holds shard r's rows at displs[r]; place them. */
        const int bshd = d->layout == FXA_LAYOUT_BSHD && !lse;
        for (int r = 0; r < w->size; r++) {
            fxt_shard(d, seq, w->size, grid_of[r], &start, &len);
            const float *src = stage + (size_t)displs[r] * (size_t)row_len;
            for (int64_t b = 0; b < d->batch; b++)
                for (int64_t h = 0; h < d->heads_q; h++)
                    for (int64_t t = 0; t < len; t++) {
                        const int64_t from =
                            bshd ? (b * len + t) * d->heads_q + h : (b * d->heads_q + h) * len + t;
                        const int64_t to = bshd ? (b * seq + start + t) * d->heads_q + h
                                                : (b * d->heads_q + h) * seq + start + t;
                        memcpy(full + to * row_len, src + from * row_len,
                               (size_t)row_len * sizeof(float));
                    }
        }
    }
    MPI_Type_free(&row);
    free(counts);
    free(displs);
    free(stage);
    return code;
}

/* --placement: hosts (the default) or ranks. 0 or an exit code. */
static int parse_placement(const char *s, int *placement)
{
    *placement = FXA_MPI_PLACE_HOSTS;
    if (!s || !strcmp(s, "hosts"))
        return 0;
    if (!strcmp(s, "ranks")) {
        *placement = FXA_MPI_PLACE_RANKS;
        return 0;
    }
    return fxt_fail(FXT_EXIT_BAD_INPUT, "--placement must be hosts or ranks, not '%s'", s);
}

/* --inputs-on: all (every rank reads its shard, the default) or rank0
 * (only rank 0 opens the files and sends the shards). 0 or an exit code. */
static int parse_inputs_on(const char *s, int *rank0)
{
    *rank0 = s && !strcmp(s, "rank0");
    if (!s || *rank0 || !strcmp(s, "all"))
        return 0;
    return fxt_fail(FXT_EXIT_BAD_INPUT, "--inputs-on must be all or rank0, not '%s'", s);
}

/* Collective: grid_of[r] = the grid rank of world rank r. */
static int grid_ranks(fxt_world *w, const fxa_mpi *m, int **grid_of)
{
    *grid_of = malloc((size_t)w->size * sizeof(int));
    int code = *grid_of ? 0 : fxt_fail(FXT_EXIT_FAILURE, "out of memory for the grid ranks");
    if ((code = fxt_world_agree(w, code)))
        return code;
    const int me = fxa_mpi_rank(m);
    MPI_Request r;
    MPI_Iallgather(&me, 1, MPI_INT, *grid_of, 1, MPI_INT, MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, "the grid ranks");
    return 0;
}

/* Collective: rank 0 gets the host name (MPI_Get_processor_name) of each
 * grid rank, names[grid rank * MPI_MAX_PROCESSOR_NAME] (NULL elsewhere or
 * out of memory: then the report leaves them out). */
static char *grid_hosts(fxt_world *w, const int *grid_of)
{
    char mine[MPI_MAX_PROCESSOR_NAME] = "";
    int len = 0;
    MPI_Get_processor_name(mine, &len);
    char *by_world = w->rank == 0 ? calloc((size_t)w->size, sizeof mine) : NULL;
    MPI_Request r;
    MPI_Igather(mine, (int)sizeof mine, MPI_CHAR, by_world, (int)sizeof mine, MPI_CHAR, 0,
                MPI_COMM_WORLD, &r);
    fxt_world_wait(w, &r, "the host names");
    char *by_grid = by_world ? calloc((size_t)w->size, sizeof mine) : NULL;
    for (int i = 0; by_grid && i < w->size; i++)
        memcpy(by_grid + (size_t)grid_of[i] * sizeof mine, by_world + (size_t)i * sizeof mine,
               sizeof mine);
    free(by_world);
    return by_grid;
}

/* Collective, when every rank reads its shard from its own path (a shared
 * file system, or a copy per host): the ranks' files must have the same
 * shapes and dtypes and the same bytes; every rank hashes each whole file
 * (one more read of the inputs), so a stale or regenerated copy on one
 * host is refused wherever it differs, naming the file and a rank. */
static int agree_on_files(fxt_world *w, const attn_opts *o, fxa_layout layout, const fxt_inputs *in)
{
    const fxa_attn_desc *d = &in->d;
    const int64_t q_shape[4] = {d->batch, d->seq_q, d->heads_q, d->head_dim};
    const int64_t kv_shape[2] = {d->seq_kv, d->heads_kv};
    const uint64_t h0 = fxt_hash_bytes(FXT_HASH_SEED, &d->dtype, sizeof d->dtype);
    uint64_t h[6] = {fxt_hash_bytes(h0, q_shape, sizeof q_shape),
                     fxt_hash_bytes(h0, kv_shape, sizeof kv_shape),
                     fxt_hash_bytes(h0, kv_shape, sizeof kv_shape),
                     0,
                     0,
                     0};
    const int seq_axis = layout == FXA_LAYOUT_BSHD ? 1 : 2;
    const int64_t q_token = d->batch * d->heads_q * d->head_dim * (int64_t)sizeof(float);
    const int64_t kv_token = d->batch * d->heads_kv * d->head_dim * (int64_t)sizeof(float);
    int code = fxt_hash_npy(o->in.q, "Q", seq_axis, d->seq_q, q_token, &h[3]);
    if (!code)
        code = fxt_hash_npy(o->in.k, "K", seq_axis, d->seq_kv, kv_token, &h[4]);
    if (!code)
        code = fxt_hash_npy(o->in.v, "V", seq_axis, d->seq_kv, kv_token, &h[5]);
    if ((code = fxt_world_agree(w, code)))
        return code;
    char what[6][300];
    const char *paths[3] = {o->in.q, o->in.k, o->in.v};
    const char *flags[3] = {"-q", "-k", "-v"};
    const char *names[6];
    for (int i = 0; i < 6; i++) {
        snprintf(what[i], sizeof what[i], i < 3 ? "shapes or dtypes of %s %s" : "bytes of %s %s",
                 flags[i % 3], paths[i % 3]);
        names[i] = what[i];
    }
    return fxt_world_agree_hashes(w, h, names, 6);
}

/* One distributed `attn` run: what its steps set up, compute and report. */
typedef struct attn_job {
    fxa_layout layout;
    int placement;   /* FXA_MPI_PLACE_HOSTS or _RANKS */
    int rank0_reads; /* --inputs-on rank0 */
    fxa_ctx_params cp;
    fxa_ctx *ctx;
    fxa_mpi_params mp; /* the grid */
    fxa_mpi *m;
    int *grid_of;  /* grid rank of each world rank */
    fxt_inputs in; /* this rank's shards */
    fxa_mpi_attn_plan *plan;
    float *out; /* this rank's output and lse */
    float *lse;
    fxa_mpi_stats ms; /* of the last run */
    double seconds;   /* the median run's, the slowest rank's */
    float *full_out;  /* rank 0: the whole output and lse */
    float *full_lse;
    fxt_verify_result vr; /* rank 0, --verify */
} attn_job;

/* Collective: the options, the context, the memory check and the grid of --ulysses/--ring. */
static int job_start(fxt_world *w, const attn_opts *o, attn_job *j)
{
    int code = fxt_parse_layout(o->in.layout, &j->layout);
    if (!code)
        code = parse_placement(o->placement, &j->placement);
    if (!code)
        code = parse_inputs_on(o->inputs_on, &j->rank0_reads);
    fxa_ctx_params_init(&j->cp);
    j->cp.n_threads = fxt_mpi_threads_per_rank(o->in.threads);
    if (!code && fxa_ctx_create(&j->cp, &j->ctx) != FXA_OK)
        code = fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_create_error());
    const int node_ranks = fxt_mpi_node_ranks();
    if (!code)
        code = fxt_attn_check_memory(o, w->size, node_ranks, w->rank == 0);
    if ((code = fxt_world_agree(w, code)))
        return code;
    fxa_mpi_params_init(&j->mp);
    j->mp.ulysses = o->cp.ulysses > 0 ? (int)o->cp.ulysses : 1;
    j->mp.ring = o->cp.ring > 0 ? (int)o->cp.ring : 0;
    j->mp.prefetch = (int)o->cp.prefetch;
    j->mp.timeout_seconds = w->timeout;
    j->mp.placement = j->placement;
    fxt_world_guard("start-up");
    const fxa_status st = fxa_mpi_create(MPI_COMM_WORLD, j->ctx, &j->mp, &j->m);
    fxt_world_unguard();
    if ((code = fxt_world_lib_fail(w, st, fxa_mpi_create_error())))
        return code;
    return grid_ranks(w, j->m, &j->grid_of);
}

/* Collective: this rank's shards (read here, or sent by rank 0), checked alike on all ranks. */
static int job_inputs(fxt_world *w, const attn_opts *o, attn_job *j)
{
    int code;
    if (j->rank0_reads) {
        if ((code = fxt_inputs_scatter(w, j->grid_of, o->in.q, o->in.k, o->in.v, j->layout,
                                       o->in.dtype, o->reproducible, &j->in)))
            return code;
    } else {
        code = fxt_inputs_load_shard(o->in.q, o->in.k, o->in.v, j->layout, o->in.dtype, w->size,
                                     fxa_mpi_rank(j->m), o->reproducible, &j->in);
    }
    if (!code)
        code = fxt_attn_apply_options(o, &j->in.d);
    if ((code = fxt_world_agree(w, code)))
        return code;
    return j->rank0_reads ? 0 : agree_on_files(w, o, j->layout, &j->in);
}

/* Collective: the planned grid (--grid auto), the distributed plan and this rank's output. */
static int job_plan(fxt_world *w, const attn_opts *o, attn_job *j)
{
    int code;
    fxa_status st;
    if (o->cp.grid) {
        /* --grid auto, now that the shapes are known: the grid rank (so
         * the shard just read) is the same for every grid shape. */
        int u = (int)o->cp.ulysses, r = (int)o->cp.ring;
        if ((code = fxt_mpi_grid_auto(w, "--grid", o->cp.grid, &j->in.d, j->cp.n_threads, &u, &r)))
            return code;
        fxa_mpi_destroy(j->m);
        j->m = NULL;
        j->mp.ulysses = u;
        j->mp.ring = r;
        fxt_world_guard("creating the planned grid");
        st = fxa_mpi_create(MPI_COMM_WORLD, j->ctx, &j->mp, &j->m);
        fxt_world_unguard();
        if ((code = fxt_world_lib_fail(w, st, fxa_mpi_create_error())))
            return code;
    }
    st = fxa_mpi_attn_plan_create(j->m, &j->in.d, &j->plan);
    if ((code = fxt_world_lib_fail(w, st, fxa_mpi_last_error(j->m))))
        return code;
    const size_t rows = (size_t)(j->in.d.batch * j->in.d.heads_q * j->in.q_len);
    j->out = malloc((size_t)j->in.nq * sizeof(float) + 1);
    j->lse = malloc(rows * sizeof(float) + 1);
    if (!j->out || !j->lse)
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for the output");
    return fxt_world_agree(w, code);
}

/* Collective: the run (with --repeats, a warm-up and the timed runs); j->seconds the median of
 * the slowest rank's times. */
static int job_runs(fxt_world *w, const attn_opts *o, attn_job *j)
{
    const fxa_attn_args a = {.struct_size = sizeof a,
                             .q = j->in.q,
                             .k = j->in.k,
                             .v = j->in.v,
                             .out = j->out,
                             .lse = j->lse};
    j->ms = (fxa_mpi_stats){.struct_size = sizeof j->ms};
    double secs[101];
    for (int64_t i = 0; i <= (o->repeats > 1 ? o->repeats : 0); i++) {
        /* With repeats, the first run warms up and the others are timed. */
        fxt_world_barrier(w, "the start of a run");
        const fxa_status st = fxa_mpi_attn_run(j->plan, &a, &j->ms);
        const int code = fxt_world_lib_fail(w, st, fxa_mpi_last_error(j->m));
        if (code)
            return code;
        double slowest = j->ms.seconds;
        fxt_world_allreduce(w, &slowest, 1, MPI_DOUBLE, MPI_MAX, "the timings");
        if (i > 0 || o->repeats <= 1)
            secs[o->repeats > 1 ? i - 1 : 0] = slowest;
    }
    const int n_timed = o->repeats > 1 ? (int)o->repeats : 1;
    for (int i = 1; i < n_timed; i++) /* insertion sort: at most 101 */
        for (int k = i; k > 0 && secs[k] < secs[k - 1]; k--) {
            const double t = secs[k];
            secs[k] = secs[k - 1];
            secs[k - 1] = t;
        }
    j->seconds = secs[n_timed / 2];
    return 0;
}

/* Collective: rank 0 gathers the output, verifies it (--verify) and writes it. */
static int job_collect(fxt_world *w, const attn_opts *o, attn_job *j)
{
    const fxa_attn_desc *d = &j->in.d;
    int code = 0;
    if (w->rank == 0) {
        j->full_out =
            malloc((size_t)(d->batch * d->heads_q * d->seq_q * d->head_dim) * sizeof(float) + 1);
        j->full_lse = malloc((size_t)(d->batch * d->heads_q * d->seq_q) * sizeof(float) + 1);
        if (!j->full_out || !j->full_lse)
            code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for the whole output");
    }
    if ((code = fxt_world_agree(w, code)))
        return code;
    const int64_t rows_per_token = d->batch * d->heads_q;
    if ((code =
             gather_rows(w, j->grid_of, d, j->out, rows_per_token, j->full_out, d->head_dim, 0)) ||
        (code = gather_rows(w, j->grid_of, d, j->lse, rows_per_token, j->full_lse, 1, 1)))
        return code;
    if (w->rank == 0) {
        fxt_inputs whole;
        if (o->verify) {
            code = fxt_inputs_load(o->in.q, o->in.k, o->in.v, j->layout, o->in.dtype, &whole);
            if (!code) {
                if (!(code = fxt_attn_apply_options(o, &whole.d)))
                    code = fxt_attn_verify(&whole, j->full_out, j->full_lse, &j->vr);
                fxt_inputs_free(&whole);
            }
        }
        if (!code)
            code = fxt_attn_write_outputs(o, &j->in, j->full_out, o->lse ? j->full_lse : NULL);
    }
    return fxt_world_agree(w, code);
}

/* Collective (--stats: the host names): rank 0 prints the statistics (--stats, a JSON line)
 * or the verification (--verify). */
static void job_report(fxt_world *w, const attn_opts *o, const attn_job *j)
{
    char *hosts = o->stats ? grid_hosts(w, j->grid_of) : NULL;
    const fxa_mpi_stats *ms = &j->ms;
    const fxt_verify_result *vr = &j->vr;
    if (w->rank == 0 && o->stats) {
        const double flops = fxa_attn_flops(&j->in.d);
        fxt_json_printf(
            "{\"ranks\": %d, \"ulysses\": %d, \"ring\": %d, \"rows\": %lld, "
            "\"fallback_rows\": %lld, \"vmax\": %.9g, \"max_bound\": %.17g, "
            "\"threads_per_rank\": %d, \"isa\": \"%s\", \"seconds\": %.6f, \"gflops\": %.3f, "
            "\"a2a_seconds\": %.6f, \"ring_compute_seconds\": %.6f, "
            "\"ring_wait_seconds\": %.6f",
            w->size, j->mp.ulysses, w->size / j->mp.ulysses, (long long)ms->rows,
            (long long)ms->fallback_rows, ms->vmax, ms->max_bound, fxa_ctx_threads(j->ctx),
            fxa_ctx_isa(j->ctx), j->seconds, j->seconds > 0 ? flops / j->seconds * 1e-9 : 0.0,
            ms->a2a_seconds, ms->ring_compute_seconds, ms->ring_wait_seconds);
        if (o->verify)
            fxt_json_printf(
                ", \"verify_rows\": %lld, \"max_abs_err\": %.6g, \"max_rel_err\": %.6g, "
                "\"max_lse_err\": %.6g",
                (long long)vr->rows, vr->max_abs_err, vr->max_rel_err, vr->max_lse_err);
        fxt_json_printf(", \"placement\": \"%s\"",
                        j->placement == FXA_MPI_PLACE_HOSTS ? "hosts" : "ranks");
        for (int i = 0; hosts && i < w->size; i++)
            fxt_json_printf("%s\"%s\"", i ? ", " : ", \"grid_hosts\": [",
                            hosts + (size_t)i * MPI_MAX_PROCESSOR_NAME);
        printf("%s}\n", hosts ? "]" : "");
    } else if (w->rank == 0 && o->verify) {
        printf("verify: %lld rows, max abs err %.3g (%.3g of max|v|), max lse err %.3g\n",
               (long long)vr->rows, vr->max_abs_err, vr->max_rel_err, vr->max_lse_err);
    }
    free(hosts);
}

static void job_free(attn_job *j)
{
    free(j->grid_of);
    free(j->full_out);
    free(j->full_lse);
    free(j->out);
    free(j->lse);
    fxt_inputs_free(&j->in);
    fxa_mpi_attn_plan_destroy(j->plan);
    fxa_mpi_destroy(j->m);
    fxa_ctx_destroy(j->ctx);
}

static int run(fxt_world *w, const attn_opts *o)
{
    attn_job j;
    memset(&j, 0, sizeof j);
    int code = job_start(w, o, &j);
    if (!code)
        code = job_inputs(w, o, &j);
    if (!code)
        code = job_plan(w, o, &j);
    if (!code)
        code = job_runs(w, o, &j);
    if (!code)
        code = job_collect(w, o, &j);
    if (!code)
        job_report(w, o, &j);
    job_free(&j);
    return code;
}

int fxt_attn_mpi(const attn_opts *o)
{
    fxt_world w;
    int code = fxt_world_init(&w, o->cp.timeout);
    if (code)
        return code;
    attn_opts mine = *o;
    fxt_opt table[FXT_MAX_OPTS];
    fxt_attn_opts_table(&mine, table);
    if (!(code = fxt_world_agree_options(&w, table)))
        code = run(&w, o);
    fxt_world_finalize(&w);
    return code;
}
