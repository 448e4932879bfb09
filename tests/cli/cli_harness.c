/* The harness of test_cli (cli_harness.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "cli_harness.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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

#include "cli_npy.h"
#include "testfiles.h"
#include "testutil.h"

extern char **environ;

const int64_t g_qshape[4] = {PB, PSQ, PHQ, PD};
const int64_t g_kvshape[4] = {PB, PSKV, PHKV, PD};
float g_q[NQ], g_k[NKV], g_v[NKV];

const char *g_in_dir;
const char *g_out_dir;
const char *g_out;
const char *g_lse;

static const char *g_tool;
static char g_root[64];
static const char *g_stdin_path;
static const char *g_stdout_path;
static const char *g_stderr_path;

static char *g_paths[1024];
static int g_npaths;

/* ------------------------------------------------------------------------ */
/* Paths and files                                                           */
/* ------------------------------------------------------------------------ */

void die(const char *fmt, ...)
{
    va_list ap;
    fputs("test_cli: setup failed: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\ntest_cli: temporary folder kept: %s\n", g_root);
    exit(1);
}

const char *join(const char *dir, const char *name)
{
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = malloc(n);
    if (!p || g_npaths == (int)(sizeof g_paths / sizeof g_paths[0]))
        die("out of memory for paths");
    snprintf(p, n, "%s/%s", dir, name);
    g_paths[g_npaths++] = p;
    return p;
}

const char *IN(const char *name)
{
    return join(g_in_dir, name);
}

void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        die("cannot create %s: %s", path, strerror(errno));
    if ((n && fwrite(data, 1, n, f) != n) || fclose(f) != 0)
        die("cannot write %s", path);
}

unsigned char *read_bytes(const char *path, size_t *len)
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

int file_holds(const char *path, const void *want, size_t n)
{
    size_t len;
    unsigned char *got = read_bytes(path, &len);
    const int same = got && want && len == n && memcmp(got, want, n) == 0;
    free(got);
    return same;
}

int file_exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

void clear_dir(const char *dir)
{
    DIR *dp = opendir(dir);
    struct dirent *e;
    if (!dp)
        die("cannot open %s: %s", dir, strerror(errno));
    while ((e = readdir(dp)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char p[TEST_PATH_CAP];
        test_path_join(p, dir, e->d_name);
        test_remove_tree(p);
        if (file_exists(p))
            die("cannot remove %s", p);
    }
    closedir(dp);
}

/* ------------------------------------------------------------------------ */
/* Text                                                                      */
/* ------------------------------------------------------------------------ */

int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

int has_error_line(const char *text)
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

int mentions(const char *text, const char *word)
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

void format_shape(const int64_t *shape, int ndim, char *buf, size_t cap)
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
/* Running the tool                                                          */
/* ------------------------------------------------------------------------ */

void run_free(run_result *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

void format_cmd(const char *const *args, char *buf, size_t cap)
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

double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Wait for pid, killing it after TOOL_TIMEOUT_S; its status in r. */
static void wait_tool(pid_t pid, run_result *r)
{
    int status = 0;
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
}

void run_tool(const char *const *args, run_result *r)
{
    char *argv[MAX_ARGS + 2];
    int n = 0;
    posix_spawn_file_actions_t fa;
    pid_t pid;
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
    wait_tool(pid, r);
    size_t len;
    r->out = (char *)read_bytes(g_stdout_path, &len);
    r->err = (char *)read_bytes(g_stderr_path, &len);
    if (!r->out || !r->err)
        die("cannot read the captured output");
}

const char *describe_exit(const run_result *r, char *buf, size_t cap)
{
    if (r->timed_out)
        snprintf(buf, cap, "a hang (killed after %.0f s)", TOOL_TIMEOUT_S);
    else if (r->sig)
        snprintf(buf, cap, "death by signal %d (%s)", r->sig, strsignal(r->sig));
    else
        snprintf(buf, cap, "exit %d", r->code);
    return buf;
}

int run_ok(const char *label, run_result *r, const char *const *args)
{
    char cmd[4096];
    char how[128];
    run_result own;
    run_result *res = r ? r : &own;
    format_cmd(args, cmd, sizeof cmd);
    run_tool(args, res);
    const int ok = res->code == 0;
    CHECK(ok, "[%s] %s\n    expected exit 0, got %s\n    stderr: %s", label, cmd,
          describe_exit(res, how, sizeof how), res->err);
    if (ok)
        CHECK(!has_error_line(res->err), "[%s] %s\n    exit 0 but stderr has an error line: %s",
              label, cmd, res->err);
    if (!r)
        run_free(&own);
    return ok;
}

int run_expect(const char *label, int want, const char *mention, double seconds, run_result *r,
               const char *const *args)
{
    char cmd[4096], how[128];
    run_result own;
    run_result *res = r ? r : &own;
    format_cmd(args, cmd, sizeof cmd);
    const double t0 = now_s();
    run_tool(args, res);
    const double took = now_s() - t0;
    int ok = res->code == want && took <= seconds;
    CHECK(ok, "[%s] %s\n    expected exit %d within %.0f s, got %s after %.1f s\n    stderr: %s",
          label, cmd, want, seconds, describe_exit(res, how, sizeof how), took, res->err);
    if (ok && want != 0) {
        ok = starts_with(res->err, ERR_PREFIX) && strstr(res->err, mention) &&
             strchr(res->err, '\n') == strrchr(res->err, '\n');
        CHECK(ok, "[%s] expected one error line mentioning '%s', got: %s", label, mention,
              res->err);
    }
    if (!r)
        run_free(&own);
    return ok;
}

/* ------------------------------------------------------------------------ */
/* Set-up and tear-down                                                      */
/* ------------------------------------------------------------------------ */

void cli_setup(const char *tool)
{
    g_tool = tool;
    if (access(g_tool, X_OK) != 0) {
        fprintf(stderr, "test_cli: %s is not an executable: %s\n", g_tool, strerror(errno));
        exit(1);
    }
    snprintf(g_root, sizeof g_root, "/tmp/test_cli.XXXXXX");
    if (!mkdtemp(g_root)) {
        fprintf(stderr, "test_cli: mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
    g_in_dir = join(g_root, "in");
    g_out_dir = join(g_root, "out");
    const char *cap_dir = join(g_root, "cap");
    if (mkdir(g_in_dir, 0755) || mkdir(g_out_dir, 0755) || mkdir(cap_dir, 0755))
        die("mkdir: %s", strerror(errno));
    g_out = join(g_out_dir, "out.npy");
    g_lse = join(g_out_dir, "lse.npy");
    g_stdin_path = join(cap_dir, "stdin");
    g_stdout_path = join(cap_dir, "stdout");
    g_stderr_path = join(cap_dir, "stderr");
    write_bytes(g_stdin_path, "", 0);

    fxt_rng rng;
    fxt_rng_seed(&rng, 20240917);
    for (size_t i = 0; i < NQ; i++)
        g_q[i] = (float)fxt_rng_normal(&rng);
    for (size_t i = 0; i < NKV; i++)
        g_k[i] = (float)fxt_rng_normal(&rng);
    for (size_t i = 0; i < NKV; i++)
        g_v[i] = (float)fxt_rng_normal(&rng);
    write_f32(IN("q.npy"), 4, g_qshape, g_q);
    write_f32(IN("k.npy"), 4, g_kvshape, g_k);
    write_f32(IN("v.npy"), 4, g_kvshape, g_v);
}

int cli_finish(void)
{
    if (g_failures == 0) {
        test_remove_tree(g_root);
        if (file_exists(g_root))
            fprintf(stderr, "test_cli: could not remove %s\n", g_root);
    } else {
        printf("test_cli: temporary folder kept for inspection: T=%s\n", g_root);
    }
    for (int i = 0; i < g_npaths; i++)
        free(g_paths[i]);
    g_npaths = 0;
    return test_summary("test_cli");
}
