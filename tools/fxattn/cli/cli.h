/*
 * Shared pieces of the fxattn subcommands: the option parser, error
 * reporting with the CLI's exit codes, and helpers that turn a library
 * status into an exit code.
 */
#ifndef FXT_CLI_H
#define FXT_CLI_H

#include <stdint.h>

#include "fxattn.h"

/* Exit codes (README.md, "Command line"): 0 success, 2 bad usage or bad input, 1 other. */
enum { FXT_EXIT_OK = 0, FXT_EXIT_FAILURE = 1, FXT_EXIT_BAD_INPUT = 2 };

typedef enum fxt_opt_kind {
    FXT_OPT_FLAG = 0,   /* int, set to 1 */
    FXT_OPT_STRING = 1, /* const char * */
    FXT_OPT_INT = 2,    /* int64_t, in [min, max] */
    FXT_OPT_DOUBLE = 3  /* double, finite */
} fxt_opt_kind;

typedef struct fxt_opt {
    const char *name;  /* "--threads" */
    const char *alias; /* "-t" or NULL */
    fxt_opt_kind kind;
    void *dest;
    int64_t min; /* FXT_OPT_INT only */
    int64_t max;
} fxt_opt;

/* Parse argv[first..argc) against opts (terminated by a zeroed entry).
 * Returns 0, or prints "fxattn: error: ..." and returns FXT_EXIT_BAD_INPUT. */
int fxt_parse_options(const char *cmd, int argc, char **argv, int first, const fxt_opt *opts);

/* Print "fxattn: error: <message>" to stderr and return code. */
int fxt_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* While buf is set (cap > 0), fxt_fail stores its first message there
 * instead of printing: distributed commands agree on one message across
 * ranks and print it once. fxt_fail_capture(NULL, 0) prints again. */
void fxt_fail_capture(char *buf, size_t cap);

/* Exit code for a library status: invalid input -> 2, anything else -> 1. */
int fxt_exit_code(fxa_status st);

/* Parse "bshd"/"bhsd", "auto"/"online", "on"/"off", "f32"/"bf16"/"f16",
 * "auto"/"fp32"/"bf16" (compute).
 * Return 0 on success, else print an error and return FXT_EXIT_BAD_INPUT. */
int fxt_parse_layout(const char *s, fxa_layout *out);
int fxt_parse_mode(const char *s, fxa_mode *out);
int fxt_parse_onoff(const char *opt, const char *s, int *out);
int fxt_parse_dtype(const char *s, fxa_dtype *out);
int fxt_parse_compute(const char *s, fxa_compute *out);
const char *fxt_dtype_name(fxa_dtype t);

/* A path and the option that named it ("-o", "--lse"); path NULL: not given. */
typedef struct fxt_path {
    const char *opt;
    const char *path;
} fxt_path;

#define FXT_MAX_OUTPUTS 8

/* Before any work: every output given can be written (fxa_output_check),
 * no two outputs name the same file and no output is one of the inputs.
 * Returns 0, or prints "fxattn: error: <cmd> <option>: ..." and returns
 * FXT_EXIT_BAD_INPUT. */
int fxt_check_outputs(const char *cmd, const fxt_path *outs, int n_outs, const fxt_path *ins,
                      int n_ins);

/* The output is none of the files of the checkpoint `weights` (a file,
 * an index or a folder: fxattn_checkpoint.h), its shards included.
 * Returns 0 (also when the checkpoint cannot be opened: its loader reports
 * that), or prints the error and returns FXT_EXIT_BAD_INPUT. */
int fxt_check_output_vs_checkpoint(const char *cmd, const fxt_path *out, const fxt_path *weights);

/* One '<f4' output: its path, shape and data. */
typedef struct fxt_npy_out {
    const char *path;
    int ndim;
    const int64_t *shape;
    const float *data;
} fxt_npy_out;

/* Write n (at most FXT_MAX_OUTPUTS) outputs all or nothing: staged next to
 * their targets (files first, devices and FIFOs, written in place, last)
 * and committed together. Returns 0 or prints the error and returns
 * FXT_EXIT_FAILURE. */
int fxt_write_npy_outputs(const fxt_npy_out *outs, int n);

/* printf to stdout for JSON output: every number printed as inf, -inf, nan
 * or -nan (outside strings) becomes null, so that --json and --stats stay
 * valid JSON on any input. */
void fxt_json_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Memory check: when need_bytes (per process) exceeds what this process
 * may use (fxa_available_memory(), shared evenly by `sharers` processes on
 * the node, e.g. the MPI ranks of a node; 1 otherwise), prints "fxattn:
 * error: needs X GiB, Y GiB available (what)" and returns
 * FXT_EXIT_FAILURE; 0 when it fits. Commands call it with their estimate
 * before allocating anything large. (Defined in runner.c.) */
int fxt_check_memory(double need_bytes, int sharers, const char *what);

#endif
