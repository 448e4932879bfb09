/* A small JSON checker (cli_json.h). */
#include "cli_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Skip the digits at s. */
static const char *skip_digits(const char *s)
{
    while (*s >= '0' && *s <= '9')
        s++;
    return s;
}

static int jp_number(jp *p)
{
    const char *s = p->s;
    if (*s == '-')
        s++;
    if (*s == '0')
        s++;
    else if (*s >= '1' && *s <= '9')
        s = skip_digits(s);
    else
        return 0;
    if (*s == '.') {
        s++;
        if (!(*s >= '0' && *s <= '9'))
            return 0;
        s = skip_digits(s);
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!(*s >= '0' && *s <= '9'))
            return 0;
        s = skip_digits(s);
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

int json_one_object_line(const char *text, size_t *where)
{
    jp p = {text, 0};
    *where = 0;
    if (text[0] != '{')
        return 0;
    const int ok = jp_value(&p);
    *where = (size_t)(p.s - text);
    return ok && p.s[0] == '\n' && p.s[1] == 0;
}

const char *json_field(const char *text, const char *key)
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

int json_is_number(const char *text, const char *key)
{
    const char *s = json_field(text, key);
    jp p = {s, 0};
    return s && jp_number(&p) && (*p.s == ',' || *p.s == '}' || *p.s == ' ');
}

int json_number_is(const char *text, const char *key, double want)
{
    const char *s = json_field(text, key);
    char *end;
    if (!s)
        return 0;
    double v = strtod(s, &end);
    return end != s && v == want;
}

int json_positive(const char *text, const char *key)
{
    const char *s = json_field(text, key);
    return s && strtod(s, NULL) > 0.0;
}

int json_string_is(const char *text, const char *key, const char *want)
{
    const char *s = json_field(text, key);
    const size_t n = strlen(want);
    return s && s[0] == '"' && strncmp(s + 1, want, n) == 0 && s[n + 1] == '"';
}
