/*
 * End-to-end test of `fxattn layer` (the Wan2.2 self-attention layer):
 *
 *   test_layer /path/to/fxattn
 *
 * Builds a small layer (grid 2x3x4 = 24 tokens, 4 heads x 16 = hidden 64)
 * with Wan2.2 tensor names, writes it as .safetensors files (F32, BF16, and
 * F8_E4M3 weights with per-channel scales) and x as .npy, runs the CLI and
 * checks y against this file's own reference of the same math, written from
 * Wan's definition (interleaved RoPE pairs on the checkpoint as stored; the
 * tool converts to rotate-half, this reference does not):
 *   y = (attn(rope(rms(x Wq^T + bq) gq), rope(rms(x Wk^T + bk) gk), x Wv^T + bv)) Wo^T + bo.
 * Tolerance: the reference runs in double (y64) and in plain fp32 (every
 * operation rounded to fp32, recursive sums over the hidden and key
 * dimensions: y32). fxattn's error must stay within twice plain fp32's,
 * plus 2^-22 max|y64| (four fp32 roundings at the output's scale), the
 * project's acceptance envelope; at this size plain fp32 errs by a few 1e-7
 * of max|y|. With FP8 operands the reference uses the decoded operands (the
 * quantisation error is the input's, not the kernels').
 * The bf16 layer (--dtype bf16) is held to the same envelope around its own
 * plain twin: the fp32 reference with q, k, v, the probabilities and the
 * attention output rounded to bf16 (y16), from the operands it saw (bf16
 * weights, x rounded to bf16): error within twice plain bf16's plus 2^-12,
 * at most 2^-5 of max|y64|.
 * Also: the interleaved checkpoint gives the same bytes as the equivalent
 * rotate-half one run with --rope-layout half (and the wrong layout is far
 * outside the tolerance), --verify and --stats, and errors (missing tensor,
 * wrong shape, S != F*H*W, bad dtype, FP8 without scale, ...) exit 2 with one
 * "fxattn: error:" line and leave the output untouched.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fxattn_proj.h"
#include "fxattn_npy.h"
#include "testutil.h"

extern char **environ;

enum { GF = 2, GH = 3, GW = 4, S = GF * GH * GW, NH = 4, D = 16, H = NH * D };
#define TOOL_TIMEOUT_S 60.0
#define MAX_ARGS 40

static const char *g_tool;
static char g_dir[64];

/* ---- files -------------------------------------------------------------------------- */

static void die(const char *what)
{
    fprintf(stderr, "test_layer: setup failed: %s: %s\n", what, strerror(errno));
    exit(1);
}

static char *g_paths[1024];
static int g_npaths;

/* g_dir/name, kept until the end of the test. */
static const char *path_of(const char *name)
{
    const size_t n = strlen(g_dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p || g_npaths == (int)(sizeof g_paths / sizeof g_paths[0]))
        die("out of memory for paths");
    snprintf(p, n, "%s/%s", g_dir, name);
    return g_paths[g_npaths++] = p;
}

static void write_file(const char *name, const void *data, size_t n)
{
    FILE *f = fopen(path_of(name), "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0)
        die(name);
}

static int exists(const char *name)
{
    struct stat st;
    return stat(path_of(name), &st) == 0;
}

/* A C-order .npy file (version 1.0) of descr '<f4' or '<f2'. */
static void write_npy(const char *name, const char *descr, int ndim, const int64_t *shape,
                      const void *data, size_t bytes)
{
    char dict[256], shp[64] = "";
    for (int i = 0; i < ndim; i++)
        snprintf(shp + strlen(shp), sizeof shp - strlen(shp), "%lld, ", (long long)shape[i]);
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr, shp);
    const size_t total = (10 + (size_t)n + 1 + 63) / 64 * 64;
    unsigned char *buf = calloc(1, total + bytes);
    if (!buf)
        die("calloc");
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)((total - 10) & 0xff);
    buf[9] = (unsigned char)((total - 10) >> 8);
    memcpy(buf + 10, dict, (size_t)n);
    memset(buf + 10 + n, ' ', total - 11 - (size_t)n);
    buf[total - 1] = '\n';
    memcpy(buf + total, data, bytes);
    write_file(name, buf, total + bytes);
    free(buf);
}

/* One tensor of a .safetensors file. */
typedef struct st_tensor {
    char name[96];
    const char *dtype;
    int ndim;
    int64_t shape[2];
    const void *data;
    size_t nbytes;
} st_tensor;

/* 8-byte little-endian header length, JSON header (padded with spaces to a
 * multiple of 8), then the tensors' data in order. */
static void write_safetensors(const char *name, const st_tensor *t, int n)
{
    size_t cap = 4096 + (size_t)n * 256, len = 0, off = 0, data = 0;
    char *hdr = malloc(cap);
    if (!hdr)
        die("malloc");
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                i ? "," : "", t[i].name, t[i].dtype);
        for (int k = 0; k < t[i].ndim; k++)
            len += (size_t)snprintf(hdr + len, cap - len, k ? ",%lld" : "%lld",
                                    (long long)t[i].shape[k]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off,
                                off + t[i].nbytes);
        off += t[i].nbytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8)
        hdr[len++] = ' ';
    unsigned char *buf = malloc(8 + len + off);
    if (!buf)
        die("malloc");
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)((uint64_t)len >> (8 * i));
    memcpy(buf + 8, hdr, len);
    for (int i = 0; i < n; i++) {
        memcpy(buf + 8 + len + data, t[i].data, t[i].nbytes);
        data += t[i].nbytes;
    }
    write_file(name, buf, 8 + len + off);
    free(buf);
    free(hdr);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* ---- the layer ---------------------------------------------------------------------- */

/* A checkpoint as stored (Wan's interleaved RoPE layout unless permuted). */
typedef struct layer {
    float x[S * H];
    float w[4][H * H]; /* q, k, v, o: [out][in] */
    float b[4][H];
    float g[2][H]; /* norm_q, norm_k */
} layer;

static const char *const g_mods[4] = {"q", "k", "v", "o"};

static void make_layer(layer *L, uint64_t seed)
{
    fxt_rng r;
    fxt_rng_seed(&r, seed);
    for (int i = 0; i < S * H; i++)
        L->x[i] = (float)fxt_rng_normal(&r);
    for (int m = 0; m < 4; m++) {
        for (int i = 0; i < H * H; i++)
            L->w[m][i] = (float)(fxt_rng_normal(&r) / sqrt((double)H));
        for (int i = 0; i < H; i++)
            L->b[m][i] = (float)(0.1 * fxt_rng_normal(&r));
    }
    for (int n = 0; n < 2; n++)
        for (int i = 0; i < H; i++)
            L->g[n][i] = (float)(1.0 + 0.2 * fxt_rng_normal(&r));
}

/* Round weights, biases and gammas to bf16 (the values a BF16 file holds). */
static void round_bf16(layer *L, uint16_t w16[4][H * H], uint16_t b16[4][H], uint16_t g16[2][H])
{
    for (int m = 0; m < 4; m++) {
        for (int i = 0; i < H * H; i++)
            L->w[m][i] = fxa_bf16_to_f32(w16[m][i] = fxa_f32_to_bf16(L->w[m][i]));
        for (int i = 0; i < H; i++)
            L->b[m][i] = fxa_bf16_to_f32(b16[m][i] = fxa_f32_to_bf16(L->b[m][i]));
    }
    for (int n = 0; n < 2; n++)
        for (int i = 0; i < H; i++)
            L->g[n][i] = fxa_bf16_to_f32(g16[n][i] = fxa_f32_to_bf16(L->g[n][i]));
}

/* The rotate-half checkpoint equivalent to an interleaved one: per head,
 * Q/K output channel i takes interleaved channel 2i (i < D/2) or
 * 2(i - D/2) + 1, in the weights, biases and gammas; V and O stay. */
static void to_half(const layer *in, layer *out)
{
    *out = *in;
    for (int m = 0; m < 2; m++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < D; i++) {
                const int from = h * D + (i < D / 2 ? 2 * i : 2 * (i - D / 2) + 1);
                const int to = h * D + i;
                memcpy(&out->w[m][to * H], &in->w[m][from * H], H * sizeof(float));
                out->b[m][to] = in->b[m][from];
                out->g[m][to] = in->g[m][from];
            }
}

static void tensor(st_tensor *t, const char *leaf, const char *dtype, int ndim, int64_t d0,
                   int64_t d1, const void *data, size_t nbytes)
{
    snprintf(t->name, sizeof t->name, "blocks.3.self_attn.%s", leaf);
    t->dtype = dtype;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = data;
    t->nbytes = nbytes;
}

/* The tensors of an F32 checkpoint (block 3) into t; returns their count.
 * skip: a leaf name to leave out (NULL: none). */
static int f32_tensors(const layer *L, st_tensor *t, const char *skip)
{
    int n = 0;
    char leaf[32];
    for (int m = 0; m < 4; m++) {
        snprintf(leaf, sizeof leaf, "%s.weight", g_mods[m]);
        if (!skip || strcmp(skip, leaf))
            tensor(&t[n++], leaf, "F32", 2, H, H, L->w[m], sizeof L->w[m]);
        snprintf(leaf, sizeof leaf, "%s.bias", g_mods[m]);
        if (!skip || strcmp(skip, leaf))
            tensor(&t[n++], leaf, "F32", 1, H, 0, L->b[m], sizeof L->b[m]);
    }
    if (!skip || strcmp(skip, "norm_q.weight"))
        tensor(&t[n++], "norm_q.weight", "F32", 1, H, 0, L->g[0], sizeof L->g[0]);
    if (!skip || strcmp(skip, "norm_k.weight"))
        tensor(&t[n++], "norm_k.weight", "F32", 1, H, 0, L->g[1], sizeof L->g[1]);
    return n;
}

/* Find tensor `leaf` among t[0..n). */
static st_tensor *find(st_tensor *t, int n, const char *leaf)
{
    char name[96];
    snprintf(name, sizeof name, "blocks.3.self_attn.%s", leaf);
    for (int i = 0; i < n; i++)
        if (strcmp(t[i].name, name) == 0)
            return &t[i];
    fprintf(stderr, "test_layer: no tensor %s\n", name);
    exit(1);
}

/* ---- the reference -------------------------------------------------------------------- */

/* The operands as the kernels see them, in double. */
typedef struct operands {
    double x[S * H];
    double w[4][H * H];
    double b[4][H];
    double g[2][H];
} operands;

static void operands_from(const layer *L, operands *op)
{
    for (int i = 0; i < S * H; i++)
        op->x[i] = L->x[i];
    for (int m = 0; m < 4; m++) {
        for (int i = 0; i < H * H; i++)
            op->w[m][i] = L->w[m][i];
        for (int i = 0; i < H; i++)
            op->b[m][i] = L->b[m][i];
    }
    for (int n = 0; n < 2; n++)
        for (int i = 0; i < H; i++)
            op->g[n][i] = L->g[n][i];
}

static int g_fp32; /* 1: the reference rounds every operation to fp32 */
static int g_bf16; /* 1 (with g_fp32): q, k, v, p and a stored in bf16 too */

static double R(double v)
{
    return g_fp32 ? (double)(float)v : v;
}

static double B(double v)
{
    return g_bf16 ? (double)fxa_bf16_to_f32(fxa_f32_to_bf16((float)v)) : v;
}

/* out[s][o] = sum_i in[s][i] w[o][i] + b[o], recursive sums. */
static void linear(const double *in, const double *w, const double *b, double *out)
{
    for (int s = 0; s < S; s++)
        for (int o = 0; o < H; o++) {
            double acc = 0.0;
            for (int i = 0; i < H; i++)
                acc = R(acc + R(in[s * H + i] * R(w[o * H + i])));
            out[s * H + o] = R(acc + b[o]);
        }
}

/* Wan's RMSNorm over all heads (x * rsqrt(mean x^2 + eps) * weight), then
 * its 3-D RoPE on interleaved pairs (2j, 2j+1) of every head. */
static void norm_rope(double *t, const double *g)
{
    const int pairs = D / 2, hp = pairs / 3, tp = pairs - 2 * hp;
    for (int s = 0; s < S; s++) {
        double *row = t + s * H;
        double ss = 0.0;
        for (int i = 0; i < H; i++)
            ss = R(ss + R(row[i] * row[i]));
        const double r = R(1.0 / R(sqrt(R(R(ss / H) + 1e-6))));
        for (int i = 0; i < H; i++)
            row[i] = R(R(row[i] * r) * g[i]);
        const int pos[3] = {s / (GH * GW), (s / GW) % GH, s % GW};
        for (int h = 0; h < NH; h++)
            for (int j = 0; j < pairs; j++) {
                const int axis = j < tp ? 0 : j < tp + hp ? 1 : 2;
                const int idx = axis == 0 ? j : axis == 1 ? j - tp : j - tp - hp;
                const int n = axis == 0 ? tp : hp;
                const double ang = pos[axis] * pow(1e4, -(double)idx / n);
                const double c = R(cos(ang)), sn = R(sin(ang));
                double *p = row + h * D + 2 * j;
                const double x0 = p[0], x1 = p[1];
                p[0] = R(R(x0 * c) - R(x1 * sn));
                p[1] = R(R(x0 * sn) + R(x1 * c));
            }
    }
}

/* Softmax attention per head, exact row max; a [S][H]. */
static void attention(const double *q, const double *k, const double *v, double *a)
{
    const double tau = R(1.0 / sqrt((double)D));
    double p[S];
    for (int h = 0; h < NH; h++)
        for (int i = 0; i < S; i++) {
            double mx = -INFINITY, sum = 0.0;
            for (int j = 0; j < S; j++) {
                double dot = 0.0;
                for (int c = 0; c < D; c++)
                    dot = R(dot + R(q[i * H + h * D + c] * k[j * H + h * D + c]));
                p[j] = R(tau * dot);
                mx = p[j] > mx ? p[j] : mx;
            }
            for (int j = 0; j < S; j++) {
                p[j] = R(exp(R(p[j] - mx)));
                sum = R(sum + p[j]);
                p[j] = B(p[j]);
            }
            for (int c = 0; c < D; c++) {
                double acc = 0.0;
                for (int j = 0; j < S; j++)
                    acc = R(acc + R(p[j] * v[j * H + h * D + c]));
                a[i * H + h * D + c] = B(R(acc / sum));
            }
        }
}

/* y [S][H] of the layer, in double (prec 0), plain fp32 (1) or plain bf16
 * storage (2: fp32 operations, q, k, v, p and a rounded to bf16). */
static void reference(const operands *op, int prec, double *y)
{
    static double xr[S * H], q[S * H], k[S * H], v[S * H], a[S * H];
    g_fp32 = prec >= 1;
    g_bf16 = prec == 2;
    for (int i = 0; i < S * H; i++)
        xr[i] = R(op->x[i]);
    linear(xr, op->w[0], op->b[0], q);
    linear(xr, op->w[1], op->b[1], k);
    linear(xr, op->w[2], op->b[2], v);
    norm_rope(q, op->g[0]);
    norm_rope(k, op->g[1]);
    for (int i = 0; i < S * H; i++) {
        q[i] = B(q[i]);
        k[i] = B(k[i]);
        v[i] = B(v[i]);
    }
    attention(q, k, v, a);
    linear(a, op->w[3], op->b[3], y);
}

/* Errors of y (read from a .npy) against y64, and plain fp32's (plain
 * bf16's with bf16), relative to max|y64|; returns 1 when y is within the
 * envelope. rel_out: the error over the tolerance. */
static int within_envelope_of(const char *label, const char *y_name, const operands *op, int bf16,
                              double *rel_out)
{
    static double y64[S * H], y32[S * H];
    char err[600];
    fxa_npy a;
    reference(op, 0, y64);
    reference(op, bf16 ? 2 : 1, y32);
    if (fxa_npy_read(path_of(y_name), &a, err, sizeof err) != FXA_OK) {
        CHECK(0, "[%s] cannot read y: %s", label, err);
        return 0;
    }
    CHECK(a.ndim == 2 && a.shape[0] == S && a.shape[1] == H && a.dtype == FXA_F32,
          "[%s] y has the wrong shape or dtype", label);
    double ymax = 0.0, e = 0.0, e32 = 0.0;
    for (int i = 0; i < S * H && a.count == S * H; i++) {
        const double yi = ((const float *)a.data)[i];
        ymax = fmax(ymax, fabs(y64[i]));
        e = isnan(yi) ? INFINITY : fmax(e, fabs(yi - y64[i]));
        e32 = fmax(e32, fabs(y32[i] - y64[i]));
    }
    fxa_npy_free(&a);
    const double rel = e / ymax, rel32 = e32 / ymax;
    const double tol = bf16 ? fmin(2.0 * rel32 + 0x1p-12, 0x1p-5) : 2.0 * rel32 + 0x1p-22;
    printf("  %-34s error %.3g of max|y| (plain %s %.3g, tolerance %.3g)\n", label, rel,
           bf16 ? "bf16" : "fp32", rel32, tol);
    if (rel_out)
        *rel_out = rel / tol;
    return rel <= tol;
}

static int within_envelope(const char *label, const char *y_name, const operands *op,
                           double *rel_out)
{
    return within_envelope_of(label, y_name, op, 0, rel_out);
}

/* ---- running the tool ----------------------------------------------------------------- */

typedef struct result {
    int code; /* exit status, -1 when killed or timed out */
    char out[8192];
    char err[8192];
} result;

static void slurp(const char *name, char *buf, size_t cap)
{
    FILE *f = fopen(path_of(name), "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    buf[n] = '\0';
    if (f)
        fclose(f);
}

/* Run the tool with args (NULL-terminated, argv[0] excluded). */
static void run_v(result *r, const char *const *args)
{
    char *argv[MAX_ARGS + 2];
    int n = 0;
    argv[n++] = (char *)g_tool;
    for (; args[n - 1] && n <= MAX_ARGS; n++)
        argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    posix_spawn_file_actions_t fa;
    const char *out_path = path_of("stdout.txt");
    const char *err_path = path_of("stderr.txt");
    if (posix_spawn_file_actions_init(&fa) ||
        posix_spawn_file_actions_addopen(&fa, 1, out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644) ||
        posix_spawn_file_actions_addopen(&fa, 2, err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644))
        die("posix_spawn_file_actions");
    pid_t pid;
    int status = 0;
    fflush(stdout);
    if (posix_spawn(&pid, g_tool, &fa, NULL, argv, environ) != 0)
        die("posix_spawn");
    posix_spawn_file_actions_destroy(&fa);
    const double t0 = test_now_seconds();
    r->code = -1;
    for (;;) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            if (WIFEXITED(status))
                r->code = WEXITSTATUS(status);
            break;
        }
        if (test_now_seconds() - t0 > TOOL_TIMEOUT_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
        }
        const struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    slurp("stdout.txt", r->out, sizeof r->out);
    slurp("stderr.txt", r->err, sizeof r->err);
}

/* Collect a NULL-terminated vararg list after `first` into args. */
static void collect(const char **args, int n, const char *first, va_list ap)
{
    for (const char *a = first; a && n < MAX_ARGS; a = va_arg(ap, const char *))
        args[n++] = a;
    args[n] = NULL;
}

/* Run the tool with a NULL-terminated argument list. */
static void run(result *r, const char *first, ...)
{
    const char *args[MAX_ARGS + 1];
    va_list ap;
    va_start(ap, first);
    collect(args, 0, first, ap);
    va_end(ap);
    run_v(r, args);
}

/* Whole file; NULL when it cannot be read. */
static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    long len = -1;
    if (f && fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0 &&
        (buf = malloc((size_t)len + 1)) && fread(buf, 1, (size_t)len, f) != (size_t)len) {
        free(buf);
        buf = NULL;
    }
    if (f)
        fclose(f);
    *n = buf ? (size_t)len : 0;
    return buf;
}

#define XFILE "x.npy"
#define YFILE "y.npy"
#define GRID "2,3,4"

/* A good run writing y.npy; returns 1 on exit 0. */
static int run_ok(const char *label, result *r, const char *weights, const char *x,
                  const char *extra1, const char *extra2)
{
    remove(path_of(YFILE));
    run(r, "layer", "--weights", path_of(weights), "--block", "3", "-x", path_of(x), "--grid", GRID,
        "--heads", "4", "-o", path_of(YFILE), "--threads", "1", extra1, extra2, NULL);
    CHECK(r->code == 0, "[%s] exit %d, stderr: %s", label, r->code, r->err);
    return r->code == 0;
}

/* ---- the checks ----------------------------------------------------------------------- */

static void check_good(const char *label, const char *weights, const char *x, const char *extra,
                       const operands *op)
{
    result r;
    if (run_ok(label, &r, weights, x, extra, NULL))
        CHECK(within_envelope(label, YFILE, op, NULL), "[%s] y outside the fp32 envelope", label);
}

/* F32 and BF16 checkpoints, f32 and f16 x ([S, H] and [1, S, H]). */
static void test_float_checkpoints(void)
{
    static layer L, B;
    static operands op;
    static st_tensor t[12];
    static uint16_t w16[4][H * H], b16[4][H], g16[2][H], x16[S * H];
    make_layer(&L, 11);
    write_npy(XFILE, "<f4", 2, (const int64_t[]){S, H}, L.x, sizeof L.x);
    write_safetensors("f32.safetensors", t, f32_tensors(&L, t, NULL));
    operands_from(&L, &op);
    check_good("F32 checkpoint, f32 x", "f32.safetensors", XFILE, NULL, &op);

    B = L;
    round_bf16(&B, w16, b16, g16);
    const int n = f32_tensors(&B, t, NULL);
    for (int i = 0; i < n; i++) {
        t[i].dtype = "BF16";
        t[i].nbytes /= 2;
    }
    for (int m = 0; m < 4; m++) {
        char leaf[32];
        snprintf(leaf, sizeof leaf, "%s.weight", g_mods[m]);
        find(t, n, leaf)->data = w16[m];
        snprintf(leaf, sizeof leaf, "%s.bias", g_mods[m]);
        find(t, n, leaf)->data = b16[m];
    }
    find(t, n, "norm_q.weight")->data = g16[0];
    find(t, n, "norm_k.weight")->data = g16[1];
    write_safetensors("bf16.safetensors", t, n);
    for (int i = 0; i < S * H; i++)
        B.x[i] = fxa_f16_to_f32(x16[i] = fxa_f32_to_f16(L.x[i]));
    write_npy("x16.npy", "<f2", 3, (const int64_t[]){1, S, H}, x16, sizeof x16);
    operands_from(&B, &op);
    check_good("BF16 checkpoint, f16 x [1,S,H]", "bf16.safetensors", "x16.npy", NULL, &op);
}

/* The per-channel E4M3 quantisation of weight m into codes and scales, and
 * the decoded values into op. */
static void quantise_weight(const layer *L, int m, uint8_t *codes, float *scales, operands *op)
{
    CHECK(fxa_e4m3_quantize_weights(L->w[m], H, H, codes, scales) == FXA_OK, "quantise");
    for (int o = 0; o < H; o++)
        for (int i = 0; i < H; i++)
            op->w[m][o * H + i] = (double)fxa_e4m3_to_f32(codes[o * H + i]) * scales[o];
}

/* F8_E4M3 checkpoint with scales, and --fp8 on an F32 checkpoint. */
static void test_fp8(void)
{
    static layer L;
    static operands op;
    static st_tensor t[16];
    static uint8_t codes[4][H * H], xq[S * (H + 4)];
    static float scales[4][H];
    make_layer(&L, 12);
    write_npy("x8.npy", "<f4", 2, (const int64_t[]){S, H}, L.x, sizeof L.x);
    operands_from(&L, &op);
    int n = f32_tensors(&L, t, NULL);
    for (int m = 0; m < 4; m++) {
        char leaf[32];
        quantise_weight(&L, m, codes[m], scales[m], &op);
        snprintf(leaf, sizeof leaf, "%s.weight", g_mods[m]);
        st_tensor *w = find(t, n, leaf);
        w->dtype = "F8_E4M3";
        w->data = codes[m];
        w->nbytes = H * H;
        /* Both accepted names and shapes: q/k/v "X.weight_scale" [H], o
         * "o.scale_weight" [H, 1]. */
        snprintf(leaf, sizeof leaf, m < 3 ? "%s.weight_scale" : "%s.scale_weight", g_mods[m]);
        tensor(&t[n++], leaf, "F32", m < 3 ? 1 : 2, H, 1, scales[m], sizeof scales[m]);
    }
    write_safetensors("fp8.safetensors", t, n);
    check_good("F8_E4M3 checkpoint + scales", "fp8.safetensors", "x8.npy", NULL, &op);

    /* --fp8 on the F32 checkpoint: x quantised per row, weights per output
     * channel, by the library's quantisers; the reference decodes them. */
    n = f32_tensors(&L, t, NULL);
    write_safetensors("f32b.safetensors", t, n);
    CHECK(fxa_e4m3_quantize_rows(L.x, S, H, xq) == FXA_OK, "quantise x");
    for (int s = 0; s < S; s++) {
        float sc;
        memcpy(&sc, xq + s * (H + 4) + H, sizeof sc);
        for (int i = 0; i < H; i++)
            op.x[s * H + i] = (double)fxa_e4m3_to_f32(xq[s * (H + 4) + i]) * sc;
    }
    check_good("--fp8 (x per row, W per channel)", "f32b.safetensors", "x8.npy", "--fp8", &op);

    /* FP8 weights without scales, and FP8 mixed with F32 in q/k/v: refused. */
    n = f32_tensors(&L, t, NULL);
    for (int m = 0; m < 4; m++) {
        char leaf[32];
        snprintf(leaf, sizeof leaf, "%s.weight", g_mods[m]);
        st_tensor *w = find(t, n, leaf);
        w->dtype = "F8_E4M3";
        w->data = codes[m];
        w->nbytes = H * H;
    }
    write_safetensors("fp8_noscale.safetensors", t, n);
    n = f32_tensors(&L, t, NULL);
    st_tensor *w = find(t, n, "v.weight");
    w->dtype = "F8_E4M3";
    w->data = codes[2];
    w->nbytes = H * H;
    tensor(&t[n++], "v.weight_scale", "F32", 1, H, 0, scales[2], sizeof scales[2]);
    write_safetensors("fp8_mixed.safetensors", t, n);
}

/* Interleaved and rotate-half checkpoints of the same layer. */
static void test_rope_layouts(void)
{
    static layer L, Hf;
    static operands op;
    static st_tensor t[12];
    result r;
    size_t n1 = 0, n2 = 0;
    make_layer(&L, 13);
    to_half(&L, &Hf);
    write_npy("x13.npy", "<f4", 2, (const int64_t[]){S, H}, L.x, sizeof L.x);
    write_safetensors("inter.safetensors", t, f32_tensors(&L, t, NULL));
    write_safetensors("half.safetensors", t, f32_tensors(&Hf, t, NULL));
    operands_from(&L, &op);
    unsigned char *a = NULL, *b = NULL;
    if (run_ok("interleaved checkpoint", &r, "inter.safetensors", "x13.npy", NULL, NULL)) {
        CHECK(within_envelope("interleaved checkpoint", YFILE, &op, NULL), "interleaved: y");
        a = (unsigned char *)read_all(path_of(YFILE), &n1);
    }
    if (run_ok("rotate-half checkpoint", &r, "half.safetensors", "x13.npy", "--rope-layout",
               "half"))
        b = (unsigned char *)read_all(path_of(YFILE), &n2);
    CHECK(a && b && n1 == n2 && memcmp(a, b, n1) == 0,
          "the interleaved checkpoint and its rotate-half twin give different bytes");
    free(a);
    free(b);
    /* The wrong layout must be far outside the tolerance. */
    double ratio = 0.0;
    if (run_ok("interleaved read as half", &r, "inter.safetensors", "x13.npy", "--rope-layout",
               "half")) {
        within_envelope("interleaved read as half (wrong)", YFILE, &op, &ratio);
        CHECK(ratio > 100.0, "the wrong RoPE layout is only %.3g x the tolerance", ratio);
    }
}

/* --verify and --stats (with files, and synthetic). */
static void test_verify_stats(void)
{
    result r;
    run(&r, "layer", "--weights", path_of("f32.safetensors"), "--block", "3", "-x", path_of(XFILE),
        "--grid", GRID, "--heads", "4", "--threads", "1", "--verify", "--stats", NULL);
    CHECK(r.code == 0, "--verify --stats: exit %d: %s", r.code, r.err);
    double rel = -1, tol = -1;
    const char *p = strstr(r.out, "\"max_rel_err\": ");
    const char *q = strstr(r.out, "\"tolerance\": ");
    if (p && q) {
        rel = strtod(p + 15, NULL);
        tol = strtod(q + 13, NULL);
    }
    CHECK(rel >= 0 && rel <= tol && tol < 1e-5, "--verify: rel %g, tolerance %g in %s", rel, tol,
          r.out);
    const char *keys[] = {"\"qkv_seconds\"",
                          "\"attention_seconds\"",
                          "\"out_seconds\"",
                          "\"fallback_rows\"",
                          "\"gflops\"",
                          "\"tokens\": 24",
                          "\"attention_compute\": \"fp32\""}; /* f32 layer: fp32 */
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        CHECK(strstr(r.out, keys[i]) != NULL, "--stats lacks %s: %s", keys[i], r.out);
    /* An fp32 layer's projections run an fp32 GEMM. */
    const char *gemms[] = {"\"qkv_gemm\": \"", "\"out_gemm\": \""};
    for (int g = 0; g < 2; g++) {
        const char *at = strstr(r.out, gemms[g]);
        const char *name = at ? at + strlen(gemms[g]) : "";
        CHECK(strncmp(name, "openblas\"", 9) == 0 || strncmp(name, "onednn_f32\"", 11) == 0,
              "--stats: %s names no fp32 GEMM: %s", gemms[g], r.out);
    }
    CHECK(r.out[0] == '{' && strchr(r.out, '\n') == strrchr(r.out, '\n'), "--stats: one line");
    run(&r, "layer", "--grid", "2,2,3", "--heads", "3", "--dim", "32", "--seed", "5", "--verify",
        "--fp8", "--threads", "1", NULL);
    CHECK(r.code == 0 && strstr(r.out, "verify: 12 tokens"), "synthetic --verify: %d %s %s", r.code,
          r.out, r.err);
}

/* The bf16 layer: a BF16 checkpoint (its bits used as they are) and an F32
 * one (weights rounded once at load; biases and gammas stay fp32), x rounded
 * to bf16, within the bf16 envelope and visibly not the fp32 layer; the
 * synthetic layer's --verify and --stats report dtype and the bf16 twin. */
static void test_bf16(void)
{
    static layer L, B16;
    static operands op;
    static uint16_t w16[4][H * H], b16[4][H], g16[2][H];
    make_layer(&L, 11); /* the layer of test_float_checkpoints' files */
    B16 = L;
    round_bf16(&B16, w16, b16, g16);
    for (int i = 0; i < S * H; i++)
        B16.x[i] = fxa_bf16_to_f32(fxa_f32_to_bf16(L.x[i]));
    result r;
    double ratio = 0.0;
    operands_from(&B16, &op);
    if (run_ok("bf16 layer, BF16 checkpoint", &r, "bf16.safetensors", XFILE, "--dtype", "bf16")) {
        CHECK(within_envelope_of("bf16 layer, BF16 checkpoint", YFILE, &op, 1, &ratio),
              "bf16 layer (BF16 checkpoint) outside the bf16 envelope");
        /* fp32 storage would be ~1e-7 of max|y|, far below 2^-4 of this tolerance. */
        CHECK(ratio > 0x1p-4, "the bf16 layer's error is only %.3g of its tolerance: fp32 ran?",
              ratio);
    }
    layer F = L;
    for (int m = 0; m < 4; m++)
        for (int i = 0; i < H * H; i++)
            F.w[m][i] = B16.w[m][i];
    memcpy(F.x, B16.x, sizeof F.x);
    operands_from(&F, &op);
    if (run_ok("bf16 layer, F32 checkpoint", &r, "f32.safetensors", XFILE, "--dtype", "bf16"))
        CHECK(within_envelope_of("bf16 layer, F32 checkpoint", YFILE, &op, 1, NULL),
              "bf16 layer (F32 checkpoint rounded at load) outside the bf16 envelope");
    run(&r, "layer", "--grid", "2,2,3", "--heads", "3", "--dim", "32", "--seed", "5", "--verify",
        "--stats", "--dtype", "bf16", "--threads", "1", NULL);
    double rel = -1, tol = -1, twin = -1;
    const char *p = strstr(r.out, "\"max_rel_err\": ");
    const char *q = strstr(r.out, "\"tolerance\": ");
    const char *t = strstr(r.out, "\"bf16_rel_err\": ");
    if (p && q && t) {
        rel = strtod(p + 15, NULL);
        tol = strtod(q + 13, NULL);
        twin = strtod(t + 16, NULL);
    }
    CHECK(r.code == 0 && strstr(r.out, "\"dtype\": \"bf16\"") && rel >= 0 && rel <= tol &&
              twin > 0 && tol <= 0x1p-5,
          "synthetic bf16 --verify --stats: exit %d, rel %g, twin %g, tolerance %g: %s %s", r.code,
          rel, twin, tol, r.out, r.err);
    run(&r, "layer", "--grid", "2,2,3", "--heads", "3", "--dim", "32", "--verify", "--fp8",
        "--dtype", "bf16", "--threads", "1", NULL);
    CHECK(r.code == 0 && strstr(r.out, "plain bf16"), "--fp8 --dtype bf16 --verify: %d %s %s",
          r.code, r.out, r.err);
}

/* One bad run of `fxattn layer ARGS`: exit 2, an error line naming
 * `word`, y.npy neither created nor changed. */
static void expect_error(const char *label, const char *word, const char *first, ...)
{
    const char *args[MAX_ARGS + 1] = {"layer"};
    va_list ap;
    va_start(ap, first);
    collect(args, 1, first, ap);
    va_end(ap);
    for (int stale = 0; stale < 2; stale++) {
        remove(path_of(YFILE));
        if (stale)
            write_file(YFILE, "stale", 5);
        result r;
        run_v(&r, args);
        CHECK(r.code == 2, "[%s] exit %d, expected 2; stderr: %s", label, r.code, r.err);
        CHECK(strncmp(r.err, "fxattn: error: ", 15) == 0 && strstr(r.err, word) &&
                  strchr(r.err, '\n') == strrchr(r.err, '\n'),
              "[%s] expected one error line mentioning '%s', got: %s", label, word, r.err);
        char buf[16];
        slurp(YFILE, buf, sizeof buf);
        CHECK(stale ? strcmp(buf, "stale") == 0 : !exists(YFILE), "[%s] the output was %s", label,
              stale ? "changed" : "created");
    }
}

/* Hostile finite weights: q and k weights and biases scaled by 2^66 (~7e19): every
 * projected value is finite but its square is not, and RMSNorm is scale
 * invariant, so y must be the unscaled layer's (eps = 1e-6 against a mean
 * square ~1 moves it by ~1e-6 of max|y|: 2^-16 is the bound), with and
 * without --verify (whose plain-fp32 twin overflows here). */
static void test_scaled_qk(void)
{
    static layer L, B;
    static operands op;
    static st_tensor t[12];
    static double y64[S * H];
    make_layer(&L, 11);
    B = L;
    for (int m = 0; m < 2; m++) {
        for (int i = 0; i < H * H; i++)
            B.w[m][i] = ldexpf(L.w[m][i], 66);
        for (int i = 0; i < H; i++)
            B.b[m][i] = ldexpf(L.b[m][i], 66);
    }
    write_npy(XFILE, "<f4", 2, (const int64_t[]){S, H}, L.x, sizeof L.x);
    write_safetensors("scaled.safetensors", t, f32_tensors(&B, t, NULL));
    operands_from(&L, &op);
    reference(&op, 0, y64);
    for (int verify = 0; verify < 2; verify++) {
        result r;
        const char *label = verify ? "q/k scaled by 2^66, --verify" : "q/k scaled by 2^66";
        if (!run_ok(label, &r, "scaled.safetensors", XFILE, verify ? "--verify" : NULL, NULL))
            continue;
        char err[600];
        fxa_npy a;
        if (fxa_npy_read(path_of(YFILE), &a, err, sizeof err) != FXA_OK) {
            CHECK(0, "[%s] cannot read y: %s", label, err);
            continue;
        }
        double ymax = 0.0, e = 0.0;
        const int whole = a.count == S * H;
        for (int i = 0; i < S * H && whole; i++) {
            const double yi = ((const float *)a.data)[i];
            ymax = fmax(ymax, fabs(y64[i]));
            e = isfinite(yi) ? fmax(e, fabs(yi - y64[i])) : INFINITY;
        }
        fxa_npy_free(&a);
        printf("  %-34s error %.3g of max|y| against the unscaled layer\n", label, e / ymax);
        CHECK(whole && e <= 0x1p-16 * ymax,
              "[%s] y is %.3g of max|y| away from the unscaled layer's", label, e / ymax);
    }
}

static void test_errors(void)
{
    static layer L;
    static st_tensor t[16];
    static int32_t ints[H * H];
    make_layer(&L, 11);
    int n = f32_tensors(&L, t, "norm_k.weight");
    write_safetensors("missing.safetensors", t, n);
    n = f32_tensors(&L, t, NULL);
    find(t, n, "k.weight")->shape[0] = H / 2;
    find(t, n, "k.weight")->nbytes /= 2;
    write_safetensors("shape.safetensors", t, n);
    n = f32_tensors(&L, t, NULL);
    find(t, n, "q.weight")->dtype = "I32";
    find(t, n, "q.weight")->data = ints;
    write_safetensors("dtype.safetensors", t, n);

    static layer N;
    N = L;
    N.w[0][3 * H + 4] = NAN;
    write_safetensors("nan_q.safetensors", t, f32_tensors(&N, t, NULL));
    N = L;
    N.b[2][2] = -INFINITY;
    write_safetensors("inf_vbias.safetensors", t, f32_tensors(&N, t, NULL));

    const char *y = path_of(YFILE), *x = path_of(XFILE);
#define FILE_ARGS(w) "--weights", path_of(w), "--block", "3", "-x", x, "--heads", "4", "-o", y
    expect_error("missing tensor", "blocks.3.self_attn.norm_k.weight",
                 FILE_ARGS("missing.safetensors"), "--grid", GRID, NULL);
    expect_error("wrong shape", "shape", FILE_ARGS("shape.safetensors"), "--grid", GRID, NULL);
    expect_error("bad dtype", "I32", FILE_ARGS("dtype.safetensors"), "--grid", GRID, NULL);
    expect_error("FP8 without scale", "scale", FILE_ARGS("fp8_noscale.safetensors"), "--grid", GRID,
                 NULL);
    expect_error("FP8 mixed with F32", "all F8_E4M3 or none", FILE_ARGS("fp8_mixed.safetensors"),
                 "--grid", GRID, NULL);
    /* Non-finite values named as stored, before the RoPE permutation and
     * the [Q|K|V] fusion. */
    expect_error("NaN in q.weight",
                 "'blocks.3.self_attn.q.weight' has a non-finite value (nan) at [3, 4]",
                 FILE_ARGS("nan_q.safetensors"), "--grid", GRID, NULL);
    expect_error("-Inf in v.bias",
                 "'blocks.3.self_attn.v.bias' has a non-finite value (-inf) at [2]",
                 FILE_ARGS("inf_vbias.safetensors"), "--grid", GRID, NULL);
    expect_error("S != F*H*W", "tokens", FILE_ARGS("f32.safetensors"), "--grid", "2,3,5", NULL);
    expect_error("no --grid with -x", "--grid", FILE_ARGS("f32.safetensors"), NULL);
    expect_error("wrong block", "blocks.4.self_attn.q.weight", "--weights",
                 path_of("f32.safetensors"), "--block", "4", "-o", y, NULL);
    expect_error("heads do not divide hidden", "divide", FILE_ARGS("f32.safetensors"), "--grid",
                 GRID, "--heads", "5", NULL);
    expect_error("--dim disagrees", "--dim", FILE_ARGS("f32.safetensors"), "--grid", GRID, "--dim",
                 "32", NULL);
    expect_error("bad --rope-layout", "--rope-layout", FILE_ARGS("f32.safetensors"), "--grid", GRID,
                 "--rope-layout", "pairs", NULL);
    expect_error("bad --grid", "--grid", "--grid", "2,3", "-o", y, NULL);
    expect_error("bad --dtype", "--dtype", FILE_ARGS("f32.safetensors"), "--grid", GRID, "--dtype",
                 "f16", NULL);
    expect_error("missing x", "nothere.npy", "-x", path_of("nothere.npy"), "--grid", GRID, "-o", y,
                 NULL);
#undef FILE_ARGS
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_layer /path/to/fxattn\n");
        return 2;
    }
    g_tool = argv[1];
    snprintf(g_dir, sizeof g_dir, "/tmp/test_layer.XXXXXX");
    if (!mkdtemp(g_dir))
        die("mkdtemp");
    test_float_checkpoints();
    test_fp8();
    test_rope_layouts();
    test_verify_stats();
    test_bf16();
    test_scaled_qk();
    test_errors();
    const int status = test_summary("test_layer");
    for (int i = 0; i < g_npaths; i++)
        free(g_paths[i]);
    if (status == 0)
        nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    else
        fprintf(stderr, "test_layer: files kept in %s\n", g_dir);
    return status;
}
