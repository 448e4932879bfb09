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

/* Buffers of one run: the projections' outputs, the attention output, y. */
typedef struct bufs {
    float *cs, *sn, *q, *k, *v, *a, *y;
} bufs;

static int bufs_alloc(bufs *b, const fxt_layer_cfg *cfg)
{
    const size_t n = (size_t)(cfg->tokens * cfg->hidden) * sizeof(float);
    float **const all[] = {&b->q, &b->k, &b->v, &b->a, &b->y};
    int ok = 1;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ok &= (*all[i] = malloc(n)) != NULL;
    return ok ? fxt_layer_rope(cfg, &b->cs, &b->sn)
              : fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's activations");
}

static void bufs_free(bufs *b)
{
    float *const all[] = {b->cs, b->sn, b->q, b->k, b->v, b->a, b->y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

/* QKV projection, attention, output projection; stage times in rep. */
static int forward(fxt_runner *r, const fxt_layer_cfg *cfg, const fxt_layer_weights *w,
                   const fxt_layer_x *x, const bufs *b, fxt_layer_report *rep)
{
    fxa_proj_desc pd;
    fxa_proj_args pa;
    fxt_layer_qkv_call(cfg, w, cfg->heads, x, b->cs, b->sn, b->q, b->k, b->v, &pd, &pa);
    const double t0 = fxt_now();
    fxa_status st = fxa_proj_run(r->ctx, &pd, &pa);
    if (st != FXA_OK)
        return fxt_fail(fxt_exit_code(st), "QKV projection: %s", fxa_ctx_last_error(r->ctx));
    const double t1 = fxt_now();
    const fxa_attn_args aa = {.struct_size = sizeof aa, .q = b->q, .k = b->k, .v = b->v,
                              .out = b->a};
    fxa_attn_stats ast;
    int code = fxt_runner_run(r, &aa, &ast, 0);
    if (code)
        return code;
    const double t2 = fxt_now();
    st = fxt_layer_out(r->ctx, cfg, &w->o, cfg->tokens, b->a, b->y);
    if (st != FXA_OK)
        return fxt_fail(fxt_exit_code(st), "output projection: %s", fxa_ctx_last_error(r->ctx));
    rep->qkv_seconds = t1 - t0;
    rep->attention_seconds = t2 - t1;
    rep->out_seconds = fxt_now() - t2;
    rep->rows = ast.rows;
    rep->fallback_rows = ast.fallback_rows;
    return 0;
}

static int run_single(const layer_opts *o)
{
    fxt_layer_cfg cfg;
    fxt_layer_weights w;
    fxt_layer_x x;
    fxt_runner r;
    bufs b;
    fxt_layer_check check;
    fxa_attn_desc d;
    memset(&w, 0, sizeof w);
    memset(&x, 0, sizeof x);
    memset(&r, 0, sizeof r);
    memset(&b, 0, sizeof b);
    int code = fxt_layer_setup(o, &cfg);
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
    if (!code)
        code = bufs_alloc(&b, &cfg);
    if (!code) {
        fxt_layer_attn_desc(&cfg, cfg.heads, &d);
        code = fxt_runner_init(&r, (int)o->threads, &d);
    }
    fxt_layer_report rep = {.mode = "single", .ranks = 1, .ulysses = 1, .ring = 1, .tp = 1};
    if (!code)
        code = forward(&r, &cfg, &w, &x, &b, &rep);
    if (!code && o->verify && !(code = fxt_layer_verify(&cfg, &w, &x, b.y, &check))) {
        rep.check = &check;
        code = fxt_layer_check_result(&check);
    }
    if (!code && o->out)
        code = fxt_layer_write(o->out, &cfg, b.y);
    if (!code) {
        rep.threads = fxa_ctx_threads(r.ctx);
        rep.isa = fxa_ctx_isa(r.ctx);
        fxt_layer_print(o, &cfg, &rep);
    }
    bufs_free(&b);
    fxt_runner_free(&r);
    fxt_layer_x_free(&x);
    fxt_layer_weights_free(&w);
    return code;
}

int fxt_cmd_layer(int argc, char **argv)
{
    layer_opts o;
    fxt_opt opts[FXT_MAX_OPTS];
    fxt_layer_opts_defaults(&o);
    fxt_layer_opts_table(&o, opts);
    int code = fxt_parse_options("layer", argc, argv, 2, opts);
    if (!code)
        code = fxt_layer_check_opts(&o);
    if (code)
        return code;
    return fxt_layer_is_distributed(&o) ? fxt_layer_mpi(&o) : run_single(&o);
}
