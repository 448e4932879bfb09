/*
 * `fxattn layer`: the Wan2.2 self-attention layer end to end (layer.h), in
 * one process; under mpirun (or with --ulysses/--ring/--tp) layer_mpi.c.
 * The output is staged and committed only after the whole run (and
 * --verify) succeeded, so a failed run writes nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "layer.h"
#include "runner.h"

/* The layer of cfg on x with weights w into y, through libfxattn_wan's
 * plan; stage times and attention rows into rep. */
static int forward(fxa_ctx *ctx, const fxt_layer_cfg *cfg, const fxa_wan_weights *w,
                   const fxt_layer_x *x, float *y, fxt_layer_report *rep)
{
    fxa_wan_plan *plan = NULL;
    size_t bytes = 0;
    void *ws = NULL;
    fxa_wan_stats s = {.struct_size = sizeof s};
    const fxa_wan_args args = {.struct_size = sizeof args, .weights = w, .x = x->data, .y = y};
    fxa_status st = fxa_wan_plan_create(ctx, &cfg->wan, &plan, &bytes);
    if (st != FXA_OK)
        return fxt_fail(fxt_exit_code(st), "%s", fxa_ctx_last_error(ctx));
    int code = 0;
    if (!(ws = aligned_alloc(64, (bytes + 63) & ~(size_t)63)))
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's activations");
    else if ((st = fxa_wan_layer_run(plan, &args, ws, &s)) != FXA_OK)
        code = fxt_fail(fxt_exit_code(st), "%s", fxa_ctx_last_error(ctx));
    free(ws);
    fxa_wan_plan_destroy(plan);
    if (code)
        return code;
    rep->qkv_seconds = s.qkv_seconds;
    rep->attention_seconds = s.attention_seconds;
    rep->out_seconds = s.out_seconds;
    rep->rows = s.rows;
    rep->fallback_rows = s.fallback_rows;
    rep->compute = s.compute;
    rep->qkv_gemm = s.qkv_gemm;
    rep->out_gemm = s.out_gemm;
    return 0;
}

static int run_single(const layer_opts *o)
{
    fxt_layer_cfg cfg;
    fxa_wan_weights w;
    fxt_layer_x x;
    fxt_layer_check check;
    fxa_ctx *ctx = NULL;
    float *y = NULL;
    memset(&w, 0, sizeof w);
    memset(&x, 0, sizeof x);
    const fxt_path out = {"-o", o->out};
    const fxt_path ins[2] = {{"-x", o->x}, {"--weights", o->weights}};
    int code = fxt_check_outputs("layer", &out, 1, ins, 2);
    if (!code)
        code = fxt_check_output_vs_checkpoint("layer", &out, &ins[1]);
    if (!code)
        code = fxt_layer_setup(o, &cfg);
    if (!code) {
        /* fp32 weights (4 hidden^2; E4M3 codes count as fp32 here, an
         * overestimate), x, Q|K|V, the attention output and y (7 S hidden
         * floats with a spare), plus the projection's own copy of the
         * output (3 S hidden floats). */
        const double h = (double)cfg.hidden, s = (double)cfg.tokens;
        code = fxt_check_memory(16.0 * h * h + 40.0 * s * h, 1, "layer: weights and activations");
    }
    if (!code)
        code = fxt_layer_load_weights(o, &cfg, 0, cfg.heads, &w);
    if (!code)
        code = fxt_layer_load_x(o, &cfg, 0, cfg.tokens, &x);
    if (!code && !(y = malloc((size_t)(cfg.tokens * cfg.hidden) * sizeof(float))))
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's output");
    if (!code)
        code = fxt_context(o->threads, &ctx);
    fxt_layer_report rep = {.mode = "single", .ranks = 1, .ulysses = 1, .ring = 1, .tp = 1};
    if (!code)
        code = forward(ctx, &cfg, &w, &x, y, &rep);
    if (!code && o->verify && !(code = fxt_layer_verify(&cfg, &w, &x, y, &check))) {
        rep.check = &check;
        code = fxt_layer_check_result(&check);
    }
    if (!code && o->out)
        code = fxt_layer_write(o->out, &cfg, y);
    if (!code) {
        rep.threads = fxa_ctx_threads(ctx);
        rep.isa = fxa_ctx_isa(ctx);
        fxt_layer_print(o, &cfg, &rep);
    }
    free(y);
    fxa_ctx_destroy(ctx);
    fxt_layer_x_free(&x);
    fxa_wan_weights_free(&w);
    return code;
}

int fxt_cmd_layer(int argc, char **argv)
{
    layer_opts o;
    int code = fxt_layer_opts_parse(argc, argv, &o);
    if (!code)
        code = fxt_layer_check_opts(&o);
    if (code)
        return code;
    return fxt_layer_is_distributed(&o) ? fxt_layer_mpi(&o) : run_single(&o);
}
