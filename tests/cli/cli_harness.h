/*
 * The harness of test_cli: a temporary folder (in/ for inputs, out/ for
 * outputs, cap/ for the captured stdout and stderr), the shared problem and
 * its input files, and runs of the fxattn binary through posix_spawn (no
 * shell) with their exit status and output.
 */
#ifndef FXA_CLI_HARNESS_H
#define FXA_CLI_HARNESS_H

#include <stddef.h>
#include <stdint.h>

#define MAX_ARGS 48
#define TOOL_TIMEOUT_S 60.0
#define ERR_PREFIX "fxattn: error: "

/* A NULL-terminated argument list (argv[0] excluded) of string literals and
 * paths: ARGV("attn", "-q", q). */
#define ARGV(...) ((const char *const[]){__VA_ARGS__, NULL})

/* The problem: Q [1,37,4,16], K/V [1,53,2,16] (GQA, 2 q heads per kv head). */
enum { PB = 1, PSQ = 37, PHQ = 4, PSKV = 53, PHKV = 2, PD = 16 };
#define NQ ((size_t)PB * PSQ * PHQ * PD)
#define NKV ((size_t)PB * PSKV * PHKV * PD)
extern const int64_t g_qshape[4];  /* bshd shape of Q */
extern const int64_t g_kvshape[4]; /* bshd shape of K and V */
/* Modest N(0,1) values, written to in/q.npy, in/k.npy and in/v.npy. */
extern float g_q[NQ], g_k[NKV], g_v[NKV];

extern const char *g_in_dir;  /* in/ */
extern const char *g_out_dir; /* out/ */
extern const char *g_out;     /* out/out.npy */
extern const char *g_lse;     /* out/lse.npy */

/* The usual attn command line on the inputs Q, K, V, writing g_out and g_lse. */
#define ATTN3(Q, K, V) "attn", "-q", (Q), "-k", (K), "-v", (V), "-o", g_out, "--lse", g_lse

/* Make the temporary folder and the problem's input files for the binary
 * tool; exits the process when it cannot. */
void cli_setup(const char *tool);
/* Remove the temporary folder unless a check failed, free the harness's
 * memory; the test's exit status. */
int cli_finish(void);

/* Print the reason, keep the temporary folder and exit 1. */
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* dir + "/" + name, freed by cli_finish. */
const char *join(const char *dir, const char *name);
/* in/ + name. */
const char *IN(const char *name);

void write_bytes(const char *path, const void *data, size_t n);
/* Whole file, NUL-terminated; NULL (and *len 0) when it cannot be read. */
unsigned char *read_bytes(const char *path, size_t *len);
/* 1 when path can be read and holds exactly the n bytes of want (not NULL). */
int file_holds(const char *path, const void *want, size_t n);
int file_exists(const char *path);
/* Remove everything inside dir (dir itself stays). */
void clear_dir(const char *dir);

int starts_with(const char *s, const char *prefix);
/* Some line of text starts with ERR_PREFIX. */
int has_error_line(const char *text);
/* word occurs in text not glued to other letters/digits (options such as
 * "--threads" are matched as substrings). */
int mentions(const char *text, const char *word);

/* numpy's text of a shape: "(1, 37, 4, 16)", "(5,)". */
void format_shape(const int64_t *shape, int ndim, char *buf, size_t cap);

typedef struct run_result {
    int code;      /* exit status; -1 when killed */
    int sig;       /* signal that killed it, or 0 */
    int timed_out; /* killed after TOOL_TIMEOUT_S */
    char *out;     /* captured stdout, NUL-terminated */
    char *err;     /* captured stderr */
} run_result;

void run_free(run_result *r);
double now_s(void);
/* "fxattn attn -q $T/in/q.npy ...", with the temporary folder shown as $T. */
void format_cmd(const char *const *args, char *buf, size_t cap);
/* Run the tool with args; stdin is an empty file, stdout and stderr are
 * captured; killed after TOOL_TIMEOUT_S. */
void run_tool(const char *const *args, run_result *r);
/* "exit 2", "death by signal 11 (...)" or "a hang (...)". */
const char *describe_exit(const run_result *r, char *buf, size_t cap);

/* Run; check exit 0 with no error line. Returns 1 on success; r (NULL: freed
 * here) holds the run. */
int run_ok(const char *label, run_result *r, const char *const *args);
/* Run; 1 when it exited `want` (and, for a failure, printed one
 * "fxattn: error:" line mentioning `mention`) within `seconds`; r (NULL:
 * freed here) holds the run. */
int run_expect(const char *label, int want, const char *mention, double seconds, run_result *r,
               const char *const *args);

#endif
