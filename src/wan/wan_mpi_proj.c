/*
 * Tensor-parallel QKV projection: the ranks of m hold different heads of
 * the same tokens; one reduction joins their RMSNorm sums of squares (see
 * fxa_proj_run_tp in fxattn_proj.h). Part of libfxattn_wan_mpi, beside the
 * layer that uses it, so that libfxattn_mpi links neither BLAS nor oneDNN.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_proj.h"
#include "fxattn_wan_mpi.h"
#include "base/struct_size.h"

struct fxa_mpi_proj_plan {
    fxa_mpi *m;
    fxa_proj_plan *proj;
};

/* An in-place MPI_Iallreduce over m's ranks, waited under m's deadline. */
static fxa_status allreduce(fxa_mpi *m, void *buf, int n, MPI_Datatype t, MPI_Op op,
                            const char *what)
{
    MPI_Request r;
    if (MPI_Iallreduce(MPI_IN_PLACE, buf, n, t, op, fxa_mpi_comm(m), &r) != MPI_SUCCESS)
        return FXA_ERR_MPI;
    return fxa_mpi_wait_on(m, 1, &r, what);
}

/* First agree on failure (the buffers of failed ranks are shorter), then
 * sum the sums of squares over the group, Q and K in one collective. */
static fxa_status reduce_sums(double *sums, int64_t n, void *arg)
{
    fxa_mpi *m = arg;
    int failed = sums[n - 1] != 0.0;
    fxa_status st = allreduce(m, &failed, 1, MPI_INT, MPI_MAX, "the tensor-parallel failure flags");
    if (st != FXA_OK)
        return st;
    if (failed) {
        sums[n - 1] = 1.0;
        return FXA_OK;
    }
    if (n - 1 > INT32_MAX)
        return FXA_ERR_MPI;
    return allreduce(m, sums, (int)(n - 1), MPI_DOUBLE, MPI_SUM,
                     "the tensor-parallel RMSNorm sums");
}

fxa_status fxa_mpi_proj_plan_create(fxa_mpi *m, const fxa_proj_desc *d, int64_t heads_q_total,
                                    int64_t heads_kv_total, fxa_mpi_proj_plan **plan,
                                    size_t *workspace_bytes)
{
    if (!m)
        return FXA_ERR_INVALID_ARG;
    char msg[512] = "";
    fxa_status st = FXA_OK;
    fxa_proj_desc full;
    fxa_proj_desc_init(&full);
    if (!d || !plan || !workspace_bytes || heads_q_total < 1 || heads_kv_total < 0) {
        st = FXA_ERR_INVALID_ARG;
        snprintf(msg, sizeof msg, "NULL argument, or bad head totals");
    } else {
        st = fxa_struct_in(&full, sizeof full, d, FXA_PROJ_DESC_SIZE_0_1, "fxa_proj_desc", msg,
                           sizeof msg);
    }
    if (plan)
        *plan = NULL;
    st = fxa_mpi_agree(m, st, msg);
    if (st != FXA_OK)
        return st;
    d = &full;
    /* Every rank must project the same tokens the same way. */
    const int64_t same[] = {d->tokens,      d->head_dim,    d->x_format,   d->w_format,
                            d->norm,        d->rope,        d->out_layout, heads_q_total,
                            heads_kv_total, d->heads_kv > 0};
    struct {
        int64_t same[sizeof same / sizeof same[0]];
        double eps;
    } all;
    memset(&all, 0, sizeof all);
    memcpy(all.same, same, sizeof same);
    all.eps = d->eps;
    st = fxa_mpi_check_same(m, &all, sizeof all,
                            "the projection (tokens, head_dim, formats, options)");
    if (st != FXA_OK)
        return st;
    fxa_mpi_proj_plan *p = calloc(1, sizeof *p);
    if (!p) {
        st = FXA_ERR_NO_MEMORY;
        snprintf(msg, sizeof msg, "out of memory for the projection's plan");
    } else {
        p->m = m;
        const fxa_proj_tp tp = {.struct_size = sizeof tp,
                                .norm_features_q = heads_q_total * d->head_dim,
                                .norm_features_k = heads_kv_total * d->head_dim,
                                .reduce = reduce_sums,
                                .arg = m};
        st = fxa_proj_plan_create_tp(fxa_mpi_ctx(m), d, &tp, &p->proj, workspace_bytes);
        snprintf(msg, sizeof msg, "%s", fxa_ctx_last_error(fxa_mpi_ctx(m)));
    }
    st = fxa_mpi_agree(m, st, msg);
    if (st != FXA_OK) {
        fxa_mpi_proj_plan_destroy(p);
        return st;
    }
    *plan = p;
    return FXA_OK;
}

fxa_status fxa_mpi_proj_run(fxa_mpi_proj_plan *p, const fxa_proj_args *a, void *workspace)
{
    return fxa_mpi_proj_run_stats(p, a, workspace, NULL);
}

fxa_status fxa_mpi_proj_run_stats(fxa_mpi_proj_plan *p, const fxa_proj_args *a, void *workspace,
                                  fxa_proj_stats *stats)
{
    if (!p)
        return FXA_ERR_INVALID_ARG;
    fxa_mpi *m = p->m;
    char msg[512];
    const fxa_status st = fxa_proj_run_stats(p->proj, a, workspace, stats);
    snprintf(msg, sizeof msg, "%s", fxa_ctx_last_error(fxa_mpi_ctx(m)));
    /* A failure on one rank shows up on the others as "another rank
     * failed": agree so that every rank reports the failing rank's own. */
    const fxa_status mine =
        st == FXA_ERR_INVALID_ARG && strstr(msg, "another tensor-parallel rank failed") ? FXA_OK
                                                                                        : st;
    const fxa_status agreed = fxa_mpi_agree(m, mine, msg);
    return agreed != FXA_OK ? agreed : st;
}

void fxa_mpi_proj_plan_destroy(fxa_mpi_proj_plan *p)
{
    if (!p)
        return;
    fxa_proj_plan_destroy(p->proj);
    free(p);
}
