/* What the distributed forward and backward share (mpi_begin.h). */
#include <stdio.h>
#include <string.h>

#include "base/struct_size.h"
#include "mpi_begin.h"

uint64_t fxa_mpi_desc_hash(const fxa_attn_desc *d, int backward)
{
    const uint64_t seed = backward ? 0x6b77645f61747466ull : 0xcbf29ce484222325ull;
    const int64_t ints[] = {d->batch,    d->heads_q,        d->heads_kv, d->seq_q,       d->seq_kv,
                            d->head_dim, d->layout,         d->dtype,    d->mode,        d->center,
                            d->compute,  d->heads_per_tile, d->block_q,  d->reproducible};
    const uint64_t h = fxa_mpi_hash(seed, ints, sizeof ints);
    return fxa_mpi_hash(h, &d->scale, sizeof d->scale);
}

/* What libfxattn_mpi takes of any descriptor: FXA_OK, else why in msg. */
static fxa_status check_common(const fxa_attn_desc *d, char *msg, size_t cap)
{
    fxa_attn_strides zero;
    memset(&zero, 0, sizeof zero);
    if (d->causal || d->mask_kind != FXA_MASK_NONE) {
        snprintf(msg, cap,
                 "libfxattn_mpi takes no attention mask and no causal (mask_kind %d, causal %d)",
                 (int)d->mask_kind, d->causal);
        return FXA_ERR_UNSUPPORTED;
    }
    if (d->dropout_p != 0.0) {
        snprintf(msg, cap, "libfxattn_mpi takes no dropout (dropout_p %g)", d->dropout_p);
        return FXA_ERR_UNSUPPORTED;
    }
    if (d->dtype == FXA_F64) {
        snprintf(msg, cap, "libfxattn_mpi takes f32, bf16 and f16 inputs, not f64");
        return FXA_ERR_UNSUPPORTED;
    }
    if (d->out_dtype != FXA_F32 || memcmp(&d->q_strides, &zero, sizeof zero) ||
        memcmp(&d->k_strides, &zero, sizeof zero) || memcmp(&d->v_strides, &zero, sizeof zero) ||
        memcmp(&d->o_strides, &zero, sizeof zero)) {
        snprintf(msg, cap,
                 "libfxattn_mpi takes contiguous BSHD or BHSD shards (strides left 0) and fp32 "
                 "output (out_dtype FXA_F32)");
        return FXA_ERR_UNSUPPORTED;
    }
    return FXA_OK;
}

/* m's context plans the single-process forward (backward 0) or backward
 * (1) of d: FXA_OK, else its refusal in msg. */
static fxa_status check_local(fxa_mpi *m, const fxa_attn_desc *d, int backward, char *msg,
                              size_t cap)
{
    size_t ws;
    fxa_status st;
    if (backward && d->reproducible) {
        snprintf(msg, cap,
                 "libfxattn_mpi's backward is not reproducible across grids yet "
                 "(reproducible 1 is for the forward; the backward takes 0)");
        return FXA_ERR_UNSUPPORTED;
    }
    if (backward) {
        fxa_attn_bwd_plan *check = NULL;
        st = fxa_attn_bwd_plan_create(m->ctx, d, &check, &ws);
        fxa_attn_bwd_plan_destroy(check);
    } else {
        fxa_attn_plan *check = NULL;
        st = fxa_attn_plan_create(m->ctx, d, &check, &ws);
        fxa_attn_plan_destroy(check);
    }
    if (st != FXA_OK)
        snprintf(msg, cap, "%s", fxa_ctx_last_error(m->ctx));
    return st;
}

/* FXA_COMPUTE_AUTO in d resolved once for all ranks: bf16 compute only where every rank's
 * context chooses it (fxa_ctx_compute_choice), so that hosts with different cores still run
 * one compute. Collective. */
static fxa_status agree_compute(fxa_mpi *m, fxa_attn_desc *d)
{
    fxa_compute_choice c = {.struct_size = sizeof c};
    char msg[512] = "";
    fxa_status st = fxa_ctx_compute_choice(m->ctx, d->dtype, d->head_dim, &c);
    if (st != FXA_OK)
        snprintf(msg, sizeof msg, "%s", fxa_ctx_last_error(m->ctx));
    if ((st = fxa_mpi_agree(m, st, msg)) != FXA_OK)
        return st;
    int bf16 = c.compute == FXA_COMPUTE_BF16;
    int all = 0;
    st = fxa_mpi_allreduce(m, &bf16, &all, 1, MPI_INT, MPI_MIN, m->comm, "agreeing on the compute");
    d->compute = all ? FXA_COMPUTE_BF16 : FXA_COMPUTE_FP32;
    return st;
}

fxa_status fxa_mpi_plan_begin(fxa_mpi *m, const fxa_attn_desc *d, int has_out, int backward,
                              fxa_attn_desc *full)
{
    if (!m)
        return FXA_ERR_INVALID_ARG;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    m->last_error[0] = '\0';
    char msg[512] = "";
    fxa_status st = FXA_OK;
    fxa_attn_desc_init(full);
    if (!d || !has_out) {
        st = FXA_ERR_INVALID_ARG;
        snprintf(msg, sizeof msg, "NULL descriptor or output");
    } else if ((st = fxa_struct_in(full, sizeof *full, d, FXA_ATTN_DESC_SIZE_0_1, "fxa_attn_desc",
                                   msg, sizeof msg)) == FXA_OK &&
               (st = check_common(full, msg, sizeof msg)) == FXA_OK) {
        st = check_local(m, full, backward, msg, sizeof msg);
    }
    st = fxa_mpi_agree(m, st, msg);
    if (st == FXA_OK && full->compute == FXA_COMPUTE_AUTO)
        st = agree_compute(m, full);
    if (st != FXA_OK)
        return st;
    return fxa_mpi_same_everywhere(m, fxa_mpi_desc_hash(full, backward),
                                   "the attention descriptor (shapes and options)");
}

void fxa_mpi_plan_init(fxa_mpi *m, const fxa_attn_desc *d, int backward, fxa_mpi **pm,
                       fxa_attn_desc *pd, uint64_t *call, size_t *es, int64_t *q_len,
                       int64_t *kv_len)
{
    int64_t start;
    *pm = m;
    *pd = *d;
    *call = fxa_mpi_desc_hash(d, backward) | 1;
    *es = d->dtype == FXA_F32 ? 4 : 2;
    fxa_mpi_shard_of(d, d->seq_q, m->size, m->rank, &start, q_len);
    fxa_mpi_shard_of(d, d->seq_kv, m->size, m->rank, &start, kv_len);
}

fxa_status fxa_mpi_call_run(fxa_mpi *m, uint64_t call, void *plan, const void *user_args,
                            fxa_mpi_stats *user_stats, fxa_mpi_take take, fxa_mpi_body body)
{
    if (!m)
        return FXA_ERR_INVALID_ARG;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    const double t0 = MPI_Wtime();
    fxa_mpi_call c;
    memset(&c, 0, sizeof c);
    m->last_error[0] = '\0';
    c.local.struct_size = sizeof c.local;
    c.local.ring_steps = m->ring > 1 ? m->ring : 0;
    c.stats = user_stats ? &c.local : NULL;
    fxa_status st = fxa_struct_out_check(user_stats, FXA_MPI_STATS_SIZE_0_1, sizeof c.local,
                                         "fxa_mpi_stats", c.msg, sizeof c.msg);
    const int stats_ok = user_stats && st == FXA_OK; /* one of unknown size is not written */
    if (st == FXA_OK)
        st = take(plan, user_args, &c);
    st = fxa_mpi_agree_call(m, st, c.msg, call);
    if (st == FXA_OK)
        st = body(plan, &c);
    c.local.seconds = MPI_Wtime() - t0;
    if (stats_ok)
        fxa_struct_out(user_stats, &c.local, sizeof c.local);
    return st;
}
