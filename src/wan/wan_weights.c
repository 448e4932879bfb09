/*
 * The weights of the Wan2.2 layer (fxattn_wan.h: fxa_wan_weights_load):
 * a checkpoint's tensors of one block, or the synthetic generator, for a
 * range of heads [h0, h0 + nh), n = nh head_dim channels: only rows
 * [h0 head_dim, + n) of q, k and v (weights, their FP8 scales, biases) and
 * of the gammas are read or generated (the generator is counter-based);
 * o.weight is read in blocks of whole rows of which only columns
 * [h0 head_dim, + n) are kept (o_columns says why), its scales and bias
 * whole. The RoPE permutation (per head) and FP8 quantisation (per output
 * channel) apply to the slice, so a slice holds the bits the same heads
 * have in the whole layer. Held: 4 n hidden weights (fp32 or E4M3),
 * 5 n + hidden biases and gammas (E4M3: 3 n + hidden scales too), and while
 * o is read one block of its rows (about O_BLOCK_BYTES, at least one row).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_checkpoint.h"
#include "fxattn_safetensors.h"
#include "fxattn_wan.h"
#include "wan_internal.h"
#include "wan_synth.h"
#include "base/struct_size.h"

#define NAME_CAP 128
#define O_BLOCK_BYTES ((int64_t)4 << 20) /* rows of o.weight read at once */

/* Where the weights come from: checkpoint ck (path, block; its naming),
 * or the synthetic generator (ck NULL, seed). fp8[m]: weight m (q, k, v,
 * o) is F8_E4M3 in ck. A failure's message goes to err. */
typedef struct src {
    fxa_ckpt *ck;
    int naming; /* NAMING_ORIGINAL or NAMING_DIFFUSERS */
    const char *path;
    int64_t block;
    int64_t hidden;
    uint64_t seed;
    int fp8[4];
    char *err;
    size_t errlen;
} src;

/* The message of a failure into c->err; returns st. */
static fxa_status failf(const src *c, fxa_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static fxa_status failf(const src *c, fxa_status st, const char *fmt, ...)
{
    if (c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

static fxa_status mat_alloc(const src *c, fxa_wan_linear *m, fxa_proj_w format, int64_t rows,
                            int64_t cols)
{
    const size_t elem = format == FXA_PROJ_W_E4M3 ? 1 : sizeof(float);
    *m = (fxa_wan_linear){.format = format, .rows = rows, .cols = cols};
    m->w = malloc((size_t)(rows * cols) * elem);
    m->bias = malloc((size_t)rows * sizeof(float));
    m->scales = format == FXA_PROJ_W_E4M3 ? malloc((size_t)rows * sizeof(float)) : NULL;
    if (!m->w || !m->bias || (format == FXA_PROJ_W_E4M3 && !m->scales))
        return failf(c, FXA_ERR_NO_MEMORY, "out of memory for the layer's weights");
    return 0;
}

static void mat_free(fxa_wan_linear *m)
{
    free(m->w);
    free(m->scales);
    free(m->bias);
    memset(m, 0, sizeof *m);
}

void fxa_wan_weights_free(fxa_wan_weights *w)
{
    mat_free(&w->qkv);
    mat_free(&w->o);
    free(w->gamma_q);
    free(w->gamma_k);
    memset(w, 0, sizeof *w);
}

/* ---- sources: a checkpoint or the generator -------------------------------- */

enum { M_Q, M_K, M_V, M_O };

/* The two namings of a block's tensors: Wan2.2's original
 * (blocks.N.self_attn.q.weight, ...) and diffusers'
 * (blocks.N.attn1.to_q.weight, ..., to_out.0 for o); the gammas are
 * norm_q / norm_k under either. The same tensors, in the same channel
 * order. */
enum { NAMING_ORIGINAL, NAMING_DIFFUSERS };
static const char *const PREFIX[2] = {"self_attn", "attn1"};
static const char *const MODS[2][4] = {{"q", "k", "v", "o"}, {"to_q", "to_k", "to_v", "to_out.0"}};

/* A [hidden] vector of the block: its checkpoint leaf, and its synthetic
 * values (element i is element first + i of stream, mean + sd N(0, 1)). */
typedef struct vec {
    const char *leaf; /* after the module's name when mod >= 0 */
    int mod;
    uint64_t stream;
    int64_t first;
    double mean, sd;
} vec;

/* The bias of module m (its leaf: MODS[naming][m] + ".bias"). */
static vec bias_vec(int m, int64_t hidden)
{
    return m == M_O ? (vec){".bias", m, FXA_WAN_STREAM_BO, 0, 0.0, 0.1}
                    : (vec){".bias", m, FXA_WAN_STREAM_BQKV, m * hidden, 0.0, 0.1};
}

static const vec NORM_Q = {"norm_q.weight", -1, FXA_WAN_STREAM_GQ, 0, 1.0, 0.2};
static const vec NORM_K = {"norm_k.weight", -1, FXA_WAN_STREAM_GK, 0, 1.0, 0.2};

/* "blocks.N.<prefix>.<module><leaf>" (mod >= 0) or "blocks.N.<prefix>.<leaf>" */
static void tensor_name(const src *c, int mod, const char *leaf, char name[NAME_CAP])
{
    snprintf(name, NAME_CAP, "blocks.%lld.%s.%s%s", (long long)c->block, PREFIX[c->naming],
             mod >= 0 ? MODS[c->naming][mod] : "", leaf);
}

/* Tensor `name` of the checkpoint into *f, *t (both NULL when absent). */
static fxa_status lookup(const src *c, const char *name, const fxa_st_file **f,
                         const fxa_st_tensor **t)
{
    char why[700];
    const fxa_status st = fxa_ckpt_find(c->ck, name, f, t, why, sizeof why);
    return st == FXA_OK ? FXA_OK : failf(c, st, "%s", why);
}

static void shape_text(const fxa_st_tensor *t, char *buf, size_t cap)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < t->ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
}

/* Tensor `leaf` of module `mod` (-1: none) of the block, which must exist. */
static fxa_status find(const src *c, int mod, const char *leaf, const fxa_st_file **f,
                       const fxa_st_tensor **t)
{
    char name[NAME_CAP];
    tensor_name(c, mod, leaf, name);
    const fxa_status st = lookup(c, name, f, t);
    if (st == FXA_OK && !*t)
        return failf(c, FXA_ERR_INVALID_ARG, "%s: no tensor '%s'", c->path, name);
    return st;
}

/* t has shape [rows] (cols 0) or [rows, cols]. */
static fxa_status check_shape(const src *c, const fxa_st_tensor *t, int64_t rows, int64_t cols)
{
    const int ndim = cols ? 2 : 1;
    if (t->ndim == ndim && t->shape[0] == rows && (!cols || t->shape[1] == cols))
        return 0;
    char got[160];
    shape_text(t, got, sizeof got);
    if (cols)
        return failf(c, FXA_ERR_INVALID_ARG, "%s: tensor '%s' has shape %s, expected [%lld, %lld]",
                     c->path, t->name, got, (long long)rows, (long long)cols);
    return failf(c, FXA_ERR_INVALID_ARG, "%s: tensor '%s' has shape %s, expected [%lld]", c->path,
                 t->name, got, (long long)rows);
}

/* A reader's failure (its message names the file). */
static fxa_status read_fail(const src *c, fxa_status st, const char *err)
{
    return failf(c, st, "%s", err);
}

/* t is F32, BF16 or F16. */
static fxa_status check_float(const src *c, const fxa_st_tensor *t)
{
    if (!t->supported || t->dtype == FXA_ST_F8_E4M3)
        return failf(c, FXA_ERR_INVALID_ARG,
                     "%s: tensor '%s' has dtype %s; expected F32, BF16 or F16", c->path, t->name,
                     t->dtype_name);
    return 0;
}

/* Rows [r0, r0 + n) of an F32, BF16 or F16 tensor as fp32 into dst (n rows
 * of its other dimensions). */
static fxa_status read_float_rows(const src *c, const fxa_st_file *f, const fxa_st_tensor *t,
                                  int64_t r0, int64_t n, float *dst)
{
    char err[600];
    const fxa_status code = check_float(c, t);
    if (code)
        return code;
    const int64_t per_row = t->ndim && t->shape[0] ? t->count / t->shape[0] : 0;
    const fxa_status st =
        fxa_st_read_rows_f32(f, t, r0, n, dst, (size_t)(n * per_row), err, sizeof err);
    if (st != FXA_OK)
        return read_fail(c, st, err);
    /* Non-finite values are reported here, in the tensor's own coordinates
     * as stored (before any RoPE permutation or [Q|K|V] fusion). */
    for (int64_t i = 0; i < n * per_row; i++) {
        if (isfinite(dst[i]))
            continue;
        if (t->ndim >= 2)
            return failf(c, FXA_ERR_INVALID_ARG,
                         "%s: tensor '%s' has a non-finite value (%g) at [%lld, %lld]", c->path,
                         t->name, (double)dst[i], (long long)(r0 + i / per_row),
                         (long long)(i % per_row));
        return failf(c, FXA_ERR_INVALID_ARG,
                     "%s: tensor '%s' has a non-finite value (%g) at [%lld]", c->path, t->name,
                     (double)dst[i], (long long)(r0 + i));
    }
    return 0;
}

/* Elements [r0, r0 + n) of vector v ([hidden]) into dst. */
static fxa_status vector_rows(const src *c, vec v, int64_t r0, int64_t n, float *dst)
{
    if (!c->ck) {
        fxa_wan_synth_fill(dst, v.first + r0, n, c->seed, v.stream, v.mean, v.sd);
        return 0;
    }
    const fxa_st_file *f = NULL;
    const fxa_st_tensor *t = NULL;
    fxa_status code = find(c, v.mod, v.leaf, &f, &t);
    if (!code)
        code = check_shape(c, t, c->hidden, 0);
    return code ? code : read_float_rows(c, f, t, r0, n, dst);
}

/* Weight of module `mod`: its shape and whether it is FP8 (into c->fp8). */
static fxa_status weight_kind(src *c, int mod)
{
    const fxa_st_file *f = NULL;
    const fxa_st_tensor *t = NULL;
    fxa_status code = find(c, mod, ".weight", &f, &t);
    if (!code)
        code = check_shape(c, t, c->hidden, c->hidden);
    if (!code && !t->supported)
        code = failf(c, FXA_ERR_INVALID_ARG,
                     "%s: tensor '%s' has dtype %s; expected F32, BF16, F16 or F8_E4M3", c->path,
                     t->name, t->dtype_name);
    c->fp8[mod] = !code && t->dtype == FXA_ST_F8_E4M3;
    return code;
}

/* The scale tensor of FP8 weight `mod` (see the header comment). */
static fxa_status find_scale(const src *c, int mod, const fxa_st_file **f, const fxa_st_tensor **t)
{
    char a[NAME_CAP], b[NAME_CAP], w[NAME_CAP];
    tensor_name(c, mod, ".weight_scale", a);
    tensor_name(c, mod, ".scale_weight", b);
    tensor_name(c, mod, ".weight", w);
    const fxa_st_file *fa = NULL, *fb = NULL;
    const fxa_st_tensor *ta = NULL, *tb = NULL;
    fxa_status st = lookup(c, a, &fa, &ta);
    if (st == FXA_OK)
        st = lookup(c, b, &fb, &tb);
    if (st != FXA_OK)
        return st;
    if (ta && tb)
        return failf(c, FXA_ERR_INVALID_ARG, "%s: both '%s' and '%s' are present; keep one",
                     c->path, a, b);
    if (!ta && !tb)
        return failf(c, FXA_ERR_INVALID_ARG,
                     "%s: %s is F8_E4M3 but has no scale: "
                     "expected '%s' or '%s' (one value per output channel)",
                     c->path, w, a, b);
    *f = ta ? fa : fb;
    *t = ta ? ta : tb;
    return 0;
}

/* A single-value scale t (shape [] or [1]) into dst[n]. */
static fxa_status read_one_scale(const src *c, const fxa_st_file *f, const fxa_st_tensor *t,
                                 int64_t n, float *dst)
{
    char err[600];
    const fxa_status code = check_float(c, t);
    if (code)
        return code;
    const fxa_status st = fxa_st_read_f32(f, t, dst, 1, err, sizeof err);
    if (st != FXA_OK)
        return read_fail(c, st, err);
    if (!isfinite(dst[0]) || dst[0] < 0.0f)
        return failf(c, FXA_ERR_INVALID_ARG, "%s: scale '%s' is %g (must be finite, not negative)",
                     c->path, t->name, (double)dst[0]);
    for (int64_t i = 1; i < n; i++)
        dst[i] = dst[0];
    return 0;
}

/* Scales of output channels [r0, r0 + n) of FP8 weight `mod` into dst[n]:
 * only those rows of a per-channel scale are read. */
static fxa_status read_scales(const src *c, int mod, int64_t r0, int64_t n, float *dst)
{
    const fxa_st_file *f = NULL;
    const fxa_st_tensor *t = NULL;
    fxa_status code = find_scale(c, mod, &f, &t);
    if (code)
        return code;
    const int per_channel = (t->ndim == 1 && t->shape[0] == c->hidden) ||
                            (t->ndim == 2 && t->shape[0] == c->hidden && t->shape[1] == 1);
    if (!per_channel && t->count != 1) {
        char got[160];
        shape_text(t, got, sizeof got);
        return failf(c, FXA_ERR_INVALID_ARG,
                     "%s: scale '%s' has shape %s, expected [%lld], [%lld, 1] or one value",
                     c->path, t->name, got, (long long)c->hidden, (long long)c->hidden);
    }
    code = per_channel ? read_float_rows(c, f, t, r0, n, dst) : read_one_scale(c, f, t, n, dst);
    for (int64_t i = 0; !code && i < n; i++)
        if (!isfinite(dst[i]) || dst[i] < 0.0f)
            code = failf(c, FXA_ERR_INVALID_ARG,
                         "%s: scale '%s' has %g at channel %lld (must be finite, not "
                         "negative)",
                         c->path, t->name, (double)dst[i], (long long)(r0 + i));
    return code;
}

/* Rows [r0, r0 + n) of weight `mod` ([hidden][hidden]) into dst: E4M3 codes
 * when the checkpoint's weight is F8_E4M3, else fp32. */
static fxa_status weight_rows(const src *c, int mod, int64_t r0, int64_t n, void *dst)
{
    const int64_t h = c->hidden;
    if (!c->ck) {
        fxa_wan_synth_fill(dst, r0 * h, n * h, c->seed, FXA_WAN_STREAM_WQ + (uint64_t)mod, 0.0,
                           1.0 / sqrt((double)h));
        return 0;
    }
    const fxa_st_file *f = NULL;
    const fxa_st_tensor *t = NULL;
    fxa_status code = find(c, mod, ".weight", &f, &t);
    if (code || !c->fp8[mod])
        return code ? code : read_float_rows(c, f, t, r0, n, dst);
    char err[600];
    const fxa_status st = fxa_st_read_rows(f, t, r0, n, dst, (size_t)(n * h), err, sizeof err);
    if (st != FXA_OK)
        return read_fail(c, st, err);
    const uint8_t *codes = dst; /* E4M3's only non-finite codes: the NaNs S.1111.111 */
    for (int64_t i = 0; i < n * h; i++)
        if ((codes[i] & 0x7f) == 0x7f)
            return failf(c, FXA_ERR_INVALID_ARG,
                         "%s: tensor '%s' has a NaN code (0x%02x) at [%lld, %lld]", c->path,
                         t->name, codes[i], (long long)(r0 + i / h), (long long)(i % h));
    return 0;
}

/* Output channels [r0, r0 + n) of module `mod` (weight rows, their scales
 * when FP8, bias) into rows [d0, d0 + n) of m. */
static fxa_status linear_rows(const src *c, int mod, int64_t r0, int64_t n, fxa_wan_linear *m,
                              int64_t d0)
{
    const size_t elem = m->format == FXA_PROJ_W_E4M3 ? 1 : sizeof(float);
    fxa_status code = weight_rows(c, mod, r0, n, (char *)m->w + (size_t)(d0 * m->cols) * elem);
    if (!code && m->format == FXA_PROJ_W_E4M3)
        code = read_scales(c, mod, r0, n, m->scales + d0);
    return code ? code : vector_rows(c, bias_vec(mod, c->hidden), r0, n, m->bias + d0);
}

/* fp32 rows to E4M3 codes with per-output-channel scales (--fp8). */
static fxa_status quantize(const src *c, const float *w, int64_t rows, int64_t cols, uint8_t *codes,
                           float *scales)
{
    if (fxa_e4m3_quantize_weights(w, rows, cols, codes, scales) != FXA_OK)
        return failf(c, FXA_ERR_INVALID_ARG, "--fp8: a weight is not finite");
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
static fxa_status o_columns(const src *c, int64_t c0, int64_t n, int fp8, fxa_wan_linear *m)
{
    const int64_t h = c->hidden;
    const int raw8 = c->fp8[M_O];
    const size_t elem = raw8 ? 1 : sizeof(float);        /* as read */
    const size_t kept = raw8 || fp8 ? 1 : sizeof(float); /* as held in m */
    int64_t rows = O_BLOCK_BYTES / (h * (int64_t)elem);
    rows = rows < 1 ? 1 : rows > h ? h : rows;
    void *block = malloc((size_t)(rows * h) * elem);
    uint8_t *codes = fp8 ? malloc((size_t)(rows * h)) : NULL;
    fxa_status code = !block || (fp8 && !codes)
                          ? failf(c, FXA_ERR_NO_MEMORY, "out of memory for the layer's weights")
                          : 0;
    for (int64_t r = 0; !code && r < h; r += rows) {
        const int64_t b = h - r < rows ? h - r : rows;
        code = weight_rows(c, M_O, r, b, block);
        if (!code && fp8)
            code = quantize(c, block, b, h, codes, m->scales + r);
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

/* Open checkpoint c->path (one file, a sharded index or a folder) and
 * settle its naming from block c->block's q weight: Wan2.2's original
 * names or diffusers'. */
static fxa_status ckpt_open(src *c)
{
    char why[700], names[2][NAME_CAP];
    fxa_status st = fxa_ckpt_open(c->path, &c->ck, why, sizeof why);
    if (st != FXA_OK)
        return read_fail(c, st, why);
    const fxa_st_tensor *t[2] = {NULL, NULL};
    for (int n = NAMING_ORIGINAL; n <= NAMING_DIFFUSERS && st == FXA_OK; n++) {
        const fxa_st_file *f = NULL;
        c->naming = n;
        tensor_name(c, M_Q, ".weight", names[n]);
        st = lookup(c, names[n], &f, &t[n]);
    }
    if (st != FXA_OK)
        return st;
    if (t[0] && t[1])
        return failf(c, FXA_ERR_INVALID_ARG,
                     "%s: block %lld is named both ways ('%s' and '%s'); keep one naming", c->path,
                     (long long)c->block, names[0], names[1]);
    if (!t[0] && !t[1])
        return failf(c, FXA_ERR_INVALID_ARG,
                     "%s: no self-attention weights of block %lld: looked for '%s' (Wan2.2's "
                     "names) and '%s' (diffusers' names)",
                     c->path, (long long)c->block, names[0], names[1]);
    c->naming = t[0] ? NAMING_ORIGINAL : NAMING_DIFFUSERS;
    return FXA_OK;
}

fxa_status fxa_wan_checkpoint_hidden(const char *path, int64_t block, int64_t *hidden, char *err,
                                     size_t errlen)
{
    src c = {.path = path, .block = block, .err = err, .errlen = errlen};
    if (!path || !hidden)
        return failf(&c, FXA_ERR_INVALID_ARG, "fxa_wan_checkpoint_hidden: NULL argument");
    fxa_status code = ckpt_open(&c);
    const fxa_st_file *f = NULL;
    const fxa_st_tensor *t = NULL;
    if (!code)
        code = find(&c, M_Q, ".weight", &f, &t);
    if (!code && t->ndim != 2) {
        char got[160];
        shape_text(t, got, sizeof got);
        code = failf(&c, FXA_ERR_INVALID_ARG,
                     "%s: tensor '%s' has shape %s, expected [hidden, hidden]", path, t->name, got);
    }
    if (!code)
        *hidden = t->shape[1];
    fxa_ckpt_close(c.ck);
    return code;
}

/* Open the checkpoint (every weight's shape and dtype; q, k and v all FP8
 * or none), or set up the generator. */
static fxa_status src_open(src *c)
{
    if (!c->path)
        return FXA_OK;
    fxa_status code = ckpt_open(c);
    for (int m = M_Q; m <= M_O && !code; m++)
        code = weight_kind(c, m);
    if (!code && (c->fp8[M_Q] != c->fp8[M_K] || c->fp8[M_Q] != c->fp8[M_V]))
        code = failf(c, FXA_ERR_INVALID_ARG,
                     "%s: the q, k and v weights of block %lld must be all F8_E4M3 or none "
                     "(they form one fused weight)",
                     c->path, (long long)c->block);
    return code;
}

/* Heads [h0, h0 + nh) of source c into w, as stored (n = nh head_dim): Q, K,
 * V rows [h0 d, h0 d + n) each, their gammas, o's columns (quantised when
 * fp8_o), o's scales and bias whole. */
static fxa_status read_heads(const src *c, int64_t d, int64_t h0, int64_t nh, int fp8_o,
                             fxa_wan_weights *w)
{
    const int64_t h = c->hidden;
    const int64_t n = nh * d;
    const int64_t c0 = h0 * d;
    fxa_status code =
        mat_alloc(c, &w->qkv, c->fp8[M_Q] ? FXA_PROJ_W_E4M3 : FXA_PROJ_W_F32, 3 * n, h);
    if (!code)
        code = mat_alloc(c, &w->o, c->fp8[M_O] || fp8_o ? FXA_PROJ_W_E4M3 : FXA_PROJ_W_F32, h, n);
    w->gamma_q = malloc((size_t)n * sizeof(float));
    w->gamma_k = malloc((size_t)n * sizeof(float));
    if (!code && (!w->gamma_q || !w->gamma_k))
        code = failf(c, FXA_ERR_NO_MEMORY, "out of memory for the layer's weights");
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

/* fp32 QKV weights to E4M3 codes with per-output-channel scales (fp8). */
static fxa_status qkv_to_fp8(const src *c, fxa_wan_linear *m)
{
    if (m->format == FXA_PROJ_W_E4M3)
        return FXA_OK;
    uint8_t *codes = malloc((size_t)(m->rows * m->cols));
    float *scales = malloc((size_t)m->rows * sizeof(float));
    const fxa_status code = codes && scales
                                ? quantize(c, m->w, m->rows, m->cols, codes, scales)
                                : failf(c, FXA_ERR_NO_MEMORY, "out of memory for the FP8 weights");
    if (code) {
        free(codes);
        free(scales);
        return code;
    }
    free(m->w);
    m->w = codes;
    m->scales = scales;
    m->format = FXA_PROJ_W_E4M3;
    return FXA_OK;
}

/* fp32 weights to bf16 bits, each rounded once to nearest even (a BF16
 * checkpoint's values, widened exactly when read, get their own bits back). */
static fxa_status to_bf16(const src *c, fxa_wan_linear *m)
{
    if (m->format != FXA_PROJ_W_F32)
        return FXA_OK;
    const size_t n = (size_t)(m->rows * m->cols);
    uint16_t *h = malloc(n * sizeof(uint16_t) + 1);
    if (!h)
        return failf(c, FXA_ERR_NO_MEMORY, "out of memory for the bf16 weights");
    if (fxa_convert_f32(m->w, FXA_BF16, h, n) != FXA_OK) {
        free(h);
        return failf(c, FXA_ERR_INVALID_ARG, "a weight is beyond bf16's range");
    }
    free(m->w);
    m->w = h;
    m->format = FXA_PROJ_W_BF16;
    return FXA_OK;
}

/* Interleaved RoPE pairs to rotate-half in the Q/K rows of the held heads. */
static fxa_status to_rotate_half(const src *c, fxa_wan_weights *w)
{
    fxa_proj_desc d;
    fxa_proj_desc_init(&d);
    d.in_features = w->hidden;
    d.heads_q = d.heads_kv = w->head_count;
    d.head_dim = w->head_dim;
    d.w_format = w->qkv.format;
    const fxa_status st = fxa_rope_interleaved_to_half(&d, w->qkv.w, w->qkv.scales, w->qkv.bias,
                                                       w->gamma_q, w->gamma_k);
    if (st != FXA_OK)
        return failf(c, st, "cannot convert the interleaved RoPE weights: %s", fxa_status_str(st));
    return FXA_OK;
}

void fxa_wan_load_params_init(fxa_wan_load_params *p)
{
    memset(p, 0, sizeof *p);
    p->struct_size = sizeof *p;
}

/* hidden, heads and the head range of p against the source: the checks
 * that need no tensor data. */
static fxa_status check_params(src *c, const fxa_wan_load_params *p, int64_t *h0, int64_t *nh)
{
    if (p->dtype != FXA_F32 && p->dtype != FXA_BF16)
        return failf(c, FXA_ERR_INVALID_ARG,
                     "fxa_wan_load_params.dtype must be FXA_F32 or FXA_BF16, not %d",
                     (int)p->dtype);
    fxa_status code = FXA_OK;
    if (c->path)
        code = fxa_wan_checkpoint_hidden(c->path, p->block, &c->hidden, c->err, c->errlen);
    if (code)
        return code;
    if (c->hidden < 1)
        return failf(c, FXA_ERR_INVALID_ARG, "the hidden size must be positive, not %lld",
                     (long long)c->hidden);
    if (c->hidden > PTRDIFF_MAX / 16 / c->hidden) /* qkv's 3 hidden^2 floats, and more */
        return failf(c, FXA_ERR_INVALID_ARG, "the hidden size %lld is too large to address",
                     (long long)c->hidden);
    if (p->heads < 1 || c->hidden % p->heads)
        return failf(c, FXA_ERR_INVALID_ARG, "%lld heads do not divide the hidden size %lld",
                     (long long)p->heads, (long long)c->hidden);
    *h0 = p->head_begin;
    if (*h0 < 0 || *h0 >= p->heads)
        return failf(c, FXA_ERR_INVALID_ARG, "head_begin %lld is not within the %lld heads",
                     (long long)*h0, (long long)p->heads);
    *nh = p->head_count ? p->head_count : p->heads - *h0;
    if (*nh < 1 || *nh > p->heads - *h0)
        return failf(c, FXA_ERR_INVALID_ARG,
                     "%lld heads from head %lld are not within the %lld heads", (long long)*nh,
                     (long long)*h0, (long long)p->heads);
    return FXA_OK;
}

fxa_status fxa_wan_weights_load(const char *path, const fxa_wan_load_params *p_in,
                                fxa_wan_weights *w, char *err, size_t errlen)
{
    src c = {.path = path, .err = err, .errlen = errlen};
    int64_t h0 = 0, nh = 0;
    if (!p_in || !w)
        return failf(&c, FXA_ERR_INVALID_ARG, "fxa_wan_weights_load: NULL argument");
    memset(w, 0, sizeof *w);
    fxa_wan_load_params full;
    fxa_wan_load_params_init(&full);
    char msg[200];
    if (fxa_struct_in(&full, sizeof full, p_in, FXA_WAN_LOAD_PARAMS_SIZE_0_1, "fxa_wan_load_params",
                      msg, sizeof msg) != FXA_OK)
        return failf(&c, FXA_ERR_INVALID_ARG, "%s", msg);
    const fxa_wan_load_params *p = &full;
    c.block = p->block;
    c.seed = p->seed;
    c.hidden = p->hidden;
    fxa_status code = check_params(&c, p, &h0, &nh);
    if (code)
        return code;
    w->hidden = c.hidden;
    w->heads = p->heads;
    w->head_dim = c.hidden / p->heads;
    w->head_begin = h0;
    w->head_count = nh;
    code = src_open(&c);
    if (!code)
        code = read_heads(&c, w->head_dim, h0, nh, p->fp8 && !c.fp8[M_O], w);
    fxa_ckpt_close(c.ck);
    if (!code && !p->rope_half)
        code = to_rotate_half(&c, w);
    if (!code && p->fp8)
        code = qkv_to_fp8(&c, &w->qkv);
    if (!code && p->dtype == FXA_BF16)
        code = to_bf16(&c, &w->qkv);
    if (!code && p->dtype == FXA_BF16)
        code = to_bf16(&c, &w->o);
    if (code)
        fxa_wan_weights_free(w);
    return code;
}
