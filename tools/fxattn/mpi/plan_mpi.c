/*
 * The planner under mpirun (docs/cluster.md): libfxattn_mpi's
 * fxa_mpi_grid_plan over the job's MPI_COMM_WORLD, on a planning context
 * (the ring of all ranks). Used by `fxattn plan --measure` and by `--grid
 * auto` of attn and bench (`--cp-grid auto` of layer).
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "fxattn_mpi.h"
#include "mpi_cli.h"
#include "plan.h"
#include "runner.h"

/* Collective: measure what m->measure asks for on this job and fill m
 * (fxa_mpi_grid_plan), the best grid into *best. gflops: --gflops (one
 * host's rate, NaN when not given), shared among the model's ranks per
 * host once the hosts are known. Returns 0 or the exit code every rank
 * agrees on (the error printed once). */
static int plan_job(fxt_world *w, int threads, double gflops, fxa_grid_model *m,
                    fxt_plan_source *src, fxa_grid_time *best)
{
    fxa_ctx *ctx = NULL;
    fxa_mpi *mpi = NULL;
    int code = fxt_context(threads, &ctx);
    if ((code = fxt_world_agree(w, code)))
        return code;
    fxa_mpi_params mp;
    fxa_mpi_params_init(&mp);
    mp.timeout_seconds = w->timeout;
    fxt_world_guard("start-up");
    fxa_status st = fxa_mpi_create(MPI_COMM_WORLD, ctx, &mp, &mpi);
    fxt_world_unguard();
    if ((code = fxt_world_lib_fail(w, st, fxa_mpi_create_error())))
        goto done;
    if (!isnan(gflops))
        m->rank_flops = gflops * 1e9; /* for the call's measurement; shared below */
    *best = (fxa_grid_time){.struct_size = sizeof *best};
    st = fxa_mpi_grid_plan(mpi, m, best);
    if ((code = fxt_world_lib_fail(w, st, fxa_mpi_last_error(mpi))))
        goto done;
    const int per_host = m->ranks / m->hosts;
    if (m->measure & FXA_GRID_MEASURE_COMPUTE) {
        src->compute = "measured per rank, all ranks at once (the slowest)";
    } else {
        m->rank_flops = gflops * 1e9 / per_host;
        src->compute = "--gflops split among a host's ranks";
        char err[200];
        if (fxa_grid_best(m, best, err, sizeof err) != FXA_OK)
            code = fxt_fail(FXT_EXIT_BAD_INPUT, "plan: %s", err); /* the same on every rank */
        code = fxt_world_agree(w, code);                          /* printed once */
    }
    if (m->measure & FXA_GRID_MEASURE_INTER)
        src->inter = "measured";
    if (m->measure & FXA_GRID_MEASURE_INTRA)
        src->intra = "measured";
done: /* library errors: the same on every rank, printed by rank 0 */
    fxa_mpi_destroy(mpi);
    fxa_ctx_destroy(ctx);
    return code;
}

int fxt_plan_mpi(const plan_opts *o)
{
    fxt_world w;
    int code = fxt_world_init(&w, 0.0);
    if (code)
        return code;
    plan_opts mine = *o;
    fxt_opt table[FXT_MAX_OPTS];
    fxt_plan_opts_table(&mine, table);
    if ((code = fxt_world_agree_options(&w, table))) {
        fxt_world_finalize(&w);
        return code;
    }
    fxa_grid_model m;
    fxt_plan_source src;
    fxa_grid_time best;
    code = fxt_plan_model_from_opts(o, &m, &src);
    if ((code = fxt_world_agree(&w, code)))
        goto done;
    const int threads = fxt_mpi_threads_per_rank(o->threads);
    if ((code = plan_job(&w, threads, o->gflops, &m, &src, &best)))
        goto done;
    if (w.rank == 0) {
        fxt_fail_capture(NULL, 0);
        code = fxt_plan_print(&m, &src, o->json, "plan");
        if (m.measure & FXA_GRID_UNEVEN_HOSTS)
            fprintf(stderr, "fxattn: warning: this job's hosts run different numbers of ranks; "
                            "the plan assumes P / N on each\n");
    }
done:
    fxt_world_finalize(&w);
    return code;
}

int fxt_mpi_grid_auto(fxt_world *w, const char *opt, const char *grid, const fxa_attn_desc *d,
                      int threads, int *ulysses, int *ring)
{
    if (!grid)
        return 0;
    int code = 0;
    if (strcmp(grid, "auto") != 0)
        code =
            fxt_fail(FXT_EXIT_BAD_INPUT, "%s '%s': only 'auto' (the planner's choice)", opt, grid);
    else if (*ulysses > 0 || *ring > 0)
        code = fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s auto picks --ulysses and --ring: give one or the other", opt);
    plan_opts o;
    fxt_plan_opts_defaults(&o);
    o.seq = d->seq_kv;
    o.heads = d->heads_q;
    o.dim = d->head_dim;
    o.dtype = fxt_dtype_name(d->dtype);
    fxa_grid_model m;
    fxt_plan_source src;
    fxa_grid_time best;
    if (!code)
        code = fxt_plan_model_from_opts(&o, &m, &src);
    if ((code = fxt_world_agree(w, code)) || (code = plan_job(w, threads, NAN, &m, &src, &best)))
        return code;
    /* Every rank holds the same model (measurements shared): the same pick. */
    *ulysses = best.ulysses;
    *ring = best.ring;
    if (w->rank == 0)
        printf("grid auto: Ulysses %d x ring %d (predicted %.4f s; %d ranks on %d hosts, "
               "%.2f GFLOP/s per rank, between hosts %.4g Gbit/s %.3g us)\n",
               *ulysses, *ring, best.seconds, m.ranks, m.hosts, m.rank_flops * 1e-9,
               m.inter.bytes_per_second * 8e-9, m.inter.latency_seconds * 1e6);
    return 0;
}
