/*
 * `fxattn layer` under mpirun (layer.h), on libfxattn_wan_mpi
 * (fxattn_wan_mpi.h: the T x C grid, who holds which tokens and heads):
 *
 *   --ulysses U --ring R   context parallel (T = 1; the default, a pure ring)
 *   --tp T                 tensor parallel (C = 1, T = P)
 *   --tp T --ulysses U --ring R   both, T U R = P (without --ring, R = P / (T U))
 *
 * Each rank reads only its heads' weights (fxa_wan_weights_load with its
 * shard's head range) and its tokens of x; rank 0 also loads the whole
 * layer and x for --verify (never without it). Memory per rank: 4 n hidden
 * weights (n = its heads' channels), its tokens' x, Q, K, V and attention
 * output ([len][n] each) and y rows ([len][hidden]), the RoPE tables of all
 * tokens; rank 0 also all of y.
 *
 * Every failure, on any rank, is agreed on over the world: all ranks exit
 * with the same status, and rank 0 prints the failing rank's message once.
 * Rank 0 verifies and writes y.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fxattn_mpi.h"
#include "fxattn_wan_mpi.h"
#include "input_hash.h"
#include "layer.h"
#include "mpi_cli.h"

/* One rank's state. */
typedef struct job {
    fxt_world *w;
    const layer_opts *o;
    fxt_layer_cfg cfg;
    fxa_ctx *ctx;
    fxa_wan_mpi_plan *plan;
    fxa_wan_mpi_shard s;
    int T, U, R;
    fxa_wan_weights part; /* this rank's heads (all of them when T = 1) */
    fxa_wan_weights all;  /* rank 0, --verify, T > 1: the whole layer */
    fxt_layer_x x;        /* this rank's tokens */
    void *ws;
    size_t ws_bytes;
    float *y;     /* this rank's tokens */
    float *y_all; /* rank 0: the whole y */
    fxt_layer_report rep;
} job;

static void job_free(job *j)
{
    free(j->ws);
    free(j->y);
    free(j->y_all);
    fxt_layer_x_free(&j->x);
    fxa_wan_weights_free(&j->all);
    fxa_wan_weights_free(&j->part);
    fxa_wan_mpi_plan_destroy(j->plan);
    fxa_ctx_destroy(j->ctx);
}

/* Collective: the grid, the groups and the attention plan
 * (libfxattn_wan_mpi), then this rank's shard. */
static int plan(job *j)
{
    fxa_wan_grid g;
    fxa_wan_grid_init(&g);
    g.tp = (int)j->o->tp;
    g.ulysses = (int)j->o->ulysses;
    g.ring = (int)j->o->ring;
    g.timeout_seconds = j->w->timeout;
    if (j->o->cp_grid) {
        /* --cp-grid auto: the planner's grid for the layer's attention over
         * every rank (so not with --tp, whose groups would change it). */
        int code = j->o->tp > 0 ? fxt_fail(FXT_EXIT_BAD_INPUT,
                                           "--cp-grid auto plans context parallelism over "
                                           "every rank: not with --tp")
                                : 0;
        fxa_attn_desc ad;
        fxa_wan_attn_desc(&j->cfg.wan, j->cfg.heads, &ad);
        if ((code = fxt_world_agree(j->w, code)) ||
            (code = fxt_mpi_grid_auto(j->w, "--cp-grid", j->o->cp_grid, &ad,
                                      fxa_ctx_threads(j->ctx), &g.ulysses, &g.ring)))
            return code;
    }
    fxt_world_guard("start-up");
    const fxa_status st =
        fxa_wan_mpi_plan_create(MPI_COMM_WORLD, j->ctx, &j->cfg.wan, &g, &j->plan, &j->ws_bytes);
    fxt_world_unguard();
    const int code = fxt_world_lib_fail(j->w, st, fxa_wan_mpi_create_error());
    if (!code) {
        fxa_wan_mpi_shard_of(j->plan, &j->s);
        fxa_wan_mpi_grid_of(j->plan, &j->T, &j->U, &j->R);
    }
    return code;
}

/* This rank's weights (fp32 rows of its heads, as in cmd_layer.c) and
 * activations of its tokens; rank 0 also gathers y, and for --verify
 * holds the whole layer and x. node_ranks ranks share the node's memory. */
static int check_memory(const job *j, int node_ranks)
{
    const double h = (double)j->cfg.hidden, s = (double)j->s.token_count;
    const double all = (double)j->cfg.tokens;
    double need = 16.0 * h * h / j->T + 40.0 * s * h;
    if (j->o->weights && j->T > 1)
        need += 16.0 * h * h / j->T; /* another shard, hashed (check_inputs) */
    if (j->w->rank == 0)
        need += 4.0 * all * h + (j->o->verify ? 16.0 * h * h + 40.0 * all * h : 0.0);
    return fxt_check_memory(need, node_ranks, "layer: this rank's weights and activations");
}

/* Weights, x and buffers of this rank. */
static int load(job *j)
{
    const fxa_wan_mpi_shard *s = &j->s;
    int code = fxt_layer_load_weights(j->o, &j->cfg, s->head_begin, s->head_count, &j->part);
    if (!code && j->w->rank == 0 && j->o->verify && s->head_count < j->cfg.heads)
        code = fxt_layer_load_weights(j->o, &j->cfg, 0, j->cfg.heads, &j->all);
    if (!code)
        code = fxt_layer_load_x(j->o, &j->cfg, s->token_begin, s->token_count, &j->x);
    if (code)
        return code;
    j->ws = aligned_alloc(64, (j->ws_bytes + 63) & ~(size_t)63);
    j->y = malloc((size_t)(s->token_count * j->cfg.hidden) * sizeof(float) + 1);
    j->y_all =
        j->w->rank != 0 ? NULL : malloc((size_t)(j->cfg.tokens * j->cfg.hidden) * sizeof(float));
    if (!j->ws || !j->y || (j->w->rank == 0 && !j->y_all))
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's activations");
    return 0;
}

static uint64_t hash_linear(uint64_t h, const fxa_wan_linear *l)
{
    const size_t es = l->format == FXA_PROJ_W_F32 ? 4 : l->format == FXA_PROJ_W_BF16 ? 2 : 1;
    h = fxt_hash_bytes(h, l->w, (size_t)(l->rows * l->cols) * es);
    if (l->scales)
        h = fxt_hash_bytes(h, l->scales, (size_t)l->rows * sizeof(float));
    if (l->bias)
        h = fxt_hash_bytes(h, l->bias, (size_t)l->rows * sizeof(float));
    return h;
}

static uint64_t hash_weights(uint64_t h, const fxa_wan_weights *w)
{
    const size_t n = (size_t)(w->head_count * w->head_dim) * sizeof(float);
    h = hash_linear(hash_linear(h, &w->qkv), &w->o);
    return fxt_hash_bytes(fxt_hash_bytes(h, w->gamma_q, n), w->gamma_k, n);
}

/* The hash of every head's weights from --weights, loaded (and converted,
 * the same way on every rank) one tensor-parallel shard at a time; this
 * rank's own shard is the one it holds. */
static int hash_checkpoint(const job *j, uint64_t *h)
{
    *h = FXT_HASH_SEED;
    for (int t = 0; t < j->T; t++) {
        int64_t h0, nh;
        fxa_mpi_shard(j->cfg.heads, j->T, t, &h0, &nh);
        if (h0 == j->s.head_begin && nh == j->s.head_count) {
            *h = hash_weights(*h, &j->part);
            continue;
        }
        fxa_wan_weights piece;
        memset(&piece, 0, sizeof piece);
        const int code = fxt_layer_load_weights(j->o, &j->cfg, h0, nh, &piece);
        if (!code)
            *h = hash_weights(*h, &piece);
        fxa_wan_weights_free(&piece);
        if (code)
            return code;
    }
    return 0;
}

/* Collective: every rank computes on the same bytes of --weights and -x.
 * Each rank hashes every piece of them that any rank uses (not only its
 * own), so a copy on one host that differs anywhere the job reads is
 * refused, naming the file. */
static int check_inputs(job *j)
{
    uint64_t h[2] = {0, 0};
    int code = j->o->weights ? hash_checkpoint(j, &h[0]) : 0;
    if (!code && j->o->x)
        code = fxt_hash_npy(j->o->x, "x", j->cfg.x_axis, j->cfg.tokens,
                            j->cfg.hidden * (int64_t)sizeof(float), &h[1]);
    if ((code = fxt_world_agree(j->w, code)))
        return code;
    char weights[400], x[400];
    snprintf(weights, sizeof weights, "weights (block %lld of --weights %s)",
             (long long)j->o->block, j->o->weights ? j->o->weights : "");
    snprintf(x, sizeof x, "bytes of -x %s", j->o->x ? j->o->x : "");
    const char *what[2] = {weights, x};
    return fxt_world_agree_hashes(j->w, h, what, 2);
}

/* Collective: the layer, then y on rank 0. */
static int forward(job *j)
{
    fxa_wan_stats st = {.struct_size = sizeof st};
    const fxa_wan_args args = {
        .struct_size = sizeof args, .weights = &j->part, .x = j->x.data, .y = j->y};
    fxa_status s = fxa_wan_mpi_layer_run(j->plan, &args, j->ws, &st);
    int code = fxt_world_lib_fail(j->w, s, fxa_wan_mpi_last_error(j->plan));
    if (code)
        return code;
    s = fxa_wan_mpi_gather(j->plan, j->y, j->y_all);
    if ((code = fxt_world_lib_fail(j->w, s, fxa_wan_mpi_last_error(j->plan))))
        return code;
    j->rep.qkv_seconds = st.qkv_seconds;
    j->rep.attention_seconds = st.attention_seconds;
    j->rep.out_seconds = st.out_seconds;
    j->rep.rows = st.rows;
    j->rep.fallback_rows = st.fallback_rows;
    j->rep.compute = st.compute;
    j->rep.qkv_gemm = st.qkv_gemm;
    j->rep.out_gemm = st.out_gemm;
    return 0;
}

/* Rank 0: --verify (against the whole layer and x) and -o. */
static int finish(job *j, fxt_layer_check *check)
{
    fxt_layer_x whole;
    memset(&whole, 0, sizeof whole);
    int code = 0;
    if (j->w->rank == 0 && j->o->verify) {
        const int all_tokens = j->s.token_count == j->cfg.tokens;
        const fxa_wan_weights *w = j->s.head_count < j->cfg.heads ? &j->all : &j->part;
        if (!all_tokens)
            code = fxt_layer_load_x(j->o, &j->cfg, 0, j->cfg.tokens, &whole);
        if (!code)
            code = fxt_layer_verify(&j->cfg, w, all_tokens ? &j->x : &whole, j->y_all, check);
        if (!code) {
            j->rep.check = check;
            code = fxt_layer_check_result(check);
        }
        fxt_layer_x_free(&whole);
    }
    if (!code && j->w->rank == 0 && j->o->out)
        code = fxt_layer_write(j->o->out, &j->cfg, j->y_all);
    return fxt_world_agree(j->w, code);
}

/* Rank 0: the --stats / --verify line. */
static void report(job *j)
{
    const int tp_mode = j->o->tp > 0;
    j->rep.mode = !tp_mode ? "context" : j->U * j->R > 1 ? "tensor+context" : "tensor";
    j->rep.ranks = j->w->size;
    j->rep.ulysses = j->U;
    j->rep.ring = j->R;
    j->rep.tp = j->T;
    j->rep.threads = fxa_ctx_threads(j->ctx);
    j->rep.isa = fxa_ctx_isa(j->ctx);
    fxt_layer_print(j->o, &j->cfg, &j->rep);
}

static int run(fxt_world *w, const layer_opts *o)
{
    job j;
    fxt_layer_check check;
    memset(&j, 0, sizeof j);
    j.w = w;
    j.o = o;
    fxa_ctx_params cp;
    fxa_ctx_params_init(&cp);
    cp.n_threads = fxt_mpi_threads_per_rank(o->threads);
    const int node_ranks = fxt_mpi_node_ranks();
    int code = fxt_layer_setup(o, &j.cfg);
    if (!code && fxa_ctx_create(&cp, &j.ctx) != FXA_OK)
        code = fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_create_error());
    if ((code = fxt_world_agree(w, code)) || (code = plan(&j)) ||
        (code = fxt_world_agree(w, check_memory(&j, node_ranks))) ||
        (code = fxt_world_agree(w, load(&j))) || (code = check_inputs(&j)) ||
        (code = forward(&j)) || (code = finish(&j, &check)))
        goto done;
    if (w->rank == 0)
        report(&j);
done:
    job_free(&j);
    return code;
}

int fxt_layer_mpi(const layer_opts *o)
{
    fxt_world w;
    int code = fxt_world_init(&w, o->timeout);
    if (code)
        return code;
    layer_opts mine = *o;
    fxt_opt table[FXT_MAX_OPTS];
    fxt_layer_opts_table(&mine, table);
    if (!(code = fxt_world_agree_options(&w, table)))
        code = run(&w, o);
    fxt_world_finalize(&w);
    return code;
}
