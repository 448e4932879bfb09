/* Option parsing and error reporting shared by the subcommands (cli.h). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"

static char *g_capture;
static size_t g_capture_cap;

void fxt_fail_capture(char *buf, size_t cap)
{
    g_capture = cap ? buf : NULL;
    g_capture_cap = cap;
    if (g_capture)
        g_capture[0] = '\0';
}

static int word_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.';
}

void fxt_json_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    char *buf = malloc((size_t)n + 1);
    if (!buf)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int in_string = 0;
    for (int i = 0; i < n; i++) {
        const char c = buf[i];
        if (in_string) {
            if (c == '\\' && i + 1 < n)
                putchar(buf[i++]);
            else if (c == '"')
                in_string = 0;
            putchar(buf[i]);
            continue;
        }
        if (c == '"') {
            in_string = 1;
            putchar(c);
            continue;
        }
        if (i == 0 || !word_char(buf[i - 1])) {
            const int sign = c == '-' || c == '+';
            const char *w = buf + i + sign;
            if ((strncmp(w, "inf", 3) == 0 || strncmp(w, "nan", 3) == 0) && !word_char(w[3])) {
                fputs("null", stdout);
                i += sign + 2;
                continue;
            }
        }
        putchar(c);
    }
    free(buf);
}

/* Control characters (a newline in a path, an escape sequence) shown as '?',
 * so that an error stays one line and cannot forge another. */
static void one_line(char *text)
{
    for (unsigned char *p = (unsigned char *)text; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            *p = '?';
}

int fxt_fail(int code, const char *fmt, ...)
{
    va_list ap;
    if (g_capture) {
        if (!g_capture[0]) { /* the first message wins */
            va_start(ap, fmt);
            vsnprintf(g_capture, g_capture_cap, fmt, ap);
            va_end(ap);
            one_line(g_capture);
        }
        return code;
    }
    /* One write per message, so lines from several ranks do not interleave. */
    char line[1024];
    int len = snprintf(line, sizeof line, "fxattn: error: ");
    va_start(ap, fmt);
    vsnprintf(line + len, sizeof line - (size_t)len, fmt, ap);
    va_end(ap);
    one_line(line);
    fprintf(stderr, "%s\n", line);
    return code;
}

int fxt_exit_code(fxa_status st)
{
    return st == FXA_ERR_INVALID_ARG ? FXT_EXIT_BAD_INPUT : FXT_EXIT_FAILURE;
}

static const fxt_opt *find_opt(const fxt_opt *opts, const char *arg)
{
    for (const fxt_opt *o = opts; o->name; o++) {
        if (strcmp(arg, o->name) == 0 || (o->alias && strcmp(arg, o->alias) == 0))
            return o;
    }
    return NULL;
}

/* Why an integer option's value is refused, or NULL when *v holds it. */
static const char *int_refusal(const fxt_opt *o, const char *val, long long *v)
{
    char *end = NULL;
    errno = 0;
    *v = strtoll(val, &end, 10);
    if (end == val)
        return "is not an integer";
    if (*end)
        return "is not an integer (characters follow the number)";
    if (errno == ERANGE || *v < o->min || *v > o->max)
        return "is out of range";
    return NULL;
}

/* Why a number option's value is refused, or NULL when *v holds it: only
 * finite normal numbers (and zero) are taken; strtod reports ERANGE for
 * values beyond the largest double and for nonzero values below the
 * smallest normal one. */
static const char *double_refusal(const char *val, double *v)
{
    char *end = NULL;
    errno = 0;
    *v = strtod(val, &end);
    if (end == val)
        return "is not a number";
    if (*end)
        return "is not a number (characters follow it)";
    if (errno == ERANGE && fabs(*v) > 1.0)
        return "is too large (beyond the largest double, about 1.8e308)";
    if (errno == ERANGE)
        return "is too small (nonzero but below the smallest normal double, about 2.2e-308)";
    if (!isfinite(*v))
        return "is not a finite number";
    return NULL;
}

static int store_value(const char *cmd, const fxt_opt *o, const char *val)
{
    const char *why;
    if (o->kind != FXT_OPT_FLAG && val[0] == '\0')
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s %s: the value is empty", cmd, o->name);
    switch (o->kind) {
    case FXT_OPT_STRING: *(const char **)o->dest = val; return 0;
    case FXT_OPT_INT: {
        long long v;
        if ((why = int_refusal(o, val, &v)))
            return fxt_fail(FXT_EXIT_BAD_INPUT, "%s %s: '%s' %s: give an integer in %lld..%lld",
                            cmd, o->name, val, why, (long long)o->min, (long long)o->max);
        *(int64_t *)o->dest = v;
        return 0;
    }
    case FXT_OPT_DOUBLE: {
        double v;
        if ((why = double_refusal(val, &v)))
            return fxt_fail(FXT_EXIT_BAD_INPUT, "%s %s: '%s' %s", cmd, o->name, val, why);
        *(double *)o->dest = v;
        return 0;
    }
    case FXT_OPT_FLAG: break;
    }
    return fxt_fail(FXT_EXIT_FAILURE, "internal: bad option kind");
}

int fxt_parse_options(const char *cmd, int argc, char **argv, int first, const fxt_opt *opts)
{
    for (int i = first; i < argc; i++) {
        const fxt_opt *o = find_opt(opts, argv[i]);
        if (!o)
            return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: unknown option '%s' (see 'fxattn help')", cmd,
                            argv[i]);
        if (o->kind == FXT_OPT_FLAG) {
            *(int *)o->dest = 1;
            continue;
        }
        if (i + 1 >= argc)
            return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: option %s needs a value", cmd, o->name);
        if (store_value(cmd, o, argv[++i]))
            return FXT_EXIT_BAD_INPUT;
    }
    return 0;
}

int fxt_parse_layout(const char *s, fxa_layout *out)
{
    if (strcmp(s, "bshd") == 0)
        *out = FXA_LAYOUT_BSHD;
    else if (strcmp(s, "bhsd") == 0)
        *out = FXA_LAYOUT_BHSD;
    else
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--layout must be bshd or bhsd, not '%s'", s);
    return 0;
}

int fxt_parse_mode(const char *s, fxa_mode *out)
{
    if (strcmp(s, "auto") == 0)
        *out = FXA_MODE_AUTO;
    else if (strcmp(s, "online") == 0)
        *out = FXA_MODE_ONLINE;
    else
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--mode must be auto or online, not '%s'", s);
    return 0;
}

int fxt_parse_onoff(const char *opt, const char *s, int *out)
{
    if (strcmp(s, "on") == 0)
        *out = 1;
    else if (strcmp(s, "off") == 0)
        *out = 0;
    else
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s must be on or off, not '%s'", opt, s);
    return 0;
}

int fxt_parse_dtype(const char *s, fxa_dtype *out)
{
    if (strcmp(s, "f32") == 0)
        *out = FXA_F32;
    else if (strcmp(s, "bf16") == 0)
        *out = FXA_BF16;
    else if (strcmp(s, "f16") == 0)
        *out = FXA_F16;
    else
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--dtype must be f32, bf16 or f16, not '%s'", s);
    return 0;
}

int fxt_parse_compute(const char *s, fxa_compute *out)
{
    if (strcmp(s, "fp32") == 0)
        *out = FXA_COMPUTE_FP32;
    else if (strcmp(s, "bf16") == 0)
        *out = FXA_COMPUTE_BF16;
    else if (strcmp(s, "auto") == 0)
        *out = FXA_COMPUTE_AUTO;
    else
        return fxt_fail(FXT_EXIT_BAD_INPUT, "--compute must be auto, fp32 or bf16, not '%s'", s);
    return 0;
}

const char *fxt_dtype_name(fxa_dtype t)
{
    return t == FXA_F32 ? "f32" : (t == FXA_BF16 ? "bf16" : "f16");
}
