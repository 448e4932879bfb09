/*
 * libFuzzer target for the fxattn option parser (tools/fxattn/cli/cli_args.c).
 *
 * Contract: an input is a command line after "fxattn", as in /proc/PID/cmdline: arguments
 * each ended by a NUL byte (the last one may lack it); at most MAX_ARGS arguments of at most
 * MAX_ARG_LEN bytes are kept (longer ones are cut, the rest is ignored). Each argument gets
 * its own exact-size heap copy, so reading past its NUL is an ASan error. If the first
 * argument names a subcommand, its option table is used; otherwise every table is tried.
 * fxt_parse_options runs from argv[2] as the subcommands call it, then the value parsers
 * (layout/mode/onoff/dtype/compute) run on the strings it stored. Checked (__builtin_trap):
 *  - the return code and every stored value match a small model of the parser (exact name or
 *    alias, flags set 1, values from the next argument, integers in [min, max], doubles
 *    finite, the last occurrence wins, parsing stops at the first error);
 *  - a stored string is the default or one of argv[2..argc) itself (no copy, no overread);
 *  - each value parser returns 0 with the enum the spelling names, or FXT_EXIT_BAD_INPUT
 *    with its output untouched.
 * The defaults and option tables are the commands' own (tools/fxattn/cli/cmd_opts.c, which
 * tools/fxattn/cmd/cmd_{attn,check,bench,demo,layer,info}.c parse with), so they cannot drift.
 * fxt_fail writes to stderr: the stderr stream is pointed at /dev/null once at start
 * (libFuzzer and the sanitizers keep writing to file descriptor 2).
 * Nothing here writes a file.
 */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cmd_opts.h"

#define MAX_ARGS 32
#define MAX_ARG_LEN 256

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_NAME "fuzz_args"
#include "fuzz_check.h"

/* ---- the option tables (tools/fxattn/cli/cmd_opts.c) ------------------------------------ */

typedef struct all_opts {
    attn_opts attn;
    check_opts check;
    bench_args bench;
    demo_opts demo;
    layer_opts layer;
    plan_opts plan;
    info_opts info;
} all_opts;

enum { CMD_ATTN, CMD_CHECK, CMD_BENCH, CMD_DEMO, CMD_LAYER, CMD_PLAN, CMD_INFO, CMD_COUNT };
static const char *const g_cmd_names[CMD_COUNT] = {"attn",  "check", "bench", "demo",
                                                   "layer", "plan",  "info"};

/* The defaults of cmd and its table (zero-terminated, at most FXT_MAX_OPTS entries) over a,
 * as the command sets them up before parsing. */
static void make_table(int cmd, all_opts *a, fxt_opt opts[FXT_MAX_OPTS])
{
    memset(a, 0, sizeof *a);
    switch (cmd) {
    case CMD_ATTN:
        fxt_attn_opts_defaults(&a->attn);
        fxt_attn_opts_table(&a->attn, opts);
        break;
    case CMD_CHECK:
        fxt_check_opts_defaults(&a->check);
        fxt_check_opts_table(&a->check, opts);
        break;
    case CMD_BENCH:
        fxt_bench_args_defaults(&a->bench);
        fxt_bench_args_table(&a->bench, opts);
        break;
    case CMD_DEMO:
        fxt_demo_opts_defaults(&a->demo);
        fxt_demo_opts_table(&a->demo, opts);
        break;
    case CMD_LAYER:
        fxt_layer_opts_defaults(&a->layer);
        fxt_layer_opts_table(&a->layer, opts);
        break;
    case CMD_PLAN:
        fxt_plan_opts_defaults(&a->plan);
        fxt_plan_opts_table(&a->plan, opts);
        break;
    default:
        fxt_info_opts_defaults(&a->info);
        fxt_info_opts_table(&a->info, opts);
        break;
    }
}

/* ---- a model of fxt_parse_options --------------------------------------------------- */

/* One stored value, whatever its kind. */
typedef union value {
    const char *s;
    int64_t i;
    double d;
    int flag;
} value;

static value load(const fxt_opt *o)
{
    value v;
    memset(&v, 0, sizeof v);
    switch (o->kind) {
    case FXT_OPT_STRING: v.s = *(const char *const *)o->dest; break;
    case FXT_OPT_INT: v.i = *(const int64_t *)o->dest; break;
    case FXT_OPT_DOUBLE: v.d = *(const double *)o->dest; break;
    case FXT_OPT_FLAG: v.flag = *(const int *)o->dest; break;
    }
    return v;
}

static int same_value(fxt_opt_kind kind, value a, value b)
{
    switch (kind) {
    case FXT_OPT_STRING: return a.s == b.s;
    case FXT_OPT_INT: return a.i == b.i;
    case FXT_OPT_DOUBLE:
        return memcmp(&a.d, &b.d, sizeof a.d) == 0; /* NaN (not given) equals itself */
    case FXT_OPT_FLAG: return a.flag == b.flag;
    }
    return 0;
}

/* What fxt_parse_options should return and store, from the values before the call (in
 * expect[]). Independent of cli_args.c except for the C library's strtoll/strtod. */
static int model_parse(int argc, char **argv, int first, const fxt_opt *opts, value *expect)
{
    for (int i = first; i < argc; i++) {
        int found = -1;
        for (int j = 0; opts[j].name != NULL; j++) {
            if (strcmp(argv[i], opts[j].name) == 0 ||
                (opts[j].alias != NULL && strcmp(argv[i], opts[j].alias) == 0)) {
                found = j;
                break;
            }
        }
        if (found < 0) {
            return FXT_EXIT_BAD_INPUT;
        }
        const fxt_opt *o = &opts[found];
        if (o->kind == FXT_OPT_FLAG) {
            expect[found].flag = 1;
            continue;
        }
        if (i + 1 >= argc) {
            return FXT_EXIT_BAD_INPUT;
        }
        const char *val = argv[++i];
        char *end = NULL;
        errno = 0;
        if (val[0] == '\0') { /* an empty value is refused, whatever its kind */
            return FXT_EXIT_BAD_INPUT;
        }
        if (o->kind == FXT_OPT_STRING) {
            expect[found].s = val;
        } else if (o->kind == FXT_OPT_INT) {
            long long v = strtoll(val, &end, 10);
            if (errno != 0 || end == val || *end != '\0' || v < o->min || v > o->max) {
                return FXT_EXIT_BAD_INPUT;
            }
            expect[found].i = (int64_t)v;
        } else {
            double v = strtod(val, &end);
            if (errno != 0 || end == val || *end != '\0' || !isfinite(v)) {
                return FXT_EXIT_BAD_INPUT;
            }
            expect[found].d = v;
        }
    }
    return 0;
}

/* ---- the value parsers -------------------------------------------------------------- */

#define UNTOUCHED (-7) /* a value parser's output before the call */

/* A spelling a value parser accepts, and the value it names. */
typedef struct spelling {
    const char *text;
    int value;
} spelling;

/* A value parser given s returned r and left its output at out (UNTOUCHED before the call):
 * when s is one of known[0..n), 0 and that spelling's value; else FXT_EXIT_BAD_INPUT with the
 * output untouched. */
static void check_parsed(const char *s, int r, int out, const spelling *known, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(s, known[i].text) == 0) {
            CHECK(r == 0 && out == known[i].value);
            return;
        }
    }
    CHECK(r == FXT_EXIT_BAD_INPUT && out == UNTOUCHED);
}

static void check_value_parsers(const char *s)
{
    static const spelling layouts[] = {{"bshd", FXA_LAYOUT_BSHD}, {"bhsd", FXA_LAYOUT_BHSD}};
    static const spelling modes[] = {{"auto", FXA_MODE_AUTO}, {"online", FXA_MODE_ONLINE}};
    static const spelling onoffs[] = {{"on", 1}, {"off", 0}};
    static const spelling dtypes[] = {{"f32", FXA_F32}, {"bf16", FXA_BF16}, {"f16", FXA_F16}};
    static const spelling computes[] = {
        {"fp32", FXA_COMPUTE_FP32}, {"bf16", FXA_COMPUTE_BF16}, {"auto", FXA_COMPUTE_AUTO}};
    if (s == NULL) {
        return;
    }
    fxa_layout layout = (fxa_layout)UNTOUCHED;
    int r = fxt_parse_layout(s, &layout);
    check_parsed(s, r, (int)layout, layouts, sizeof layouts / sizeof layouts[0]);

    fxa_mode mode = (fxa_mode)UNTOUCHED;
    r = fxt_parse_mode(s, &mode);
    check_parsed(s, r, (int)mode, modes, sizeof modes / sizeof modes[0]);

    int onoff = UNTOUCHED;
    r = fxt_parse_onoff("--center", s, &onoff);
    check_parsed(s, r, onoff, onoffs, sizeof onoffs / sizeof onoffs[0]);

    fxa_dtype dtype = (fxa_dtype)UNTOUCHED;
    r = fxt_parse_dtype(s, &dtype);
    check_parsed(s, r, (int)dtype, dtypes, sizeof dtypes / sizeof dtypes[0]);
    if (r == 0) {
        CHECK(strcmp(fxt_dtype_name(dtype), s) == 0);
    }

    fxa_compute compute = (fxa_compute)UNTOUCHED;
    r = fxt_parse_compute(s, &compute);
    check_parsed(s, r, (int)compute, computes, sizeof computes / sizeof computes[0]);
}

/* ---- one command line --------------------------------------------------------------- */

static void run_table(int cmd, int argc, char **argv)
{
    all_opts a;
    fxt_opt opts[FXT_MAX_OPTS];
    value before[FXT_MAX_OPTS];
    value expect[FXT_MAX_OPTS];
    int n = 0;

    make_table(cmd, &a, opts);
    for (; n < FXT_MAX_OPTS && opts[n].name != NULL; n++) {
        before[n] = load(&opts[n]);
        expect[n] = before[n];
    }
    CHECK(n < FXT_MAX_OPTS); /* zero-terminated within its bound */
    const int want = model_parse(argc, argv, 2, opts, expect);
    const int got = fxt_parse_options(g_cmd_names[cmd], argc, argv, 2, opts);
    CHECK(got == want);
    for (int j = 0; j < n; j++) {
        const fxt_opt *o = &opts[j];
        const value v = load(o);
        CHECK(same_value(o->kind, v, expect[j]));
        if (same_value(o->kind, v, before[j])) {
            continue;
        }
        switch (o->kind) {
        case FXT_OPT_STRING: {
            int from_argv = 0;
            for (int i = 2; i < argc; i++) {
                from_argv = from_argv || v.s == argv[i];
            }
            CHECK(from_argv);
            break;
        }
        case FXT_OPT_INT: CHECK(v.i >= o->min && v.i <= o->max); break;
        case FXT_OPT_DOUBLE: CHECK(isfinite(v.d)); break;
        case FXT_OPT_FLAG: CHECK(v.flag == 1); break;
        }
    }

    /* The value parsers on the strings the command hands them (cmd_attn.c
     * fxt_attn_apply_options, inputs.c settle_dtype, cmd_check.c, cmd_bench.c); here on every stored string, also after a
     * failed parse. */
    for (int j = 0; j < n; j++) {
        if (opts[j].kind == FXT_OPT_STRING) {
            check_value_parsers(load(&opts[j]).s);
        }
    }
}

static void silence_stderr(void)
{
    g_fuzz_report = stderr; /* the original stderr, for contract violations */
#if defined(__GLIBC__)
    /* glibc's stderr is an assignable FILE *; libFuzzer copied the old pointer at start-up,
     * so its statistics still reach descriptor 2. A dup2 onto descriptor 2 would hide them. */
    FILE *null = fopen("/dev/null", "w");
    if (null != NULL) {
        stderr = null;
    }
#endif
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    silence_stderr();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *argv[MAX_ARGS + 2];
    int argc = 0;
    static char prog[] = "fxattn";
    argv[argc++] = prog;

    size_t pos = 0;
    while (pos < size && argc < MAX_ARGS + 1) {
        const uint8_t *nul = memchr(data + pos, 0, size - pos);
        const size_t piece = nul != NULL ? (size_t)(nul - (data + pos)) : size - pos;
        const size_t len = piece < MAX_ARG_LEN ? piece : MAX_ARG_LEN;
        char *arg = malloc(len + 1);
        if (arg == NULL) {
            break;
        }
        memcpy(arg, data + pos, len);
        arg[len] = '\0';
        argv[argc++] = arg;
        pos += piece + 1;
    }
    argv[argc] = NULL;

    int cmd = -1;
    for (int c = 0; c < CMD_COUNT && argc > 1; c++) {
        if (strcmp(argv[1], g_cmd_names[c]) == 0) {
            cmd = c;
        }
    }
    if (cmd >= 0) {
        run_table(cmd, argc, argv);
    } else {
        for (int c = 0; c < CMD_COUNT; c++) {
            run_table(c, argc, argv);
        }
    }

    for (int i = 1; i < argc; i++) {
        free(argv[i]);
    }
    return 0;
}
