/*
 * `fxattn plan`: the predicted step time of every U x R grid of --ranks
 * ranks on --hosts hosts and of all-gather + local attention, and the best
 * grid (docs/cluster.md). The compute rate is --gflops (one host, all its
 * cores) or a short measured run on this node, split among the host's
 * ranks; the links are given or assumed. Under mpirun, --measure measures
 * the links and each rank's compute rate over the job's own communicator
 * (plan_mpi.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "cmd_opts.h"
#include "commands.h"
#include "plan.h"
#include "runner.h"

int fxt_cmd_plan(int argc, char **argv)
{
    plan_opts o;
    fxt_opt opts[FXT_MAX_OPTS];
    fxt_plan_opts_defaults(&o);
    fxt_plan_opts_table(&o, opts);
    int code = fxt_parse_options("plan", argc, argv, 2, opts);
    if (code)
        return code;
    if (o.measure)
        return fxt_plan_mpi(&o);
    if (o.ranks == 0)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "plan: --ranks P is required (or --measure under "
                                            "mpirun)");
    if (o.hosts > 0 && o.ranks % o.hosts)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "plan: --hosts %lld does not divide --ranks %lld",
                        (long long)o.hosts, (long long)o.ranks);
    fxa_grid_model m;
    fxt_plan_source src;
    if ((code = fxt_plan_model_from_opts(&o, &m, &src)))
        return code;
    m.hosts = m.hosts > 0 ? m.hosts : 1;
    const int per_host = m.ranks / m.hosts;
    if (isnan(o.gflops)) {
        fxa_ctx *ctx = NULL;
        if ((code = fxt_context(o.threads, &ctx)))
            return code;
        const fxa_status st = fxa_grid_measure(ctx, &m);
        if (st != FXA_OK)
            code = fxt_fail(fxt_exit_code(st), "plan: %s", fxa_ctx_last_error(ctx));
        fxa_ctx_destroy(ctx);
        if (code)
            return code;
        m.rank_flops /= per_host;
        for (int i = 0; i < m.n_step_rates; i++)
            m.step_flops[i] /= per_host;
        src.compute = "measured on this node, split among a host's ranks";
    } else {
        m.rank_flops = o.gflops * 1e9 / per_host;
        src.compute = "--gflops split among a host's ranks";
    }
    return fxt_plan_print(&m, &src, o.json, "plan");
}
