/* `fxattn info`: which kernel set this machine runs, and the compute the automatic mode
 * takes for bf16 inputs (at head dim 128), with the tile rates it was chosen by. */
#include <stdio.h>
#include <stdlib.h>

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
    fxa_compute_choice c = {.struct_size = sizeof c};
    st = fxa_ctx_compute_choice(ctx, FXA_BF16, 128, &c);
    if (st != FXA_OK) {
        code = fxt_fail(fxt_exit_code(st), "%s", fxa_ctx_last_error(ctx));
        fxa_ctx_destroy(ctx);
        return code;
    }
    printf("compute auto: bf16 inputs compute in %s",
           c.compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32");
    const char *pinned = getenv("FXA_AUTO_COMPUTE");
    if (pinned && *pinned)
        printf(" (FXA_AUTO_COMPUTE=%s)\n", pinned);
    else if (c.bf16_gflops > 0.0)
        printf(" (one thread, D 128: bf16 tile %.1f GFLOP/s, fp32 tile %.1f, ratio %.2f; bf16 "
               "from 1.25)\n",
               c.bf16_gflops, c.fp32_gflops, c.bf16_gflops / c.fp32_gflops);
    else
        printf(" (this kernel set has no bf16 tile of its own)\n");
    printf("compute auto: f32 and f16 inputs compute in fp32\n");
    fxa_ctx_destroy(ctx);
    return FXT_EXIT_OK;
}
