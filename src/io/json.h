/*
 * Strict JSON (RFC 8259) for the hostile-file readers of libfxattn_io: the .safetensors header
 * (safetensors.c) and the sharded checkpoint index (checkpoint.c).
 *
 * A document is read in two passes. fxa_jp_check_syntax checks that the bytes are one JSON
 * value with only JSON whitespace around it: valid UTF-8, every escape including \uXXXX with
 * surrogate pairs (an unpaired surrogate is refused), no leading zeros, nesting at most
 * max_depth deep. The reader then walks the same bytes again with the cursor functions below,
 * checking its schema and decoding the strings it keeps into an arena of len + 1 bytes (which
 * holds every string of the document).
 *
 * Messages go to err as one line "<path>: <text>"; syntax errors read "malformed JSON <doc> at
 * byte K: ..." with K counted from the start of the JSON text. Functions returning int return
 * 0 on success and -1 after reporting (status then says why: FXA_ERR_INVALID_ARG, or
 * FXA_ERR_NO_MEMORY after fxa_jp_out_of_memory).
 */
#ifndef FXA_IO_JSON_H
#define FXA_IO_JSON_H

#include <stddef.h>

#include "fxattn.h"

/* Where messages go: "<path>: <text>" into err[errlen] (err may be NULL, errlen 0). */
typedef struct fxa_msg {
    const char *path;
    char *err;
    size_t errlen;
} fxa_msg;

/* Write "<m->path>: <fmt...>" into m->err, truncated to fit. */
void fxa_msg_fail(const fxa_msg *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef struct fxa_jp {
    const fxa_msg *msg;
    const char *doc;        /* what the text is, in messages: "header", "index" */
    int max_depth;          /* nested objects and arrays allowed */
    const unsigned char *s; /* the text: any bytes, not NUL-terminated */
    size_t len;
    size_t pos;
    char *arena; /* schema pass: where strings are decoded; NULL in the syntax pass */
    size_t arena_top;
    size_t arena_cap;
    fxa_status status; /* of the first failure */
} fxa_jp;

/* A parser over s[0..len) at position 0, syntax pass (no arena). */
void fxa_jp_init(fxa_jp *p, const fxa_msg *msg, const char *doc, int max_depth,
                 const unsigned char *s, size_t len);

/* Syntax pass: the text is one JSON value with only whitespace around it. */
int fxa_jp_check_syntax(fxa_jp *p);

/* Report bad content (FXA_ERR_INVALID_ARG): "<path>: <fmt...>"; returns -1. */
int fxa_jp_fail(fxa_jp *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Report an allocation failure while reading the text (FXA_ERR_NO_MEMORY); returns -1. */
int fxa_jp_out_of_memory(fxa_jp *p);

/* "malformed JSON <doc> at byte <pos>: expected <expected>, found <what is there>"; -1. */
int fxa_jp_syntax_error(fxa_jp *p, const char *expected);

/* Next byte as 0..255, or -1 at the end of the text. */
int fxa_jp_peek(const fxa_jp *p);

void fxa_jp_skip_ws(fxa_jp *p);

/* What kind of JSON value starts with byte c (of a text whose syntax is checked). */
const char *fxa_json_value_kind(int c);

/*
 * The JSON string at p->pos (a '"'). In the schema pass its decoded bytes and a NUL go to the
 * arena top, *out and *out_len tell where (out and out_len must then not be NULL); they stay
 * only if the caller then calls fxa_jp_keep. In the syntax pass out and out_len may be NULL.
 */
int fxa_jp_string(fxa_jp *p, const char **out, size_t *out_len);

/* Keep the string fxa_jp_string just decoded (of len bytes). */
void fxa_jp_keep(fxa_jp *p, size_t len);

/* Skip whitespace, expect byte c (what names it in the message), skip whitespace. */
int fxa_jp_expect(fxa_jp *p, int c, const char *what);

/* After an entry of an object or array: ',' (returns 1: more follow) or close (returns 0). */
int fxa_jp_next(fxa_jp *p, int close);

/* Past the '{' or '[' at p->pos and whitespace: 1 when an entry follows, 0 when the container
 * was empty (its close is consumed too). */
int fxa_jp_open(fxa_jp *p, int close);

/*
 * Schema-pass walks of one container at p->pos. The value there must be an object (array),
 * else "<path>: <must>, found <kind>". For each member, fxa_jp_object decodes the key to the
 * arena top (not kept: the callback calls fxa_jp_keep to keep it), passes ':' and calls member
 * with p->pos at the value; fxa_jp_array calls element with each element's index. A callback
 * consumes its value and returns 0, or -1 after reporting; the walk then returns -1 too, and 0
 * after the close.
 */
typedef int fxa_jp_member_fn(fxa_jp *p, const char *key, size_t key_len, void *user);
typedef int fxa_jp_element_fn(fxa_jp *p, int index, void *user);
int fxa_jp_object(fxa_jp *p, const char *must, fxa_jp_member_fn *member, void *user);
int fxa_jp_array(fxa_jp *p, const char *must, fxa_jp_element_fn *element, void *user);

/* Skip any one value at p->pos (schema pass; nothing is decoded). */
int fxa_jp_skip_value(fxa_jp *p);

static inline int fxa_json_is_digit(int c)
{
    return c >= '0' && c <= '9';
}

#endif
