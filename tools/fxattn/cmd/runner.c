/* Context + plan + workspace for the subcommands (runner.h). */
#include "runner.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"

int fxt_context(int64_t threads, fxa_ctx **ctx)
{
    fxa_ctx_params p;
    fxa_ctx_params_init(&p);
    p.n_threads = (int)threads;
    const fxa_status st = fxa_ctx_create(&p, ctx);
    if (st != FXA_OK)
        return fxt_fail(fxt_exit_code(st), "cannot create a context: %s%s%s", fxa_status_str(st),
                        *fxa_ctx_create_error() ? ": " : "", fxa_ctx_create_error());
    return 0;
}

int fxt_runner_init(fxt_runner *r, int threads, const fxa_attn_desc *d)
{
    size_t bytes = 0;
    memset(r, 0, sizeof *r);
    const int err = fxt_context(threads, &r->ctx);
    if (err)
        return err;
    fxa_status st = fxa_attn_plan_create(r->ctx, d, &r->plan, &bytes);
    if (st != FXA_OK) {
        int code = fxt_fail(fxt_exit_code(st), "%s", fxa_ctx_last_error(r->ctx));
        fxt_runner_free(r);
        return code;
    }
    if (bytes && !(r->workspace = aligned_alloc(64, (bytes + 63) & ~(size_t)63))) {
        fxt_runner_free(r);
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for a %zu-byte workspace", bytes);
    }
    return 0;
}

int fxt_runner_run(fxt_runner *r, const fxa_attn_args *a, fxa_attn_stats *st, int bounds_only)
{
    fxa_status s = bounds_only ? fxa_attn_bounds(r->plan, a, r->workspace, st)
                               : fxa_attn_run(r->plan, a, r->workspace, st);
    if (s != FXA_OK)
        return fxt_fail(fxt_exit_code(s), "%s", fxa_ctx_last_error(r->ctx));
    return 0;
}

void fxt_runner_free(fxt_runner *r)
{
    fxa_attn_plan_destroy(r->plan);
    fxa_ctx_destroy(r->ctx);
    free(r->workspace);
    memset(r, 0, sizeof *r);
}

/* cli.h; here rather than in cli_args.c, which the option-parser fuzz target
 * builds without the library. */
int fxt_check_memory(double need_bytes, int sharers, const char *what)
{
    const uint64_t avail = fxa_available_memory();
    if (avail == UINT64_MAX)
        return 0;
    const double mine = (double)avail / (sharers > 1 ? sharers : 1);
    if (need_bytes <= mine)
        return 0;
    if (sharers > 1)
        return fxt_fail(FXT_EXIT_FAILURE,
                        "needs %.1f GiB, %.1f GiB available (%s; %.1f GiB shared by %d ranks)",
                        need_bytes / 1073741824.0, mine / 1073741824.0, what,
                        (double)avail / 1073741824.0, sharers);
    return fxt_fail(FXT_EXIT_FAILURE, "needs %.1f GiB, %.1f GiB available (%s)",
                    need_bytes / 1073741824.0, mine / 1073741824.0, what);
}

int fxt_resolve_compute(fxa_compute *compute, fxa_dtype dtype, int64_t head_dim)
{
    if (*compute != FXA_COMPUTE_AUTO)
        return 0;
    fxa_ctx_params p;
    fxa_ctx *ctx = NULL;
    fxa_ctx_params_init(&p);
    p.n_threads = 1;
    fxa_status st = fxa_ctx_create(&p, &ctx);
    if (st != FXA_OK)
        return fxt_fail(fxt_exit_code(st), "%s", fxa_ctx_create_error());
    fxa_compute_choice c = {.struct_size = sizeof c};
    st = fxa_ctx_compute_choice(ctx, dtype, head_dim, &c);
    const int code = st == FXA_OK ? 0 : fxt_fail(fxt_exit_code(st), "%s", fxa_ctx_last_error(ctx));
    fxa_ctx_destroy(ctx);
    *compute = c.compute;
    return code;
}
