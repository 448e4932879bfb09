/*
 * Tensor-parallel QKV projection: the ranks of m hold different heads of
 * the same tokens; one reduction joins their RMSNorm sums of squares (see
 * fxa_proj_run_tp in fxattn_proj.h). Part of libfxattn_wan_mpi, beside the
 * layer that uses it, so that libfxattn_mpi links neither BLAS nor oneDNN.
 */
#include <stdio.h>
#include <string.h>

#include "fxattn_proj.h"
#include "mpi/mpi_internal.h"

typedef struct tp_reduce {
    fxa_mpi *m;
} tp_reduce;

/* First agree on failure (the buffers of failed ranks are shorter), then
 * sum the sums of squares over the group, Q and K in one collective. */
static fxa_status reduce_sums(double *sums, int64_t n, void *arg)
{
    const tp_reduce *r = arg;
    int failed = sums[n - 1] != 0.0;
    fxa_status st = fxa_mpi_allreduce(r->m, MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, r->m->comm,
                                      "the tensor-parallel failure flags");
    if (st != FXA_OK)
        return st;
    if (failed) {
        sums[n - 1] = 1.0;
        return FXA_OK;
    }
    if (n - 1 > INT32_MAX)
        return FXA_ERR_MPI;
    return fxa_mpi_allreduce(r->m, MPI_IN_PLACE, sums, (int)(n - 1), MPI_DOUBLE, MPI_SUM,
                             r->m->comm, "the tensor-parallel RMSNorm sums");
}

fxa_status fxa_mpi_proj_run(fxa_mpi *m, const fxa_proj_desc *d, const fxa_proj_args *a,
                            int64_t heads_q_total, int64_t heads_kv_total)
{
    if (!m)
        return FXA_ERR_INVALID_ARG;
    if (m->broken)
        return FXA_ERR_TIMEOUT;
    m->last_error[0] = '\0';
    char msg[512] = "";
    fxa_status st = FXA_OK;
    if (!d || d->struct_size < sizeof *d || heads_q_total < 1 || heads_kv_total < 0) {
        st = FXA_ERR_INVALID_ARG;
        snprintf(msg, sizeof msg, "projection descriptor missing, or bad head totals");
    }
    st = fxa_mpi_agree(m, st, msg);
    if (st != FXA_OK)
        return st;
    /* Every rank must project the same tokens the same way. */
    const int64_t same[] = {d->tokens,      d->head_dim,    d->x_format,   d->w_format,
                            d->norm,        d->rope,        d->out_layout, heads_q_total,
                            heads_kv_total, d->heads_kv > 0};
    uint64_t h = fxa_mpi_hash(0xcbf29ce484222325ull, same, sizeof same);
    h = fxa_mpi_hash(h, &d->eps, sizeof d->eps);
    st = fxa_mpi_same_everywhere(m, h, "the projection (tokens, head_dim, formats, options)");
    if (st != FXA_OK)
        return st;
    tp_reduce r = {m};
    const fxa_proj_tp tp = {.struct_size = sizeof tp,
                            .norm_features_q = heads_q_total * d->head_dim,
                            .norm_features_k = heads_kv_total * d->head_dim,
                            .reduce = reduce_sums,
                            .arg = &r};
    st = fxa_proj_run_tp(m->ctx, d, a, &tp);
    snprintf(msg, sizeof msg, "%s", fxa_ctx_last_error(m->ctx));
    /* A failure on one rank shows up on the others as "another rank
     * failed": agree so that every rank reports the failing rank's own. */
    const fxa_status mine =
        st == FXA_ERR_INVALID_ARG && strstr(msg, "another tensor-parallel rank failed") ? FXA_OK
                                                                                        : st;
    const fxa_status agreed = fxa_mpi_agree(m, mine, msg);
    return agreed != FXA_OK ? agreed : st;
}
