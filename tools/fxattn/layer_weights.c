/*
 * Weights of `fxattn layer` (layer.h): a Wan2.2 checkpoint or synthetic ones.
 *
 * Checkpoint tensors of block N (PyTorch Linear layout [out][in]):
 *   blocks.N.self_attn.{q,k,v,o}.weight  [hidden, hidden]  F32, BF16, F16 or F8_E4M3
 *   blocks.N.self_attn.{q,k,v,o}.bias    [hidden]          F32, BF16, F16
 *   blocks.N.self_attn.norm_{q,k}.weight [hidden]          F32, BF16, F16
 * An F8_E4M3 weight keeps its codes and needs one scale per output channel
 * (w[o][i] = decode(code[o][i]) * scale[o]), F32, BF16 or F16, named
 *   blocks.N.self_attn.X.weight_scale  or  blocks.N.self_attn.X.scale_weight
 * (exactly one of them), of shape [hidden] or [hidden, 1], or a single value
 * ([] or [1]) used for every channel. q, k and v form one fused weight, so
 * they must be all F8_E4M3 or none.
 *
 * Synthetic weights (no --weights): deterministic from --seed, W ~ N(0, 1) /
 * sqrt(hidden), biases ~ 0.1 N(0, 1), gammas ~ 1 + 0.2 N(0, 1).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "layer.h"
#include "safetensors.h"

#define NAME_CAP 128

/* Streams of the synthetic generator (x is FXT_LAYER_STREAM_X). */
enum { S_WQ = 1, S_WK, S_WV, S_WO, S_BQKV, S_BO, S_GQ, S_GK };

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float fxt_layer_synth(uint64_t seed, uint64_t stream, uint64_t i)
{
    /* Counter-based, so that any slice (a rank's shard) is cheap to make:
     * the Irwin-Hall sum of four 16-bit pieces of one hash, variance 1. */
    const uint64_t h = mix64(mix64(seed * 0x9e3779b97f4a7c15ull + stream) + i);
    const int64_t s = (int64_t)((h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) +
                                (h >> 48));
    return (float)(s - 131070) * (1.0f / 37837.23f);
}

/* n values mean + sd * N(0, 1) of one stream. */
static void synth_fill(float *dst, int64_t n, uint64_t seed, uint64_t stream, double mean,
                       double sd)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)(mean + sd * (double)fxt_layer_synth(seed, stream, (uint64_t)i));
}

static int mat_alloc(fxt_layer_mat *m, fxa_proj_w format, int64_t rows, int64_t cols)
{
    const size_t elem = format == FXA_PROJ_W_E4M3 ? 1 : sizeof(float);
    *m = (fxt_layer_mat){.format = format, .rows = rows, .cols = cols};
    m->w = malloc((size_t)(rows * cols) * elem);
    m->bias = malloc((size_t)rows * sizeof(float));
    m->scales = format == FXA_PROJ_W_E4M3 ? malloc((size_t)rows * sizeof(float)) : NULL;
    if (!m->w || !m->bias || (format == FXA_PROJ_W_E4M3 && !m->scales))
        return fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's weights");
    return 0;
}

static void mat_free(fxt_layer_mat *m)
{
    free(m->w);
    free(m->scales);
    free(m->bias);
    memset(m, 0, sizeof *m);
}

void fxt_layer_weights_free(fxt_layer_weights *w)
{
    mat_free(&w->qkv);
    mat_free(&w->o);
    free(w->gamma_q);
    free(w->gamma_k);
    memset(w, 0, sizeof *w);
}

/* ---- checkpoint ------------------------------------------------------------ */

typedef struct ckpt {
    fxt_st_file *f;
    const char *path;
    int64_t block;
    int64_t hidden;
} ckpt;

/* "blocks.N.self_attn.<leaf>" */
static void tensor_name(const ckpt *c, const char *leaf, char name[NAME_CAP])
{
    snprintf(name, NAME_CAP, "blocks.%lld.self_attn.%s", (long long)c->block, leaf);
}

static void shape_text(const fxt_st_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

/* Tensor `leaf` of the block, which must exist. */
static int find(const ckpt *c, const char *leaf, const fxt_st_tensor **t)
{
    char name[NAME_CAP];
    tensor_name(c, leaf, name);
    *t = fxt_st_find(c->f, name);
    if (!*t)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: no tensor '%s'", c->path, name);
    return 0;
}

/* t has shape [rows] (cols 0) or [rows, cols]. */
static int check_shape(const ckpt *c, const fxt_st_tensor *t, int64_t rows, int64_t cols)
{
    const int ndim = cols ? 2 : 1;
    if (t->ndim == ndim && t->shape[0] == rows && (!cols || t->shape[1] == cols))
        return 0;
    char got[160];
    shape_text(t, got, sizeof got);
    if (cols)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: tensor '%s' has shape %s, expected [%lld, %lld]",
                        c->path, t->name, got, (long long)rows, (long long)cols);
    return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: tensor '%s' has shape %s, expected [%lld]", c->path,
                    t->name, got, (long long)rows);
}

/* Read an F32, BF16 or F16 tensor as fp32 into dst (t->count elements). */
static int read_floats(const ckpt *c, const fxt_st_tensor *t, float *dst)
{
    char err[600];
    if (!t->supported || t->dtype == FXT_ST_F8_E4M3)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s: tensor '%s' has dtype %s; expected F32, BF16 or F16", c->path,
                        t->name, t->dtype_name);
    const fxa_status st = fxt_st_read_f32(c->f, t, dst, (size_t)t->count, err, sizeof err);
    if (st != FXA_OK)
        return fxt_fail(st == FXA_ERR_NO_MEMORY ? FXT_EXIT_FAILURE : FXT_EXIT_BAD_INPUT, "%s", err);
    return 0;
}

/* Vector `leaf` [hidden] into dst. */
static int read_vector(const ckpt *c, const char *leaf, float *dst)
{
    const fxt_st_tensor *t = NULL;
    int code = find(c, leaf, &t);
    if (!code)
        code = check_shape(c, t, c->hidden, 0);
    return code ? code : read_floats(c, t, dst);
}

/* Weight of module `mod` (q, k, v, o): its shape and whether it is FP8. */
static int weight_kind(const ckpt *c, const char *mod, int *fp8)
{
    char leaf[32];
    const fxt_st_tensor *t = NULL;
    snprintf(leaf, sizeof leaf, "%s.weight", mod);
    int code = find(c, leaf, &t);
    if (!code)
        code = check_shape(c, t, c->hidden, c->hidden);
    if (!code && !t->supported)
        code = fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s: tensor '%s' has dtype %s; expected F32, BF16, F16 or F8_E4M3",
                        c->path, t->name, t->dtype_name);
    *fp8 = !code && t->dtype == FXT_ST_F8_E4M3;
    return code;
}

/* The scale tensor of FP8 weight `mod` (see the header comment). */
static int find_scale(const ckpt *c, const char *mod, const fxt_st_tensor **t)
{
    char a[NAME_CAP], b[NAME_CAP], leaf[32];
    snprintf(leaf, sizeof leaf, "%s.weight_scale", mod);
    tensor_name(c, leaf, a);
    snprintf(leaf, sizeof leaf, "%s.scale_weight", mod);
    tensor_name(c, leaf, b);
    const fxt_st_tensor *ta = fxt_st_find(c->f, a);
    const fxt_st_tensor *tb = fxt_st_find(c->f, b);
    if (ta && tb)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: both '%s' and '%s' are present; keep one",
                        c->path, a, b);
    if (!ta && !tb)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s: blocks.%lld.self_attn.%s.weight is F8_E4M3 but has no scale: "
                        "expected '%s' or '%s' (one value per output channel)",
                        c->path, (long long)c->block, mod, a, b);
    *t = ta ? ta : tb;
    return 0;
}

/* Per-output-channel scales of FP8 weight `mod` into dst[hidden]. */
static int read_scales(const ckpt *c, const char *mod, float *dst)
{
    const fxt_st_tensor *t = NULL;
    int code = find_scale(c, mod, &t);
    if (code)
        return code;
    const int per_channel = (t->ndim == 1 && t->shape[0] == c->hidden) ||
                            (t->ndim == 2 && t->shape[0] == c->hidden && t->shape[1] == 1);
    if (!per_channel && t->count != 1) {
        char got[160];
        shape_text(t, got, sizeof got);
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s: scale '%s' has shape %s, expected [%lld], [%lld, 1] or one value",
                        c->path, t->name, got, (long long)c->hidden, (long long)c->hidden);
    }
    if ((code = read_floats(c, t, dst)))
        return code;
    for (int64_t i = 1; !per_channel && i < c->hidden; i++)
        dst[i] = dst[0];
    for (int64_t i = 0; i < c->hidden; i++)
        if (!isfinite(dst[i]) || dst[i] < 0.0f)
            return fxt_fail(FXT_EXIT_BAD_INPUT,
                            "%s: scale '%s' has %g at channel %lld (must be finite, not negative)",
                            c->path, t->name, (double)dst[i], (long long)i);
    return 0;
}

/* Weight and bias of module `mod` into rows [row0, row0 + hidden) of m. */
static int read_linear(const ckpt *c, const char *mod, int64_t row0, fxt_layer_mat *m)
{
    char leaf[32];
    const fxt_st_tensor *t = NULL;
    snprintf(leaf, sizeof leaf, "%s.weight", mod);
    int code = find(c, leaf, &t);
    if (!code && m->format == FXA_PROJ_W_E4M3) {
        char err[600];
        uint8_t *dst = (uint8_t *)m->w + row0 * m->cols;
        const fxa_status st = fxt_st_read(c->f, t, dst, (size_t)t->nbytes, err, sizeof err);
        if (st != FXA_OK)
            code = fxt_fail(FXT_EXIT_BAD_INPUT, "%s", err);
        if (!code)
            code = read_scales(c, mod, m->scales + row0);
    } else if (!code) {
        code = read_floats(c, t, (float *)m->w + row0 * m->cols);
    }
    snprintf(leaf, sizeof leaf, "%s.bias", mod);
    return code ? code : read_vector(c, leaf, m->bias + row0);
}

int fxt_layer_weights_hidden(const char *path, int64_t block, int64_t *hidden)
{
    char err[600];
    ckpt c = {NULL, path, block, 0};
    const fxa_status st = fxt_st_open(path, &c.f, err, sizeof err);
    if (st != FXA_OK)
        return fxt_fail(st == FXA_ERR_NO_MEMORY ? FXT_EXIT_FAILURE : FXT_EXIT_BAD_INPUT, "%s", err);
    const fxt_st_tensor *t = NULL;
    int code = find(&c, "q.weight", &t);
    if (!code && t->ndim != 2) {
        char got[160];
        shape_text(t, got, sizeof got);
        code = fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s: tensor '%s' has shape %s, expected [hidden, hidden]", path, t->name,
                        got);
    }
    if (!code)
        *hidden = t->shape[1];
    fxt_st_close(c.f);
    return code;
}

static int load_checkpoint(const layer_opts *o, const fxt_layer_cfg *cfg, fxt_layer_weights *w)
{
    char err[600];
    const int64_t h = cfg->hidden;
    ckpt c = {NULL, o->weights, o->block, h};
    fxa_status st = fxt_st_open(o->weights, &c.f, err, sizeof err);
    if (st != FXA_OK)
        return fxt_fail(st == FXA_ERR_NO_MEMORY ? FXT_EXIT_FAILURE : FXT_EXIT_BAD_INPUT, "%s", err);
    int fp8[4] = {0, 0, 0, 0};
    const char *const mods[4] = {"q", "k", "v", "o"};
    int code = 0;
    for (int i = 0; i < 4 && !code; i++)
        code = weight_kind(&c, mods[i], &fp8[i]);
    if (!code && (fp8[0] != fp8[1] || fp8[0] != fp8[2]))
        code = fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s: the q, k and v weights of block %lld must be all F8_E4M3 or none "
                        "(they form one fused weight)",
                        o->weights, (long long)o->block);
    if (!code)
        code = mat_alloc(&w->qkv, fp8[0] ? FXA_PROJ_W_E4M3 : FXA_PROJ_W_F32, 3 * h, h);
    if (!code)
        code = mat_alloc(&w->o, fp8[3] ? FXA_PROJ_W_E4M3 : FXA_PROJ_W_F32, h, h);
    w->gamma_q = malloc((size_t)h * sizeof(float));
    w->gamma_k = malloc((size_t)h * sizeof(float));
    if (!code && (!w->gamma_q || !w->gamma_k))
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's weights");
    for (int i = 0; i < 3 && !code; i++)
        code = read_linear(&c, mods[i], i * h, &w->qkv);
    if (!code)
        code = read_linear(&c, "o", 0, &w->o);
    if (!code)
        code = read_vector(&c, "norm_q.weight", w->gamma_q);
    if (!code)
        code = read_vector(&c, "norm_k.weight", w->gamma_k);
    fxt_st_close(c.f);
    return code;
}

static int load_synthetic(const layer_opts *o, const fxt_layer_cfg *cfg, fxt_layer_weights *w)
{
    const int64_t h = cfg->hidden;
    const uint64_t seed = (uint64_t)o->seed;
    const double sd = 1.0 / sqrt((double)h);
    int code = mat_alloc(&w->qkv, FXA_PROJ_W_F32, 3 * h, h);
    if (!code)
        code = mat_alloc(&w->o, FXA_PROJ_W_F32, h, h);
    w->gamma_q = malloc((size_t)h * sizeof(float));
    w->gamma_k = malloc((size_t)h * sizeof(float));
    if (!code && (!w->gamma_q || !w->gamma_k))
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's weights");
    if (code)
        return code;
    float *wqkv = w->qkv.w;
    synth_fill(wqkv, h * h, seed, S_WQ, 0.0, sd);
    synth_fill(wqkv + h * h, h * h, seed, S_WK, 0.0, sd);
    synth_fill(wqkv + 2 * h * h, h * h, seed, S_WV, 0.0, sd);
    synth_fill(w->o.w, h * h, seed, S_WO, 0.0, sd);
    synth_fill(w->qkv.bias, 3 * h, seed, S_BQKV, 0.0, 0.1);
    synth_fill(w->o.bias, h, seed, S_BO, 0.0, 0.1);
    synth_fill(w->gamma_q, h, seed, S_GQ, 1.0, 0.2);
    synth_fill(w->gamma_k, h, seed, S_GK, 1.0, 0.2);
    return 0;
}

/* fp32 weights to E4M3 codes with per-output-channel scales (--fp8). */
static int mat_to_fp8(fxt_layer_mat *m)
{
    if (m->format == FXA_PROJ_W_E4M3)
        return 0;
    uint8_t *codes = malloc((size_t)(m->rows * m->cols));
    float *scales = malloc((size_t)m->rows * sizeof(float));
    fxa_status st = codes && scales ? fxa_e4m3_quantize_weights(m->w, m->rows, m->cols, codes,
                                                                 scales)
                                    : FXA_ERR_NO_MEMORY;
    if (st != FXA_OK) {
        free(codes);
        free(scales);
        return st == FXA_ERR_NO_MEMORY
                   ? fxt_fail(FXT_EXIT_FAILURE, "out of memory for the FP8 weights")
                   : fxt_fail(FXT_EXIT_BAD_INPUT, "--fp8: a weight is not finite");
    }
    free(m->w);
    m->w = codes;
    m->scales = scales;
    m->format = FXA_PROJ_W_E4M3;
    return 0;
}

int fxt_layer_load_weights(const layer_opts *o, const fxt_layer_cfg *cfg, fxt_layer_weights *w)
{
    memset(w, 0, sizeof *w);
    int code = o->weights ? load_checkpoint(o, cfg, w) : load_synthetic(o, cfg, w);
    if (!code && cfg->interleaved) {
        fxa_proj_desc d;
        fxa_proj_desc_init(&d);
        d.in_features = cfg->hidden;
        d.heads_q = d.heads_kv = cfg->heads;
        d.head_dim = cfg->head_dim;
        d.w_format = w->qkv.format;
        const fxa_status st = fxa_rope_interleaved_to_half(&d, w->qkv.w, w->qkv.scales,
                                                           w->qkv.bias, w->gamma_q, w->gamma_k);
        if (st != FXA_OK)
            code = fxt_fail(fxt_exit_code(st), "cannot convert the interleaved RoPE weights: %s",
                            fxa_status_str(st));
    }
    if (!code && o->fp8)
        code = mat_to_fp8(&w->qkv);
    if (!code && o->fp8)
        code = mat_to_fp8(&w->o);
    if (code)
        fxt_layer_weights_free(w);
    return code;
}
