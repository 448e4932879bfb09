/* The Wan2.2 layer over MPI ranks, tensor x context parallel
 * (fxattn_wan_mpi.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_mpi.h"
#include "fxattn_wan_mpi.h"
#include "wan_fail.h"
#include "wan_internal.h"
#include "base/convert_inline.h"
#include "base/struct_size.h"

#define REDUCE_CHUNK (1 << 26) /* floats per MPI_Ireduce */

struct fxa_wan_mpi_plan {
    fxa_ctx *ctx;
    fxa_wan_desc d;
    int64_t tokens, hidden;
    int rank, size;
    int T, C, U, R; /* T x C ranks, C = U R */
    int tp_mode;    /* a grid with --tp: the norm and output projection over the TP group */
    int cp_mode;    /* attention over the CP group; 0 only for pure tensor parallelism */
    fxa_wan_mpi_shard shard;
    MPI_Comm tp_comm, cp_comm;
    fxa_mpi *m_world; /* error agreement and the layer's own waits */
    int owns_world;   /* m_world made by fxa_wan_mpi_plan_create (else the caller's) */
    fxa_mpi *m_tp, *m_cp;
    fxa_mpi_attn_plan *cp_plan;
    fxa_attn_plan *tp_plan; /* pure tensor parallel: this rank's heads over all tokens */
    /* The projections of this rank's tokens and heads, one plan per weight
     * format: QKV (over the TP group under --tp) and output. */
    fxa_proj_plan *qkv[FXA_WAN_FORMATS], *out[FXA_WAN_FORMATS];
    fxa_mpi_proj_plan *qkv_tp[FXA_WAN_FORMATS];
    size_t act_bytes;  /* one activation of this rank's tokens and heads (d.dtype) */
    size_t a_bytes;    /* the attention output: act_bytes, or fp32 under a_f32 */
    int a_f32;         /* bf16 layer over a CP group: attention writes fp32 (what
                             * libfxattn_mpi writes), rounded to bf16 in place after */
    size_t x16_bytes;  /* x rounded to bf16 (dtype bf16, fp32 x), after Q, K, V, A */
    size_t tp_bytes;   /* (rounded up to 64), after x16 */
    size_t proj_bytes; /* the projections' workspace, after tp_bytes */
    float *cs, *sn;    /* RoPE tables of all tokens */
    char error[600];
};

void fxa_wan_grid_init(fxa_wan_grid *g)
{
    memset(g, 0, sizeof *g);
    g->struct_size = sizeof *g;
}

/* Agree over the world on this rank's status st (message msg when it
 * failed); the agreed message into p->error. */
static fxa_status agree(fxa_wan_mpi_plan *p, fxa_status st, const char *msg)
{
    const fxa_status a = fxa_mpi_agree(p->m_world, st, msg);
    if (a != FXA_OK)
        snprintf(p->error, sizeof p->error, "%s", fxa_mpi_last_error(p->m_world));
    return a;
}

/* After a collective call on the group `label` of group_size ranks (its
 * status and message are the same on its ranks): the status of the world.
 * A group that is the world keeps its message; a smaller one agrees over
 * the world, so that the other groups stop too instead of waiting in the
 * next collective. A timeout leaves the group unusable: no agreement. */
static fxa_status group_agree(fxa_wan_mpi_plan *p, const char *label, int group_size, fxa_status st,
                              const char *msg)
{
    if (st == FXA_ERR_TIMEOUT || group_size == p->size) {
        if (st != FXA_OK)
            snprintf(p->error, sizeof p->error, "%s", msg);
        return st;
    }
    char m[sizeof p->error];
    snprintf(m, sizeof m, "%s group: %s", label, msg);
    return agree(p, st, m);
}

/* Wait for one request of the layer's own collectives. */
static fxa_status wait1(fxa_wan_mpi_plan *p, MPI_Request *r, const char *what)
{
    const fxa_status st = fxa_mpi_wait_on(p->m_world, 1, r, what);
    if (st != FXA_OK)
        snprintf(p->error, sizeof p->error, "%s", fxa_mpi_last_error(p->m_world));
    return st;
}

/* T, U and R from the grid and P ranks, and the splits: the same on every
 * rank for the same arguments. */
static fxa_status settle_grid(fxa_wan_mpi_plan *p, const fxa_wan_grid *g, char *err, size_t errlen)
{
    const int64_t P = p->size;
    p->tp_mode = g->tp > 0;
    p->T = g->tp > 0 ? g->tp : 1;
    p->U = g->ulysses > 0 ? g->ulysses : 1;
    const int64_t tu = (int64_t)p->T * p->U;
    if (p->tp_mode && g->ulysses == 0 && g->ring == 0 && p->T != P)
        return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG, "--tp %d needs %d ranks, not %d",
                             p->T, p->T, p->size);
    if (p->tp_mode && g->ring > 0 && tu * g->ring != P)
        return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG,
                             "--tp %d x --ulysses %d x --ring %d needs %lld ranks, not %d", p->T,
                             p->U, g->ring, (long long)(tu * g->ring), p->size);
    if (p->tp_mode && g->ring == 0 && P % tu)
        return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG,
                             "--tp %d x --ulysses %d needs a multiple of %lld ranks, not %d", p->T,
                             p->U, (long long)tu, p->size);
    /* Without --tp, U R = P is libfxattn_mpi's check. */
    p->R = p->tp_mode ? (int)(P / tu) : g->ring;
    p->C = p->size / p->T;
    p->cp_mode = !p->tp_mode || p->C > 1;
    if (p->T > 1 && p->d.heads < p->T)
        return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG,
                             "--tp %d: %lld heads cannot be split over %d ranks", p->T,
                             (long long)p->d.heads, p->T);
    if (p->cp_mode && p->tokens < p->C)
        return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG,
                             "%lld tokens cannot be split over %d ranks%s", (long long)p->tokens,
                             p->C, p->tp_mode ? " (--ulysses x --ring)" : "");
    fxa_wan_mpi_shard *s = &p->shard;
    s->tp_index = p->rank % p->T;
    s->cp_index = p->rank / p->T;
    s->holds_y = s->tp_index == 0;
    fxa_mpi_shard(p->d.heads, p->T, s->tp_index, &s->head_begin, &s->head_count);
    fxa_mpi_shard(p->tokens, p->C, s->cp_index, &s->token_begin, &s->token_count);
    return FXA_OK;
}

/* Collective over the world: every rank has arrived (a barrier polled
 * against the deadline), so that the blocking MPI_Comm_split after it
 * waits on no rank that stopped before it. */
static fxa_status arrive(fxa_wan_mpi_plan *p)
{
    MPI_Request r;
    MPI_Ibarrier(fxa_mpi_comm(p->m_world), &r);
    return wait1(p, &r, "the ranks forming the layer's groups");
}

/* The libfxattn_mpi context of a group (comm: its ranks), whose messages
 * name the ranks by their rank in the layer's grid; agreed like
 * group_agree. */
static fxa_status group_context(fxa_wan_mpi_plan *p, MPI_Comm comm, const fxa_mpi_params *mp,
                                const char *label, int group_size, fxa_mpi **out)
{
    fxa_status st = fxa_mpi_create(comm, p->ctx, mp, out);
    if (st != FXA_OK)
        return group_agree(p, label, group_size, st, fxa_mpi_create_error());
    st = fxa_mpi_name_ranks(*out, p->rank);
    return group_agree(p, label, group_size, st, fxa_mpi_last_error(*out));
}

/* The TP and CP communicators and the libfxattn_mpi contexts on them. */
static fxa_status groups(fxa_wan_mpi_plan *p, double timeout)
{
    fxa_status st = arrive(p);
    if (st != FXA_OK)
        return st;
    MPI_Comm_split(fxa_mpi_comm(p->m_world), p->shard.cp_index, p->shard.tp_index, &p->tp_comm);
    if ((st = arrive(p)) != FXA_OK)
        return st;
    MPI_Comm_split(fxa_mpi_comm(p->m_world), p->shard.tp_index, p->shard.cp_index, &p->cp_comm);
    fxa_mpi_params mp;
    fxa_mpi_params_init(&mp);
    mp.timeout_seconds = timeout;
    /* The groups come from m_world's communicator, already placed by hosts:
     * their ranks keep that order, so that the shards settle_grid gave by
     * cp_index are the CP context's grid ranks. */
    mp.placement = FXA_MPI_PLACE_RANKS;
    if (p->tp_mode)
        st = group_context(p, p->tp_comm, &mp, "tensor-parallel", p->T, &p->m_tp);
    if (st == FXA_OK && p->cp_mode) {
        mp.ulysses = p->U;
        mp.ring = p->R;
        st = group_context(p, p->cp_comm, &mp, "context-parallel", p->C, &p->m_cp);
    }
    return st;
}

/* The attention plan: over the CP group, or local under pure --tp. */
static fxa_status attention_plan(fxa_wan_mpi_plan *p)
{
    fxa_attn_desc ad;
    fxa_wan_attn_desc(&p->d, p->shard.head_count, &ad);
    if (p->cp_mode) {
        p->a_f32 = ad.out_dtype == FXA_BF16;
        ad.out_dtype = FXA_F32;
        const fxa_status st = fxa_mpi_attn_plan_create(p->m_cp, &ad, &p->cp_plan);
        return group_agree(p, "context-parallel", p->C, st, fxa_mpi_last_error(p->m_cp));
    }
    const fxa_status st = fxa_attn_plan_create(p->ctx, &ad, &p->tp_plan, &p->tp_bytes);
    return agree(p, st, st == FXA_OK ? "" : fxa_ctx_last_error(p->ctx));
}

/* This rank's RoPE tables (all tokens, [S][head_dim]). */
static fxa_status rope(fxa_wan_mpi_plan *p)
{
    const size_t n = (size_t)(p->tokens * p->d.head_dim) * sizeof(float);
    fxa_status st = FXA_OK;
    p->cs = malloc(n);
    p->sn = malloc(n);
    if (!p->cs || !p->sn)
        st = FXA_ERR_NO_MEMORY;
    else
        st = fxa_wan_rope(&p->d, p->cs, p->sn);
    return agree(p, st, st == FXA_OK ? "" : "cannot build the RoPE tables (out of memory?)");
}

/* Plan projection pd on this rank's context (its workspace in *bytes) and
 * agree on the outcome with the others; label names it in the message. */
static fxa_status local_proj_plan(fxa_wan_mpi_plan *p, const fxa_proj_desc *pd,
                                  fxa_proj_plan **plan, size_t *bytes, const char *label)
{
    const fxa_status st = fxa_proj_plan_create(p->ctx, pd, plan, bytes);
    char why[600] = "";
    if (st != FXA_OK)
        snprintf(why, sizeof why, "%s: %s", label, fxa_ctx_last_error(p->ctx));
    return agree(p, st, why);
}

/* The projections' plans of this rank's shard; proj_bytes the largest
 * workspace among them. */
static fxa_status projection_plans(fxa_wan_mpi_plan *p)
{
    static const fxa_proj_w formats[FXA_WAN_FORMATS] = {FXA_PROJ_W_F32, FXA_PROJ_W_BF16,
                                                        FXA_PROJ_W_E4M3};
    const int64_t tokens = p->shard.token_count, heads = p->shard.head_count;
    fxa_status st = FXA_OK;
    for (int f = 0; f < FXA_WAN_FORMATS && st == FXA_OK; f++) {
        fxa_proj_desc pd;
        size_t b = 0;
        fxa_wan_qkv_desc(&p->d, formats[f], heads, tokens, &pd);
        if (p->tp_mode) {
            st = fxa_mpi_proj_plan_create(p->m_tp, &pd, p->d.heads, p->d.heads, &p->qkv_tp[f], &b);
            st = group_agree(p, "tensor-parallel", p->T, st, fxa_mpi_last_error(p->m_tp));
        } else {
            st = local_proj_plan(p, &pd, &p->qkv[f], &b, "QKV projection");
        }
        p->proj_bytes = b > p->proj_bytes ? b : p->proj_bytes;
        if (st != FXA_OK)
            break;
        fxa_wan_out_desc(&p->d, formats[f], heads, tokens, &pd);
        st = local_proj_plan(p, &pd, &p->out[f], &b, "output projection");
        p->proj_bytes = b > p->proj_bytes ? b : p->proj_bytes;
    }
    p->proj_bytes = (p->proj_bytes + 63) & ~(size_t)63;
    return st;
}

/* The calling thread's last plan-creation failure (fxa_wan_mpi_create_error). */
static _Thread_local char create_error[1024];

const char *fxa_wan_mpi_create_error(void)
{
    return create_error;
}

/* The plan on the handle m (owned by the plan when owns_m); a failure's
 * message into err. */
static fxa_status plan_on(fxa_mpi *m, int owns_m, const fxa_wan_desc *d, const fxa_wan_grid *g,
                          fxa_wan_mpi_plan **plan_out, size_t *workspace_bytes, char *err,
                          size_t errlen)
{
    fxa_wan_mpi_plan *p = calloc(1, sizeof *p);
    if (!p) {
        if (owns_m)
            fxa_mpi_destroy(m);
        return fxa_wan_failf(err, errlen, FXA_ERR_NO_MEMORY, "out of memory for the layer's plan");
    }
    p->ctx = fxa_mpi_ctx(m);
    p->tp_comm = p->cp_comm = MPI_COMM_NULL;
    p->m_world = m;
    p->owns_world = owns_m;
    p->rank = fxa_mpi_rank(m);
    p->size = fxa_mpi_size(m);
    char why[600] = "";
    /* Local checks (the descriptor, the grid), agreed on. */
    fxa_wan_grid grid;
    fxa_wan_grid_init(&grid);
    fxa_status st = fxa_struct_in(&grid, sizeof grid, g, FXA_WAN_GRID_SIZE_0_1, "fxa_wan_grid", why,
                                  sizeof why);
    if (st == FXA_OK)
        st = fxa_wan_check_desc(d, &p->d, why, sizeof why);
    if (st == FXA_OK) {
        p->tokens = p->d.frames * p->d.height * p->d.width;
        p->hidden = p->d.heads * p->d.head_dim;
        st = settle_grid(p, &grid, why, sizeof why);
    }
    st = agree(p, st, why);
    if (st == FXA_OK)
        st = groups(p, grid.timeout_seconds);
    if (st == FXA_OK)
        st = attention_plan(p);
    if (st == FXA_OK)
        st = rope(p);
    if (st == FXA_OK)
        st = projection_plans(p);
    if (st != FXA_OK) {
        fxa_wan_failf(err, errlen, st, "%s", p->error);
        fxa_wan_mpi_plan_destroy(p);
        return st;
    }
    p->tp_bytes = (p->tp_bytes + 63) & ~(size_t)63;
    p->act_bytes = fxa_wan_act_bytes(&p->d, p->shard.token_count, p->shard.head_count);
    fxa_wan_desc d32 = p->d;
    d32.dtype = FXA_F32;
    p->a_bytes = p->a_f32 ? fxa_wan_act_bytes(&d32, p->shard.token_count, p->shard.head_count)
                          : p->act_bytes;
    p->x16_bytes = fxa_wan_x16_bytes(&p->d, p->shard.token_count);
    *workspace_bytes = 3 * p->act_bytes + p->a_bytes + p->x16_bytes + p->tp_bytes + p->proj_bytes;
    *plan_out = p;
    return FXA_OK;
}

fxa_status fxa_wan_mpi_plan_create(MPI_Comm comm, fxa_ctx *ctx, const fxa_wan_desc *d,
                                   const fxa_wan_grid *g, fxa_wan_mpi_plan **plan_out,
                                   size_t *workspace_bytes)
{
    char *const err = create_error;
    const size_t errlen = sizeof create_error;
    create_error[0] = '\0';
    if (!ctx || !d || !g || !plan_out || !workspace_bytes)
        return fxa_wan_failf(err, errlen, FXA_ERR_INVALID_ARG,
                             "fxa_wan_mpi_plan_create: NULL argument");
    *plan_out = NULL;
    fxa_mpi_params mp;
    fxa_mpi_params_init(&mp);
    mp.timeout_seconds = g->timeout_seconds;
    fxa_mpi *m = NULL;
    const fxa_status st = fxa_mpi_create(comm, ctx, &mp, &m);
    if (st != FXA_OK)
        return fxa_wan_failf(err, errlen, st, "%s", fxa_mpi_create_error());
    return plan_on(m, 1, d, g, plan_out, workspace_bytes, err, errlen);
}

fxa_status fxa_wan_mpi_plan_create_on(fxa_mpi *m, const fxa_wan_desc *d, const fxa_wan_grid *g,
                                      fxa_wan_mpi_plan **plan_out, size_t *workspace_bytes)
{
    if (!m)
        return FXA_ERR_INVALID_ARG;
    if (!d || !g || !plan_out || !workspace_bytes) {
        fxa_mpi_report(m, "fxa_wan_mpi_plan_create_on: NULL argument");
        return FXA_ERR_INVALID_ARG;
    }
    *plan_out = NULL;
    char err[sizeof create_error];
    const fxa_status st = plan_on(m, 0, d, g, plan_out, workspace_bytes, err, sizeof err);
    if (st != FXA_OK)
        fxa_mpi_report(m, err);
    return st;
}

void fxa_wan_mpi_plan_destroy(fxa_wan_mpi_plan *p)
{
    if (!p)
        return;
    fxa_mpi_attn_plan_destroy(p->cp_plan);
    fxa_attn_plan_destroy(p->tp_plan);
    for (int f = 0; f < FXA_WAN_FORMATS; f++) {
        fxa_proj_plan_destroy(p->qkv[f]);
        fxa_proj_plan_destroy(p->out[f]);
        fxa_mpi_proj_plan_destroy(p->qkv_tp[f]);
    }
    fxa_mpi_destroy(p->m_cp);
    fxa_mpi_destroy(p->m_tp);
    if (p->cp_comm != MPI_COMM_NULL)
        MPI_Comm_free(&p->cp_comm);
    if (p->tp_comm != MPI_COMM_NULL)
        MPI_Comm_free(&p->tp_comm);
    if (p->owns_world)
        fxa_mpi_destroy(p->m_world);
    free(p->cs);
    free(p->sn);
    free(p);
}

void fxa_wan_mpi_shard_of(const fxa_wan_mpi_plan *p, fxa_wan_mpi_shard *s)
{
    *s = p->shard;
}

void fxa_wan_mpi_grid_of(const fxa_wan_mpi_plan *p, int *tp, int *ulysses, int *ring)
{
    *tp = p->T;
    *ulysses = p->cp_mode ? p->U : 1;
    *ring = p->cp_mode ? p->C / p->U : 1;
}

const char *fxa_wan_mpi_last_error(const fxa_wan_mpi_plan *p)
{
    return p ? p->error : "";
}

/* The weights hold the shard's heads of the plan's layer. */
static fxa_status check_weights(const fxa_wan_mpi_plan *p, const fxa_wan_weights *w, char *why,
                                size_t n)
{
    const fxa_wan_mpi_shard *s = &p->shard;
    if (w->hidden == p->hidden && w->heads == p->d.heads && w->head_dim == p->d.head_dim &&
        w->head_begin == s->head_begin && w->head_count == s->head_count && w->qkv.w && w->o.w &&
        (unsigned)w->qkv.format <= FXA_PROJ_W_E4M3 && (unsigned)w->o.format <= FXA_PROJ_W_E4M3)
        return FXA_OK;
    return fxa_wan_failf(
        why, n, FXA_ERR_INVALID_ARG,
        "the weights hold heads [%lld, +%lld) of %lld x %lld; this rank's shard is "
        "heads [%lld, +%lld) of %lld x %lld",
        (long long)w->head_begin, (long long)w->head_count, (long long)w->heads,
        (long long)w->head_dim, (long long)s->head_begin, (long long)s->head_count,
        (long long)p->d.heads, (long long)p->d.head_dim);
}

/* The QKV projection of this rank's tokens onto its heads. */
static fxa_status qkv(fxa_wan_mpi_plan *p, const fxa_wan_weights *w, const void *x, void *q,
                      void *k, void *v, void *x16, void *proj_ws, fxa_proj_stats *ps)
{
    const int64_t off = p->shard.token_begin * p->d.head_dim;
    if (x16) {
        char why[600] = "";
        const fxa_status st = agree(
            p, fxa_wan_round_x(p->ctx, &p->d, x, p->shard.token_count, x16, why, sizeof why), why);
        if (st != FXA_OK)
            return st;
        x = x16;
    }
    fxa_proj_args pa;
    fxa_wan_qkv_args(w, x, p->cs + off, p->sn + off, q, k, v, &pa);
    if (p->tp_mode) {
        const fxa_status st = fxa_mpi_proj_run_stats(p->qkv_tp[w->qkv.format], &pa, proj_ws, ps);
        return group_agree(p, "tensor-parallel", p->T, st, fxa_mpi_last_error(p->m_tp));
    }
    const fxa_status st = fxa_proj_run_stats(p->qkv[w->qkv.format], &pa, proj_ws, ps);
    char why[600] = "";
    if (st != FXA_OK)
        snprintf(why, sizeof why, "QKV projection: %s", fxa_ctx_last_error(p->ctx));
    return agree(p, st, why);
}

/* rows[2] (attention rows, fallback rows of this rank's heads) summed over
 * the TP group. */
static fxa_status sum_rows(fxa_wan_mpi_plan *p, int64_t rows[2])
{
    if (!p->tp_mode)
        return FXA_OK;
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, rows, 2, MPI_INT64_T, MPI_SUM, p->tp_comm, &r);
    return wait1(p, &r, "the tensor-parallel row counts");
}

/* Attention of this rank's heads: over the CP group, or over all tokens
 * locally (pure tensor parallelism); *compute: the compute it ran. */
static fxa_status attention(fxa_wan_mpi_plan *p, const void *q, const void *k, const void *v,
                            void *a, void *tp_ws, int64_t rows[2], fxa_compute *compute)
{
    const fxa_attn_args args = {.struct_size = sizeof args, .q = q, .k = k, .v = v, .out = a};
    fxa_status st;
    if (p->cp_mode) {
        fxa_mpi_stats ms = {.struct_size = sizeof ms};
        st = fxa_mpi_attn_run(p->cp_plan, &args, &ms);
        st = group_agree(p, "context-parallel", p->C, st, fxa_mpi_last_error(p->m_cp));
        rows[0] = ms.rows;
        rows[1] = ms.fallback_rows;
        *compute = ms.compute;
        /* In place, in index order: element i's bf16 lands at or below its
         * own fp32, never on one not yet read. */
        const size_t n = (size_t)(p->shard.token_count * p->shard.head_count * p->d.head_dim);
        unsigned char *bytes = a;
        for (size_t i = 0; st == FXA_OK && p->a_f32 && i < n; i++) {
            float f;
            memcpy(&f, bytes + 4 * i, sizeof f);
            const uint16_t h = fxa_f32_to_bf16_bits(f);
            memcpy(bytes + 2 * i, &h, sizeof h);
        }
    } else {
        fxa_attn_stats ast = {.struct_size = sizeof ast};
        st = fxa_attn_run(p->tp_plan, &args, tp_ws, &ast);
        char why[600] = "";
        if (st != FXA_OK)
            snprintf(why, sizeof why, "attention: %s", fxa_ctx_last_error(p->ctx));
        st = agree(p, st, why);
        rows[0] = ast.rows;
        rows[1] = ast.fallback_rows;
        *compute = ast.compute;
    }
    return st == FXA_OK ? sum_rows(p, rows) : st;
}

/* Tensor parallel: the TP group's partial outputs of its tokens summed on
 * its t = 0 rank, which adds the bias once. */
static fxa_status reduce_y(fxa_wan_mpi_plan *p, const fxa_wan_linear *o, float *y)
{
    const int root = p->shard.holds_y;
    const int64_t n = p->shard.token_count * p->hidden;
    for (int64_t off = 0; off < n; off += REDUCE_CHUNK) {
        const int64_t c = n - off < REDUCE_CHUNK ? n - off : REDUCE_CHUNK;
        MPI_Request r;
        MPI_Ireduce(root ? MPI_IN_PLACE : y + off, y + off, (int)c, MPI_FLOAT, MPI_SUM, 0,
                    p->tp_comm, &r);
        const fxa_status st = wait1(p, &r, "the output projection's partial sums");
        if (st != FXA_OK)
            return st;
    }
    for (int64_t s = 0; root && o->bias && s < p->shard.token_count; s++)
        for (int64_t c = 0; c < p->hidden; c++)
            y[s * p->hidden + c] += o->bias[c];
    return FXA_OK;
}

/* The output projection of this rank's attention output (tensor parallel:
 * by its heads' columns of o.weight, the bias added after the sum). */
static fxa_status out_proj(fxa_wan_mpi_plan *p, const fxa_wan_weights *w, const void *a, float *y,
                           void *proj_ws, fxa_proj_stats *ps)
{
    fxa_wan_linear o = w->o;
    if (p->tp_mode)
        o.bias = NULL;
    fxa_status st = fxa_wan_out_run(p->out[o.format], &o, a, y, proj_ws, ps);
    char why[600] = "";
    if (st != FXA_OK)
        snprintf(why, sizeof why, "output projection: %s", fxa_ctx_last_error(p->ctx));
    if ((st = agree(p, st, why)) != FXA_OK)
        return st;
    return p->tp_mode ? reduce_y(p, &w->o, y) : FXA_OK;
}

static double now(void)
{
    return MPI_Wtime();
}

fxa_status fxa_wan_mpi_run(fxa_wan_mpi_plan *p, const fxa_wan_weights *w, const void *x, float *y,
                           void *workspace, fxa_wan_stats *stats)
{
    const fxa_wan_args a = {sizeof a, w, x, y};
    return fxa_wan_mpi_layer_run(p, &a, workspace, stats);
}

/* fxa_wan_mpi_layer_run, its failure's message in p->error. */
static fxa_status layer_run(fxa_wan_mpi_plan *p, const fxa_wan_args *args, void *workspace,
                            fxa_wan_stats *stats)
{
    p->error[0] = '\0';
    char why[600] = "";
    fxa_wan_args in = {0};
    fxa_status st = !args ? fxa_wan_failf(why, sizeof why, FXA_ERR_INVALID_ARG,
                                          "fxa_wan_mpi_layer_run: NULL args")
                          : fxa_struct_in(&in, sizeof in, args, FXA_WAN_ARGS_SIZE_0_3,
                                          "fxa_wan_args", why, sizeof why);
    const fxa_wan_weights *w = in.weights;
    const void *x = in.x;
    float *y = in.y;
    if (st == FXA_OK)
        st = !w || !x || !y || !workspace
                 ? fxa_wan_failf(why, sizeof why, FXA_ERR_INVALID_ARG,
                                 "the layer's weights, x, y and workspace must not be NULL")
             : stats
                 ? fxa_struct_size_check(fxa_struct_size_of(stats), FXA_WAN_STATS_SIZE_0_1,
                                         sizeof(fxa_wan_stats), "fxa_wan_stats", why, sizeof why)
                 : FXA_OK;
    if (st == FXA_OK)
        st = check_weights(p, w, why, sizeof why);
    if ((st = agree(p, st, why)) != FXA_OK)
        return st;
    const size_t act = p->act_bytes;
    char *q = workspace, *k = q + act, *v = k + act, *a = v + act;
    void *x16 = p->x16_bytes ? a + p->a_bytes : NULL;
    char *tp_ws = a + p->a_bytes + p->x16_bytes;
    void *proj_ws = tp_ws + p->tp_bytes;
    double t[4], secs[3];
    int64_t rows[2] = {0, 0};
    fxa_compute compute = FXA_COMPUTE_FP32;
    fxa_proj_stats ps[2] = {{.struct_size = sizeof ps[0]}, {.struct_size = sizeof ps[1]}};
    t[0] = now();
    if ((st = qkv(p, w, x, q, k, v, x16, proj_ws, &ps[0])) != FXA_OK)
        return st;
    t[1] = now();
    if ((st = attention(p, q, k, v, a, tp_ws, rows, &compute)) != FXA_OK)
        return st;
    t[2] = now();
    if ((st = out_proj(p, w, a, y, proj_ws, &ps[1])) != FXA_OK)
        return st;
    t[3] = now();
    for (int i = 0; i < 3; i++)
        secs[i] = t[i + 1] - t[i];
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, secs, 3, MPI_DOUBLE, MPI_MAX, fxa_mpi_comm(p->m_world), &r);
    if ((st = wait1(p, &r, "the timings")) != FXA_OK)
        return st;
    const fxa_wan_stats full = {.struct_size = sizeof full,
                                .qkv_seconds = secs[0],
                                .attention_seconds = secs[1],
                                .out_seconds = secs[2],
                                .rows = rows[0],
                                .fallback_rows = rows[1],
                                .compute = compute,
                                .qkv_gemm = ps[0].gemm,
                                .out_gemm = ps[1].gemm};
    if (stats)
        fxa_struct_out(stats, &full, sizeof full);
    return FXA_OK;
}

fxa_status fxa_wan_mpi_layer_run(fxa_wan_mpi_plan *p, const fxa_wan_args *args, void *workspace,
                                 fxa_wan_stats *stats)
{
    if (!p)
        return FXA_ERR_INVALID_ARG;
    const fxa_status st = layer_run(p, args, workspace, stats);
    if (st != FXA_OK && !p->owns_world)
        fxa_mpi_report(p->m_world, p->error); /* the caller's handle carries the layer's errors */
    return st;
}

fxa_status fxa_wan_mpi_gather(fxa_wan_mpi_plan *p, const float *y, float *y_all)
{
    if (!p)
        return FXA_ERR_INVALID_ARG;
    p->error[0] = '\0';
    const int root = p->rank == 0;
    fxa_status st = root && !y_all ? fxa_wan_failf(p->error, sizeof p->error, FXA_ERR_INVALID_ARG,
                                                   "fxa_wan_mpi_gather: rank 0 needs y_all")
                                   : FXA_OK;
    int *counts = root ? malloc((size_t)p->C * sizeof(int)) : NULL;
    int *displs = root ? malloc((size_t)p->C * sizeof(int)) : NULL;
    if (st == FXA_OK && root && (!counts || !displs))
        st = FXA_ERR_NO_MEMORY;
    for (int c = 0; st == FXA_OK && root && c < p->C; c++) {
        int64_t start, len;
        fxa_mpi_shard(p->tokens, p->C, c, &start, &len);
        counts[c] = (int)len;
        displs[c] = (int)start;
    }
    st = agree(p, st, st == FXA_OK ? "" : p->error[0] ? p->error : "out of memory gathering y");
    if (st == FXA_OK && p->shard.holds_y) {
        if (!p->cp_mode) {
            if (root && y_all != y)
                memcpy(y_all, y, (size_t)(p->tokens * p->hidden) * sizeof(float));
        } else {
            MPI_Datatype row;
            MPI_Type_contiguous((int)p->hidden, MPI_FLOAT, &row);
            MPI_Type_commit(&row);
            MPI_Request r;
            MPI_Igatherv(y, (int)p->shard.token_count, row, y_all, counts, displs, row, 0,
                         p->cp_comm, &r);
            st = wait1(p, &r, "gathering y");
            MPI_Type_free(&row);
        }
    }
    free(counts);
    free(displs);
    return st;
}
