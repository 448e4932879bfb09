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
 *
 * A range of heads [h0, h0 + nh) (all of them in one process, a tensor-
 * parallel rank's slice under MPI) is loaded alone, with n = nh head_dim:
 * only rows [h0 head_dim, + n) of q, k and v (weights, their FP8 scales,
 * biases) and of the gammas are read from the file, or generated (the
 * generator is counter-based); o.weight is read in blocks of whole rows of
 * which only columns [h0 head_dim, + n) are kept (o_columns says why), its
 * scales and bias whole. The RoPE permutation (per head) and --fp8 (per
 * output channel) apply to the slice, so a slice holds the bits the same
 * heads have in the whole layer. Held: 4 n hidden weights (fp32 or E4M3),
 * 5 n + hidden biases and gammas (E4M3: 3 n + hidden scales too), and while
 * o is read one block of its rows (about O_BLOCK_BYTES, at least one row).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "layer.h"
#include "fxattn_safetensors.h"

#define NAME_CAP 128
#define O_BLOCK_BYTES ((int64_t)4 << 20) /* rows of o.weight read at once */

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

/* Values [first, first + n) of one stream as mean + sd * N(0, 1) into dst[n]. */
static void synth_fill(float *dst, int64_t first, int64_t n, uint64_t seed, uint64_t stream,
                       double mean, double sd)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = (float)(mean + sd * (double)fxt_layer_synth(seed, stream, (uint64_t)(first + i)));
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

/* ---- sources: a checkpoint or the generator -------------------------------- */

/* Where the weights come from: checkpoint f (path, block), or the synthetic
 * generator (f NULL, seed). fp8[m]: weight m (q, k, v, o) is F8_E4M3 in f. */
typedef struct src {
    fxa_st_file *f;
    const char *path;
    int64_t block;
    int64_t hidden;
    uint64_t seed;
    int fp8[4];
} src;

enum { M_Q, M_K, M_V, M_O };
static const char *const MODS[4] = {"q", "k", "v", "o"};

/* A [hidden] vector of the block: its checkpoint leaf, and its synthetic
 * values (element i is element first + i of stream, mean + sd N(0, 1)). */
typedef struct vec {
    const char *leaf;
    uint64_t stream;
    int64_t first;
    double mean, sd;
} vec;

/* The bias of module m. */
static vec bias_vec(int m, int64_t hidden)
{
    static const char *const leaves[4] = {"q.bias", "k.bias", "v.bias", "o.bias"};
    return m == M_O ? (vec){leaves[m], S_BO, 0, 0.0, 0.1}
                    : (vec){leaves[m], S_BQKV, m * hidden, 0.0, 0.1};
}

static const vec NORM_Q = {"norm_q.weight", S_GQ, 0, 1.0, 0.2};
static const vec NORM_K = {"norm_k.weight", S_GK, 0, 1.0, 0.2};

/* "blocks.N.self_attn.<leaf>" */
static void tensor_name(const src *c, const char *leaf, char name[NAME_CAP])
{
    snprintf(name, NAME_CAP, "blocks.%lld.self_attn.%s", (long long)c->block, leaf);
}

static void shape_text(const fxa_st_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

/* Tensor `leaf` of the block, which must exist. */
static int find(const src *c, const char *leaf, const fxa_st_tensor **t)
{
    char name[NAME_CAP];
    tensor_name(c, leaf, name);
    *t = fxa_st_find(c->f, name);
    if (!*t)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: no tensor '%s'", c->path, name);
    return 0;
}

/* t has shape [rows] (cols 0) or [rows, cols]. */
static int check_shape(const src *c, const fxa_st_tensor *t, int64_t rows, int64_t cols)
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

/* A reader's failure as an exit code (its message names the file). */
static int read_fail(fxa_status st, const char *err)
{
    return fxt_fail(st == FXA_ERR_NO_MEMORY ? FXT_EXIT_FAILURE : FXT_EXIT_BAD_INPUT, "%s", err);
}

/* t is F32, BF16 or F16. */
static int check_float(const src *c, const fxa_st_tensor *t)
{
    if (!t->supported || t->dtype == FXA_ST_F8_E4M3)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s: tensor '%s' has dtype %s; expected F32, BF16 or F16", c->path,
                        t->name, t->dtype_name);
    return 0;
}

/* Rows [r0, r0 + n) of an F32, BF16 or F16 tensor as fp32 into dst (n rows
 * of its other dimensions). */
static int read_float_rows(const src *c, const fxa_st_tensor *t, int64_t r0, int64_t n,
                           float *dst)
{
    char err[600];
    const int code = check_float(c, t);
    if (code)
        return code;
    const int64_t per_row = t->ndim && t->shape[0] ? t->count / t->shape[0] : 0;
    const fxa_status st =
        fxa_st_read_rows_f32(c->f, t, r0, n, dst, (size_t)(n * per_row), err, sizeof err);
    if (st != FXA_OK)
        return read_fail(st, err);
    /* Non-finite values are reported here, in the tensor's own coordinates
     * as stored (before any RoPE permutation or [Q|K|V] fusion). */
    for (int64_t i = 0; i < n * per_row; i++) {
        if (isfinite(dst[i]))
            continue;
        if (t->ndim >= 2)
            return fxt_fail(FXT_EXIT_BAD_INPUT,
                            "%s: tensor '%s' has a non-finite value (%g) at [%lld, %lld]",
                            c->path, t->name, (double)dst[i], (long long)(r0 + i / per_row),
                            (long long)(i % per_row));
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: tensor '%s' has a non-finite value (%g) at [%lld]",
                        c->path, t->name, (double)dst[i], (long long)(r0 + i));
    }
    return 0;
}

/* Elements [r0, r0 + n) of vector v ([hidden]) into dst. */
static int vector_rows(const src *c, vec v, int64_t r0, int64_t n, float *dst)
{
    if (!c->f) {
        synth_fill(dst, v.first + r0, n, c->seed, v.stream, v.mean, v.sd);
        return 0;
    }
    const fxa_st_tensor *t = NULL;
    int code = find(c, v.leaf, &t);
    if (!code)
        code = check_shape(c, t, c->hidden, 0);
    return code ? code : read_float_rows(c, t, r0, n, dst);
}

/* Weight of module `mod`: its shape and whether it is FP8 (into c->fp8). */
static int weight_kind(src *c, int mod)
{
    char leaf[32];
    const fxa_st_tensor *t = NULL;
    snprintf(leaf, sizeof leaf, "%s.weight", MODS[mod]);
    int code = find(c, leaf, &t);
    if (!code)
        code = check_shape(c, t, c->hidden, c->hidden);
    if (!code && !t->supported)
        code = fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s: tensor '%s' has dtype %s; expected F32, BF16, F16 or F8_E4M3",
                        c->path, t->name, t->dtype_name);
    c->fp8[mod] = !code && t->dtype == FXA_ST_F8_E4M3;
    return code;
}

/* The scale tensor of FP8 weight `mod` (see the header comment). */
static int find_scale(const src *c, int mod, const fxa_st_tensor **t)
{
    char a[NAME_CAP], b[NAME_CAP], leaf[32];
    snprintf(leaf, sizeof leaf, "%s.weight_scale", MODS[mod]);
    tensor_name(c, leaf, a);
    snprintf(leaf, sizeof leaf, "%s.scale_weight", MODS[mod]);
    tensor_name(c, leaf, b);
    const fxa_st_tensor *ta = fxa_st_find(c->f, a);
    const fxa_st_tensor *tb = fxa_st_find(c->f, b);
    if (ta && tb)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: both '%s' and '%s' are present; keep one",
                        c->path, a, b);
    if (!ta && !tb)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s: blocks.%lld.self_attn.%s.weight is F8_E4M3 but has no scale: "
                        "expected '%s' or '%s' (one value per output channel)",
                        c->path, (long long)c->block, MODS[mod], a, b);
    *t = ta ? ta : tb;
    return 0;
}

/* A single-value scale t (shape [] or [1]) into dst[n]. */
static int read_one_scale(const src *c, const fxa_st_tensor *t, int64_t n, float *dst)
{
    char err[600];
    const int code = check_float(c, t);
    if (code)
        return code;
    const fxa_status st = fxa_st_read_f32(c->f, t, dst, 1, err, sizeof err);
    if (st != FXA_OK)
        return read_fail(st, err);
    if (!isfinite(dst[0]) || dst[0] < 0.0f)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: scale '%s' is %g (must be finite, not negative)",
                        c->path, t->name, (double)dst[0]);
    for (int64_t i = 1; i < n; i++)
        dst[i] = dst[0];
    return 0;
}

/* Scales of output channels [r0, r0 + n) of FP8 weight `mod` into dst[n]:
 * only those rows of a per-channel scale are read. */
static int read_scales(const src *c, int mod, int64_t r0, int64_t n, float *dst)
{
    const fxa_st_tensor *t = NULL;
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
    code = per_channel ? read_float_rows(c, t, r0, n, dst) : read_one_scale(c, t, n, dst);
    for (int64_t i = 0; !code && i < n; i++)
        if (!isfinite(dst[i]) || dst[i] < 0.0f)
            code = fxt_fail(FXT_EXIT_BAD_INPUT,
                            "%s: scale '%s' has %g at channel %lld (must be finite, not "
                            "negative)",
                            c->path, t->name, (double)dst[i], (long long)(r0 + i));
    return code;
}

/* Rows [r0, r0 + n) of weight `mod` ([hidden][hidden]) into dst: E4M3 codes
 * when the checkpoint's weight is F8_E4M3, else fp32. */
static int weight_rows(const src *c, int mod, int64_t r0, int64_t n, void *dst)
{
    const int64_t h = c->hidden;
    if (!c->f) {
        synth_fill(dst, r0 * h, n * h, c->seed, S_WQ + (uint64_t)mod, 0.0, 1.0 / sqrt((double)h));
        return 0;
    }
    char leaf[32];
    const fxa_st_tensor *t = NULL;
    snprintf(leaf, sizeof leaf, "%s.weight", MODS[mod]);
    int code = find(c, leaf, &t);
    if (code || !c->fp8[mod])
        return code ? code : read_float_rows(c, t, r0, n, dst);
    char err[600];
    const fxa_status st = fxa_st_read_rows(c->f, t, r0, n, dst, (size_t)(n * h), err, sizeof err);
    if (st != FXA_OK)
        return read_fail(st, err);
    const uint8_t *codes = dst; /* E4M3's only non-finite codes: the NaNs S.1111.111 */
    for (int64_t i = 0; i < n * h; i++)
        if ((codes[i] & 0x7f) == 0x7f)
            return fxt_fail(FXT_EXIT_BAD_INPUT,
                            "%s: tensor '%s' has a NaN code (0x%02x) at [%lld, %lld]", c->path,
                            t->name, codes[i], (long long)(r0 + i / h), (long long)(i % h));
    return 0;
}

/* Output channels [r0, r0 + n) of module `mod` (weight rows, their scales
 * when FP8, bias) into rows [d0, d0 + n) of m. */
static int linear_rows(const src *c, int mod, int64_t r0, int64_t n, fxt_layer_mat *m,
                       int64_t d0)
{
    const size_t elem = m->format == FXA_PROJ_W_E4M3 ? 1 : sizeof(float);
    int code = weight_rows(c, mod, r0, n, (char *)m->w + (size_t)(d0 * m->cols) * elem);
    if (!code && m->format == FXA_PROJ_W_E4M3)
        code = read_scales(c, mod, r0, n, m->scales + d0);
    return code ? code : vector_rows(c, bias_vec(mod, c->hidden), r0, n, m->bias + d0);
}

/* fp32 rows to E4M3 codes with per-output-channel scales (--fp8). */
static int quantize(const float *w, int64_t rows, int64_t cols, uint8_t *codes, float *scales)
{
    if (fxa_e4m3_quantize_weights(w, rows, cols, codes, scales) != FXA_OK)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--fp8: a weight is not finite");
    return 0;
}

/* Copy columns [c0, c0 + n) of `rows` rows of `cols` elements of elem bytes
 * from src into dst ([rows][n]). */
static void copy_columns(void *dst, const void *src_rows, int64_t rows, int64_t cols, int64_t c0,
                         int64_t n, size_t elem)
{
    for (int64_t r = 0; r < rows; r++)
        memcpy((char *)dst + (size_t)(r * n) * elem,
               (const char *)src_rows + (size_t)(r * cols + c0) * elem, (size_t)n * elem);
}

/*
 * Columns [c0, c0 + n) of o.weight ([hidden][hidden], [out][in]) into m
 * ([hidden][n], allocated in its format: E4M3 when the checkpoint's o is,
 * or when fp8 quantises the fp32 rows), with all hidden scales when E4M3.
 * o is read in blocks of whole rows, only the columns kept: a rank's
 * columns are strided (n of every hidden values), and --fp8 scales each
 * output channel by the absmax of its whole row, so quantising block by
 * block (per row) gives the bits of quantising the whole weight. Memory: m,
 * and one block of whole rows (about O_BLOCK_BYTES, at least one row; with
 * fp8 also its codes).
 */
static int o_columns(const src *c, int64_t c0, int64_t n, int fp8, fxt_layer_mat *m)
{
    const int64_t h = c->hidden;
    const int raw8 = c->fp8[M_O];
    const size_t elem = raw8 ? 1 : sizeof(float); /* as read */
    const size_t kept = raw8 || fp8 ? 1 : sizeof(float); /* as held in m */
    int64_t rows = O_BLOCK_BYTES / (h * (int64_t)elem);
    rows = rows < 1 ? 1 : rows > h ? h : rows;
    void *block = malloc((size_t)(rows * h) * elem);
    uint8_t *codes = fp8 ? malloc((size_t)(rows * h)) : NULL;
    int code = !block || (fp8 && !codes)
                   ? fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's weights")
                   : 0;
    for (int64_t r = 0; !code && r < h; r += rows) {
        const int64_t b = h - r < rows ? h - r : rows;
        code = weight_rows(c, M_O, r, b, block);
        if (!code && fp8)
            code = quantize(block, b, h, codes, m->scales + r);
        if (!code)
            copy_columns((char *)m->w + (size_t)(r * n) * kept, fp8 ? (void *)codes : block, b, h,
                         c0, n, kept);
    }
    free(block);
    free(codes);
    if (!code && raw8)
        code = read_scales(c, M_O, 0, h, m->scales);
    return code;
}

int fxt_layer_weights_hidden(const char *path, int64_t block, int64_t *hidden)
{
    char err[600];
    src c = {.path = path, .block = block};
    const fxa_status st = fxa_st_open(path, &c.f, err, sizeof err);
    if (st != FXA_OK)
        return read_fail(st, err);
    const fxa_st_tensor *t = NULL;
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
    fxa_st_close(c.f);
    return code;
}

/* Open the source of o (checkpoint headers: every weight's shape and dtype;
 * q, k and v all FP8 or none), or set up the generator. */
static int src_open(const layer_opts *o, const fxt_layer_cfg *cfg, src *c)
{
    char err[600];
    *c = (src){.path = o->weights, .block = o->block, .hidden = cfg->hidden,
               .seed = (uint64_t)o->seed};
    if (!o->weights)
        return 0;
    const fxa_status st = fxa_st_open(o->weights, &c->f, err, sizeof err);
    if (st != FXA_OK)
        return read_fail(st, err);
    int code = 0;
    for (int m = M_Q; m <= M_O && !code; m++)
        code = weight_kind(c, m);
    if (!code && (c->fp8[M_Q] != c->fp8[M_K] || c->fp8[M_Q] != c->fp8[M_V]))
        code = fxt_fail(FXT_EXIT_BAD_INPUT,
                        "%s: the q, k and v weights of block %lld must be all F8_E4M3 or none "
                        "(they form one fused weight)",
                        o->weights, (long long)o->block);
    return code;
}

/* Heads [h0, h0 + nh) of source c into w, as stored (n = nh head_dim): Q, K,
 * V rows [h0 d, h0 d + n) each, their gammas, o's columns (quantised when
 * fp8_o), o's scales and bias whole. */
static int read_heads(const src *c, const fxt_layer_cfg *cfg, int64_t h0, int64_t nh, int fp8_o,
                      fxt_layer_weights *w)
{
    const int64_t h = cfg->hidden;
    const int64_t n = nh * cfg->head_dim;
    const int64_t c0 = h0 * cfg->head_dim;
    int code = mat_alloc(&w->qkv, c->fp8[M_Q] ? FXA_PROJ_W_E4M3 : FXA_PROJ_W_F32, 3 * n, h);
    if (!code)
        code = mat_alloc(&w->o, c->fp8[M_O] || fp8_o ? FXA_PROJ_W_E4M3 : FXA_PROJ_W_F32, h, n);
    w->gamma_q = malloc((size_t)n * sizeof(float));
    w->gamma_k = malloc((size_t)n * sizeof(float));
    if (!code && (!w->gamma_q || !w->gamma_k))
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory for the layer's weights");
    for (int m = M_Q; m <= M_V && !code; m++)
        code = linear_rows(c, m, c0, n, &w->qkv, m * n);
    if (!code)
        code = o_columns(c, c0, n, fp8_o, &w->o);
    if (!code)
        code = vector_rows(c, bias_vec(M_O, h), 0, h, w->o.bias);
    if (!code)
        code = vector_rows(c, NORM_Q, c0, n, w->gamma_q);
    if (!code)
        code = vector_rows(c, NORM_K, c0, n, w->gamma_k);
    return code;
}

/* fp32 QKV weights to E4M3 codes with per-output-channel scales (--fp8). */
static int qkv_to_fp8(fxt_layer_mat *m)
{
    if (m->format == FXA_PROJ_W_E4M3)
        return 0;
    uint8_t *codes = malloc((size_t)(m->rows * m->cols));
    float *scales = malloc((size_t)m->rows * sizeof(float));
    int code = codes && scales ? quantize(m->w, m->rows, m->cols, codes, scales)
                               : fxt_fail(FXT_EXIT_FAILURE, "out of memory for the FP8 weights");
    if (code) {
        free(codes);
        free(scales);
        return code;
    }
    free(m->w);
    m->w = codes;
    m->scales = scales;
    m->format = FXA_PROJ_W_E4M3;
    return 0;
}

/* Interleaved RoPE pairs to rotate-half in the Q/K rows of nh heads. */
static int to_rotate_half(const fxt_layer_cfg *cfg, int64_t nh, fxt_layer_weights *w)
{
    fxa_proj_desc d;
    fxa_proj_desc_init(&d);
    d.in_features = cfg->hidden;
    d.heads_q = d.heads_kv = nh;
    d.head_dim = cfg->head_dim;
    d.w_format = w->qkv.format;
    const fxa_status st = fxa_rope_interleaved_to_half(&d, w->qkv.w, w->qkv.scales, w->qkv.bias,
                                                       w->gamma_q, w->gamma_k);
    if (st != FXA_OK)
        return fxt_fail(fxt_exit_code(st), "cannot convert the interleaved RoPE weights: %s",
                        fxa_status_str(st));
    return 0;
}

int fxt_layer_load_weights(const layer_opts *o, const fxt_layer_cfg *cfg, int64_t h0, int64_t nh,
                           fxt_layer_weights *w)
{
    src c;
    memset(w, 0, sizeof *w);
    int code = src_open(o, cfg, &c);
    if (!code)
        code = read_heads(&c, cfg, h0, nh, o->fp8 && !c.fp8[M_O], w);
    fxa_st_close(c.f);
    if (!code && cfg->interleaved)
        code = to_rotate_half(cfg, nh, w);
    if (!code && o->fp8)
        code = qkv_to_fp8(&w->qkv);
    if (code)
        fxt_layer_weights_free(w);
    return code;
}
