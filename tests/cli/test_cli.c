/*
 * End-to-end tests of the fxattn command line (README.md, "Command line").
 *
 *   test_cli /path/to/fxattn
 *
 * Works in a fresh folder made with mkdtemp under /tmp (in/ for inputs, out/
 * for outputs, cap/ for the captured stdout and stderr), runs the binary with
 * posix_spawn (no shell) and checks:
 *  A. good runs: values against the fp64 reference, shapes, the --stats and
 *     `check --json` objects, layouts, modes, dtypes, .npy versions, and that
 *     a successful run replaces an existing output;
 *  B. bad input and bad usage: exit status 2, an "fxattn: error: " line on
 *     stderr, and the output folder exactly as before the run (nothing new,
 *     old files unchanged byte for byte, no "*.tmp.*" leftovers), each case
 *     with and without old output files in place;
 *  C. output failures (missing folder, /dev/full): non-zero exit, the error
 *     line, nothing left behind, and /dev/full still a character device.
 *     The /dev/full case runs in a private mount namespace with its own
 *     /dev/full when it can (so a tool that renames a file onto /dev/full
 *     cannot damage the machine), else on the real /dev/full when this user
 *     cannot create files in /dev, else on a copy of the device node in the
 *     temporary folder.
 * The temporary folder is removed at the end unless a check failed.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cmd_opts.h"
#include "fp64_attn.h"
#include "fxattn.h"
#include "fxattn_npy.h"
#include "testutil.h"

extern char **environ;

#define MAX_ARGS 48
#define TOOL_TIMEOUT_S 60.0
#define REF_TOL 1e-5
#define ERR_PREFIX "fxattn: error: "

/* The problem: Q [1,37,4,16], K/V [1,53,2,16] (GQA, 2 q heads per kv head). */
enum { PB = 1, PSQ = 37, PHQ = 4, PSKV = 53, PHKV = 2, PD = 16 };
#define NQ ((size_t)PB * PSQ * PHQ * PD)
#define NKV ((size_t)PB * PSKV * PHKV * PD)

static const char *g_tool;
static char g_root[64];
static char *g_in_dir;
static char *g_out_dir;
static char *g_cap_dir;
static char *g_out; /* out/out.npy */
static char *g_lse; /* out/lse.npy */
static char *g_stdin_path;
static char *g_stdout_path;
static char *g_stderr_path;

/* Bytes of the outputs of the first good run (A1): what later runs on the
 * same inputs must reproduce. */
static unsigned char *g_run_out;
static size_t g_run_out_len;
static unsigned char *g_run_lse;
static size_t g_run_lse_len;
/* Bytes of a good run on other inputs (A1b): the "old files" put in place
 * before the failure cases, which must survive them unchanged. */
static unsigned char *g_old_out;
static size_t g_old_out_len;
static unsigned char *g_old_lse;
static size_t g_old_lse_len;

static float g_q[NQ], g_k[NKV], g_v[NKV];

/* ------------------------------------------------------------------------ */
/* Small utilities                                                           */
/* ------------------------------------------------------------------------ */

static char *g_paths[1024];
static int g_npaths;

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *fmt, ...)
{
    va_list ap;
    fputs("test_cli: setup failed: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\ntest_cli: temporary folder kept: %s\n", g_root);
    exit(1);
}

/* dir + "/" + name, owned by a pool freed at the end. */
static const char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p || g_npaths == (int)(sizeof g_paths / sizeof g_paths[0]))
        die("out of memory for paths");
    snprintf(p, n, "%s/%s", dir, name);
    g_paths[g_npaths++] = p;
    return p;
}

static const char *IN(const char *name)
{
    return join(g_in_dir, name);
}

static char *xjoin(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p)
        die("out of memory");
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        die("cannot create %s: %s", path, strerror(errno));
    if ((n && fwrite(data, 1, n, f) != n) || fclose(f) != 0)
        die("cannot write %s", path);
}

/* Whole file, NUL-terminated; NULL (and *len 0) when it cannot be read. */
static unsigned char *read_bytes(const char *path, size_t *len)
{
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096;
    size_t n = 0;
    unsigned char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        cap *= 2;
        unsigned char *nb = realloc(buf, cap + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
        }
        buf = nb;
    }
    fclose(f);
    if (!buf)
        die("out of memory reading %s", path);
    buf[n] = 0;
    *len = n;
    return buf;
}

static int file_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path) == 0 ? 0 : -1;
}

static int rm_tree(const char *path)
{
    return nftw(path, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Remove everything inside dir (dir itself stays). */
static void clear_dir(const char *dir)
{
    DIR *dp = opendir(dir);
    struct dirent *e;
    if (!dp)
        die("cannot open %s: %s", dir, strerror(errno));
    while ((e = readdir(dp)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char *p = xjoin(dir, e->d_name);
        if (rm_tree(p) != 0)
            die("cannot remove %s", p);
        free(p);
    }
    closedir(dp);
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

/* Some line of text starts with the CLI's error prefix. */
static int has_error_line(const char *text)
{
    for (const char *line = text; line && *line;) {
        if (starts_with(line, ERR_PREFIX))
            return 1;
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    return 0;
}

static int is_word_char(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

/* word occurs in text not glued to other letters/digits (options such as
 * "--threads" are matched as substrings). */
static int mentions(const char *text, const char *word)
{
    const size_t n = strlen(word);
    if (!is_word_char((unsigned char)word[0]))
        return strstr(text, word) != NULL;
    for (const char *p = strstr(text, word); p; p = strstr(p + 1, word)) {
        const int before = p > text ? (unsigned char)p[-1] : ' ';
        const int after = (unsigned char)p[n];
        if (!is_word_char(before) && !is_word_char(after))
            return 1;
    }
    return 0;
}

static void format_shape(const int64_t *shape, int ndim, char *buf, size_t cap)
{
    size_t len = 0;
    len += (size_t)snprintf(buf, cap, "(");
    for (int i = 0; i < ndim && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (ndim == 1 && len < cap)
        len += (size_t)snprintf(buf + len, cap - len, ",");
    if (len < cap)
        snprintf(buf + len, cap - len, ")");
}

/* ------------------------------------------------------------------------ */
/* .npy files                                                                */
/* ------------------------------------------------------------------------ */

/* A .npy file written by hand: any descr, order and version; data_bytes of
 * data may disagree with the shape on purpose. */
static void write_npy(const char *path, int version, const char *descr, int fortran, int ndim,
                      const int64_t *shape, const void *data, size_t data_bytes)
{
    char shape_text[256];
    char dict[512];
    unsigned char *buf;
    format_shape(shape, ndim, shape_text, sizeof shape_text);
    const int dict_len =
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr,
                 fortran ? "True" : "False", shape_text);
    const size_t pre = version == 1 ? 10 : 12;
    const size_t total = (pre + (size_t)dict_len + 1 + 63) / 64 * 64;
    const size_t header_len = total - pre;
    buf = malloc(total + data_bytes);
    if (!buf)
        die("out of memory");
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)version;
    buf[7] = 0;
    if (version == 1) {
        buf[8] = (unsigned char)(header_len & 0xff);
        buf[9] = (unsigned char)(header_len >> 8);
    } else {
        for (int i = 0; i < 4; i++)
            buf[8 + i] = (unsigned char)((header_len >> (8 * i)) & 0xff);
    }
    memcpy(buf + pre, dict, (size_t)dict_len);
    memset(buf + pre + (size_t)dict_len, ' ', total - 1 - pre - (size_t)dict_len);
    buf[total - 1] = '\n';
    if (data_bytes)
        memcpy(buf + total, data, data_bytes);
    write_bytes(path, buf, total + data_bytes);
    free(buf);
}

/* A valid '<f4' file through the tools' own atomic writer. */
static void write_f32(const char *path, int ndim, const int64_t *shape, const float *data)
{
    fxa_staged st;
    char err[600];
    if (fxa_npy_stage_f32(path, ndim, shape, data, &st, err, sizeof err) != FXA_OK ||
        fxa_staged_commit(&st, err, sizeof err) != FXA_OK)
        die("%s", err);
}

static void write_f16(const char *path, int ndim, const int64_t *shape, const uint16_t *data,
                      size_t n)
{
    write_npy(path, 1, "<f2", 0, ndim, shape, data, n * sizeof(uint16_t));
}

/* ------------------------------------------------------------------------ */
/* Running the tool                                                          */
/* ------------------------------------------------------------------------ */

typedef struct run_result {
    int code;      /* exit status; -1 when killed */
    int sig;       /* signal that killed it, or 0 */
    int timed_out; /* killed after TOOL_TIMEOUT_S */
    char *out;     /* captured stdout, NUL-terminated */
    char *err;     /* captured stderr */
} run_result;

static void run_free(run_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* "fxattn attn -q $T/in/q.npy ...", with the temporary folder shown as $T. */
static void format_cmd(const char *const *args, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "fxattn");
    const size_t root_len = strlen(g_root);
    for (int i = 0; args[i] && len < cap; i++) {
        const char *a = args[i];
        const int quote = a[0] == 0 || strpbrk(a, " \t'\"") != NULL;
        if (strncmp(a, g_root, root_len) == 0)
            len +=
                (size_t)snprintf(buf + len, cap - len, " %s$T%s", quote ? "'" : "", a + root_len);
        else
            len += (size_t)snprintf(buf + len, cap - len, " %s%s", quote ? "'" : "", a);
        if (quote && len < cap)
            len += (size_t)snprintf(buf + len, cap - len, "'");
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Run g_tool with args (NULL-terminated, argv[0] excluded); stdin is an
 * empty file, stdout and stderr go to files in cap/. */
static void run_tool(const char *const *args, run_result *r)
{
    char *argv[MAX_ARGS + 2];
    int n = 0;
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int status = 0;
    memset(r, 0, sizeof *r);
    argv[n++] = (char *)g_tool;
    while (args[n - 1]) {
        if (n > MAX_ARGS)
            die("too many arguments");
        argv[n] = (char *)args[n - 1];
        n++;
    }
    argv[n] = NULL;
    if (posix_spawn_file_actions_init(&fa) ||
        posix_spawn_file_actions_addopen(&fa, 0, g_stdin_path, O_RDONLY, 0) ||
        posix_spawn_file_actions_addopen(&fa, 1, g_stdout_path, O_WRONLY | O_CREAT | O_TRUNC,
                                         0644) ||
        posix_spawn_file_actions_addopen(&fa, 2, g_stderr_path, O_WRONLY | O_CREAT | O_TRUNC, 0644))
        die("posix_spawn_file_actions");
    fflush(stdout);
    fflush(stderr);
    int e = posix_spawn(&pid, g_tool, &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (e != 0)
        die("cannot run %s: %s", g_tool, strerror(e));
    const double t0 = now_s();
    for (;;) {
        pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            break;
        if (w < 0 && errno != EINTR)
            die("waitpid: %s", strerror(errno));
        if (now_s() - t0 > TOOL_TIMEOUT_S) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            r->timed_out = 1;
            break;
        }
        const struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    if (WIFEXITED(status) && !r->timed_out) {
        r->code = WEXITSTATUS(status);
    } else {
        r->code = -1;
        r->sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
    size_t len;
    r->out = (char *)read_bytes(g_stdout_path, &len);
    r->err = (char *)read_bytes(g_stderr_path, &len);
    if (!r->out || !r->err)
        die("cannot read the captured output");
}

static const char *describe_exit(const run_result *r, char *buf, size_t cap)
{
    if (r->timed_out)
        snprintf(buf, cap, "a hang (killed after %.0f s)", TOOL_TIMEOUT_S);
    else if (r->sig)
        snprintf(buf, cap, "death by signal %d (%s)", r->sig, strsignal(r->sig));
    else
        snprintf(buf, cap, "exit %d", r->code);
    return buf;
}

/* Collect a NULL-terminated vararg list of strings into args. */
static void collect_args(const char **args, const char *first, va_list ap)
{
    int n = 0;
    for (const char *a = first; a; a = va_arg(ap, const char *)) {
        if (n == MAX_ARGS)
            die("too many arguments");
        args[n++] = a;
    }
    args[n] = NULL;
}

/* Run; check exit 0 with no error line. Returns 1 on success. */
static int run_ok(const char *label, run_result *r, const char *first, ...)
{
    const char *args[MAX_ARGS + 1];
    char cmd[4096];
    char how[128];
    va_list ap;
    va_start(ap, first);
    collect_args(args, first, ap);
    va_end(ap);
    format_cmd(args, cmd, sizeof cmd);
    run_tool(args, r);
    const int ok = r->code == 0;
    CHECK(ok, "[%s] %s\n    expected exit 0, got %s\n    stderr: %s", label, cmd,
          describe_exit(r, how, sizeof how), r->err);
    if (ok)
        CHECK(!has_error_line(r->err), "[%s] %s\n    exit 0 but stderr has an error line: %s",
              label, cmd, r->err);
    return ok;
}

/* ------------------------------------------------------------------------ */
/* A small JSON checker: the text is exactly one object (plus a newline)      */
/* ------------------------------------------------------------------------ */

typedef struct jp {
    const char *s;
    int depth;
} jp;

static void jp_ws(jp *p)
{
    while (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')
        p->s++;
}

static int jp_value(jp *p);

static int jp_string(jp *p)
{
    if (*p->s != '"')
        return 0;
    p->s++;
    while (*p->s && *p->s != '"') {
        if ((unsigned char)*p->s < 0x20)
            return 0;
        if (*p->s == '\\') {
            p->s++;
            if (!*p->s)
                return 0;
        }
        p->s++;
    }
    if (*p->s != '"')
        return 0;
    p->s++;
    return 1;
}

static int jp_number(jp *p)
{
    const char *s = p->s;
    if (*s == '-')
        s++;
    if (*s == '0')
        s++;
    else if (*s >= '1' && *s <= '9')
        while (*s >= '0' && *s <= '9')
            s++;
    else
        return 0;
    if (*s == '.') {
        s++;
        if (!(*s >= '0' && *s <= '9'))
            return 0;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!(*s >= '0' && *s <= '9'))
            return 0;
        while (*s >= '0' && *s <= '9')
            s++;
    }
    p->s = s;
    return 1;
}

static int jp_container(jp *p, char open, char close)
{
    if (*p->s != open || ++p->depth > 64)
        return 0;
    p->s++;
    jp_ws(p);
    if (*p->s == close) {
        p->s++;
        p->depth--;
        return 1;
    }
    for (;;) {
        jp_ws(p);
        if (open == '{') {
            if (!jp_string(p))
                return 0;
            jp_ws(p);
            if (*p->s != ':')
                return 0;
            p->s++;
            jp_ws(p);
        }
        if (!jp_value(p))
            return 0;
        jp_ws(p);
        if (*p->s == ',') {
            p->s++;
            continue;
        }
        if (*p->s != close)
            return 0;
        p->s++;
        p->depth--;
        return 1;
    }
}

static int jp_value(jp *p)
{
    switch (*p->s) {
    case '{': return jp_container(p, '{', '}');
    case '[': return jp_container(p, '[', ']');
    case '"': return jp_string(p);
    case 't': return strncmp(p->s, "true", 4) == 0 ? (p->s += 4, 1) : 0;
    case 'f': return strncmp(p->s, "false", 5) == 0 ? (p->s += 5, 1) : 0;
    case 'n': return strncmp(p->s, "null", 4) == 0 ? (p->s += 4, 1) : 0;
    default: return jp_number(p);
    }
}

/* text is one JSON object on one line, ending with a newline. On failure
 * *where is the offset of the first offending character. */
static int json_one_object_line(const char *text, size_t *where)
{
    jp p = {text, 0};
    *where = 0;
    if (text[0] != '{')
        return 0;
    const int ok = jp_value(&p);
    *where = (size_t)(p.s - text);
    return ok && p.s[0] == '\n' && p.s[1] == 0;
}

/* Value text right after "key": (spaces skipped), or NULL. */
static const char *json_field(const char *text, const char *key)
{
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    for (const char *p = strstr(text, pat); p; p = strstr(p + 1, pat)) {
        const char *s = p + strlen(pat);
        while (*s == ' ')
            s++;
        if (*s != ':')
            continue;
        s++;
        while (*s == ' ')
            s++;
        return s;
    }
    return NULL;
}

static int json_number_is(const char *text, const char *key, double want)
{
    const char *s = json_field(text, key);
    char *end;
    if (!s)
        return 0;
    double v = strtod(s, &end);
    return end != s && v == want;
}

static int json_is_number(const char *text, const char *key)
{
    const char *s = json_field(text, key);
    jp p = {s, 0};
    return s && jp_number(&p) && (*p.s == ',' || *p.s == '}' || *p.s == ' ');
}

static int json_string_is(const char *text, const char *key, const char *want)
{
    const char *s = json_field(text, key);
    const size_t n = strlen(want);
    return s && s[0] == '"' && strncmp(s + 1, want, n) == 0 && s[n + 1] == '"';
}

/* ------------------------------------------------------------------------ */
/* Results against the fp64 reference                                        */
/* ------------------------------------------------------------------------ */

static void desc_for(fxa_attn_desc *d, fxa_layout layout)
{
    fxa_attn_desc_init(d);
    d->batch = PB;
    d->heads_q = PHQ;
    d->heads_kv = PHKV;
    d->seq_q = PSQ;
    d->seq_kv = PSKV;
    d->head_dim = PD;
    d->layout = layout;
    d->scale = 0.0; /* 1/sqrt(D) */
}

/* Read an output and check its dtype and shape; 1 when it matches. */
static int read_output(const char *label, const char *path, int ndim, const int64_t *shape,
                       fxa_npy *a)
{
    char err[600];
    char got[256];
    char want[256];
    fxa_status st = fxa_npy_read(path, a, err, sizeof err);
    CHECK(st == FXA_OK, "[%s] cannot read the output %s: %s", label, path, err);
    if (st != FXA_OK)
        return 0;
    int same = a->dtype == FXA_F32 && a->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = a->shape[i] == shape[i];
    format_shape(a->shape, a->ndim, got, sizeof got);
    format_shape(shape, ndim, want, sizeof want);
    CHECK(same, "[%s] %s has shape %s dtype %s, expected %s <f4", label, path, got,
          a->dtype == FXA_F32 ? "<f4" : "<f2", want);
    if (!same)
        fxa_npy_free(a);
    return same;
}

/* out (and lse when lse_path) against the fp64 reference of q, k, v (the
 * fp32 values the kernels saw), within REF_TOL absolute. */
static void check_ref(const char *label, const fxa_attn_desc *d, const float *q, const float *k,
                      const float *v, const char *out_path, const char *lse_path)
{
    const int bshd = d->layout == FXA_LAYOUT_BSHD;
    const int64_t oshape[4] = {d->batch, bshd ? d->seq_q : d->heads_q, bshd ? d->heads_q : d->seq_q,
                               d->head_dim};
    const int64_t lshape[3] = {d->batch, d->heads_q, d->seq_q};
    fxa_npy o = {0};
    fxa_npy l = {0};
    double ref[FXA_MAX_HEAD_DIM];
    double ref_lse;
    double max_out = 0.0;
    double max_lse = 0.0;
    if (!read_output(label, out_path, 4, oshape, &o))
        return;
    const int have_lse = lse_path && read_output(label, lse_path, 3, lshape, &l);
    const float *out = o.data;
    const float *lse = l.data;
    for (int64_t b = 0; b < d->batch; b++)
        for (int64_t h = 0; h < d->heads_q; h++)
            for (int64_t i = 0; i < d->seq_q; i++) {
                fxt_fp64_attn_row(d, q, k, v, b, h, i, ref, &ref_lse);
                const int64_t off = fxt_row_offset(d, d->heads_q, d->seq_q, b, h, i);
                for (int64_t c = 0; c < d->head_dim; c++) {
                    const double e = fabs((double)out[off + c] - ref[c]);
                    if (!(e <= max_out))
                        max_out = e; /* NaN sticks */
                }
                if (have_lse) {
                    const int64_t li = (b * d->heads_q + h) * d->seq_q + i;
                    const double e = fabs((double)lse[li] - ref_lse);
                    if (!(e <= max_lse))
                        max_lse = e;
                }
            }
    CHECK(max_out <= REF_TOL, "[%s] max |out - fp64 reference| = %.3g, above %.0e", label, max_out,
          REF_TOL);
    if (have_lse)
        CHECK(max_lse <= REF_TOL, "[%s] max |lse - fp64 reference| = %.3g, above %.0e", label,
              max_lse, REF_TOL);
    fxa_npy_free(&o);
    fxa_npy_free(&l);
}

/* The --stats line: one JSON object with every key CLI.md promises. */
static void check_stats(const char *label, const char *out, const char *mode, const char *center,
                        double fallback_rows)
{
    size_t where;
    static const char *const numeric[] = {"rows", "fallback_rows", "C",       "gate",
                                          "vmax", "max_bound",     "seconds", "gflops"};
    CHECK(json_one_object_line(out, &where),
          "[%s] --stats: stdout is not exactly one JSON object on one line (problem at offset "
          "%zu): %s",
          label, where, out);
    for (size_t i = 0; i < sizeof numeric / sizeof numeric[0]; i++)
        CHECK(json_is_number(out, numeric[i]), "[%s] --stats: no numeric \"%s\" in %s", label,
              numeric[i], out);
    CHECK(json_number_is(out, "rows", (double)(PB * PHQ * PSQ)),
          "[%s] --stats: \"rows\" is not %d: %s", label, PB * PHQ * PSQ, out);
    CHECK(strstr(out, "\"rows\": 148") != NULL, "[%s] --stats: no \"rows\": 148 in %s", label, out);
    CHECK(json_string_is(out, "mode", mode), "[%s] --stats: \"mode\" is not \"%s\": %s", label,
          mode, out);
    CHECK(json_string_is(out, "center", center), "[%s] --stats: \"center\" is not \"%s\": %s",
          label, center, out);
    if (fallback_rows >= 0)
        CHECK(json_number_is(out, "fallback_rows", fallback_rows),
              "[%s] --stats: \"fallback_rows\" is not %.0f: %s", label, fallback_rows, out);
}

/* No "*.tmp.*" entry in dir. */
static void check_no_tmp(const char *label, const char *dir)
{
    DIR *dp = opendir(dir);
    struct dirent *e;
    CHECK(dp != NULL, "[%s] cannot list %s", label, dir);
    if (!dp)
        return;
    while ((e = readdir(dp)) != NULL)
        CHECK(strstr(e->d_name, ".tmp.") == NULL, "[%s] temporary file left behind: %s/%s", label,
              dir, e->d_name);
    closedir(dp);
}

/* ------------------------------------------------------------------------ */
/* A. Good runs                                                              */
/* ------------------------------------------------------------------------ */

static void transpose_bshd_to_bhsd(const float *src, float *dst, int64_t b_, int64_t s_, int64_t h_,
                                   int64_t d_)
{
    for (int64_t b = 0; b < b_; b++)
        for (int64_t s = 0; s < s_; s++)
            for (int64_t h = 0; h < h_; h++)
                for (int64_t c = 0; c < d_; c++)
                    dst[((b * h_ + h) * s_ + s) * d_ + c] = src[((b * s_ + s) * h_ + h) * d_ + c];
}

static void round_through(const float *src, float *dst, size_t n, fxa_dtype t)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = t == FXA_F16 ? fxa_f16_to_f32(fxa_f32_to_f16(src[i]))
                              : fxa_bf16_to_f32(fxa_f32_to_bf16(src[i]));
}

static void test_good_runs(void)
{
    const char *q = IN("q.npy");
    const char *k = IN("k.npy");
    const char *v = IN("v.npy");
    fxa_attn_desc d;
    run_result r;
    desc_for(&d, FXA_LAYOUT_BSHD);

    /* A1: the main run, GQA, with --lse --stats --threads 2. */
    clear_dir(g_out_dir);
    if (run_ok("A1 attn --lse --stats", &r, "attn", "-q", q, "-k", k, "-v", v, "-o", g_out, "--lse",
               g_lse, "--stats", "--threads", "2", (const char *)NULL)) {
        check_ref("A1 attn --lse --stats", &d, g_q, g_k, g_v, g_out, g_lse);
        check_stats("A1 attn --lse --stats", r.out, "auto", "on", -1);
        check_no_tmp("A1", g_out_dir);
        g_run_out = read_bytes(g_out, &g_run_out_len);
        g_run_lse = read_bytes(g_lse, &g_run_lse_len);
    }
    run_free(&r);

    /* A1b: a good run on (Q, K/2, V): its files are the "old output files"
     * of the failure cases, different from what any run on (Q, K, V) makes. */
    {
        static float k_half[NKV];
        const int64_t ks[4] = {PB, PSKV, PHKV, PD};
        const char *o = join(g_out_dir, "out_old.npy");
        const char *l = join(g_out_dir, "lse_old.npy");
        for (size_t i = 0; i < NKV; i++)
            k_half[i] = 0.5f * g_k[i];
        write_f32(IN("k_half.npy"), 4, ks, k_half);
        if (run_ok("A1b attn on K/2", &r, "attn", "-q", q, "-k", IN("k_half.npy"), "-v", v, "-o", o,
                   "--lse", l, (const char *)NULL)) {
            check_ref("A1b attn on K/2", &d, g_q, k_half, g_v, o, l);
            g_old_out = read_bytes(o, &g_old_out_len);
            g_old_lse = read_bytes(l, &g_old_lse_len);
        }
        run_free(&r);
    }
    CHECK(!g_old_out || !g_run_out || g_old_out_len != g_run_out_len ||
              memcmp(g_old_out, g_run_out, g_run_out_len) != 0,
          "[A1b attn on K/2] gives the same output file as A1: the old-file checks would be "
          "blind");
    if (!g_old_out || !g_old_lse) { /* stand-ins for the failure cases */
        static const char old[] = "old output file\n";
        free(g_old_out);
        free(g_old_lse);
        g_old_out = (unsigned char *)strdup(old);
        g_old_lse = (unsigned char *)strdup(old);
        if (!g_old_out || !g_old_lse)
            die("out of memory");
        g_old_out_len = g_old_lse_len = strlen(old);
    }

    /* A2: --layout bhsd on transposed files: the transposed output, bit for bit. */
    {
        static float qt[NQ], kt[NKV], vt[NKV];
        const int64_t qs[4] = {PB, PHQ, PSQ, PD};
        const int64_t ks[4] = {PB, PHKV, PSKV, PD};
        const char *out_b = join(g_out_dir, "out_bhsd.npy");
        const char *lse_b = join(g_out_dir, "lse_bhsd.npy");
        fxa_attn_desc db;
        desc_for(&db, FXA_LAYOUT_BHSD);
        transpose_bshd_to_bhsd(g_q, qt, PB, PSQ, PHQ, PD);
        transpose_bshd_to_bhsd(g_k, kt, PB, PSKV, PHKV, PD);
        transpose_bshd_to_bhsd(g_v, vt, PB, PSKV, PHKV, PD);
        write_f32(IN("q_bhsd.npy"), 4, qs, qt);
        write_f32(IN("k_bhsd.npy"), 4, ks, kt);
        write_f32(IN("v_bhsd.npy"), 4, ks, vt);
        if (run_ok("A2 --layout bhsd", &r, "attn", "-q", IN("q_bhsd.npy"), "-k", IN("k_bhsd.npy"),
                   "-v", IN("v_bhsd.npy"), "-o", out_b, "--lse", lse_b, "--layout", "bhsd",
                   "--threads", "2", (const char *)NULL)) {
            check_ref("A2 --layout bhsd", &db, qt, kt, vt, out_b, lse_b);
            fxa_npy ob = {0};
            fxa_npy os = {0};
            fxa_npy lb = {0};
            fxa_npy ls = {0};
            const int64_t lshape[3] = {PB, PHQ, PSQ};
            const int64_t oshape[4] = {PB, PSQ, PHQ, PD};
            if (read_output("A2 --layout bhsd", out_b, 4, qs, &ob) &&
                read_output("A2 (bshd output of A1)", g_out, 4, oshape, &os)) {
                static float expect[NQ];
                transpose_bshd_to_bhsd(os.data, expect, PB, PSQ, PHQ, PD);
                size_t diff = 0;
                for (size_t i = 0; i < NQ; i++)
                    diff += memcmp(&expect[i], (const float *)ob.data + i, sizeof(float)) != 0;
                CHECK(diff == 0,
                      "[A2 --layout bhsd] %zu of %zu output values differ (bitwise) from the "
                      "transposed bshd output",
                      diff, NQ);
            }
            if (read_output("A2 --layout bhsd", lse_b, 3, lshape, &lb) &&
                read_output("A2 (bshd lse of A1)", g_lse, 3, lshape, &ls))
                CHECK(memcmp(lb.data, ls.data, (size_t)PB * PHQ * PSQ * sizeof(float)) == 0,
                      "[A2 --layout bhsd] lse differs (bitwise) from the bshd run's lse");
            fxa_npy_free(&ob);
            fxa_npy_free(&os);
            fxa_npy_free(&lb);
            fxa_npy_free(&ls);
        }
        run_free(&r);
    }

    /* A3: --mode online, --center off. */
    {
        const char *o2 = join(g_out_dir, "out_online.npy");
        const char *l2 = join(g_out_dir, "lse_online.npy");
        if (run_ok("A3 --mode online", &r, "attn", "-q", q, "-k", k, "-v", v, "-o", o2, "--lse", l2,
                   "--mode", "online", "--stats", (const char *)NULL)) {
            check_ref("A3 --mode online", &d, g_q, g_k, g_v, o2, l2);
            check_stats("A3 --mode online", r.out, "online", "on", (double)(PB * PHQ * PSQ));
        }
        run_free(&r);
        const char *o3 = join(g_out_dir, "out_nocenter.npy");
        const char *l3 = join(g_out_dir, "lse_nocenter.npy");
        if (run_ok("A4 --center off", &r, "attn", "-q", q, "-k", k, "-v", v, "-o", o3, "--lse", l3,
                   "--center", "off", "--stats", (const char *)NULL)) {
            check_ref("A4 --center off", &d, g_q, g_k, g_v, o3, l3);
            check_stats("A4 --center off", r.out, "auto", "off", -1);
        }
        run_free(&r);
    }

    /* A5: '<f2' files run as f16; A6: --dtype bf16 on '<f4' files; A7: mixed
     * file dtypes with --dtype f32. */
    {
        static uint16_t q16[NQ], k16[NKV], v16[NKV];
        static float qh[NQ], kh[NKV], vh[NKV];
        const int64_t qs[4] = {PB, PSQ, PHQ, PD};
        const int64_t ks[4] = {PB, PSKV, PHKV, PD};
        for (size_t i = 0; i < NQ; i++) {
            q16[i] = fxa_f32_to_f16(g_q[i]);
            qh[i] = fxa_f16_to_f32(q16[i]);
        }
        for (size_t i = 0; i < NKV; i++) {
            k16[i] = fxa_f32_to_f16(g_k[i]);
            v16[i] = fxa_f32_to_f16(g_v[i]);
            kh[i] = fxa_f16_to_f32(k16[i]);
            vh[i] = fxa_f16_to_f32(v16[i]);
        }
        write_f16(IN("q_f16.npy"), 4, qs, q16, NQ);
        write_f16(IN("k_f16.npy"), 4, ks, k16, NKV);
        write_f16(IN("v_f16.npy"), 4, ks, v16, NKV);
        const char *o = join(g_out_dir, "out_f16.npy");
        const char *l = join(g_out_dir, "lse_f16.npy");
        if (run_ok("A5 <f2 inputs", &r, "attn", "-q", IN("q_f16.npy"), "-k", IN("k_f16.npy"), "-v",
                   IN("v_f16.npy"), "-o", o, "--lse", l, "--stats", (const char *)NULL)) {
            check_ref("A5 <f2 inputs", &d, qh, kh, vh, o, l);
            check_stats("A5 <f2 inputs", r.out, "auto", "on", -1);
            CHECK(json_string_is(r.out, "dtype", "f16"),
                  "[A5 <f2 inputs] --stats does not say \"dtype\": \"f16\" (CLI.md: <f2 inputs "
                  "imply f16): %s",
                  r.out);
        }
        run_free(&r);

        static float qb[NQ], kb[NKV], vb[NKV];
        round_through(g_q, qb, NQ, FXA_BF16);
        round_through(g_k, kb, NKV, FXA_BF16);
        round_through(g_v, vb, NKV, FXA_BF16);
        const char *ob = join(g_out_dir, "out_bf16.npy");
        if (run_ok("A6 --dtype bf16", &r, "attn", "-q", q, "-k", k, "-v", v, "-o", ob, "--dtype",
                   "bf16", "--stats", (const char *)NULL)) {
            check_ref("A6 --dtype bf16", &d, qb, kb, vb, ob, NULL);
            CHECK(json_string_is(r.out, "dtype", "bf16"),
                  "[A6 --dtype bf16] --stats does not say \"dtype\": \"bf16\": %s", r.out);
        }
        run_free(&r);

        const char *om = join(g_out_dir, "out_mixed.npy");
        if (run_ok("A7 mixed <f2/<f4 files with --dtype f32", &r, "attn", "-q", IN("q_f16.npy"),
                   "-k", k, "-v", v, "-o", om, "--dtype", "f32", (const char *)NULL))
            check_ref("A7 mixed <f2/<f4 files with --dtype f32", &d, qh, g_k, g_v, om, NULL);
        run_free(&r);
    }

    /* A8: .npy versions 2.0 and 3.0 give the same bytes as version 1.0. */
    {
        const int64_t qs[4] = {PB, PSQ, PHQ, PD};
        const int64_t ks[4] = {PB, PSKV, PHKV, PD};
        write_npy(IN("q_v2.npy"), 2, "<f4", 0, 4, qs, g_q, sizeof g_q);
        write_npy(IN("k_v3.npy"), 3, "<f4", 0, 4, ks, g_k, sizeof g_k);
        const char *o = join(g_out_dir, "out_v23.npy");
        if (run_ok("A8 .npy 2.0/3.0 inputs", &r, "attn", "-q", IN("q_v2.npy"), "-k", IN("k_v3.npy"),
                   "-v", v, "-o", o, "--threads", "2", (const char *)NULL)) {
            size_t n;
            unsigned char *bytes = read_bytes(o, &n);
            CHECK(bytes && g_run_out && n == g_run_out_len && memcmp(bytes, g_run_out, n) == 0,
                  "[A8 .npy 2.0/3.0 inputs] output differs from the version 1.0 run (A1)");
            free(bytes);
        }
        run_free(&r);
    }

    /* A9: --verify prints "max abs err". */
    if (run_ok("A9 --verify", &r, "attn", "-q", q, "-k", k, "-v", v, "-o",
               join(g_out_dir, "out_verify.npy"), "--verify", (const char *)NULL))
        CHECK(strstr(r.out, "max abs err") != NULL,
              "[A9 --verify] stdout has no \"max abs err\": %s", r.out);
    run_free(&r);
    check_no_tmp("A2..A9", g_out_dir);

    /* A10: an existing output is replaced by a successful run. */
    clear_dir(g_out_dir);
    {
        static const char stale[] = "stale output from an older run\n";
        write_bytes(g_out, stale, sizeof stale - 1);
        write_bytes(g_lse, stale, sizeof stale - 1);
        if (run_ok("A10 replaces existing files", &r, "attn", "-q", q, "-k", k, "-v", v, "-o",
                   g_out, "--lse", g_lse, "--threads", "2", (const char *)NULL)) {
            size_t n1, n2;
            unsigned char *b1 = read_bytes(g_out, &n1);
            unsigned char *b2 = read_bytes(g_lse, &n2);
            CHECK(b1 && g_run_out && n1 == g_run_out_len && memcmp(b1, g_run_out, n1) == 0,
                  "[A10 replaces existing files] out.npy was not replaced by the new output "
                  "(%zu bytes, expected %zu)",
                  n1, g_run_out_len);
            CHECK(b2 && g_run_lse && n2 == g_run_lse_len && memcmp(b2, g_run_lse, n2) == 0,
                  "[A10 replaces existing files] lse.npy was not replaced by the new output");
            free(b1);
            free(b2);
            check_no_tmp("A10", g_out_dir);
        }
        run_free(&r);
    }
    clear_dir(g_out_dir);

    /* A11: check --json, check without -v, help. */
    if (run_ok("A11 check --json", &r, "check", "-q", q, "-k", k, "-v", v, "--json",
               (const char *)NULL)) {
        size_t where;
        CHECK(json_one_object_line(r.out, &where),
              "[A11 check --json] stdout is not one JSON object on one line (problem at offset "
              "%zu): %s",
              where, r.out);
        const char *heads = json_field(r.out, "heads");
        CHECK(heads && heads[0] == '[', "[A11 check --json] no \"heads\": [ in %s", r.out);
        CHECK(strstr(r.out, "\"heads\": [") != NULL, "[A11 check --json] no \"heads\": [ in %s",
              r.out);
        CHECK(json_is_number(r.out, "fallback_share_centered"),
              "[A11 check --json] no numeric \"fallback_share_centered\" in %s", r.out);
        CHECK(json_number_is(r.out, "heads_q", PHQ) || json_field(r.out, "heads_q") == NULL,
              "[A11 check --json] \"heads_q\" is not %d: %s", PHQ, r.out);
    }
    run_free(&r);
    if (run_ok("A12 check without -v", &r, "check", "-q", q, "-k", k, (const char *)NULL))
        CHECK(r.out[0] != 0, "[A12 check without -v] printed nothing on stdout");
    run_free(&r);
    if (run_ok("A13 help", &r, "help", (const char *)NULL))
        CHECK(strstr(r.out, "usage") != NULL && strstr(r.out, "attn") != NULL,
              "[A13 help] stdout has no usage text: %s", r.out);
    run_free(&r);
    CHECK(!file_exists(join(g_out_dir, "out.npy")) && !file_exists(g_lse),
          "[A11..A13] check/help wrote files into the output folder");
}

/* ------------------------------------------------------------------------ */
/* B/C. Failures leave the output folder exactly as it was                   */
/* ------------------------------------------------------------------------ */

typedef struct fail_case {
    const char *label;
    int want;             /* 2, or -1 for "any non-zero" */
    const char *mention;  /* word the error must mention, or NULL */
    const char *make_dir; /* a folder to create in out/ before the run, or NULL */
} fail_case;

/* After the run: out/ holds exactly what was put there (nothing, or old
 * out.npy and lse.npy, plus make_dir), old files byte for byte unchanged. */
static void check_out_dir(const fail_case *fc, int with_old, const char *ctx)
{
    DIR *dp = opendir(g_out_dir);
    struct dirent *e;
    if (!dp)
        die("cannot list %s", g_out_dir);
    while ((e = readdir(dp)) != NULL) {
        const char *n = e->d_name;
        if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0)
            continue;
        if (with_old && (strcmp(n, "out.npy") == 0 || strcmp(n, "lse.npy") == 0))
            continue;
        if (fc->make_dir && strcmp(n, fc->make_dir) == 0)
            continue;
        CHECK(0, "%s\n    the failed run left %s in the output folder%s", ctx, n,
              strstr(n, ".tmp.") ? " (a temporary file)" : "");
    }
    closedir(dp);
    if (fc->make_dir) {
        char *sub = xjoin(g_out_dir, fc->make_dir);
        DIR *sp = opendir(sub);
        int entries = 0;
        while (sp && (e = readdir(sp)) != NULL)
            entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
        if (sp)
            closedir(sp);
        CHECK(sp && entries == 0, "%s\n    the folder out/%s is gone or no longer empty", ctx,
              fc->make_dir);
        free(sub);
    }
    if (with_old) {
        size_t n1, n2;
        unsigned char *b1 = read_bytes(g_out, &n1);
        unsigned char *b2 = read_bytes(g_lse, &n2);
        CHECK(b1 && n1 == g_old_out_len && memcmp(b1, g_old_out, n1) == 0,
              "%s\n    the old out.npy was %s by the failed run", ctx, b1 ? "changed" : "removed");
        CHECK(b2 && n2 == g_old_lse_len && memcmp(b2, g_old_lse, n2) == 0,
              "%s\n    the old lse.npy was %s by the failed run", ctx, b2 ? "changed" : "removed");
        free(b1);
        free(b2);
    }
}

static void expect_fail_args(const fail_case *fc, const char *const *args)
{
    char cmd[4096];
    char ctx[4600];
    char how[128];
    format_cmd(args, cmd, sizeof cmd);
    for (int with_old = 0; with_old < 2; with_old++) {
        run_result r;
        clear_dir(g_out_dir);
        if (with_old) {
            write_bytes(g_out, g_old_out, g_old_out_len);
            write_bytes(g_lse, g_old_lse, g_old_lse_len);
        }
        if (fc->make_dir) {
            char *sub = xjoin(g_out_dir, fc->make_dir);
            if (mkdir(sub, 0755) != 0)
                die("mkdir %s: %s", sub, strerror(errno));
            free(sub);
        }
        run_tool(args, &r);
        snprintf(ctx, sizeof ctx, "[%s; %s] %s", fc->label,
                 with_old ? "old output files in place" : "no output files before", cmd);
        const int code_ok =
            !r.timed_out && !r.sig && (fc->want < 0 ? r.code != 0 : r.code == fc->want);
        CHECK(code_ok, "%s\n    expected exit %s, got %s\n    stderr: %s", ctx,
              fc->want < 0 ? "non-zero (1)" : "2", describe_exit(&r, how, sizeof how), r.err);
        CHECK(has_error_line(r.err),
              "%s\n    stderr has no line starting with \"" ERR_PREFIX "\": '%s'", ctx, r.err);
        if (fc->mention)
            CHECK(mentions(r.err, fc->mention), "%s\n    the error does not mention %s: %s", ctx,
                  fc->mention, r.err);
        check_out_dir(fc, with_old, ctx);
        run_free(&r);
    }
}

static void expect_fail(const char *label, int want, const char *mention, const char *first, ...)
{
    const char *args[MAX_ARGS + 1];
    const fail_case fc = {label, want, mention, NULL};
    va_list ap;
    va_start(ap, first);
    collect_args(args, first, ap);
    va_end(ap);
    expect_fail_args(&fc, args);
}

/* The usual attn command line with one input replaced. */
#define ATTN3(Q, K, V) "attn", "-q", (Q), "-k", (K), "-v", (V), "-o", g_out, "--lse", g_lse
#define BAD(label, mention, ...) expect_fail((label), 2, (mention), __VA_ARGS__, (const char *)NULL)

static void make_bad_files(void)
{
    const int64_t qs[4] = {PB, PSQ, PHQ, PD};
    const int64_t ks[4] = {PB, PSKV, PHKV, PD};
    static float buf[2 * NQ + 16];

    /* Non-finite values. */
    memcpy(buf, g_q, sizeof g_q);
    buf[5 * PD + 3] = NAN;
    write_f32(IN("q_nan.npy"), 4, qs, buf);
    memcpy(buf, g_k, sizeof g_k);
    buf[7 * PD + 1] = INFINITY;
    write_f32(IN("k_inf.npy"), 4, ks, buf);
    memcpy(buf, g_v, sizeof g_v);
    buf[NKV - 2] = -INFINITY;
    write_f32(IN("v_ninf.npy"), 4, ks, buf);
    {
        static uint16_t q16[NQ];
        for (size_t i = 0; i < NQ; i++)
            q16[i] = fxa_f32_to_f16(g_q[i]);
        q16[11] = 0x7e00; /* f16 NaN */
        write_f16(IN("q_f16_nan.npy"), 4, qs, q16, NQ);
    }
    /* Too large for f16. */
    memcpy(buf, g_q, sizeof g_q);
    buf[3] = 1e6f;
    write_f32(IN("q_big.npy"), 4, qs, buf);

    /* Shapes. */
    {
        const int64_t s3[3] = {PSQ, PHQ, PD};
        const int64_t v52[4] = {PB, PSKV - 1, PHKV, PD};
        const int64_t q_b2[4] = {2, PSQ, PHQ, PD};
        const int64_t q_d8[4] = {PB, PSQ, PHQ, 8};
        const int64_t q_h3[4] = {PB, PSQ, 3, PD};
        const int64_t q_s0[4] = {PB, 0, PHQ, PD};
        const int64_t k_s0[4] = {PB, 0, PHKV, PD};
        const int64_t k_d0[4] = {PB, PSKV, PHKV, 0};
        const int64_t q_d0[4] = {PB, PSQ, PHQ, 0};
        memset(buf, 0, sizeof buf);
        memcpy(buf, g_q, sizeof g_q);
        memcpy(buf + NQ, g_q, sizeof g_q);
        write_f32(IN("q_3d.npy"), 3, s3, buf);
        write_f32(IN("v_short.npy"), 4, v52, g_v);
        write_f32(IN("q_b2.npy"), 4, q_b2, buf);
        write_f32(IN("q_d8.npy"), 4, q_d8, buf);
        write_f32(IN("q_h3.npy"), 4, q_h3, buf);
        write_f32(IN("q_s0.npy"), 4, q_s0, buf);
        write_f32(IN("k_s0.npy"), 4, k_s0, buf);
        write_f32(IN("v_s0.npy"), 4, k_s0, buf);
        write_f32(IN("q_d0.npy"), 4, q_d0, buf);
        write_f32(IN("k_d0.npy"), 4, k_d0, buf);
        write_f32(IN("v_d0.npy"), 4, k_d0, buf);
    }

    /* Broken files. */
    {
        const int64_t lies[4] = {PB, PSQ, 2 * PHQ, PD};
        const int64_t flat[1] = {(int64_t)NQ};
        static double q64[NQ];
        static int32_t qi[NQ];
        static uint32_t qbe[NQ];
        for (size_t i = 0; i < NQ; i++) {
            uint32_t u;
            q64[i] = g_q[i];
            qi[i] = (int32_t)lrint(g_q[i] * 100.0f);
            memcpy(&u, &g_q[i], 4);
            qbe[i] = __builtin_bswap32(u);
        }
        write_npy(IN("q_trunc.npy"), 1, "<f4", 0, 4, qs, g_q, sizeof g_q - 100);
        write_npy(IN("q_trunc_hdr.npy"), 1, "<f4", 0, 4, qs, g_q, 0);
        write_npy(IN("q_lies.npy"), 1, "<f4", 0, 4, lies, g_q, sizeof g_q);
        memcpy(buf, g_q, sizeof g_q);
        write_npy(IN("q_trail.npy"), 1, "<f4", 0, 4, qs, buf, sizeof g_q + 4);
        write_npy(IN("q_fortran.npy"), 1, "<f4", 1, 4, qs, g_q, sizeof g_q);
        write_npy(IN("q_be.npy"), 1, ">f4", 0, 4, qs, qbe, sizeof qbe);
        write_npy(IN("q_f8.npy"), 1, "<f8", 0, 4, qs, q64, sizeof q64);
        write_npy(IN("q_i4.npy"), 1, "<i4", 0, 4, qs, qi, sizeof qi);
        write_npy(IN("q_1d.npy"), 1, "<f4", 0, 1, flat, g_q, sizeof g_q);
        static const char text[] = "this is not a .npy file, just some text\n";
        write_bytes(IN("q_text.npy"), text, sizeof text - 1);
        write_bytes(IN("q_empty.npy"), "", 0);
        /* Only the first 9 bytes of a valid header. */
        write_npy(IN("q_tmp.npy"), 1, "<f4", 0, 4, qs, g_q, sizeof g_q);
        size_t n;
        unsigned char *b = read_bytes(IN("q_tmp.npy"), &n);
        if (!b)
            die("cannot read back q_tmp.npy");
        write_bytes(IN("q_preamble.npy"), b, 9);
        free(b);
        if (mkdir(IN("q_dir.npy"), 0755) != 0)
            die("mkdir q_dir.npy: %s", strerror(errno));
    }
}

static void test_bad_input(void)
{
    const char *q = IN("q.npy");
    const char *k = IN("k.npy");
    const char *v = IN("v.npy");
    make_bad_files();

    /* Non-finite values: the message names the tensor. */
    BAD("B1 NaN in Q", "Q", ATTN3(IN("q_nan.npy"), k, v));
    BAD("B2 +Inf in K", "K", ATTN3(q, IN("k_inf.npy"), v));
    BAD("B3 -Inf in V", "V", ATTN3(q, k, IN("v_ninf.npy")));
    BAD("B4 NaN in a <f2 Q", "Q", ATTN3(IN("q_f16_nan.npy"), IN("k_f16.npy"), IN("v_f16.npy")));
    BAD("B5 NaN in Q, --mode online", "Q", ATTN3(IN("q_nan.npy"), k, v), "--mode", "online");
    BAD("B6 +Inf in K, check", "K", "check", "-q", q, "-k", IN("k_inf.npy"), "-v", v);

    /* Shapes. */
    BAD("B7 Q is 3-D", "Q", ATTN3(IN("q_3d.npy"), k, v));
    BAD("B8 K and V shapes differ", NULL, ATTN3(q, k, IN("v_short.npy")));
    BAD("B9 batch differs (Q 2, K 1)", NULL, ATTN3(IN("q_b2.npy"), k, v));
    BAD("B10 head dim differs (Q 8, K 16)", NULL, ATTN3(IN("q_d8.npy"), k, v));
    BAD("B11 Hq=3 not a multiple of Hkv=2", NULL, ATTN3(IN("q_h3.npy"), k, v));
    BAD("B12 zero-size Sq", NULL, ATTN3(IN("q_s0.npy"), k, v));
    BAD("B13 zero-size Skv", NULL, ATTN3(q, IN("k_s0.npy"), IN("v_s0.npy")));
    BAD("B14 zero-size head dim", NULL, ATTN3(IN("q_d0.npy"), IN("k_d0.npy"), IN("v_d0.npy")));
    BAD("B15 bshd files with --layout bhsd", NULL, ATTN3(q, k, v), "--layout", "bhsd");
    BAD("B16 Q is 1-D", "Q", ATTN3(IN("q_1d.npy"), k, v));

    /* Broken or unsupported files: the message names the file. */
    BAD("B17 truncated data", "q_trunc.npy", ATTN3(IN("q_trunc.npy"), k, v));
    BAD("B18 header only, no data", "q_trunc_hdr.npy", ATTN3(IN("q_trunc_hdr.npy"), k, v));
    BAD("B19 header declares a bigger shape", "q_lies.npy", ATTN3(IN("q_lies.npy"), k, v));
    BAD("B20 trailing bytes", "q_trail.npy", ATTN3(IN("q_trail.npy"), k, v));
    BAD("B21 Fortran order", "q_fortran.npy", ATTN3(IN("q_fortran.npy"), k, v));
    BAD("B22 big-endian >f4", "q_be.npy", ATTN3(IN("q_be.npy"), k, v));
    BAD("B23 dtype <f8", "q_f8.npy", ATTN3(IN("q_f8.npy"), k, v));
    BAD("B24 dtype <i4", "q_i4.npy", ATTN3(IN("q_i4.npy"), k, v));
    BAD("B25 not a .npy file", "q_text.npy", ATTN3(IN("q_text.npy"), k, v));
    BAD("B26 empty file", "q_empty.npy", ATTN3(IN("q_empty.npy"), k, v));
    BAD("B27 truncated preamble", "q_preamble.npy", ATTN3(IN("q_preamble.npy"), k, v));
    BAD("B28 missing file", "q_missing.npy", ATTN3(IN("q_missing.npy"), k, v));
    BAD("B29 missing K file", "k_missing.npy", ATTN3(q, IN("k_missing.npy"), v));
    BAD("B30 a folder as input", "q_dir.npy", ATTN3(IN("q_dir.npy"), k, v));
    BAD("B31 truncated V (bad file last)", "q_trunc.npy", ATTN3(q, k, IN("q_trunc.npy")));

    /* dtypes. */
    BAD("B32 mixed <f2 Q and <f4 K/V without --dtype", NULL, ATTN3(IN("q_f16.npy"), k, v));
    BAD("B33 1e6 in Q with --dtype f16", "Q", ATTN3(IN("q_big.npy"), k, v), "--dtype", "f16");

    /* Options. */
    BAD("B34 unknown option", "--bogus", ATTN3(q, k, v), "--bogus");
    BAD("B35 missing value (-q at the end)", "-q", "attn", "-k", k, "-v", v, "-o", g_out, "--lse",
        g_lse, "-q");
    BAD("B36 --threads -1", "--threads", ATTN3(q, k, v), "--threads", "-1");
    BAD("B37 --threads abc", "--threads", ATTN3(q, k, v), "--threads", "abc");
    BAD("B38 --scale 0", "--scale", ATTN3(q, k, v), "--scale", "0");
    BAD("B39 --scale -2", "--scale", ATTN3(q, k, v), "--scale", "-2");
    BAD("B40 --scale nan", "--scale", ATTN3(q, k, v), "--scale", "nan");
    BAD("B41 --scale inf", "--scale", ATTN3(q, k, v), "--scale", "inf");
    BAD("B42 --mode fast", "--mode", ATTN3(q, k, v), "--mode", "fast");
    BAD("B43 --center maybe", "--center", ATTN3(q, k, v), "--center", "maybe");
    BAD("B44 --layout xyz", "--layout", ATTN3(q, k, v), "--layout", "xyz");
    BAD("B45 --dtype f64", "--dtype", ATTN3(q, k, v), "--dtype", "f64");
    BAD("B46 --block-q 99999", "--block-q", ATTN3(q, k, v), "--block-q", "99999");
    BAD("B47 missing -o", "-o", "attn", "-q", q, "-k", k, "-v", v, "--lse", g_lse);
    BAD("B48 missing -v", "-v", "attn", "-q", q, "-k", k, "-o", g_out, "--lse", g_lse);
    BAD("B49 unknown command", "frobnicate", "frobnicate", "-q", q, "-o", g_out);
    BAD("B50 no command at all", NULL, (const char *)NULL);
    BAD("B51 check: missing -k", NULL, "check", "-q", q);
    BAD("B52 check: --layout xyz", "--layout", "check", "-q", q, "-k", k, "--layout", "xyz");
}

/* ------------------------------------------------------------------------ */
/* C. Output failures                                                        */
/* ------------------------------------------------------------------------ */

/* -o target, a character device whose writes fail with ENOSPC, in folder. */
static void devfull_case(const char *label, const char *target, const char *folder)
{
    struct stat before;
    struct stat after;
    run_result r;
    char cmd[4096];
    char how[128];
    const char *base = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
    const char *const args[] = {"attn", "-q",        IN("q.npy"), "-k",   IN("k.npy"),
                                "-v",   IN("v.npy"), "-o",        target, NULL};
    char tmp_prefix[256];
    snprintf(tmp_prefix, sizeof tmp_prefix, "%s.tmp.", base);
    if (stat(target, &before) != 0 || !S_ISCHR(before.st_mode))
        die("%s is not a character device before the test", target);
    format_cmd(args, cmd, sizeof cmd);
    run_tool(args, &r);
    CHECK(!r.timed_out && !r.sig && r.code != 0,
          "[%s] %s\n    expected a non-zero exit (writing fails with ENOSPC), got %s\n"
          "    stdout: %s    stderr: %s",
          label, cmd, describe_exit(&r, how, sizeof how), r.out, r.err);
    CHECK(has_error_line(r.err),
          "[%s] %s\n    stderr has no line starting with \"" ERR_PREFIX "\": '%s'", label, cmd,
          r.err);
    const int still =
        lstat(target, &after) == 0 && S_ISCHR(after.st_mode) && after.st_rdev == before.st_rdev;
    CHECK(still,
          "[%s] %s\n    %s is no longer the character device %u,%u: it is now %s (the tool "
          "renamed its temporary file onto the device)",
          label, cmd, target, major(before.st_rdev), minor(before.st_rdev),
          lstat(target, &after) != 0 ? "missing"
          : S_ISREG(after.st_mode)   ? "a regular file"
          : S_ISCHR(after.st_mode)   ? "another character device"
                                     : "something else");
    DIR *dp = opendir(folder);
    struct dirent *e;
    while (dp && (e = readdir(dp)) != NULL)
        CHECK(!starts_with(e->d_name, tmp_prefix), "[%s] %s\n    temporary file left: %s/%s", label,
              cmd, folder, e->d_name);
    if (dp)
        closedir(dp);
    if (!still && S_ISREG(after.st_mode))
        fprintf(stderr, "    [%s] %s now holds %lld bytes (a complete .npy file)\n", label, target,
                (long long)after.st_size);
    run_free(&r);
}

/* Whether writes to path fail with ENOSPC (a working /dev/full). */
static int writes_fail_enospc(const char *path)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    const ssize_t w = write(fd, "x", 1);
    const int e = errno;
    close(fd);
    return w < 0 && e == ENOSPC;
}

/* In a child: a private mount namespace whose /dev is a fresh tmpfs with
 * its own /dev/full, so the tool can rename nothing onto the real one. */
static int isolate_dev(void)
{
    if (unshare(CLONE_NEWNS) != 0)
        return 1;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return 2;
    if (mount("test_cli_dev", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755") != 0)
        return 3;
    if (mknod("/dev/full", S_IFCHR | 0666, makedev(1, 7)) != 0)
        return 4;
    if (chmod("/dev/full", 0666) != 0 || !writes_fail_enospc("/dev/full"))
        return 5;
    return 0;
}

static void test_dev_full(void)
{
    int pfd[2];
    int msg[3] = {-1, 0, 0};
    if (pipe(pfd) != 0)
        die("pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(pfd[0]);
        g_checks = g_failures = 0;
        msg[0] = isolate_dev();
        if (msg[0] == 0)
            devfull_case("C3 -o /dev/full (private /dev)", "/dev/full", "/dev");
        msg[1] = g_checks;
        msg[2] = g_failures;
        fflush(stdout);
        fflush(stderr);
        if (write(pfd[1], msg, sizeof msg) != (ssize_t)sizeof msg)
            _exit(3);
        _exit(0);
    }
    close(pfd[1]);
    ssize_t got = read(pfd[0], msg, sizeof msg);
    close(pfd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (got == (ssize_t)sizeof msg && msg[0] == 0) {
        g_checks += msg[1];
        g_failures += msg[2];
        return;
    }
    if (got != (ssize_t)sizeof msg) {
        CHECK(0, "[C3 -o /dev/full] the isolated test process died (status 0x%x)", status);
        return;
    }
    /* No private namespace here. */
    if (faccessat(AT_FDCWD, "/dev", W_OK, AT_EACCESS) != 0) {
        /* The tool cannot create anything in /dev: the real device is safe. */
        devfull_case("C3 -o /dev/full", "/dev/full", "/dev");
        return;
    }
    /* /dev is writable but cannot be isolated: use a copy of the device node. */
    const char *node = join(g_out_dir, "full");
    clear_dir(g_out_dir);
    if (mknod(node, S_IFCHR | 0666, makedev(1, 7)) == 0 && writes_fail_enospc(node)) {
        devfull_case("C3 -o <copy of /dev/full in the temporary folder>", node, g_out_dir);
    } else {
        printf("test_cli: SKIP -o /dev/full: no private mount namespace (step %d failed), /dev "
               "is writable and no usable copy of the device node could be made\n",
               msg[0]);
    }
    clear_dir(g_out_dir);
}

static void test_output_failures(void)
{
    const char *q = IN("q.npy");
    const char *k = IN("k.npy");
    const char *v = IN("v.npy");
    const char *missing_out = join(g_out_dir, "no_such_folder/out.npy");
    const char *missing_lse = join(g_out_dir, "no_such_folder/lse.npy");
    const char *lse_dir = join(g_out_dir, "lse_is_a_folder");
    const char *args1[] = {"attn", "-q", q,           "-k",    k,     "-v",
                           v,      "-o", missing_out, "--lse", g_lse, NULL};
    const char *args2[] = {"attn", "-q", q,     "-k",    k,           "-v",
                           v,      "-o", g_out, "--lse", missing_lse, NULL};
    const char *args3[] = {"attn", "-q", q, "-k", k, "-v", v, "-o", g_out, "--lse", lse_dir, NULL};
    const fail_case c1 = {"C1 -o into a missing folder", -1, NULL, NULL};
    const fail_case c2 = {"C2 --lse into a missing folder", -1, NULL, NULL};
    const fail_case c4 = {"C4 --lse names an existing folder", -1, NULL, "lse_is_a_folder"};
    expect_fail_args(&c1, args1);
    expect_fail_args(&c2, args2);
    expect_fail_args(&c4, args3);
    clear_dir(g_out_dir);
    test_dev_full();
    struct stat st;
    CHECK(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode),
          "[C3] the real /dev/full is no longer a character device");
}

/* ------------------------------------------------------------------------ */

/* ------------------------------------------------------------------------ */
/* Hostile finite inputs: exact or refused                                   */
/* ------------------------------------------------------------------------ */

/* Run args; 1 when it exited `want` (and, for a failure, printed one
 * "fxattn: error:" line mentioning `mention`) within `seconds`. */
static int run_expect(const char *label, int want, const char *mention, double seconds,
                      run_result *r, const char *first, ...)
{
    const char *args[MAX_ARGS + 1];
    char cmd[4096], how[128];
    va_list ap;
    va_start(ap, first);
    collect_args(args, first, ap);
    va_end(ap);
    format_cmd(args, cmd, sizeof cmd);
    const double t0 = now_s();
    run_tool(args, r);
    const double took = now_s() - t0;
    int ok = r->code == want && took <= seconds;
    CHECK(ok, "[%s] %s\n    expected exit %d within %.0f s, got %s after %.1f s\n    stderr: %s",
          label, cmd, want, seconds, describe_exit(r, how, sizeof how), took, r->err);
    if (ok && want != 0) {
        ok = starts_with(r->err, ERR_PREFIX) && strstr(r->err, mention) &&
             strchr(r->err, '\n') == strrchr(r->err, '\n');
        CHECK(ok, "[%s] expected one error line mentioning '%s', got: %s", label, mention, r->err);
    }
    return ok;
}

/* The output (one row of 4) and the LSE (one value) of a 1-query run. */
static void check_one_row(const char *label, const char *out, const char *lse, float want_out,
                          double want_lse)
{
    fxa_npy a, l;
    const int64_t os[4] = {1, 1, 1, 4}, ls[3] = {1, 1, 1};
    if (read_output(label, out, 4, os, &a)) {
        for (int c = 0; c < 4; c++)
            CHECK(((const float *)a.data)[c] == want_out, "[%s] out[%d] = %.9g, exact %.9g", label,
                  c, (double)((const float *)a.data)[c], (double)want_out);
        fxa_npy_free(&a);
    }
    if (lse && read_output(label, lse, 3, ls, &l)) {
        const double got = ((const float *)l.data)[0];
        CHECK(fabs(got - want_lse) <= 0x1p-20 * want_lse, "[%s] lse = %.9g, exact %.9g", label, got,
              want_lse);
        fxa_npy_free(&l);
    }
}

/* The automatic compute: `info` names what bf16 inputs compute in; FXA_AUTO_COMPUTE=bf16 makes
 * bench's default (--compute auto) run bf16 compute, and an unknown value exits 2 naming it. */
static void check_compute_auto(run_result *r)
{
    if (run_ok("info compute", r, "info", (const char *)NULL))
        CHECK(strstr(r->out, "compute auto: bf16 inputs compute in ") != NULL,
              "[info] no compute choice: %s", r->out);
    run_free(r);
    setenv("FXA_AUTO_COMPUTE", "bf16", 1);
    if (run_ok("bench pinned bf16", r, "bench", "--dtype", "bf16", "--seq", "64", "--heads", "1",
               "--dim", "16", "--repeats", "1", "--json", (const char *)NULL)) {
        const char *c = json_field(r->out, "compute");
        CHECK(c && strncmp(c, "\"bf16\"", 6) == 0, "[bench pinned bf16] not bf16 compute: %s",
              r->out);
    }
    run_free(r);
    setenv("FXA_AUTO_COMPUTE", "fast", 1);
    run_expect("FXA_AUTO_COMPUTE=fast", 2, "FXA_AUTO_COMPUTE=fast", 30, r, "info",
               (const char *)NULL);
    run_free(r);
    unsetenv("FXA_AUTO_COMPUTE");
}

/* bench --seq-kv: cross-attention rows with Skv keys, positive rates; more keys than queries or
 * with --backward exits 2 naming the option. */
static void check_bench_seq_kv(run_result *r)
{
    if (run_ok("bench --seq-kv", r, "bench", "--seq", "300", "--seq-kv", "40", "--heads", "1",
               "--dim", "16", "--repeats", "1", "--json", (const char *)NULL)) {
        const char *kv = json_field(r->out, "seq_kv");
        const char *g = json_field(r->out, "gflops");
        CHECK(kv && strtol(kv, NULL, 10) == 40 && g && strtod(g, NULL) > 0.0,
              "[bench --seq-kv] not 40 keys with a positive rate: %s", r->out);
    }
    run_free(r);
    run_expect("bench --seq-kv > --seq", 2, "--seq-kv", 30, r, "bench", "--seq", "10", "--seq-kv",
               "20", (const char *)NULL);
    run_free(r);
    run_expect("bench --seq-kv --backward", 2, "--seq-kv", 30, r, "bench", "--seq", "64",
               "--seq-kv", "20", "--backward", (const char *)NULL);
    run_free(r);
}

static void test_hostile(void)
{
    run_result r;
    size_t where;
    /* Item 1: q.k = 4e38 overflows fp32, the scaled scores (2e38, 1e38)
     * and the LSE (2e38) fit: out = v_0 = 1 exactly. */
    const int64_t qs[4] = {1, 1, 1, 4}, ks[4] = {1, 2, 1, 4};
    const float q1[4] = {1e19f, 1e19f, 1e19f, 1e19f};
    const float k1[8] = {1e19f, 1e19f, 1e19f, 1e19f, 0.5e19f, 0.5e19f, 0.5e19f, 0.5e19f};
    const float v1[8] = {1, 1, 1, 1, 2, 2, 2, 2};
    const float q2[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    const float k2[8] = {0.5f, 0.5f, 0.5f, 0.5f, 0.25f, 0.25f, 0.25f, 0.25f};
    write_f32(IN("h_q1.npy"), 4, qs, q1);
    write_f32(IN("h_k1.npy"), 4, ks, k1);
    write_f32(IN("h_v1.npy"), 4, ks, v1);
    write_f32(IN("h_q2.npy"), 4, qs, q2);
    write_f32(IN("h_k2.npy"), 4, ks, k2);
    static const char *const centers[2] = {"on", "off"};
    static const char *const modes[2] = {"auto", "online"};
    for (int c = 0; c < 2; c++)
        for (int m = 0; m < 2; m++) {
            char label[96];
            snprintf(label, sizeof label, "q.k overflows fp32 (center %s, mode %s)", centers[c],
                     modes[m]);
            clear_dir(g_out_dir);
            if (run_ok(label, &r, "attn", "-q", IN("h_q1.npy"), "-k", IN("h_k1.npy"), "-v",
                       IN("h_v1.npy"), "-o", g_out, "--lse", g_lse, "--scale", "0.5", "--center",
                       centers[c], "--mode", modes[m], "--verify", "--stats", (const char *)NULL)) {
                check_one_row(label, g_out, g_lse, 1.0f, 0.5 * 4e38);
                CHECK(json_one_object_line(r.out, &where),
                      "[%s] --stats is not one JSON object: %s", label, r.out);
            }
            run_free(&r);
        }
    /* Item 2: --scale 3e38 on q = 0.5: the natural scores (3e38, 1.5e38)
     * fit, the base-2 ones do not; centring forms them (exact), without
     * it the run is refused naming the bound; 1e300 is refused. */
    clear_dir(g_out_dir);
    if (run_ok("--scale 3e38, centred", &r, "attn", "-q", IN("h_q2.npy"), "-k", IN("h_k2.npy"),
               "-v", IN("h_v1.npy"), "-o", g_out, "--lse", g_lse, "--scale", "3e38",
               (const char *)NULL))
        check_one_row("--scale 3e38, centred", g_out, g_lse, 1.0f, 3e38);
    run_free(&r);
    static const char *const big[2][2] = {{"3e38", "off"}, {"1e300", "on"}};
    for (int i = 0; i < 2; i++) {
        char label[64];
        snprintf(label, sizeof label, "--scale %s, center %s", big[i][0], big[i][1]);
        clear_dir(g_out_dir);
        run_expect(label, 2, "exceeds the fp32 range", 30.0, &r, "attn", "-q", IN("h_q2.npy"), "-k",
                   IN("h_k2.npy"), "-v", IN("h_v1.npy"), "-o", g_out, "--scale", big[i][0],
                   "--center", big[i][1], (const char *)NULL);
        CHECK(!file_exists(g_out), "[%s] an output was written", label);
        run_free(&r);
    }
    /* check --json on these inputs: valid JSON. */
    if (run_ok("check --json, q.k past fp32", &r, "check", "-q", IN("h_q1.npy"), "-k",
               IN("h_k1.npy"), "--scale", "0.5", "--json", (const char *)NULL))
        CHECK(json_one_object_line(r.out, &where), "[check --json] not one JSON object: %s", r.out);
    run_free(&r);

    /* Item 4: -o and --lse naming one file, also through other paths. */
    clear_dir(g_out_dir);
    write_bytes(g_out, "old", 3);
    char *link = xjoin(g_out_dir, "link.npy");
    char *dotted = xjoin(g_out_dir, "./out.npy");
    char *fresh = xjoin(g_out_dir, "fresh.npy");
    char *fresh2 = xjoin(g_out_dir, "../out/fresh.npy");
    CHECK(symlink("out.npy", link) == 0, "symlink: %s", strerror(errno));
    const char *pairs[4][2] = {{g_out, g_out}, {g_out, dotted}, {g_out, link}, {fresh, fresh2}};
    for (int i = 0; i < 4; i++) {
        run_expect("-o and --lse name one file", 2, "name the same file", 30.0, &r, "attn", "-q",
                   IN("q.npy"), "-k", IN("k.npy"), "-v", IN("v.npy"), "-o", pairs[i][0], "--lse",
                   pairs[i][1], (const char *)NULL);
        run_free(&r);
    }
    size_t n = 0;
    unsigned char *old = read_bytes(g_out, &n);
    CHECK(old && n == 3 && memcmp(old, "old", 3) == 0 && !file_exists(fresh),
          "[-o and --lse name one file] an output was written");
    free(old);
    free(link);
    free(dotted);
    free(fresh);
    free(fresh2);

    /* Item 7: a FIFO with no reader fails at once instead of blocking. */
    clear_dir(g_out_dir);
    char *fifo = xjoin(g_out_dir, "fifo");
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo: %s", strerror(errno));
    run_expect("FIFO without a reader", 1, "no reader", 20.0, &r, "attn", "-q", IN("q.npy"), "-k",
               IN("k.npy"), "-v", IN("v.npy"), "-o", fifo, (const char *)NULL);
    run_free(&r);
    free(fifo);

    /* bench: one JSON object per line; the last gives the bound pass's
     * median time (> 0: it was run) and its share of the auto run. */
    if (run_ok("bench --json", &r, "bench", "--seq", "256", "--heads", "2", "--dim", "64",
               "--repeats", "3", "--json", (const char *)NULL)) {
        int lines = 0;
        const char *last = NULL;
        for (char *line = r.out; *line; lines++) {
            char *nl = strchr(line, '\n');
            CHECK(nl != NULL, "[bench --json] output does not end with a newline: %s", r.out);
            if (!nl)
                break;
            const char saved = nl[1];
            nl[1] = 0;
            size_t at;
            CHECK(json_one_object_line(line, &at),
                  "[bench --json] line %d is not one JSON object (offset %zu): %s", lines + 1, at,
                  line);
            nl[1] = saved;
            last = line;
            line = nl + 1;
        }
        CHECK(lines == 3, "[bench --json] %d lines, want auto, online and the summary: %s", lines,
              r.out);
        const char *t = last ? json_field(last, "bound_pass_seconds_median") : NULL;
        const char *f = last ? json_field(last, "bound_pass_share") : NULL;
        CHECK(t && strtod(t, NULL) > 0.0 && f && strtod(f, NULL) > 0.0,
              "[bench --json] no positive bound_pass_seconds_median and bound_pass_share: %s",
              r.out);
    }
    run_free(&r);

    /* bench --backward: one JSON object with positive forward and backward
     * rates, in fp32 and in bf16 compute. */
    if (run_ok("bench --backward --json", &r, "bench", "--backward", "--seq", "200", "--heads", "2",
               "--dim", "40", "--repeats", "1", "--json", (const char *)NULL)) {
        size_t at;
        CHECK(json_one_object_line(r.out, &at), "[bench --backward] not one JSON object: %s",
              r.out);
        const char *f = json_field(r.out, "forward_gflops");
        const char *b = json_field(r.out, "backward_gflops");
        CHECK(f && strtod(f, NULL) > 0.0 && b && strtod(b, NULL) > 0.0,
              "[bench --backward] no positive forward_gflops and backward_gflops: %s", r.out);
    }
    run_free(&r);
    if (run_ok("bench --backward bf16 compute", &r, "bench", "--backward", "--dtype", "bf16",
               "--compute", "bf16", "--seq", "64", "--heads", "1", "--dim", "16", "--repeats", "1",
               "--json", (const char *)NULL)) {
        const char *c = json_field(r.out, "compute");
        const char *b = json_field(r.out, "backward_gflops");
        CHECK(c && strncmp(c, "\"bf16\"", 6) == 0 && b && strtod(b, NULL) > 0.0,
              "[bench --backward bf16] not bf16 compute with a positive backward_gflops: %s",
              r.out);
    }
    run_free(&r);
    check_compute_auto(&r);
    check_bench_seq_kv(&r);

    /* bench --causal: one JSON object with positive medians and speedup; with
     * --backward the backward's. */
    if (run_ok("bench --causal --json", &r, "bench", "--causal", "--seq", "200", "--heads", "2",
               "--dim", "40", "--repeats", "1", "--json", (const char *)NULL)) {
        size_t at;
        CHECK(json_one_object_line(r.out, &at), "[bench --causal] not one JSON object: %s", r.out);
        const char *c = json_field(r.out, "causal_seconds_median");
        const char *x = json_field(r.out, "causal_speedup");
        CHECK(c && strtod(c, NULL) > 0.0 && x && strtod(x, NULL) > 0.0,
              "[bench --causal] no positive causal_seconds_median and causal_speedup: %s", r.out);
    }
    run_free(&r);
    if (run_ok("bench --backward --causal --json", &r, "bench", "--backward", "--causal", "--seq",
               "200", "--heads", "2", "--dim", "40", "--repeats", "1", "--json",
               (const char *)NULL)) {
        size_t at;
        CHECK(json_one_object_line(r.out, &at), "[bench --backward --causal] not one object: %s",
              r.out);
        const char *c = json_field(r.out, "causal_backward_seconds_median");
        const char *x = json_field(r.out, "causal_backward_speedup");
        CHECK(c && strtod(c, NULL) > 0.0 && x && strtod(x, NULL) > 0.0,
              "[bench --backward --causal] no positive causal median and speedup: %s", r.out);
    }
    run_free(&r);
    /* --backward --causal times the compute asked for (bf16 inputs: bf16
     * unless --compute fp32) and refuses bf16 compute of fp32 inputs. */
    if (run_ok("bench --backward --causal bf16 compute", &r, "bench", "--backward", "--causal",
               "--dtype", "bf16", "--compute", "bf16", "--seq", "64", "--heads", "1", "--dim", "16",
               "--repeats", "1", "--json", (const char *)NULL)) {
        const char *c = json_field(r.out, "compute");
        CHECK(c && strncmp(c, "\"bf16\"", 6) == 0,
              "[bench --backward --causal bf16] not timed in bf16 compute: %s", r.out);
    }
    run_free(&r);
    run_expect("bench --backward --causal bf16 compute of f32", 2, "bf16 inputs", 10.0, &r, "bench",
               "--backward", "--causal", "--compute", "bf16", "--seq", "64", "--heads", "1",
               "--dim", "16", "--repeats", "1", (const char *)NULL);
    run_free(&r);
    run_expect("bench --backward --proj", 2, "pass one of them", 10.0, &r, "bench", "--backward",
               "--proj", "--seq", "64", "--heads", "1", "--dim", "16", (const char *)NULL);
    run_free(&r);
    run_expect("bench --causal --proj", 2, "not with --proj", 10.0, &r, "bench", "--causal",
               "--proj", "--seq", "64", "--heads", "1", "--dim", "16", (const char *)NULL);
    run_free(&r);

    /* Item 5: more memory than any machine has, refused up front. */
    run_expect("bench beyond memory", 1, "GiB available", 10.0, &r, "bench", "--seq", "16777216",
               "--heads", "1024", "--dim", "256", (const char *)NULL);
    CHECK(strstr(r.err, "needs ") != NULL, "[bench beyond memory] %s", r.err);
    run_free(&r);
    run_expect("demo beyond memory", 1, "GiB available", 10.0, &r, "demo", "--frames", "1024",
               "--height", "1024", "--width", "1024", "--heads", "1024", (const char *)NULL);
    run_free(&r);
    run_expect("layer beyond memory", 1, "GiB available", 10.0, &r, "layer", "--heads", "1024",
               "--dim", "256", (const char *)NULL);
    run_free(&r);
    /* Three sparse files of 4 TiB: refused before any is read. */
    const char *names[3] = {"h_big_q.npy", "h_big_k.npy", "h_big_v.npy"};
    for (int i = 0; i < 3; i++) {
        const int fd = open(IN(names[i]), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        CHECK(fd >= 0 && ftruncate(fd, (off_t)1 << 42) == 0, "sparse file: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
    }
    clear_dir(g_out_dir);
    run_expect("attn beyond memory", 1, "GiB available", 10.0, &r, "attn", "-q", IN("h_big_q.npy"),
               "-k", IN("h_big_k.npy"), "-v", IN("h_big_v.npy"), "-o", g_out, (const char *)NULL);
    CHECK(!file_exists(g_out), "[attn beyond memory] an output was written");
    run_free(&r);
    for (int i = 0; i < 3; i++)
        remove(IN(names[i]));
}

/* ------------------------------------------------------------------------ */
/* D. Paths and numbers: empty values, outputs checked before any write,     */
/*    refusals that give the true reason                                     */
/* ------------------------------------------------------------------------ */

/* Every string option of every command (the tables the CLI parses with)
 * given '' is refused by name before anything runs. An unknown option
 * follows, so that a tool that took '' would still stop before writing. */
static void test_empty_values(void)
{
    attn_opts ao;
    check_opts co;
    bench_args bo;
    demo_opts dmo;
    layer_opts lo;
    plan_opts po;
    info_opts io;
    fxt_opt t[FXT_MAX_OPTS];
    const char *cmds[7] = {"attn", "check", "bench", "demo", "layer", "plan", "info"};
    int tried = 0;
    for (int c = 0; c < 7; c++) {
        switch (c) {
        case 0: fxt_attn_opts_table(&ao, t); break;
        case 1: fxt_check_opts_table(&co, t); break;
        case 2: fxt_bench_args_table(&bo, t); break;
        case 3: fxt_demo_opts_table(&dmo, t); break;
        case 4: fxt_layer_opts_table(&lo, t); break;
        case 5: fxt_plan_opts_table(&po, t); break;
        default: fxt_info_opts_table(&io, t); break;
        }
        for (int i = 0; t[i].name; i++) {
            if (t[i].kind == FXT_OPT_FLAG)
                continue;
            char label[128];
            snprintf(label, sizeof label, "D1 %s %s ''", cmds[c], t[i].name);
            const fail_case fc = {label, 2, t[i].name, NULL};
            const char *args[] = {cmds[c], t[i].name, "", "--no-such-option", NULL};
            expect_fail_args(&fc, args);
            tried++;
        }
    }
    CHECK(tried >= 30, "[D1] only %d options with values were tried", tried);

    /* Whole command lines: the empty path is refused as such. */
    run_result r;
    const char *q = IN("q.npy"), *k = IN("k.npy"), *v = IN("v.npy");
    clear_dir(g_out_dir);
    run_expect("D2 attn -o ''", 2, "-o: the value is empty", 30.0, &r, "attn", "-q", q, "-k", k,
               "-v", v, "-o", "", (const char *)NULL);
    run_free(&r);
    run_expect("D3 attn --lse ''", 2, "--lse: the value is empty", 30.0, &r, "attn", "-q", q, "-k",
               k, "-v", v, "-o", g_out, "--lse", "", (const char *)NULL);
    run_free(&r);
    CHECK(!file_exists(g_out), "[D2, D3] an output was written");
}

/* Every output is checked before any is written: a device output is not
 * streamed when another output cannot be written, and no output may be an
 * input, whatever path names it. */
static void test_outputs_checked_first(void)
{
    run_result r;
    const char *q = IN("q.npy"), *k = IN("k.npy"), *v = IN("v.npy");
    const char *nodir_lse = join(g_out_dir, "nodir/l.npy");
    clear_dir(g_out_dir);
    /* An output that is a link to a file is written through the link, which
     * stays: also a link to /proc/self/fd/1 (what /dev/stdout is) while
     * stdout goes to a file. */
    clear_dir(g_out_dir);
    const char *real = join(g_out_dir, "real.npy");
    const char *via = join(g_out_dir, "via_link.npy");
    const char *fd1 = join(g_out_dir, "fd1.npy");
    write_bytes(real, "old", 3);
    CHECK(symlink("real.npy", via) == 0 && symlink("/proc/self/fd/1", fd1) == 0, "symlink: %s",
          strerror(errno));
    const int64_t os[4] = {PB, PSQ, PHQ, PD};
    struct stat ls;
    fxa_npy got;
    if (run_ok("D23 -o a link to a file", &r, "attn", "-q", q, "-k", k, "-v", v, "-o", via,
               (const char *)NULL) &&
        read_output("D23", real, 4, os, &got))
        fxa_npy_free(&got);
    CHECK(lstat(via, &ls) == 0 && S_ISLNK(ls.st_mode), "[D23] the link was replaced");
    run_free(&r);
    if (run_ok("D24 -o a link to /proc/self/fd/1, stdout a file", &r, "attn", "-q", q, "-k", k,
               "-v", v, "-o", fd1, (const char *)NULL))
        CHECK(memcmp(r.out, "\x93NUMPY", 6) == 0, "[D24] stdout does not hold the .npy");
    CHECK(lstat(fd1, &ls) == 0 && S_ISLNK(ls.st_mode), "[D24] the link was replaced");
    run_free(&r);
    clear_dir(g_out_dir);

    if (run_expect("D4 -o /dev/stdout --lse into a missing folder", 2, "nodir", 30.0, &r, "attn",
                   "-q", q, "-k", k, "-v", v, "-o", "/dev/stdout", "--lse", nodir_lse,
                   (const char *)NULL))
        CHECK(r.out[0] == 0, "[D4] something was written to stdout before the error (%zu bytes)",
              strlen(r.out));
    run_free(&r);
    const char *lse_dir = join(g_out_dir, "a_folder");
    CHECK(mkdir(lse_dir, 0755) == 0, "mkdir: %s", strerror(errno));
    if (run_expect("D5 -o /dev/stdout --lse a folder", 2, "folder", 30.0, &r, "attn", "-q", q, "-k",
                   k, "-v", v, "-o", "/dev/stdout", "--lse", lse_dir, (const char *)NULL))
        CHECK(r.out[0] == 0, "[D5] something was written to stdout before the error");
    run_free(&r);

    /* An output that is an input: refused, the input unchanged. */
    size_t n0 = 0, n1 = 0;
    unsigned char *before = read_bytes(q, &n0);
    const char *q_other = join(g_in_dir, "../in/./q.npy");
    const char *q_link = join(g_out_dir, "q_link.npy");
    CHECK(symlink(q, q_link) == 0, "symlink: %s", strerror(errno));
    const char *aliases[3] = {q, q_other, q_link};
    for (int i = 0; i < 3; i++) {
        run_expect("D6 -o names the input -q", 2, "is the input -q", 30.0, &r, "attn", "-q", q,
                   "-k", k, "-v", v, "-o", aliases[i], (const char *)NULL);
        run_free(&r);
        run_expect("D7 --lse names an input", 2, i ? "is the input -q" : "is the input -v", 30.0,
                   &r, "attn", "-q", q, "-k", k, "-v", v, "-o", g_out, "--lse",
                   aliases[i] == q ? v : aliases[i], (const char *)NULL);
        run_free(&r);
    }
    unsigned char *after = read_bytes(q, &n1);
    CHECK(before && after && n0 == n1 && memcmp(before, after, n0) == 0,
          "[D6] the input q.npy was changed");
    free(before);
    free(after);
    CHECK(!file_exists(g_out), "[D7] -o was written although --lse was refused");
    run_expect("D8 layer -o names -x", 2, "is the input -x", 30.0, &r, "layer", "-x", q, "--grid",
               "1,1,37", "-o", q_other, (const char *)NULL);
    run_free(&r);

    /* layer -o onto the checkpoint file a --weights folder holds. */
    const char *ck_dir = join(g_out_dir, "ckpt");
    const char *ck_file = join(ck_dir, "model.safetensors");
    const char json[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    unsigned char ck[8 + sizeof json + 4] = {0};
    ck[0] = (unsigned char)(sizeof json - 1);
    memcpy(ck + 8, json, sizeof json - 1);
    CHECK(mkdir(ck_dir, 0755) == 0, "mkdir: %s", strerror(errno));
    write_bytes(ck_file, ck, 8 + sizeof json - 1 + 4);
    run_expect("D22 layer -o onto a file of the --weights folder", 2, "of the checkpoint", 30.0, &r,
               "layer", "--weights", ck_dir, "-o", join(ck_dir, "./model.safetensors"),
               (const char *)NULL);
    run_free(&r);
    size_t ck_len = 0;
    unsigned char *ck_after = read_bytes(ck_file, &ck_len);
    CHECK(ck_after && ck_len == 8 + sizeof json - 1 + 4 && memcmp(ck_after, ck, ck_len) == 0,
          "[D22] the checkpoint file was changed");
    free(ck_after);

    /* demo --save-inputs: the folder exists, and every file can be written. */
    run_expect("D9 demo --save-inputs into a missing folder", 2, "--save-inputs", 30.0, &r, "demo",
               "--frames", "1", "--height", "2", "--width", "2", "--heads", "1", "--dim", "8",
               "--save-inputs", join(g_out_dir, "nodir"), (const char *)NULL);
    run_free(&r);
    clear_dir(g_out_dir);
    const char *v_dir = join(g_out_dir, "v.npy");
    CHECK(mkdir(v_dir, 0755) == 0, "mkdir: %s", strerror(errno));
    run_expect("D10 demo --save-inputs where v.npy is a folder", 2, "v.npy", 30.0, &r, "demo",
               "--frames", "1", "--height", "2", "--width", "2", "--heads", "1", "--dim", "8",
               "--save-inputs", g_out_dir, (const char *)NULL);
    CHECK(!file_exists(join(g_out_dir, "q.npy")) && !file_exists(join(g_out_dir, "k.npy")),
          "[D10] q.npy or k.npy was written");
    run_free(&r);
    clear_dir(g_out_dir);
}

/* Number options: each refusal says why; values in range are taken. */
static void test_number_messages(void)
{
    run_result r;
    const char *q = IN("q.npy"), *k = IN("k.npy"), *v = IN("v.npy");
    clear_dir(g_out_dir);
    run_expect("D11 --scale subnormal", 2, "too small", 30.0, &r, ATTN3(q, k, v), "--scale",
               "4.9e-324", (const char *)NULL);
    run_free(&r);
    run_expect("D12 --scale 1e999", 2, "too large", 30.0, &r, ATTN3(q, k, v), "--scale", "1e999",
               (const char *)NULL);
    run_free(&r);
    run_expect("D13 --scale 0.5x", 2, "characters follow", 30.0, &r, ATTN3(q, k, v), "--scale",
               "0.5x", (const char *)NULL);
    run_free(&r);
    run_expect("D14 --scale inf", 2, "not a finite number", 30.0, &r, ATTN3(q, k, v), "--scale",
               "inf", (const char *)NULL);
    run_free(&r);
    run_expect("D15 --threads 2x", 2, "characters follow", 30.0, &r, ATTN3(q, k, v), "--threads",
               "2x", (const char *)NULL);
    run_free(&r);
    run_expect("D16 --threads 1e30", 2, "out of range", 30.0, &r, ATTN3(q, k, v), "--threads",
               "99999999999999999999", (const char *)NULL);
    run_free(&r);
    CHECK(!file_exists(g_out), "[D11..D16] an output was written");
    run_expect("D17 plan --link-gbps 1e308", 2, "out of range", 30.0, &r, "plan", "--ranks", "8",
               "--gflops", "100", "--link-gbps", "1e308", (const char *)NULL);
    run_free(&r);
    run_expect("D18 plan --gflops 1e308", 2, "out of range", 30.0, &r, "plan", "--ranks", "8",
               "--gflops", "1e308", (const char *)NULL);
    run_free(&r);
    /* A path with a newline and an escape: still one error line. */
    run_expect("D20 a newline in a path", 2, "no_such?fxattn: error: forged.npy", 30.0, &r,
               ATTN3(IN("no_such\nfxattn: error: forged.npy"), k, v), (const char *)NULL);
    run_free(&r);
    run_expect("D21 an escape in an option value", 2, "?[2J", 30.0, &r, ATTN3(q, k, v), "--mode",
               "\033[2J", (const char *)NULL);
    run_free(&r);
    run_ok("D19 plan --link-gbps 1e300", &r, "plan", "--ranks", "8", "--hosts", "2", "--gflops",
           "100", "--link-gbps", "1e300", (const char *)NULL);
    run_free(&r);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s /path/to/fxattn\n", argv[0]);
        return 2;
    }
    g_tool = argv[1];
    if (access(g_tool, X_OK) != 0) {
        fprintf(stderr, "test_cli: %s is not an executable: %s\n", g_tool, strerror(errno));
        return 1;
    }
    snprintf(g_root, sizeof g_root, "/tmp/test_cli.XXXXXX");
    if (!mkdtemp(g_root)) {
        fprintf(stderr, "test_cli: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    g_in_dir = xjoin(g_root, "in");
    g_out_dir = xjoin(g_root, "out");
    g_cap_dir = xjoin(g_root, "cap");
    if (mkdir(g_in_dir, 0755) || mkdir(g_out_dir, 0755) || mkdir(g_cap_dir, 0755))
        die("mkdir: %s", strerror(errno));
    g_out = xjoin(g_out_dir, "out.npy");
    g_lse = xjoin(g_out_dir, "lse.npy");
    g_stdin_path = xjoin(g_cap_dir, "stdin");
    g_stdout_path = xjoin(g_cap_dir, "stdout");
    g_stderr_path = xjoin(g_cap_dir, "stderr");
    write_bytes(g_stdin_path, "", 0);

    /* Modest N(0,1) inputs. */
    fxt_rng rng;
    fxt_rng_seed(&rng, 20240917);
    for (size_t i = 0; i < NQ; i++)
        g_q[i] = (float)fxt_rng_normal(&rng);
    for (size_t i = 0; i < NKV; i++)
        g_k[i] = (float)fxt_rng_normal(&rng);
    for (size_t i = 0; i < NKV; i++)
        g_v[i] = (float)fxt_rng_normal(&rng);
    {
        const int64_t qs[4] = {PB, PSQ, PHQ, PD};
        const int64_t ks[4] = {PB, PSKV, PHKV, PD};
        write_f32(IN("q.npy"), 4, qs, g_q);
        write_f32(IN("k.npy"), 4, ks, g_k);
        write_f32(IN("v.npy"), 4, ks, g_v);
    }

    const double t0 = now_s();
    test_good_runs();
    test_bad_input();
    test_output_failures();
    test_hostile();
    test_empty_values();
    test_outputs_checked_first();
    test_number_messages();
    printf("test_cli: %.1f s\n", now_s() - t0);

    if (g_failures == 0) {
        if (rm_tree(g_root) != 0)
            fprintf(stderr, "test_cli: could not remove %s\n", g_root);
    } else {
        printf("test_cli: temporary folder kept for inspection: T=%s\n", g_root);
    }
    for (int i = 0; i < g_npaths; i++)
        free(g_paths[i]);
    free(g_in_dir);
    free(g_out_dir);
    free(g_cap_dir);
    free(g_out);
    free(g_lse);
    free(g_stdin_path);
    free(g_stdout_path);
    free(g_stderr_path);
    free(g_old_out);
    free(g_old_lse);
    free(g_run_out);
    free(g_run_lse);
    return test_summary("test_cli");
}
