/*
 * Strict JSON (RFC 8259) for the hostile-file readers (json.h). Moved out of safetensors.c so
 * that the checkpoint index (checkpoint.c) is read by the same parser.
 */
#include "io/json.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static void msg_vfail(const fxa_msg *c, const char *fmt, va_list args)
{
    if (c->err == NULL || c->errlen == 0) {
        return;
    }
    int n = snprintf(c->err, c->errlen, "%s: ", c->path);
    if (n < 0 || (size_t)n >= c->errlen) {
        return;
    }
    vsnprintf(c->err + n, c->errlen - (size_t)n, fmt, args);
}

void fxa_msg_fail(const fxa_msg *c, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    msg_vfail(c, fmt, args);
    va_end(args);
}

int fxa_jp_fail(fxa_jp *p, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    msg_vfail(p->msg, fmt, args);
    va_end(args);
    p->status = FXA_ERR_INVALID_ARG;
    return -1;
}

int fxa_jp_out_of_memory(fxa_jp *p)
{
    fxa_msg_fail(p->msg, "out of memory while reading the %s (%zu bytes)", p->doc, p->len);
    p->status = FXA_ERR_NO_MEMORY;
    return -1;
}

static int is_ws(int c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

int fxa_jp_peek(const fxa_jp *p)
{
    return p->pos < p->len ? p->s[p->pos] : -1;
}

void fxa_jp_skip_ws(fxa_jp *p)
{
    while (is_ws(fxa_jp_peek(p))) {
        p->pos++;
    }
}

static void describe_byte(const fxa_jp *p, int c, char out[32])
{
    if (c < 0) {
        snprintf(out, 32, "the end of the %s", p->doc);
    } else if (c >= 0x20 && c < 0x7f) {
        snprintf(out, 32, "'%c'", c);
    } else {
        snprintf(out, 32, "byte 0x%02x", (unsigned)c);
    }
}

int fxa_jp_syntax_error(fxa_jp *p, const char *expected)
{
    char found[32];
    describe_byte(p, fxa_jp_peek(p), found);
    return fxa_jp_fail(p, "malformed JSON %s at byte %zu: expected %s, found %s", p->doc, p->pos,
                       expected, found);
}

/* What kind of JSON value starts with c (the syntax pass has checked it is one). */
const char *fxa_json_value_kind(int c)
{
    switch (c) {
    case '{': return "an object";
    case '[': return "an array";
    case '"': return "a string";
    case 't':
    case 'f': return "a boolean";
    case 'n': return "null";
    default: return "a number";
    }
}

/* Length (1..4) of the valid UTF-8 sequence at s (avail bytes), or 0: no overlong forms, no
 * surrogates, nothing above U+10FFFF. */
static size_t utf8_seq(const unsigned char *s, size_t avail)
{
    const unsigned c = s[0];
    unsigned lo = 0x80;
    unsigned hi = 0xbf;
    size_t n;
    if (c < 0x80) {
        return 1;
    } else if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
    } else if (c == 0xe0) {
        n = 3;
        lo = 0xa0;
    } else if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) {
        n = 3;
    } else if (c == 0xed) {
        n = 3;
        hi = 0x9f;
    } else if (c == 0xf0) {
        n = 4;
        lo = 0x90;
    } else if (c >= 0xf1 && c <= 0xf3) {
        n = 4;
    } else if (c == 0xf4) {
        n = 4;
        hi = 0x8f;
    } else {
        return 0;
    }
    if (avail < n || s[1] < lo || s[1] > hi) {
        return 0;
    }
    for (size_t i = 2; i < n; i++) {
        if (s[i] < 0x80 || s[i] > 0xbf) {
            return 0;
        }
    }
    return n;
}

/* Four hex digits at s[0..4) (caller checked they exist). 0 or -1. */
static int hex4(const unsigned char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i];
        unsigned d;
        if (c >= '0' && c <= '9') {
            d = c - '0';
        } else if (c >= 'a' && c <= 'f') {
            d = c - 'a' + 10;
        } else if (c >= 'A' && c <= 'F') {
            d = c - 'A' + 10;
        } else {
            return -1;
        }
        v = v << 4 | d;
    }
    *out = v;
    return 0;
}

static size_t utf8_encode(unsigned cp, unsigned char out[4])
{
    if (cp < 0x80) {
        out[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (unsigned char)(0xc0 | cp >> 6);
        out[1] = (unsigned char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (unsigned char)(0xe0 | cp >> 12);
        out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
        out[2] = (unsigned char)(0x80 | (cp & 0x3f));
        return 3;
    }
    out[0] = (unsigned char)(0xf0 | cp >> 18);
    out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3f));
    out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3f));
    out[3] = (unsigned char)(0x80 | (cp & 0x3f));
    return 4;
}

/*
 * The JSON string at p->pos (a '"'). In the schema pass its decoded bytes and a NUL go to the
 * arena top, *out and *out_len tell where; they stay only if the caller then calls
 * fxa_jp_keep. A decoded string and its NUL never take more bytes than the string's text
 * with its quotes, so an arena of len + 1 bytes holds every string of the text.
 */
int fxa_jp_string(fxa_jp *p, const char **out, size_t *out_len)
{
    const size_t start = p->pos;
    char *dst = p->arena != NULL ? p->arena + p->arena_top : NULL;
    size_t n = 0;
    p->pos++;
    for (;;) {
        if (p->pos >= p->len) {
            return fxa_jp_fail(p, "malformed JSON %s at byte %zu: unterminated string", p->doc,
                               start);
        }
        const unsigned c = p->s[p->pos];
        unsigned char buf[4];
        size_t used;
        size_t produced;
        if (c == '"') {
            p->pos++;
            break;
        }
        if (c < 0x20) {
            return fxa_jp_fail(p,
                               "malformed JSON %s at byte %zu: control character 0x%02x in a "
                               "string (it must be escaped)",
                               p->doc, p->pos, c);
        }
        if (c == '\\') {
            const int e = p->pos + 1 < p->len ? p->s[p->pos + 1] : -1;
            used = 2;
            produced = 1;
            switch (e) {
            case '"':
            case '\\':
            case '/': buf[0] = (unsigned char)e; break;
            case 'b': buf[0] = '\b'; break;
            case 'f': buf[0] = '\f'; break;
            case 'n': buf[0] = '\n'; break;
            case 'r': buf[0] = '\r'; break;
            case 't': buf[0] = '\t'; break;
            case 'u': {
                unsigned cp;
                unsigned low;
                if (p->len - p->pos < 6 || hex4(p->s + p->pos + 2, &cp) != 0) {
                    return fxa_jp_fail(p,
                                       "malformed JSON %s at byte %zu: \\u must be followed by 4 "
                                       "hex digits",
                                       p->doc, p->pos);
                }
                used = 6;
                if (cp >= 0xdc00 && cp <= 0xdfff) {
                    return fxa_jp_fail(p,
                                       "malformed JSON %s at byte %zu: unpaired surrogate \\u%04X "
                                       "(a low surrogate without a high one)",
                                       p->doc, p->pos, cp);
                }
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    if (p->len - p->pos < 12 || p->s[p->pos + 6] != '\\' ||
                        p->s[p->pos + 7] != 'u' || hex4(p->s + p->pos + 8, &low) != 0 ||
                        low < 0xdc00 || low > 0xdfff) {
                        return fxa_jp_fail(p,
                                           "malformed JSON %s at byte %zu: unpaired surrogate "
                                           "\\u%04X (a high surrogate not followed by a low one)",
                                           p->doc, p->pos, cp);
                    }
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
                    used = 12;
                }
                produced = utf8_encode(cp, buf);
                break;
            }
            default: {
                char found[32];
                describe_byte(p, e, found);
                return fxa_jp_fail(p,
                                   "malformed JSON %s at byte %zu: invalid escape: '\\' "
                                   "followed by %s",
                                   p->doc, p->pos, found);
            }
            }
        } else {
            used = utf8_seq(p->s + p->pos, p->len - p->pos);
            if (used == 0) {
                return fxa_jp_fail(p,
                                   "malformed JSON %s at byte %zu: invalid UTF-8 (byte 0x%02x) "
                                   "in a string",
                                   p->doc, p->pos, c);
            }
            memcpy(buf, p->s + p->pos, used);
            produced = used;
        }
        if (dst != NULL) {
            if (p->arena_top + n + produced >= p->arena_cap) { /* cannot happen (see above) */
                return fxa_jp_fail(p, "internal error: string arena overflow at %s byte %zu",
                                   p->doc, p->pos);
            }
            memcpy(dst + n, buf, produced);
        }
        n += produced;
        p->pos += used;
    }
    if (dst != NULL) {
        dst[n] = '\0';
        *out = dst;
        *out_len = n;
    }
    return 0;
}

void fxa_jp_keep(fxa_jp *p, size_t len)
{
    p->arena_top += len + 1;
}

/* A JSON number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int scan_number(fxa_jp *p)
{
    if (fxa_jp_peek(p) == '-') {
        p->pos++;
    }
    if (fxa_jp_peek(p) == '0') {
        p->pos++;
        if (fxa_json_is_digit(fxa_jp_peek(p))) {
            return fxa_jp_fail(p, "malformed JSON %s at byte %zu: number with a leading zero",
                               p->doc, p->pos - 1);
        }
    } else if (fxa_json_is_digit(fxa_jp_peek(p))) {
        while (fxa_json_is_digit(fxa_jp_peek(p))) {
            p->pos++;
        }
    } else {
        return fxa_jp_syntax_error(p, "a digit");
    }
    if (fxa_jp_peek(p) == '.') {
        p->pos++;
        if (!fxa_json_is_digit(fxa_jp_peek(p))) {
            return fxa_jp_syntax_error(p, "a digit after '.'");
        }
        while (fxa_json_is_digit(fxa_jp_peek(p))) {
            p->pos++;
        }
    }
    if (fxa_jp_peek(p) == 'e' || fxa_jp_peek(p) == 'E') {
        p->pos++;
        if (fxa_jp_peek(p) == '+' || fxa_jp_peek(p) == '-') {
            p->pos++;
        }
        if (!fxa_json_is_digit(fxa_jp_peek(p))) {
            return fxa_jp_syntax_error(p, "a digit in the exponent");
        }
        while (fxa_json_is_digit(fxa_jp_peek(p))) {
            p->pos++;
        }
    }
    return 0;
}

static int scan_literal(fxa_jp *p, const char *word)
{
    const size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) {
        return fxa_jp_syntax_error(p, "a JSON value");
    }
    p->pos += n;
    return 0;
}

static int check_value(fxa_jp *p, int depth);

/* An object or array at p->pos, itself at nesting level depth (1 for the top level). */
static int check_container(fxa_jp *p, int depth)
{
    if (depth > p->max_depth) {
        return fxa_jp_fail(p, "malformed JSON %s at byte %zu: nesting deeper than %d levels",
                           p->doc, p->pos, p->max_depth);
    }
    const int is_object = fxa_jp_peek(p) == '{';
    const int close = is_object ? '}' : ']';
    p->pos++;
    fxa_jp_skip_ws(p);
    if (fxa_jp_peek(p) == close) {
        p->pos++;
        return 0;
    }
    for (;;) {
        if (is_object) {
            if (fxa_jp_peek(p) != '"') {
                return fxa_jp_syntax_error(p, "a string key");
            }
            if (fxa_jp_string(p, NULL, NULL) != 0) {
                return -1;
            }
            fxa_jp_skip_ws(p);
            if (fxa_jp_peek(p) != ':') {
                return fxa_jp_syntax_error(p, "':' after a key");
            }
            p->pos++;
            fxa_jp_skip_ws(p);
        }
        if (check_value(p, depth) != 0) {
            return -1;
        }
        fxa_jp_skip_ws(p);
        if (fxa_jp_peek(p) == ',') {
            p->pos++;
            fxa_jp_skip_ws(p);
        } else if (fxa_jp_peek(p) == close) {
            p->pos++;
            return 0;
        } else {
            return fxa_jp_syntax_error(p, is_object ? "',' or '}'" : "',' or ']'");
        }
    }
}

/* Any JSON value at p->pos, inside depth levels of objects and arrays. */
static int check_value(fxa_jp *p, int depth)
{
    const int c = fxa_jp_peek(p);
    switch (c) {
    case '{':
    case '[': return check_container(p, depth + 1);
    case '"': return fxa_jp_string(p, NULL, NULL);
    case 't': return scan_literal(p, "true");
    case 'f': return scan_literal(p, "false");
    case 'n': return scan_literal(p, "null");
    default:
        if (c == '-' || fxa_json_is_digit(c)) {
            return scan_number(p);
        }
        return fxa_jp_syntax_error(p, "a JSON value");
    }
}

int fxa_jp_check_syntax(fxa_jp *p)
{
    fxa_jp_skip_ws(p);
    if (check_value(p, 0) != 0) {
        return -1;
    }
    fxa_jp_skip_ws(p);
    if (p->pos != p->len) {
        char found[32];
        describe_byte(p, fxa_jp_peek(p), found);
        return fxa_jp_fail(p,
                           "malformed JSON %s at byte %zu: %s after the end of the JSON object "
                           "(only whitespace may pad the %s)",
                           p->doc, p->pos, found, p->doc);
    }
    return 0;
}

int fxa_jp_expect(fxa_jp *p, int c, const char *what)
{
    fxa_jp_skip_ws(p);
    if (fxa_jp_peek(p) != c) {
        return fxa_jp_syntax_error(p, what);
    }
    p->pos++;
    fxa_jp_skip_ws(p);
    return 0;
}

int fxa_jp_next(fxa_jp *p, int close)
{
    fxa_jp_skip_ws(p);
    if (fxa_jp_peek(p) == ',') {
        p->pos++;
        fxa_jp_skip_ws(p);
        return 1;
    }
    if (fxa_jp_peek(p) == close) {
        p->pos++;
        return 0;
    }
    return fxa_jp_syntax_error(p, close == '}' ? "',' or '}'" : "',' or ']'");
}

int fxa_jp_open(fxa_jp *p, int close)
{
    p->pos++;
    fxa_jp_skip_ws(p);
    if (fxa_jp_peek(p) == close) {
        p->pos++;
        return 0;
    }
    return 1;
}

int fxa_jp_object(fxa_jp *p, const char *must, fxa_jp_member_fn *member, void *user)
{
    if (fxa_jp_peek(p) != '{') {
        return fxa_jp_fail(p, "%s, found %s", must, fxa_json_value_kind(fxa_jp_peek(p)));
    }
    int more = fxa_jp_open(p, '}');
    while (more == 1) {
        const char *key;
        size_t key_len;
        if (fxa_jp_peek(p) != '"') {
            return fxa_jp_syntax_error(p, "a string key");
        }
        if (fxa_jp_string(p, &key, &key_len) != 0 ||
            fxa_jp_expect(p, ':', "':' after a key") != 0 || member(p, key, key_len, user) != 0) {
            return -1;
        }
        more = fxa_jp_next(p, '}');
    }
    return more;
}

int fxa_jp_array(fxa_jp *p, const char *must, fxa_jp_element_fn *element, void *user)
{
    if (fxa_jp_peek(p) != '[') {
        return fxa_jp_fail(p, "%s, found %s", must, fxa_json_value_kind(fxa_jp_peek(p)));
    }
    int index = 0;
    int more = fxa_jp_open(p, ']');
    while (more == 1) {
        if (element(p, index++, user) != 0) {
            return -1;
        }
        more = fxa_jp_next(p, ']');
    }
    return more;
}

int fxa_jp_skip_value(fxa_jp *p)
{
    char *const arena = p->arena;
    p->arena = NULL; /* checked, not decoded */
    const int rc = check_value(p, 0);
    p->arena = arena;
    return rc;
}

void fxa_jp_init(fxa_jp *p, const fxa_msg *msg, const char *doc, int max_depth,
                 const unsigned char *s, size_t len)
{
    *p = (fxa_jp){.msg = msg,
                  .doc = doc,
                  .max_depth = max_depth,
                  .s = s,
                  .len = len,
                  .status = FXA_ERR_INVALID_ARG};
}
