/* `fxattn info`: which kernel set this machine runs, and why. */
#include <stdio.h>

#include "cli.h"
#include "cmd_opts.h"
#include "commands.h"

int fxt_cmd_info(int argc, char **argv)
{
    info_opts o;
    int code = fxt_info_opts_parse(argc, argv, &o);
    if (code)
        return code;
    fxa_ctx_params p;
    fxa_ctx *ctx = NULL;
    fxa_ctx_params_init(&p);
    p.n_threads = (int)o.threads;
    fxa_status st = fxa_ctx_create(&p, &ctx);
    if (st != FXA_OK)
        return fxt_fail(fxt_exit_code(st), "%s", fxa_ctx_create_error());
    printf("fxattn %s\nkernels: %s\n  %s\nthreads: %d\n", fxa_version(), fxa_ctx_isa(ctx),
           fxa_ctx_kernel_info(ctx), fxa_ctx_threads(ctx));
    fxa_ctx_destroy(ctx);
    return FXT_EXIT_OK;
}
