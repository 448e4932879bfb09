/*
 * `fxattn layer` under mpirun (layer.h).
 *
 * The P ranks form a T x C grid, C = U R context-parallel coordinates by T
 * tensor-parallel indices, tensor parallel innermost:
 *
 *   world rank = c T + t    (t in [0, T): head slice; c in [0, C): token shard)
 *
 * so the T ranks of a TP group (same c: the same tokens, all heads between
 * them) are adjacent, on one node where the node allows it: they exchange
 * the most (the RMSNorm sums and the output projection's partial sums of
 * their tokens). A CP group (same t: the same heads, all tokens between
 * them) is every T-th rank, in c order; libfxattn_mpi's U x R grid is laid
 * out inside it (CP rank = ring index U + Ulysses index).
 *
 * Rank (t, c) holds tokens fxa_mpi_shard(S, C, c) and heads
 * fxa_mpi_shard(heads, T, t), n = nh head_dim channels of them. It projects
 * its tokens onto its heads' Q, K and V (tensor parallel: the RMSNorm across
 * all heads joins the sums of squares over the TP group, fxa_mpi_proj_run),
 * attention runs over the CP group on those heads (libfxattn_mpi; locally
 * under pure --tp), and the output projection multiplies its attention
 * output by o.weight's columns of its heads: tensor parallel, the TP group's
 * partial sums are reduced onto its t = 0 rank, which adds the bias once.
 * The t = 0 ranks' rows of y are gathered onto rank 0.
 *
 *   --ulysses U --ring R   context parallel (T = 1; the default, a pure ring)
 *   --tp T                 tensor parallel (C = 1, T = P)
 *   --tp T --ulysses U --ring R   both, T U R = P (without --ring, R = P / (T U))
 *
 * Each rank reads only its heads' weights (fxa_wan_weights_load: the rows of q,
 * k, v and the gammas; o.weight is read in blocks of whole rows of which
 * only its columns are kept; o's scales and bias whole) and its tokens of
 * x; rank 0 also loads the whole layer and x for --verify (never without
 * it). Memory per rank: 4 n hidden weights, its tokens' x,
 * Q, K, V and attention output ([len][n] each) and y rows ([len][hidden]),
 * the RoPE tables of all tokens; rank 0 also all of y.
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
#include "layer.h"
#include "mpi_cli.h"

#define REDUCE_CHUNK (1 << 26) /* floats per MPI_Reduce */

/* One rank's state. */
typedef struct job {
    fxt_world *w;
    const layer_opts *o;
    fxt_layer_cfg cfg;
    int tp_mode;          /* --tp given: QKV norm and output projection over the TP group */
    int cp_mode;          /* attention over the CP group (libfxattn_mpi) and y gathered over it;
                           * 0 only for pure tensor parallel (C = 1) */
    int T, C, U, R;       /* T x C ranks, C = U R; R 0: the library decides (pure context
                           * parallel) */
    int t, c;             /* this rank's TP index and CP coordinate */
    MPI_Comm tp_comm;     /* the ranks of this rank's tokens, by t */
    MPI_Comm cp_comm;     /* the ranks of this rank's heads, by c */
    fxa_ctx *ctx;
    fxa_mpi *m_tp;        /* on tp_comm (tp_mode) */
    fxa_mpi *m_cp;        /* on cp_comm (cp_mode) */
    fxa_wan_weights part; /* this rank's heads (all of them when T = 1) */
    fxa_wan_weights all;  /* rank 0, --verify, T > 1: the whole layer */
    fxt_layer_x x;          /* this rank's tokens */
    int64_t start, len;     /* tokens held */
    int64_t h0, nh;         /* heads held */
    float *cs, *sn;         /* RoPE tables of all tokens */
    float *q, *k, *v, *a, *y;
    float *y_all; /* rank 0: the whole y */
    fxt_layer_report rep;
} job;

static void job_free(job *j)
{
    float *const bufs[] = {j->cs, j->sn, j->q, j->k, j->v, j->a, j->y};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        free(bufs[i]);
    if (j->y_all != j->y)
        free(j->y_all);
    fxt_layer_x_free(&j->x);
    fxa_wan_weights_free(&j->all);
    fxa_wan_weights_free(&j->part);
    fxa_mpi_destroy(j->m_cp);
    fxa_mpi_destroy(j->m_tp);
    if (j->cp_comm != MPI_COMM_NULL)
        MPI_Comm_free(&j->cp_comm);
    if (j->tp_comm != MPI_COMM_NULL)
        MPI_Comm_free(&j->tp_comm);
    fxa_ctx_destroy(j->ctx);
}

/* After a collective library call on the group `label` of `group_size`
 * ranks (the status and message are the same on its ranks; a rank number in
 * the message counts in the group): the exit code, the same on every rank of
 * the world. A group that is the world prints the library's message from
 * rank 0; a smaller one agrees over the world ("rank N: <label> group:
 * <message>"), so that the other groups stop too instead of waiting in the
 * next collective. */
static int lib_agree(job *j, const char *label, int group_size, fxa_status st, const char *msg)
{
    if (st == FXA_ERR_TIMEOUT) /* the group is stuck: no agreement is possible */
        fxt_world_abort(j->w, msg);
    if (group_size == j->w->size)
        return fxt_world_lib_fail(j->w, st, msg);
    const int code = st == FXA_OK ? 0 : fxt_fail(fxt_exit_code(st), "%s group: %s", label, msg);
    return fxt_world_agree(j->w, code);
}

/* With --tp: T, U and R from the options and P ranks (T U R = P; without
 * --ring, R = P / (T U)). Without --ulysses and --ring, T = P. */
static int tp_grid(job *j)
{
    const layer_opts *o = j->o;
    const int64_t p = j->w->size;
    const int64_t u = o->ulysses > 0 ? o->ulysses : 1;
    const int64_t tu = o->tp * u;
    if (o->ulysses == 0 && o->ring == 0 && o->tp != p)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--tp %lld needs %lld ranks, not %d",
                        (long long)o->tp, (long long)o->tp, j->w->size);
    if (o->ring > 0 && tu * o->ring != p)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "--tp %lld x --ulysses %lld x --ring %lld needs %lld ranks, not %d",
                        (long long)o->tp, (long long)u, (long long)o->ring,
                        (long long)(tu * o->ring), j->w->size);
    if (o->ring == 0 && p % tu)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "--tp %lld x --ulysses %lld needs a multiple of %lld ranks, not %d",
                        (long long)o->tp, (long long)u, (long long)tu, j->w->size);
    j->T = (int)o->tp;
    j->U = (int)u;
    j->R = (int)(p / tu);
    return 0;
}

/* The grid and the checks every rank makes alike: T, C, U, R, and whether
 * the heads and tokens can be split. */
static int grid(job *j)
{
    const layer_opts *o = j->o;
    j->tp_mode = o->tp > 0;
    j->T = 1;
    j->U = o->ulysses > 0 ? (int)o->ulysses : 1;
    j->R = o->ring > 0 ? (int)o->ring : 0; /* U R = P is the library's check */
    int code = j->tp_mode ? tp_grid(j) : 0;
    j->C = j->w->size / j->T;
    j->cp_mode = !j->tp_mode || j->C > 1;
    if (!code && j->T > 1 && j->cfg.heads < j->T)
        code = fxt_fail(FXT_EXIT_BAD_INPUT, "--tp %d: %lld heads cannot be split over %d ranks",
                        j->T, (long long)j->cfg.heads, j->T);
    if (!code && j->cp_mode && j->cfg.tokens < j->C)
        code = fxt_fail(FXT_EXIT_BAD_INPUT, "%lld tokens cannot be split over %d ranks%s",
                        (long long)j->cfg.tokens, j->C,
                        j->tp_mode ? " (--ulysses x --ring)" : "");
    return code;
}

/* Settle the problem and the split; every rank gets the same answer. */
static int setup(job *j)
{
    const int rank = j->w->rank;
    int code = fxt_layer_setup(j->o, &j->cfg);
    if (!code)
        code = grid(j);
    if (code)
        return code;
    j->t = rank % j->T;
    j->c = rank / j->T;
    fxa_mpi_shard(j->cfg.heads, j->T, j->t, &j->h0, &j->nh);
    fxa_mpi_shard(j->cfg.tokens, j->C, j->c, &j->start, &j->len);
    return 0;
}

/* Collective over the world: the TP and CP communicators, and the
 * libfxattn_mpi contexts on them. */
static int groups(job *j)
{
    MPI_Comm_split(MPI_COMM_WORLD, j->c, j->t, &j->tp_comm);
    MPI_Comm_split(MPI_COMM_WORLD, j->t, j->c, &j->cp_comm);
    fxa_mpi_params mp;
    fxa_mpi_params_init(&mp);
    mp.timeout_seconds = j->w->timeout;
    int code = 0;
    if (j->tp_mode) {
        const fxa_status st = fxa_mpi_create(j->tp_comm, j->ctx, &mp, &j->m_tp);
        code = lib_agree(j, "tensor-parallel", j->T, st, fxa_mpi_create_error());
    }
    if (!code && j->cp_mode) {
        mp.ulysses = j->U;
        mp.ring = j->R;
        const fxa_status st = fxa_mpi_create(j->cp_comm, j->ctx, &mp, &j->m_cp);
        code = lib_agree(j, "context-parallel", j->C, st, fxa_mpi_create_error());
    }
    return code;
}

/* Weights, x and buffers of this rank. */
static int load(job *j)
{
    const int64_t d = j->cfg.head_dim;
    int code = fxt_layer_load_weights(j->o, &j->cfg, j->h0, j->nh, &j->part);
    if (!code && j->w->rank == 0 && j->o->verify && j->nh < j->cfg.heads)
        code = fxt_layer_load_weights(j->o, &j->cfg, 0, j->cfg.heads, &j->all);
    if (!code)
        code = fxt_layer_load_x(j->o, &j->cfg, j->start, j->len, &j->x);
    if (!code)
        code = fxt_layer_rope(&j->cfg, &j->cs, &j->sn);
    if (code)
        return code;
    const size_t n = (size_t)(j->len * j->nh * d) * sizeof(float) + 1;
    float **const bufs[] = {&j->q, &j->k, &j->v, &j->a};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = malloc(n)))
            code = FXT_EXIT_FAILURE;
    j->y = malloc((size_t)(j->len * j->cfg.hidden) * sizeof(float) + 1);
    j->y_all = j->w->rank != 0 ? NULL
               : !j->cp_mode   ? j->y
                               : malloc((size_t)(j->cfg.tokens * j->cfg.hidden) * sizeof(float));
    if (code || !j->y || (j->w->rank == 0 && !j->y_all))
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's activations");
    return 0;
}

/* The QKV projection of this rank's tokens and heads. */
static int qkv(job *j)
{
    const int64_t d = j->cfg.head_dim;
    fxa_proj_desc pd;
    fxa_proj_args pa;
    fxa_wan_qkv_call(&j->cfg.wan, &j->part, j->x.len, j->x.data, j->cs + j->start * d,
                       j->sn + j->start * d, j->q, j->k, j->v, &pd, &pa);
    if (j->tp_mode) {
        const fxa_status st = fxa_mpi_proj_run(j->m_tp, &pd, &pa, j->cfg.heads, j->cfg.heads);
        return lib_agree(j, "tensor-parallel", j->T, st, fxa_mpi_last_error(j->m_tp));
    }
    const fxa_status st = fxa_proj_run(j->ctx, &pd, &pa);
    const int code = st == FXA_OK ? 0
                                  : fxt_fail(fxt_exit_code(st), "QKV projection: %s",
                                             fxa_ctx_last_error(j->ctx));
    return fxt_world_agree(j->w, code);
}

/* Tensor parallel: rows[2] (attention rows, fallback rows of this rank's
 * heads) summed over the TP group, into the report. */
static void sum_rows(job *j, int64_t rows[2])
{
    if (j->tp_mode) {
        MPI_Request r;
        MPI_Iallreduce(MPI_IN_PLACE, rows, 2, MPI_INT64_T, MPI_SUM, j->tp_comm, &r);
        fxt_world_wait(j->w, &r, "the tensor-parallel row counts");
    }
    j->rep.rows = rows[0];
    j->rep.fallback_rows = rows[1];
}

/* Context parallel attention of this rank's heads over the CP group. */
static int attention_cp(job *j)
{
    fxa_attn_desc d;
    fxa_mpi_attn_plan *plan = NULL;
    fxa_mpi_stats ms;
    fxa_wan_attn_desc(&j->cfg.wan, j->nh, &d);
    fxa_status st = fxa_mpi_attn_plan_create(j->m_cp, &d, &plan);
    int code = lib_agree(j, "context-parallel", j->C, st, fxa_mpi_last_error(j->m_cp));
    if (!code) {
        const fxa_attn_args a = {.struct_size = sizeof a, .q = j->q, .k = j->k, .v = j->v,
                                 .out = j->a};
        st = fxa_mpi_attn_run(plan, &a, &ms);
        code = lib_agree(j, "context-parallel", j->C, st, fxa_mpi_last_error(j->m_cp));
    }
    fxa_mpi_attn_plan_destroy(plan);
    if (!code)
        sum_rows(j, (int64_t[2]){ms.rows, ms.fallback_rows});
    return code;
}

/* Pure tensor parallel attention: this rank's heads over all tokens. */
static int attention_tp(job *j)
{
    fxa_attn_desc d;
    fxa_attn_plan *plan = NULL;
    fxa_attn_stats ast;
    size_t bytes = 0;
    void *ws = NULL;
    fxa_wan_attn_desc(&j->cfg.wan, j->nh, &d);
    fxa_status st = fxa_attn_plan_create(j->ctx, &d, &plan, &bytes);
    if (st == FXA_OK && bytes && !(ws = aligned_alloc(64, (bytes + 63) & ~(size_t)63)))
        st = FXA_ERR_NO_MEMORY;
    if (st == FXA_OK) {
        const fxa_attn_args a = {.struct_size = sizeof a, .q = j->q, .k = j->k, .v = j->v,
                                 .out = j->a};
        st = fxa_attn_run(plan, &a, ws, &ast);
    }
    int code = st == FXA_OK ? 0
                            : fxt_fail(fxt_exit_code(st), "attention: %s",
                                       st == FXA_ERR_NO_MEMORY ? "out of memory"
                                                               : fxa_ctx_last_error(j->ctx));
    fxa_attn_plan_destroy(plan);
    free(ws);
    sum_rows(j, (int64_t[2]){code ? 0 : ast.rows, code ? 0 : ast.fallback_rows});
    return fxt_world_agree(j->w, code);
}

/* Collective over the world: the t = 0 ranks' rows of y into rank 0's
 * y_all, over their CP group (ordered like the token shards). */
static int gather_y(job *j)
{
    const int root = j->w->rank == 0;
    int *counts = root ? malloc((size_t)j->C * sizeof(int)) : NULL;
    int *displs = root ? malloc((size_t)j->C * sizeof(int)) : NULL;
    int code = root && (!counts || !displs)
                   ? fxt_fail(FXT_EXIT_FAILURE, "out of memory gathering y")
                   : 0;
    for (int r = 0; !code && root && r < j->C; r++) {
        int64_t start, len;
        fxa_mpi_shard(j->cfg.tokens, j->C, r, &start, &len);
        counts[r] = (int)len;
        displs[r] = (int)start;
    }
    if (!(code = fxt_world_agree(j->w, code)) && j->t == 0) {
        MPI_Datatype row;
        MPI_Type_contiguous((int)j->cfg.hidden, MPI_FLOAT, &row);
        MPI_Type_commit(&row);
        MPI_Request r;
        MPI_Igatherv(j->y, (int)j->len, row, j->y_all, counts, displs, row, 0, j->cp_comm, &r);
        fxt_world_wait(j->w, &r, "gathering y");
        MPI_Type_free(&row);
    }
    free(counts);
    free(displs);
    return code;
}

/* Tensor parallel: sum the TP group's partial outputs of its tokens on its
 * t = 0 rank, which adds the bias once. */
static void reduce_y(job *j)
{
    const int root = j->t == 0;
    const int64_t n = j->len * j->cfg.hidden;
    for (int64_t off = 0; off < n; off += REDUCE_CHUNK) {
        const int64_t c = n - off < REDUCE_CHUNK ? n - off : REDUCE_CHUNK;
        MPI_Request r;
        MPI_Ireduce(root ? MPI_IN_PLACE : j->y + off, j->y + off, (int)c, MPI_FLOAT, MPI_SUM, 0,
                    j->tp_comm, &r);
        fxt_world_wait(j->w, &r, "the output projection's partial sums");
    }
    for (int64_t s = 0; root && s < j->len; s++)
        for (int64_t c = 0; c < j->cfg.hidden; c++)
            j->y[s * j->cfg.hidden + c] += j->part.o.bias[c];
}

/* The output projection of this rank's attention output (tensor parallel:
 * by its heads' columns of o.weight, the bias left for reduce_y), then y
 * assembled on rank 0. */
static int out_proj(job *j)
{
    fxa_wan_linear o = j->part.o;
    if (j->tp_mode)
        o.bias = NULL;
    const fxa_status st = fxa_wan_out_proj(j->ctx, &j->cfg.wan, &o, j->len, j->a, j->y);
    int code = st == FXA_OK ? 0
                            : fxt_fail(fxt_exit_code(st), "output projection: %s",
                                       fxa_ctx_last_error(j->ctx));
    if ((code = fxt_world_agree(j->w, code)))
        return code;
    if (j->tp_mode)
        reduce_y(j);
    return j->cp_mode ? gather_y(j) : 0;
}

/* The three stages, timed (the slowest rank's seconds). */
static int forward(job *j)
{
    double t[4];
    int code;
    t[0] = fxt_now();
    if ((code = qkv(j)))
        return code;
    t[1] = fxt_now();
    if ((code = j->cp_mode ? attention_cp(j) : attention_tp(j)))
        return code;
    t[2] = fxt_now();
    if ((code = out_proj(j)))
        return code;
    t[3] = fxt_now();
    double secs[3] = {t[1] - t[0], t[2] - t[1], t[3] - t[2]};
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, secs, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &r);
    fxt_world_wait(j->w, &r, "the timings");
    j->rep.qkv_seconds = secs[0];
    j->rep.attention_seconds = secs[1];
    j->rep.out_seconds = secs[2];
    return 0;
}

/* Rank 0: --verify (against the whole layer and x) and -o. */
static int finish(job *j, fxt_layer_check *check)
{
    fxt_layer_x whole;
    memset(&whole, 0, sizeof whole);
    int code = 0;
    if (j->w->rank == 0 && j->o->verify) {
        const int all_tokens = j->len == j->cfg.tokens;
        const fxa_wan_weights *w = j->nh < j->cfg.heads ? &j->all : &j->part;
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
    j->rep.mode = !j->tp_mode ? "context" : j->cp_mode ? "tensor+context" : "tensor";
    j->rep.ranks = j->w->size;
    j->rep.ulysses = j->cp_mode ? j->U : 1;
    j->rep.ring = j->cp_mode ? j->C / j->U : 1;
    j->rep.tp = j->T;
    j->rep.threads = fxa_ctx_threads(j->ctx);
    j->rep.isa = fxa_ctx_isa(j->ctx);
    fxt_layer_print(j->o, &j->cfg, &j->rep);
}

/* This rank's weights (fp32 rows of its heads, as in cmd_layer.c) and
 * activations of its tokens; rank 0 also gathers y, and for --verify
 * holds the whole layer and x. node_ranks ranks share the node's memory. */
static int check_memory(const job *j, int node_ranks)
{
    const double h = (double)j->cfg.hidden, s = (double)j->len, all = (double)j->cfg.tokens;
    double need = 16.0 * h * h / j->T + 40.0 * s * h;
    if (j->w->rank == 0)
        need += 4.0 * all * h + (j->o->verify ? 16.0 * h * h + 40.0 * all * h : 0.0);
    return fxt_check_memory(need, node_ranks, "layer: this rank's weights and activations");
}

static int run(fxt_world *w, const layer_opts *o)
{
    job j;
    fxt_layer_check check;
    memset(&j, 0, sizeof j);
    j.w = w;
    j.o = o;
    j.tp_comm = j.cp_comm = MPI_COMM_NULL;
    fxa_ctx_params cp;
    fxa_ctx_params_init(&cp);
    cp.n_threads = fxt_mpi_threads_per_rank(o->threads);
    int code = setup(&j);
    const int node_ranks = fxt_mpi_node_ranks();
    if (!code)
        code = check_memory(&j, node_ranks);
    if (!code && fxa_ctx_create(&cp, &j.ctx) != FXA_OK)
        code = fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_create_error());
    if ((code = fxt_world_agree(w, code)) || (code = groups(&j)) ||
        (code = fxt_world_agree(w, load(&j))) || (code = forward(&j)) ||
        (code = finish(&j, &check)))
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
    code = run(&w, o);
    fxt_world_finalize(&w);
    return code;
}
