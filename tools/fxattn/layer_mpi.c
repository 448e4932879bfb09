/*
 * `fxattn layer` under mpirun (layer.h).
 *
 * Context parallel (--ulysses U --ring R; the default, a pure ring): each
 * rank projects its own token shard fxa_mpi_shard(S, P, rank) with all heads
 * (the projection is per token, so it needs no communication),
 * libfxattn_mpi computes attention over the shards, each rank projects its
 * attention output, and rank 0 gathers y.
 *
 * Tensor parallel (--tp T on T ranks): every rank holds all tokens and the
 * heads [h0, h1) of fxa_mpi_shard's split applied to heads. The QKV
 * projection of those heads joins the RMSNorm sums of squares over the
 * ranks (fxa_mpi_proj_run), attention runs locally on them, and the output
 * projection is row-parallel: y_partial = a_local W_o[:, cols]^T, one
 * MPI_Allreduce (sum) of the partials, the bias added once on rank 0.
 *
 * Every rank loads the whole checkpoint (tensor-parallel ranks then keep
 * only their slice; rank 0 also keeps the whole, for the bias and --verify). Every failure, on
 * any rank, is agreed on: all ranks exit with the same status, and rank 0
 * prints the failing rank's message once. Rank 0 verifies and writes y.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "fxattn_mpi.h"
#include "layer.h"
#include "mpi_cli.h"

#define ALLREDUCE_CHUNK (1 << 26) /* floats per MPI_Allreduce */

/* One rank's state. */
typedef struct job {
    fxt_world *w;
    const layer_opts *o;
    fxt_layer_cfg cfg;
    fxa_ctx *ctx;
    fxa_mpi *m;
    fxt_layer_weights all;  /* the whole layer (tensor parallel: rank 0 only) */
    fxt_layer_weights part; /* tensor parallel: this rank's heads */
    fxt_layer_x x;          /* this rank's tokens (tensor parallel: all) */
    int64_t start, len;     /* tokens held (context parallel) */
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
    fxt_layer_weights_free(&j->all);
    fxt_layer_weights_free(&j->part);
    fxa_mpi_destroy(j->m);
    fxa_ctx_destroy(j->ctx);
}

/* Copy `n` rows of `row_bytes` from src row s0 to dst row d0. */
static void copy_rows(void *dst, int64_t d0, const void *src, int64_t s0, int64_t n,
                      size_t row_bytes)
{
    if (src)
        memcpy((char *)dst + (size_t)d0 * row_bytes, (const char *)src + (size_t)s0 * row_bytes,
               (size_t)n * row_bytes);
}

/* This rank's heads [h0, h0 + nh) of j->all into j->part: their Q, K and V
 * rows, gammas, and the matching columns of o.weight (without its bias,
 * which is added once after the sum). */
static int slice_heads(job *j)
{
    const fxt_layer_weights *all = &j->all;
    fxt_layer_weights *p = &j->part;
    const int64_t h = j->cfg.hidden;
    const int64_t n = j->nh * j->cfg.head_dim;
    const int64_t c0 = j->h0 * j->cfg.head_dim;
    const size_t eq = all->qkv.format == FXA_PROJ_W_E4M3 ? 1 : sizeof(float);
    const size_t eo = all->o.format == FXA_PROJ_W_E4M3 ? 1 : sizeof(float);
    p->qkv = (fxt_layer_mat){.format = all->qkv.format, .rows = 3 * n, .cols = h};
    p->o = (fxt_layer_mat){.format = all->o.format, .rows = h, .cols = n};
    p->qkv.w = malloc((size_t)(3 * n * h) * eq);
    p->qkv.bias = malloc((size_t)(3 * n) * sizeof(float));
    p->qkv.scales = all->qkv.scales ? malloc((size_t)(3 * n) * sizeof(float)) : NULL;
    p->o.w = malloc((size_t)(h * n) * eo);
    p->o.scales = all->o.scales ? malloc((size_t)h * sizeof(float)) : NULL;
    p->gamma_q = malloc((size_t)n * sizeof(float));
    p->gamma_k = malloc((size_t)n * sizeof(float));
    if (!p->qkv.w || !p->qkv.bias || (all->qkv.scales && !p->qkv.scales) || !p->o.w ||
        (all->o.scales && !p->o.scales) || !p->gamma_q || !p->gamma_k)
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for this rank's weights");
    for (int64_t seg = 0; seg < 3; seg++) {
        copy_rows(p->qkv.w, seg * n, all->qkv.w, seg * h + c0, n, (size_t)h * eq);
        copy_rows(p->qkv.bias, seg * n, all->qkv.bias, seg * h + c0, n, sizeof(float));
        copy_rows(p->qkv.scales, seg * n, all->qkv.scales, seg * h + c0, n, sizeof(float));
    }
    copy_rows(p->gamma_q, 0, all->gamma_q, c0, n, sizeof(float));
    copy_rows(p->gamma_k, 0, all->gamma_k, c0, n, sizeof(float));
    copy_rows(p->o.scales, 0, all->o.scales, 0, h, sizeof(float));
    const char *o_all = all->o.w;
    for (int64_t r = 0; r < h; r++) /* columns [c0, c0 + n) of o.weight's row r */
        memcpy((char *)p->o.w + (size_t)(r * n) * eo, o_all + (size_t)(r * h + c0) * eo,
               (size_t)n * eo);
    return 0;
}

/* Settle the problem and the split; every rank gets the same answer. */
static int setup(job *j)
{
    const fxt_world *w = j->w;
    const layer_opts *o = j->o;
    int code = fxt_layer_setup(o, &j->cfg);
    if (!code && o->tp > 0 && o->tp != w->size)
        code = fxt_fail(FXT_EXIT_BAD_INPUT, "--tp %lld needs %lld ranks, not %d",
                        (long long)o->tp, (long long)o->tp, w->size);
    if (!code && o->tp > 0 && j->cfg.heads < w->size)
        code = fxt_fail(FXT_EXIT_BAD_INPUT, "--tp %d: %lld heads cannot be split over %d ranks",
                        w->size, (long long)j->cfg.heads, w->size);
    if (!code && o->tp == 0 && j->cfg.tokens < w->size)
        code = fxt_fail(FXT_EXIT_BAD_INPUT, "%lld tokens cannot be split over %d ranks",
                        (long long)j->cfg.tokens, w->size);
    if (code)
        return code;
    j->start = 0;
    j->len = j->cfg.tokens;
    j->h0 = 0;
    j->nh = j->cfg.heads;
    if (o->tp > 0)
        fxa_mpi_shard(j->cfg.heads, w->size, w->rank, &j->h0, &j->nh);
    else
        fxa_mpi_shard(j->cfg.tokens, w->size, w->rank, &j->start, &j->len);
    return 0;
}

/* Weights, x and buffers of this rank. */
static int load(job *j)
{
    const int tp = j->o->tp > 0;
    int code = fxt_layer_load_weights(j->o, &j->cfg, &j->all);
    if (!code && tp)
        code = slice_heads(j);
    if (!code && tp && j->w->rank != 0)
        fxt_layer_weights_free(&j->all); /* rank 0 keeps o's bias and, for --verify, the rest */
    if (!code)
        code = fxt_layer_load_x(j->o, &j->cfg, j->start, j->len, &j->x);
    if (!code)
        code = fxt_layer_rope(&j->cfg, &j->cs, &j->sn);
    if (code)
        return code;
    const size_t n = (size_t)(j->len * j->nh * j->cfg.head_dim) * sizeof(float) + 1;
    float **const bufs[] = {&j->q, &j->k, &j->v, &j->a};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (!(*bufs[i] = malloc(n)))
            code = FXT_EXIT_FAILURE;
    j->y = malloc((size_t)(j->len * j->cfg.hidden) * sizeof(float) + 1);
    j->y_all = j->w->rank != 0 ? NULL
               : tp            ? j->y
                               : malloc((size_t)(j->cfg.tokens * j->cfg.hidden) * sizeof(float));
    if (code || !j->y || (j->w->rank == 0 && !j->y_all))
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's activations");
    return 0;
}

/* The QKV projection of this rank's tokens and heads. */
static int qkv(job *j)
{
    const fxt_layer_weights *w = j->o->tp > 0 ? &j->part : &j->all;
    const int64_t d = j->cfg.head_dim;
    fxa_proj_desc pd;
    fxa_proj_args pa;
    fxt_layer_qkv_call(&j->cfg, w, j->nh, &j->x, j->cs + j->start * d, j->sn + j->start * d,
                       j->q, j->k, j->v, &pd, &pa);
    if (j->o->tp > 0) {
        const fxa_status st = fxa_mpi_proj_run(j->m, &pd, &pa, j->cfg.heads, j->cfg.heads);
        return fxt_world_lib_fail(j->w, st, fxa_mpi_last_error(j->m));
    }
    const fxa_status st = fxa_proj_run(j->ctx, &pd, &pa);
    const int code = st == FXA_OK ? 0
                                  : fxt_fail(fxt_exit_code(st), "QKV projection: %s",
                                             fxa_ctx_last_error(j->ctx));
    return fxt_world_agree(j->w, code);
}

/* Context parallel attention over the shards. */
static int attention_cp(job *j)
{
    fxa_attn_desc d;
    fxa_mpi_attn_plan *plan = NULL;
    fxa_mpi_stats ms;
    fxt_layer_attn_desc(&j->cfg, j->cfg.heads, &d);
    fxa_status st = fxa_mpi_attn_plan_create(j->m, &d, &plan);
    int code = fxt_world_lib_fail(j->w, st, fxa_mpi_last_error(j->m));
    if (!code) {
        const fxa_attn_args a = {.struct_size = sizeof a, .q = j->q, .k = j->k, .v = j->v,
                                 .out = j->a};
        st = fxa_mpi_attn_run(plan, &a, &ms);
        code = fxt_world_lib_fail(j->w, st, fxa_mpi_last_error(j->m));
    }
    if (!code) {
        j->rep.rows = ms.rows;
        j->rep.fallback_rows = ms.fallback_rows;
    }
    fxa_mpi_attn_plan_destroy(plan);
    return code;
}

/* Tensor parallel attention: this rank's heads over all tokens. */
static int attention_tp(job *j)
{
    fxa_attn_desc d;
    fxa_attn_plan *plan = NULL;
    fxa_attn_stats ast;
    size_t bytes = 0;
    void *ws = NULL;
    fxt_layer_attn_desc(&j->cfg, j->nh, &d);
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
    int64_t rows[2] = {code ? 0 : ast.rows, code ? 0 : ast.fallback_rows};
    MPI_Allreduce(MPI_IN_PLACE, rows, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    j->rep.rows = rows[0];
    j->rep.fallback_rows = rows[1];
    return fxt_world_agree(j->w, code);
}

/* Rank 0 receives every rank's rows of y into y_all. */
static int gather_y(job *j)
{
    const fxt_world *w = j->w;
    int *counts = w->rank == 0 ? malloc((size_t)w->size * sizeof(int)) : NULL;
    int *displs = w->rank == 0 ? malloc((size_t)w->size * sizeof(int)) : NULL;
    int code = w->rank == 0 && (!counts || !displs)
                   ? fxt_fail(FXT_EXIT_FAILURE, "out of memory gathering y")
                   : 0;
    for (int r = 0; !code && w->rank == 0 && r < w->size; r++) {
        int64_t start, len;
        fxa_mpi_shard(j->cfg.tokens, w->size, r, &start, &len);
        counts[r] = (int)len;
        displs[r] = (int)start;
    }
    if (!(code = fxt_world_agree(j->w, code))) {
        MPI_Datatype row;
        MPI_Type_contiguous((int)j->cfg.hidden, MPI_FLOAT, &row);
        MPI_Type_commit(&row);
        MPI_Gatherv(j->y, (int)j->len, row, j->y_all, counts, displs, row, 0, MPI_COMM_WORLD);
        MPI_Type_free(&row);
    }
    free(counts);
    free(displs);
    return code;
}

/* Tensor parallel: sum the ranks' partial outputs on rank 0, which adds the
 * bias once. */
static void reduce_y(job *j)
{
    const int64_t n = j->cfg.tokens * j->cfg.hidden;
    for (int64_t off = 0; off < n; off += ALLREDUCE_CHUNK) {
        const int64_t c = n - off < ALLREDUCE_CHUNK ? n - off : ALLREDUCE_CHUNK;
        MPI_Reduce(j->w->rank == 0 ? MPI_IN_PLACE : j->y + off, j->y + off, (int)c, MPI_FLOAT,
                   MPI_SUM, 0, MPI_COMM_WORLD);
    }
    for (int64_t s = 0; j->w->rank == 0 && s < j->cfg.tokens; s++)
        for (int64_t c = 0; c < j->cfg.hidden; c++)
            j->y[s * j->cfg.hidden + c] += j->all.o.bias[c];
}

/* The output projection of this rank's attention output (tensor parallel:
 * its columns), then y assembled on rank 0. */
static int out_proj(job *j)
{
    const int tp = j->o->tp > 0;
    const fxt_layer_mat *o = tp ? &j->part.o : &j->all.o;
    const fxa_status st = fxt_layer_out(j->ctx, &j->cfg, o, j->len, j->a, j->y);
    int code = st == FXA_OK ? 0
                            : fxt_fail(fxt_exit_code(st), "output projection: %s",
                                       fxa_ctx_last_error(j->ctx));
    if ((code = fxt_world_agree(j->w, code)))
        return code;
    if (!tp)
        return gather_y(j);
    reduce_y(j);
    return 0;
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
    if ((code = j->o->tp > 0 ? attention_tp(j) : attention_cp(j)))
        return code;
    t[2] = fxt_now();
    if ((code = out_proj(j)))
        return code;
    t[3] = fxt_now();
    double secs[3] = {t[1] - t[0], t[2] - t[1], t[3] - t[2]};
    MPI_Allreduce(MPI_IN_PLACE, secs, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    j->rep.qkv_seconds = secs[0];
    j->rep.attention_seconds = secs[1];
    j->rep.out_seconds = secs[2];
    return 0;
}

/* Rank 0: --verify (against the whole x) and -o. */
static int finish(job *j, fxt_layer_check *check)
{
    fxt_layer_x whole;
    memset(&whole, 0, sizeof whole);
    int code = 0;
    if (j->w->rank == 0 && j->o->verify) {
        if (j->o->tp == 0)
            code = fxt_layer_load_x(j->o, &j->cfg, 0, j->cfg.tokens, &whole);
        if (!code)
            code = fxt_layer_verify(&j->cfg, &j->all, j->o->tp > 0 ? &j->x : &whole, j->y_all,
                                    check);
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
    int code = setup(&j);
    if (!code && fxa_ctx_create(&cp, &j.ctx) != FXA_OK)
        code = fxt_fail(FXT_EXIT_FAILURE, "%s", fxa_ctx_create_error());
    if ((code = fxt_world_agree(w, code)))
        goto done;
    fxa_mpi_params mp;
    fxa_mpi_params_init(&mp);
    mp.ulysses = o->ulysses > 0 ? (int)o->ulysses : 1;
    mp.ring = o->ring > 0 ? (int)o->ring : 0;
    const fxa_status st = fxa_mpi_create(MPI_COMM_WORLD, j.ctx, &mp, &j.m);
    if ((code = fxt_world_lib_fail(w, st, fxa_mpi_create_error())))
        goto done;
    if ((code = fxt_world_agree(w, load(&j))) || (code = forward(&j)) || (code = finish(&j, &check)))
        goto done;
    if (w->rank == 0) {
        const int tp = o->tp > 0;
        j.rep.mode = tp ? "tensor" : "context";
        j.rep.ranks = w->size;
        j.rep.ulysses = tp ? 1 : mp.ulysses;
        j.rep.ring = tp ? 1 : w->size / mp.ulysses;
        j.rep.tp = tp ? w->size : 1;
        j.rep.threads = fxa_ctx_threads(j.ctx);
        j.rep.isa = fxa_ctx_isa(j.ctx);
        fxt_layer_print(o, &j.cfg, &j.rep);
    }
done:
    job_free(&j);
    return code;
}

int fxt_layer_mpi(const layer_opts *o)
{
    fxt_world w;
    int code = fxt_world_init(&w);
    if (code)
        return code;
    code = run(&w, o);
    fxt_world_finalize(&w);
    return code;
}
