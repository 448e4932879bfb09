/* The pieces of `fxattn layer` shared by one process and MPI (layer.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "layer.h"
#include "fxattn_npy.h"

#define MAX_GRID_SIDE (1 << 20)
#define MAX_TOKENS (1 << 24)

/* "F,H,W" into g[3]; each side 1..MAX_GRID_SIDE, the product at most
 * MAX_TOKENS. */
static int parse_grid(const char *s, int64_t g[3])
{
    const char *p = s;
    for (int i = 0; i < 3; i++) {
        char *end = NULL;
        errno = 0;
        const long long v = strtoll(p, &end, 10);
        if (errno || end == p || v < 1 || v > MAX_GRID_SIDE || *end != (i < 2 ? ',' : '\0'))
            return fxt_fail(FXT_EXIT_BAD_INPUT,
                            "--grid must be F,H,W (three positive integers), not '%s'", s);
        g[i] = v;
        p = end + 1;
    }
    if (g[0] * g[1] > MAX_TOKENS || g[0] * g[1] * g[2] > MAX_TOKENS)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--grid %s has more than %d tokens", s, MAX_TOKENS);
    return 0;
}

int fxt_layer_check_opts(const layer_opts *o)
{
    int64_t g[3];
    if (strcmp(o->rope_layout, "interleaved") != 0 && strcmp(o->rope_layout, "half") != 0)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--rope-layout must be interleaved or half, not '%s'",
                        o->rope_layout);
    if (strcmp(o->dtype, "f32") != 0 && strcmp(o->dtype, "bf16") != 0)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "layer: --dtype must be f32 or bf16, not '%s'",
                        o->dtype);
    if (o->grid && parse_grid(o->grid, g))
        return FXT_EXIT_BAD_INPUT;
    return 0;
}

/* Shape of -x from its header: tokens, hidden and the token axis. */
static int probe_x(const char *path, int64_t *tokens, int64_t *hidden, int *axis)
{
    char err[600];
    fxa_npy a;
    const fxa_status st = fxa_npy_read_slice(path, 0, 0, 0, &a, err, sizeof err);
    if (st != FXA_OK)
        return fxt_fail(st == FXA_ERR_NO_MEMORY ? FXT_EXIT_FAILURE : FXT_EXIT_BAD_INPUT, "x: %s",
                        err);
    const int ok = a.ndim == 2 || (a.ndim == 3 && a.shape[0] == 1);
    if (ok) {
        *axis = a.ndim - 2;
        *tokens = a.shape[a.ndim - 2];
        *hidden = a.shape[a.ndim - 1];
    }
    fxa_npy_free(&a);
    if (!ok)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "x: %s must have shape [S, hidden] or [1, S, hidden]",
                        path);
    return 0;
}

/* A libfxattn_wan failure as the CLI's exit code (bad input 2 unless the
 * memory ran out), its message printed. */
static int wan_fail(fxa_status st, const char *err)
{
    if (st == FXA_OK)
        return 0;
    return fxt_fail(st == FXA_ERR_NO_MEMORY ? FXT_EXIT_FAILURE : FXT_EXIT_BAD_INPUT, "%s", err);
}

int fxt_layer_setup(const layer_opts *o, fxt_layer_cfg *cfg)
{
    char err[700];
    int64_t g[3] = {4, 32, 32};
    int64_t hidden = 0;
    int64_t x_tokens = 0;
    memset(cfg, 0, sizeof *cfg);
    int code = fxt_layer_check_opts(o);
    if (!code && o->grid)
        code = parse_grid(o->grid, g);
    if (!code && o->x && !o->grid)
        code =
            fxt_fail(FXT_EXIT_BAD_INPUT, "-x needs --grid F,H,W (the latent grid of its tokens)");
    if (!code && o->weights)
        code = wan_fail(fxa_wan_checkpoint_hidden(o->weights, o->block, &hidden, err, sizeof err),
                        err);
    if (!code && o->x) {
        int64_t x_hidden = 0;
        code = probe_x(o->x, &x_tokens, &x_hidden, &cfg->x_axis);
        if (!code && hidden && x_hidden != hidden)
            code = fxt_fail(FXT_EXIT_BAD_INPUT, "x has hidden size %lld but the weights have %lld",
                            (long long)x_hidden, (long long)hidden);
        hidden = x_hidden;
    }
    if (!code && (o->x || o->weights) && hidden < 1)
        code = fxt_fail(FXT_EXIT_BAD_INPUT, "the hidden size of %s is 0",
                        o->weights ? o->weights : o->x);
    if (code)
        return code;
    if (!hidden)
        hidden = o->heads * (o->dim ? o->dim : 128);
    cfg->frames = g[0];
    cfg->height = g[1];
    cfg->width = g[2];
    cfg->tokens = g[0] * g[1] * g[2];
    cfg->hidden = hidden;
    cfg->heads = o->heads;
    cfg->head_dim = hidden / o->heads;
    cfg->interleaved = strcmp(o->rope_layout, "interleaved") == 0;
    if (o->x && x_tokens != cfg->tokens)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "x has %lld tokens but --grid %s has %lld",
                        (long long)x_tokens, o->grid, (long long)cfg->tokens);
    fxa_wan_desc_init(&cfg->wan);
    cfg->wan.frames = cfg->frames;
    cfg->wan.height = cfg->height;
    cfg->wan.width = cfg->width;
    cfg->wan.heads = cfg->heads;
    cfg->wan.head_dim = cfg->head_dim;
    cfg->wan.x_format = o->fp8 ? FXA_PROJ_X_E4M3_ROWS : FXA_PROJ_X_F32;
    cfg->wan.dtype = strcmp(o->dtype, "bf16") == 0 ? FXA_BF16 : FXA_F32;
    if (hidden % o->heads)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--heads %lld does not divide the hidden size %lld",
                        (long long)o->heads, (long long)hidden);
    if (o->dim && o->dim != cfg->head_dim)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--dim %lld does not match hidden %lld / %lld heads",
                        (long long)o->dim, (long long)hidden, (long long)o->heads);
    if (cfg->head_dim % 2 || cfg->head_dim < 6 || cfg->head_dim > FXA_MAX_HEAD_DIM)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "head_dim %lld (hidden / heads) must be even and in 6..%d for Wan's RoPE",
                        (long long)cfg->head_dim, FXA_MAX_HEAD_DIM);
    return 0;
}

/* x rows from -x (f32 or f16 on disk) into f [len][hidden]. */
static int read_x(const char *path, const fxt_layer_cfg *cfg, int64_t start, int64_t len, float *f)
{
    char err[600];
    fxa_npy a;
    const fxa_status st = fxa_npy_read_slice(path, cfg->x_axis, start, len, &a, err, sizeof err);
    if (st != FXA_OK)
        return fxt_fail(st == FXA_ERR_NO_MEMORY ? FXT_EXIT_FAILURE : FXT_EXIT_BAD_INPUT, "x: %s",
                        err);
    for (int64_t i = 0; i < a.count; i++)
        f[i] = a.dtype == FXA_F16 ? fxa_f16_to_f32(((const uint16_t *)a.data)[i])
                                  : ((const float *)a.data)[i];
    fxa_npy_free(&a);
    return 0;
}

int fxt_layer_load_x(const layer_opts *o, const fxt_layer_cfg *cfg, int64_t start, int64_t len,
                     fxt_layer_x *x)
{
    const int64_t h = cfg->hidden;
    *x = (fxt_layer_x){.format = FXA_PROJ_X_F32, .start = start, .len = len};
    float *f = malloc((size_t)(len * h) * sizeof(float) + 1);
    if (!f)
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for x");
    int code = 0;
    if (o->x)
        code = read_x(o->x, cfg, start, len, f);
    else
        for (int64_t i = 0; i < len * h; i++)
            f[i] = fxa_wan_synth((uint64_t)o->seed, FXA_WAN_SYNTH_X, (uint64_t)(start * h + i));
    for (int64_t i = 0; !code && i < len * h; i++)
        if (!isfinite(f[i]))
            code = fxt_fail(FXT_EXIT_BAD_INPUT,
                            "x has a non-finite value (%g) at token %lld, "
                            "channel %lld",
                            (double)f[i], (long long)(start + i / h), (long long)(i % h));
    if (!code && o->fp8) {
        uint8_t *packed = malloc((size_t)(len * (h + 4)) + 1);
        if (!packed)
            code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for the FP8 x");
        else if (fxa_e4m3_quantize_rows(f, len, h, packed) != FXA_OK)
            code = fxt_fail(FXT_EXIT_FAILURE, "internal: cannot quantise x");
        free(f);
        f = NULL;
        x->data = packed;
        x->format = FXA_PROJ_X_E4M3_ROWS;
    } else {
        x->data = f;
    }
    if (code)
        fxt_layer_x_free(x);
    return code;
}

void fxt_layer_x_free(fxt_layer_x *x)
{
    free(x->data);
    x->data = NULL;
}

int fxt_layer_load_weights(const layer_opts *o, const fxt_layer_cfg *cfg, int64_t h0, int64_t nh,
                           fxa_wan_weights *w)
{
    char err[700];
    fxa_wan_load_params p;
    fxa_wan_load_params_init(&p);
    p.block = o->block;
    p.heads = cfg->heads;
    p.head_begin = h0;
    p.head_count = nh;
    p.rope_half = !cfg->interleaved;
    p.fp8 = o->fp8;
    p.dtype = cfg->wan.dtype;
    p.seed = (uint64_t)o->seed;
    p.hidden = cfg->hidden;
    return wan_fail(fxa_wan_weights_load(o->weights, &p, w, err, sizeof err), err);
}

int fxt_layer_rope(const fxt_layer_cfg *cfg, float **cos_out, float **sin_out)
{
    const size_t n = (size_t)(cfg->tokens * cfg->head_dim);
    *cos_out = malloc(n * sizeof(float));
    *sin_out = malloc(n * sizeof(float));
    if (!*cos_out || !*sin_out)
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for the RoPE tables");
    if (fxa_wan_rope(&cfg->wan, *cos_out, *sin_out) != FXA_OK)
        return fxt_fail(FXT_EXIT_FAILURE, "internal: cannot build the RoPE tables");
    return 0;
}

int fxt_layer_check_result(const fxt_layer_check *c)
{
    if (c->max_rel_err <= c->tolerance)
        return 0;
    const int bf16 = c->bf16_rel_err > 0.0; /* the bf16 layer's envelope (layer.h) */
    return fxt_fail(FXT_EXIT_FAILURE,
                    "--verify: y differs from the fp64 layer by %.3g of max|y| (at token %lld, "
                    "channel %lld), above the tolerance %.3g (twice plain %s's %.3g, plus %s, at "
                    "most %s)",
                    c->max_rel_err, (long long)c->worst_token, (long long)c->worst_channel,
                    c->tolerance, bf16 ? "bf16" : "fp32", bf16 ? c->bf16_rel_err : c->fp32_rel_err,
                    bf16 ? "2^-12" : "2^-22", bf16 ? "2^-5" : "2^-12");
}

int fxt_layer_write(const char *path, const fxt_layer_cfg *cfg, const float *y)
{
    const int64_t shape[2] = {cfg->tokens, cfg->hidden};
    const fxt_path check = {"-o", path};
    const fxt_npy_out out = {path, 2, shape, y};
    const int code = fxt_check_outputs("layer", &check, 1, NULL, 0);
    return code ? code : fxt_write_npy_outputs(&out, 1);
}

void fxt_layer_print(const layer_opts *o, const fxt_layer_cfg *cfg, const fxt_layer_report *r)
{
    const fxt_layer_check *c = r->check;
    if (!o->stats) {
        if (c) {
            char bf16[48] = "";
            if (c->bf16_rel_err > 0.0)
                snprintf(bf16, sizeof bf16, ", plain bf16 %.3g", c->bf16_rel_err);
            printf("verify: %lld tokens, max abs err %.3g (%.3g of max|y|; plain fp32 %.3g%s, "
                   "tolerance %.3g)\n",
                   (long long)c->tokens, c->max_abs_err, c->max_rel_err, c->fp32_rel_err, bf16,
                   c->tolerance);
        }
        return;
    }
    const double seconds = r->qkv_seconds + r->attention_seconds + r->out_seconds;
    fxt_json_printf("{\"tokens\": %lld, \"hidden\": %lld, \"heads\": %lld, \"head_dim\": %lld, "
                    "\"grid\": [%lld, %lld, %lld], \"weights\": \"%s\", \"rope_layout\": \"%s\", "
                    "\"fp8\": %s, \"dtype\": \"%s\", \"mode\": \"%s\", \"ranks\": %d, \"ulysses\": "
                    "%d, \"ring\": %d, "
                    "\"tp\": %d, \"threads\": %d, \"isa\": \"%s\", \"qkv_seconds\": %.6f, "
                    "\"attention_seconds\": %.6f, \"out_seconds\": %.6f, \"seconds\": %.6f, "
                    "\"rows\": %lld, \"fallback_rows\": %lld, \"attention_compute\": \"%s\", "
                    "\"qkv_gemm\": \"%s\", \"out_gemm\": \"%s\", \"gflops\": %.3f",
                    (long long)cfg->tokens, (long long)cfg->hidden, (long long)cfg->heads,
                    (long long)cfg->head_dim, (long long)cfg->frames, (long long)cfg->height,
                    (long long)cfg->width, o->weights ? "file" : "synthetic",
                    cfg->interleaved ? "interleaved" : "half", o->fp8 ? "true" : "false",
                    cfg->wan.dtype == FXA_BF16 ? "bf16" : "f32", r->mode, r->ranks, r->ulysses,
                    r->ring, r->tp, r->threads, r->isa, r->qkv_seconds, r->attention_seconds,
                    r->out_seconds, seconds, (long long)r->rows, (long long)r->fallback_rows,
                    r->compute == FXA_COMPUTE_BF16 ? "bf16" : "fp32",
                    fxa_proj_gemm_name(r->qkv_gemm), fxa_proj_gemm_name(r->out_gemm),
                    seconds > 0 ? fxa_wan_flops(&cfg->wan) / seconds * 1e-9 : 0.0);
    if (c)
        fxt_json_printf(", \"verify_tokens\": %lld, \"max_abs_err\": %.6g, \"max_rel_err\": %.6g, "
                        "\"fp32_rel_err\": %.6g, \"bf16_rel_err\": %.6g, \"tolerance\": %.6g",
                        (long long)c->tokens, c->max_abs_err, c->max_rel_err, c->fp32_rel_err,
                        c->bf16_rel_err, c->tolerance);
    printf("}\n");
}

int fxt_layer_is_distributed(const layer_opts *o)
{
    return o->ulysses > 0 || o->ring > 0 || o->tp > 0 || o->cp_grid ||
           getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}
