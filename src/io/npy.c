/*
 * NumPy .npy reader (hostile-input safe) and '<f4' writer, staged and committed atomically
 * by staged.c. See fxattn_npy.h.
 * Format reference: numpy/lib/format.py (versions 1.0, 2.0, 3.0).
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64

#include "fxattn_npy.h"

#include "io/file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c keeps data in file order (little-endian) and needs a little-endian host"
#endif

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64
/* Preamble: magic, major, minor, then a 2-byte (1.0) or 4-byte (2.0, 3.0) header length. */
#define NPY_MAX_PREAMBLE_LEN (NPY_MAGIC_LEN + 2 + 4)
/* Longest text copied from a file into a message. */
#define SNIPPET_CAP 48
/*
 * Written header: 10-byte preamble, the dict (under 240 bytes with FXA_NPY_MAX_DIMS
 * dimensions), '\n', padded to a multiple of 64: at most 256 bytes. This is also why the
 * writer never needs version 2.0 (whose only purpose is headers over 65535 bytes).
 */
#define WRITE_HEADER_CAP 320

/* ------------------------------------------------------------------------ */
/* Shared helpers                                                            */
/* ------------------------------------------------------------------------ */

/*
 * Element count and byte size of a shape. Fails (-1) unless the product of the non-zero
 * dimensions times itemsize fits in int64, so that every partial product a caller may form
 * is safe too. Dimensions must be non-negative.
 */
static int shape_size(const int64_t *shape, int ndim, int64_t itemsize, int64_t *count_out,
                      int64_t *bytes_out)
{
    if (fxa_io_shape_total(shape, ndim, itemsize, bytes_out) != 0)
        return -1;
    *count_out = *bytes_out / itemsize;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Reader                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct npy_reader {
    const char *path;
    char *err;
    size_t errlen;
} npy_reader;

static void reader_fail(const npy_reader *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Message "<path>: <fmt...>". */
static void reader_fail(const npy_reader *r, const char *fmt, ...)
{
    if (r->err == NULL || r->errlen == 0) {
        return;
    }
    int n = snprintf(r->err, r->errlen, "%s: ", r->path);
    if (n < 0 || (size_t)n >= r->errlen) {
        return;
    }
    va_list args;
    va_start(args, fmt);
    vsnprintf(r->err + n, r->errlen - (size_t)n, fmt, args);
    va_end(args);
}

/* Read exactly n bytes at offset (fxa_io_pread_all); the reason goes into the
 * reader's error with the path. */
static fxa_status read_at(const npy_reader *r, int fd, void *buf, size_t n, int64_t offset,
                          const char *what)
{
    char why[256];
    const fxa_status st = fxa_io_pread_all(fd, buf, n, offset, what, why, sizeof why);
    if (st != FXA_OK)
        reader_fail(r, "%s", why);
    return st;
}

typedef struct npy_header {
    fxa_dtype dtype;
    int64_t itemsize;
    int ndim;
    int64_t shape[FXA_NPY_MAX_DIMS];
} npy_header;

/* Cursor over the header dict text (not NUL-terminated; may hold any bytes). */
typedef struct header_parser {
    const npy_reader *reader;
    const char *text;
    size_t len;
    size_t pos;
} header_parser;

/* Whitespace as Python's tokenizer sees it (no vertical tab). */
static int is_space(int c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

/* Next byte as 0..255, or -1 at the end of the header. */
static int peek(const header_parser *p)
{
    return p->pos < p->len ? (unsigned char)p->text[p->pos] : -1;
}

static void skip_space(header_parser *p)
{
    while (is_space(peek(p))) {
        p->pos++;
    }
}

static int malformed(const header_parser *p, const char *expected)
{
    int c = peek(p);
    char found[32];
    if (c < 0) {
        snprintf(found, sizeof found, "the end of the header");
    } else if (c >= 0x20 && c < 0x7f) {
        snprintf(found, sizeof found, "'%c'", c);
    } else {
        snprintf(found, sizeof found, "byte 0x%02x", (unsigned)c);
    }
    reader_fail(p->reader, "malformed header at offset %zu: expected %s, found %s", p->pos,
                expected, found);
    return -1;
}

static int expect_char(header_parser *p, int c, const char *expected)
{
    if (peek(p) != c) {
        return malformed(p, expected);
    }
    p->pos++;
    return 0;
}

static int text_is(const char *text, size_t len, const char *literal)
{
    return len == strlen(literal) && memcmp(text, literal, len) == 0;
}

/* A Python string literal in single or double quotes, without escapes. */
static int parse_string(header_parser *p, const char **text_out, size_t *len_out)
{
    int quote = peek(p);
    if (quote != '\'' && quote != '"') {
        return malformed(p, "a quoted string");
    }
    size_t begin = ++p->pos;
    while (peek(p) != quote) {
        int c = peek(p);
        if (c < 0 || c == '\n') {
            return malformed(p, "a closing quote");
        }
        if (c == '\\') {
            return malformed(p, "a string without escape sequences");
        }
        p->pos++;
    }
    *text_out = p->text + begin;
    *len_out = p->pos - begin;
    p->pos++;
    return 0;
}

static int parse_descr(header_parser *p, npy_header *hdr)
{
    const char *name;
    size_t name_len;
    char shown[SNIPPET_CAP];

    if (peek(p) == '[') {
        reader_fail(p->reader, "structured dtype (a list descr) is not supported; only <f4 "
                               "and <f2 are supported");
        return -1;
    }
    if (peek(p) != '\'' && peek(p) != '"') {
        return malformed(p, "a dtype string such as '<f4' for 'descr'");
    }
    if (parse_string(p, &name, &name_len) != 0) {
        return -1;
    }
    if (text_is(name, name_len, "<f4")) {
        hdr->dtype = FXA_F32;
        hdr->itemsize = 4;
        return 0;
    }
    if (text_is(name, name_len, "<f2")) {
        hdr->dtype = FXA_F16;
        hdr->itemsize = 2;
        return 0;
    }
    fxa_io_snippet(name, name_len, shown, sizeof shown);
    if (name_len > 0 && name[0] == '>') {
        reader_fail(p->reader,
                    "big-endian dtype '%s' is unsupported; only little-endian <f4 "
                    "and <f2 are supported",
                    shown);
    } else {
        reader_fail(p->reader, "dtype '%s' is not supported; only <f4 and <f2 are supported",
                    shown);
    }
    return -1;
}

static int parse_fortran_order(header_parser *p)
{
    size_t begin = p->pos;
    int c = peek(p);
    while ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_') {
        p->pos++;
        c = peek(p);
    }
    const char *word = p->text + begin;
    size_t word_len = p->pos - begin;
    if (text_is(word, word_len, "False")) {
        return 0;
    }
    if (text_is(word, word_len, "True")) {
        reader_fail(p->reader, "Fortran-order arrays are not supported");
        return -1;
    }
    p->pos = begin;
    return malformed(p, "True or False for 'fortran_order'");
}

/* One shape entry: decimal digits (an old Python 2 'L' suffix is allowed). */
static int parse_dimension(header_parser *p, int64_t *dim_out)
{
    size_t begin = p->pos;
    int c = peek(p);
    while (c >= 0 && !is_space(c) && c != ',' && c != ')') {
        p->pos++;
        c = peek(p);
    }
    const char *token = p->text + begin;
    size_t token_len = p->pos - begin;
    char shown[SNIPPET_CAP];
    fxa_io_snippet(token, token_len, shown, sizeof shown);
    if (token_len == 0) {
        return malformed(p, "a dimension in the shape tuple");
    }

    size_t digits_end = token_len;
    if (digits_end > 1 && token[digits_end - 1] == 'L') {
        digits_end--;
    }
    int negative = token[0] == '-';
    size_t digits_begin = negative ? 1 : 0;
    int all_digits = digits_end > digits_begin;
    for (size_t i = digits_begin; i < digits_end; i++) {
        all_digits = all_digits && token[i] >= '0' && token[i] <= '9';
    }
    if (!all_digits) {
        reader_fail(p->reader, "shape entry '%s' is not a non-negative integer", shown);
        return -1;
    }
    if (negative) {
        reader_fail(p->reader, "negative dimension %s in shape", shown);
        return -1;
    }

    int64_t value = 0;
    for (size_t i = digits_begin; i < digits_end; i++) {
        int64_t digit = token[i] - '0';
        if (value > (INT64_MAX - digit) / 10) {
            reader_fail(p->reader, "shape dimension %s is too large (overflows int64)", shown);
            return -1;
        }
        value = value * 10 + digit;
    }
    *dim_out = value;
    return 0;
}

/* A tuple of non-negative integers: (), (n,), (a, b), (a, b,). */
static int parse_shape(header_parser *p, npy_header *hdr)
{
    int ndim = 0;
    int trailing_comma = 0;
    if (expect_char(p, '(', "'(' starting the shape tuple") != 0) {
        return -1;
    }
    skip_space(p);
    while (peek(p) != ')') {
        if (ndim == FXA_NPY_MAX_DIMS) {
            reader_fail(p->reader, "shape has more than %d dimensions", FXA_NPY_MAX_DIMS);
            return -1;
        }
        if (parse_dimension(p, &hdr->shape[ndim]) != 0) {
            return -1;
        }
        ndim++;
        skip_space(p);
        trailing_comma = peek(p) == ',';
        if (trailing_comma) {
            p->pos++;
            skip_space(p);
        } else if (peek(p) != ')') {
            return malformed(p, "',' or ')' in the shape tuple");
        }
    }
    p->pos++;
    if (ndim == 1 && !trailing_comma) {
        reader_fail(p->reader,
                    "shape (%" PRId64 ") is not a tuple; a 1-D shape needs a "
                    "trailing comma, as in (%" PRId64 ",)",
                    hdr->shape[0], hdr->shape[0]);
        return -1;
    }
    hdr->ndim = ndim;
    return 0;
}

enum { KEY_DESCR = 1, KEY_FORTRAN_ORDER = 2, KEY_SHAPE = 4 };

static int parse_entry(header_parser *p, npy_header *hdr, unsigned *seen_keys)
{
    static const struct {
        const char *name;
        unsigned bit;
    } keys[] = {{"descr", KEY_DESCR}, {"fortran_order", KEY_FORTRAN_ORDER}, {"shape", KEY_SHAPE}};
    const char *key;
    size_t key_len;
    char shown[SNIPPET_CAP];

    if (parse_string(p, &key, &key_len) != 0) {
        return -1;
    }
    unsigned bit = 0;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        if (text_is(key, key_len, keys[i].name)) {
            bit = keys[i].bit;
        }
    }
    fxa_io_snippet(key, key_len, shown, sizeof shown);
    if (bit == 0) {
        reader_fail(p->reader, "unknown header key '%s'", shown);
        return -1;
    }
    if (*seen_keys & bit) {
        reader_fail(p->reader, "duplicate header key '%s'", shown);
        return -1;
    }
    *seen_keys |= bit;

    skip_space(p);
    if (expect_char(p, ':', "':' after a key") != 0) {
        return -1;
    }
    skip_space(p);
    switch (bit) {
    case KEY_DESCR: return parse_descr(p, hdr);
    case KEY_FORTRAN_ORDER: return parse_fortran_order(p);
    default: return parse_shape(p, hdr);
    }
}

/* The header dict: {'descr': ..., 'fortran_order': ..., 'shape': ...} in any order. */
static int parse_header(header_parser *p, npy_header *hdr)
{
    unsigned seen_keys = 0;
    skip_space(p);
    if (expect_char(p, '{', "'{' starting the header dict") != 0) {
        return -1;
    }
    for (;;) {
        skip_space(p);
        if (peek(p) == '}') {
            break;
        }
        if (parse_entry(p, hdr, &seen_keys) != 0) {
            return -1;
        }
        skip_space(p);
        if (peek(p) == ',') {
            p->pos++;
        } else if (peek(p) != '}') {
            return malformed(p, "',' or '}' after a value");
        }
    }
    p->pos++;
    skip_space(p);
    if (p->pos != p->len) {
        return malformed(p, "only padding after the header dict");
    }
    if (!(seen_keys & KEY_DESCR)) {
        reader_fail(p->reader, "header is missing the 'descr' key");
        return -1;
    }
    if (!(seen_keys & KEY_FORTRAN_ORDER)) {
        reader_fail(p->reader, "header is missing the 'fortran_order' key");
        return -1;
    }
    if (!(seen_keys & KEY_SHAPE)) {
        reader_fail(p->reader, "header is missing the 'shape' key");
        return -1;
    }
    return 0;
}

fxa_status fxa_npy_read(const char *path, fxa_npy *out, char *err, size_t errlen)
{
    return fxa_npy_read_slice(path, -1, 0, 0, out, err, errlen);
}

static fxa_status read_npy(const char *path, int axis, int64_t start, int64_t len, int parts,
                           int part, fxa_npy *out, char *err, size_t errlen);

fxa_status fxa_npy_read_slice(const char *path, int axis, int64_t start, int64_t len, fxa_npy *out,
                              char *err, size_t errlen)
{
    return read_npy(path, axis, start, len, 0, 0, out, err, errlen);
}

fxa_status fxa_npy_read_shard(const char *path, int axis, int parts, int part, fxa_npy *out,
                              char *err, size_t errlen)
{
    if (parts < 1 || part < 0 || part >= parts) {
        fxa_io_set_error(err, errlen, "%s: shard %d of %d does not exist", path ? path : "(null)",
                         part, parts);
        if (out)
            memset(out, 0, sizeof *out);
        return FXA_ERR_INVALID_ARG;
    }
    if (axis < 0) {
        fxa_io_set_error(err, errlen, "%s: a shard needs an axis (0 or more), not %d",
                         path ? path : "(null)", axis);
        if (out)
            memset(out, 0, sizeof *out);
        return FXA_ERR_INVALID_ARG;
    }
    return read_npy(path, axis, 0, 0, parts, part, out, err, errlen);
}

/* The request itself: a path, an output, and an axis of -1 (the whole
 * array: start and length 0) or 0 and more. */
static fxa_status check_request(const npy_reader *r, const char *path, int axis, int64_t start,
                                int64_t len, int parts, const fxa_npy *out)
{
    if (out == NULL || path == NULL) {
        reader_fail(r, "no path or no output given");
        return FXA_ERR_INVALID_ARG;
    }
    if (path[0] == '\0') {
        reader_fail(r, "the path is empty");
        return FXA_ERR_INVALID_ARG;
    }
    if (axis < -1 || (axis == -1 && parts == 0 && (start != 0 || len != 0))) {
        reader_fail(r,
                    "axis %d with start %" PRId64 " and length %" PRId64 ": the axis is -1 "
                    "(the whole array, start and length 0) or a dimension of the array",
                    axis, start, len);
        return FXA_ERR_INVALID_ARG;
    }
    return FXA_OK;
}

/* The preamble: the magic, a version 1.0, 2.0 or 3.0, and a header length
 * within the limit and the file; *header_offset where the header starts. */
static fxa_status read_preamble(const npy_reader *r, int fd, int64_t file_size,
                                size_t *header_offset, uint32_t *header_len)
{
    if (file_size == 0) {
        reader_fail(r, "file is empty, not a .npy file");
        return FXA_ERR_INVALID_ARG;
    }
    unsigned char preamble[NPY_MAX_PREAMBLE_LEN];
    const size_t avail =
        file_size < NPY_MAX_PREAMBLE_LEN ? (size_t)file_size : NPY_MAX_PREAMBLE_LEN;
    const fxa_status status = read_at(r, fd, preamble, avail, 0, "the preamble");
    if (status != FXA_OK)
        return status;
    if (avail < NPY_MAGIC_LEN || memcmp(preamble, NPY_MAGIC, NPY_MAGIC_LEN) != 0) {
        reader_fail(r, "not a .npy file (missing the \\x93NUMPY magic)");
        return FXA_ERR_INVALID_ARG;
    }
    if (avail < NPY_MAGIC_LEN + 2) {
        reader_fail(r, "truncated .npy preamble (%" PRId64 " bytes)", file_size);
        return FXA_ERR_INVALID_ARG;
    }
    const unsigned major = preamble[NPY_MAGIC_LEN];
    const unsigned minor = preamble[NPY_MAGIC_LEN + 1];
    if (major < 1 || major > 3 || minor != 0) {
        reader_fail(r, "unsupported .npy format version %u.%u (1.0, 2.0 and 3.0 are)", major,
                    minor);
        return FXA_ERR_INVALID_ARG;
    }
    const size_t length_bytes = major == 1 ? 2 : 4;
    const size_t preamble_len = NPY_MAGIC_LEN + 2 + length_bytes;
    if (avail < preamble_len) {
        reader_fail(r, "truncated .npy preamble (%" PRId64 " bytes)", file_size);
        return FXA_ERR_INVALID_ARG;
    }
    uint32_t n = 0;
    for (size_t i = 0; i < length_bytes; i++)
        n |= (uint32_t)preamble[NPY_MAGIC_LEN + 2 + i] << (8 * i);
    if (n > FXA_NPY_MAX_HEADER_LEN) {
        reader_fail(r, "header length %" PRIu32 " exceeds the limit of %d bytes", n,
                    FXA_NPY_MAX_HEADER_LEN);
        return FXA_ERR_INVALID_ARG;
    }
    if ((int64_t)preamble_len + n > file_size) {
        reader_fail(r,
                    "header length %" PRIu32 " runs past the end of the file (%" PRId64 " bytes)",
                    n, file_size);
        return FXA_ERR_INVALID_ARG;
    }
    if (n == 0) {
        reader_fail(r, "header is empty");
        return FXA_ERR_INVALID_ARG;
    }
    *header_offset = preamble_len;
    *header_len = n;
    return FXA_OK;
}

/* The header dictionary (header_len bytes at offset), ending in a newline,
 * parsed into *hdr. */
static fxa_status read_header(const npy_reader *r, int fd, size_t offset, uint32_t header_len,
                              npy_header *hdr)
{
    char *header = malloc(header_len);
    if (header == NULL) {
        reader_fail(r, "out of memory for a %" PRIu32 "-byte header", header_len);
        return FXA_ERR_NO_MEMORY;
    }
    fxa_status status = read_at(r, fd, header, header_len, (int64_t)offset, "the header");
    if (status == FXA_OK) {
        status = FXA_ERR_INVALID_ARG;
        header_parser parser = {r, header, header_len, 0};
        if (header[header_len - 1] != '\n')
            reader_fail(r, "header is not terminated by a newline");
        else if (parse_header(&parser, hdr) == 0)
            status = FXA_OK;
    }
    free(header);
    return status;
}

/* Which bytes of the file a read takes: outer blocks of len * inner
 * contiguous bytes, stride apart, from offset + start * inner; the whole
 * array is one block. */
typedef struct npy_extent {
    int64_t offset;       /* of the data in the file */
    int64_t count, bytes; /* elements and bytes read */
    int64_t outer, inner, stride;
    int64_t start, len; /* along the axis (a slice) */
} npy_extent;

/* The extent of the whole array after checking that the file holds
 * exactly its bytes, then narrowed to the slice or shard asked for. */
static fxa_status plan_extent(const npy_reader *r, const npy_header *hdr, int64_t file_size,
                              int64_t data_offset, int axis, int64_t start, int64_t len, int parts,
                              int part, npy_extent *e)
{
    memset(e, 0, sizeof *e);
    e->offset = data_offset;
    char shape_text[FXA_IO_SHAPE_TEXT_CAP];
    fxa_io_format_shape(hdr->shape, hdr->ndim, '(', shape_text);
    if (shape_size(hdr->shape, hdr->ndim, hdr->itemsize, &e->count, &e->bytes) != 0) {
        reader_fail(r, "shape %s overflows: its size in bytes does not fit in int64", shape_text);
        return FXA_ERR_INVALID_ARG;
    }
    const int64_t avail = file_size - data_offset;
    if (avail < e->bytes) {
        reader_fail(r, "truncated: header says %" PRId64 " bytes of data, file has %" PRId64,
                    e->bytes, avail);
        return FXA_ERR_INVALID_ARG;
    }
    if (avail > e->bytes) {
        reader_fail(
            r, "file has %" PRId64 " bytes of data but header says %" PRId64 " (trailing bytes)",
            avail, e->bytes);
        return FXA_ERR_INVALID_ARG;
    }
    e->outer = 1;
    e->inner = hdr->itemsize;
    if (axis < 0)
        return FXA_OK;
    if (axis < hdr->ndim && parts > 0) {
        const int64_t n = hdr->shape[axis];
        start = part * (n / parts) + (part < n % parts ? part : n % parts);
        len = n / parts + (part < n % parts ? 1 : 0);
    }
    if (axis >= hdr->ndim || start < 0 || len < 0 || start > hdr->shape[axis] ||
        len > hdr->shape[axis] - start) {
        reader_fail(r,
                    "cannot take %" PRId64 " entries from index %" PRId64 " of axis %d of shape %s",
                    len, start, axis, shape_text);
        return FXA_ERR_INVALID_ARG;
    }
    for (int i = 0; i < axis; i++)
        e->outer *= hdr->shape[i];
    for (int i = axis + 1; i < hdr->ndim; i++)
        e->inner *= hdr->shape[i];
    /* Both products divide the array's bytes, which fit in int64. */
    e->stride = hdr->shape[axis] * e->inner;
    e->count = e->outer * len * (e->inner / hdr->itemsize);
    e->bytes = e->outer * len * e->inner;
    e->start = start;
    e->len = len;
    return FXA_OK;
}

/* The extent's bytes into a new 64-byte aligned buffer (*data), its tail
 * up to the alignment zeroed; at least one block, so that an empty array
 * still has a valid pointer. */
static fxa_status read_extent(const npy_reader *r, int fd, int axis, const npy_extent *e,
                              void **data)
{
    if ((uint64_t)e->bytes > (uint64_t)SIZE_MAX - (NPY_ALIGN - 1)) {
        reader_fail(r, "%" PRId64 " bytes of data do not fit in memory", e->bytes);
        return FXA_ERR_NO_MEMORY;
    }
    size_t alloc_bytes = ((size_t)e->bytes + (NPY_ALIGN - 1)) & ~(size_t)(NPY_ALIGN - 1);
    if (alloc_bytes == 0)
        alloc_bytes = NPY_ALIGN;
    unsigned char *buf = aligned_alloc(NPY_ALIGN, alloc_bytes);
    if (buf == NULL) {
        reader_fail(r, "out of memory for %" PRId64 " bytes of data", e->bytes);
        return FXA_ERR_NO_MEMORY;
    }
    memset(buf + e->bytes, 0, alloc_bytes - (size_t)e->bytes);
    fxa_status status = FXA_OK;
    if (axis < 0) {
        status = read_at(r, fd, buf, (size_t)e->bytes, e->offset, "the data");
    } else {
        const int64_t block = e->len * e->inner;
        for (int64_t o = 0; o < e->outer && status == FXA_OK && e->len > 0; o++)
            status = read_at(r, fd, buf + o * block, (size_t)block,
                             e->offset + o * e->stride + e->start * e->inner, "the data");
    }
    if (status != FXA_OK) {
        free(buf);
        return status;
    }
    *data = buf;
    return FXA_OK;
}

/* Whole file (axis < 0), a slice [start, start + len) of `axis`, or with
 * parts > 0 shard `part` of `parts` of it (the first shape[axis] mod parts
 * shards one longer): open, preamble, header, extent, data, and a file
 * unchanged from open to end. */
static fxa_status read_npy(const char *path, int axis, int64_t start, int64_t len, int parts,
                           int part, fxa_npy *out, char *err, size_t errlen)
{
    const npy_reader reader = {path != NULL ? path : "(null)", err, errlen};
    fxa_io_clear_error(err, errlen);
    if (out != NULL)
        memset(out, 0, sizeof *out); /* a refused request leaves an empty array too */
    fxa_status status = check_request(&reader, path, axis, start, len, parts, out);
    if (status != FXA_OK)
        return status;

    struct stat file_stat;
    char open_why[128];
    const int fd = fxa_io_open_regular(path, &file_stat, open_why, sizeof open_why);
    if (fd < 0) {
        reader_fail(&reader, "%s", open_why);
        return FXA_ERR_IO;
    }
    const int64_t file_size = (int64_t)file_stat.st_size;
    size_t header_offset = 0;
    uint32_t header_len = 0;
    npy_header hdr;
    memset(&hdr, 0, sizeof hdr);
    npy_extent extent;
    void *data = NULL;
    status = read_preamble(&reader, fd, file_size, &header_offset, &header_len);
    if (status == FXA_OK)
        status = read_header(&reader, fd, header_offset, header_len, &hdr);
    if (status == FXA_OK)
        status = plan_extent(&reader, &hdr, file_size, (int64_t)header_offset + header_len, axis,
                             start, len, parts, part, &extent);
    if (status == FXA_OK)
        status = read_extent(&reader, fd, axis, &extent, &data);
    if (status == FXA_OK) {
        const fxa_io_stamp before = fxa_io_stamp_of(&file_stat);
        char why[256];
        status = fxa_io_check_unchanged(fd, &before, why, sizeof why);
        if (status != FXA_OK)
            reader_fail(&reader, "%s", why);
    }
    close(fd);
    if (status != FXA_OK) {
        free(data);
        return status;
    }
    out->ndim = hdr.ndim;
    memcpy(out->shape, hdr.shape, sizeof out->shape);
    out->slice_axis = axis < 0 ? -1 : axis;
    out->slice_start = axis < 0 ? 0 : extent.start;
    out->slice_len = axis < 0 ? 0 : extent.len;
    out->dtype = hdr.dtype;
    out->count = extent.count;
    out->data = data;
    fxa_io_clear_error(err, errlen);
    return FXA_OK;
}

void fxa_npy_free(fxa_npy *a)
{
    if (a == NULL) {
        return;
    }
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ------------------------------------------------------------------------ */
/* Writer                                                                    */
/* ------------------------------------------------------------------------ */

/* NumPy's version 1.0 header for a '<f4' C-order array; returns its total length. */
static size_t build_header(int ndim, const int64_t *shape, unsigned char header[WRITE_HEADER_CAP])
{
    const size_t prefix_len = NPY_MAGIC_LEN + 2 + 2;
    char shape_text[FXA_IO_SHAPE_TEXT_CAP];
    fxa_io_format_shape(shape, ndim, '(', shape_text);
    int dict_len = snprintf((char *)header + prefix_len, WRITE_HEADER_CAP - prefix_len,
                            "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }", shape_text);
    size_t dict_end = prefix_len + (size_t)dict_len;
    size_t total = (dict_end + 1 + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    memset(header + dict_end, ' ', total - 1 - dict_end);
    header[total - 1] = '\n';

    size_t header_len = total - prefix_len;
    memcpy(header, NPY_MAGIC, NPY_MAGIC_LEN);
    header[NPY_MAGIC_LEN] = 1;
    header[NPY_MAGIC_LEN + 1] = 0;
    header[NPY_MAGIC_LEN + 2] = (unsigned char)(header_len & 0xff);
    header[NPY_MAGIC_LEN + 3] = (unsigned char)(header_len >> 8);
    return total;
}

fxa_status fxa_npy_stage_f32(const char *path, int ndim, const int64_t *shape, const float *data,
                             fxa_staged *st, char *err, size_t errlen)
{
    unsigned char header[WRITE_HEADER_CAP];

    fxa_io_clear_error(err, errlen);
    if (path == NULL || st == NULL) {
        fxa_io_set_error(err, errlen, "npy writer: no path or no staging struct given");
        if (st != NULL)
            memset(st, 0, sizeof *st);
        return FXA_ERR_INVALID_ARG;
    }
    memset(st, 0, sizeof *st);
    if (path[0] == '\0') {
        fxa_io_set_error(err, errlen, "npy writer: the output path is empty");
        return FXA_ERR_INVALID_ARG;
    }
    if (ndim < 0 || ndim > FXA_NPY_MAX_DIMS || (ndim > 0 && shape == NULL)) {
        fxa_io_set_error(err, errlen, "%s: cannot write %d dimensions (0..%d, with a shape)", path,
                         ndim, FXA_NPY_MAX_DIMS);
        return FXA_ERR_INVALID_ARG;
    }
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0) {
            fxa_io_set_error(err, errlen, "%s: negative dimension %" PRId64 " in shape", path,
                             shape[i]);
            return FXA_ERR_INVALID_ARG;
        }
    }
    int64_t count;
    int64_t data_bytes;
    if (shape_size(shape, ndim, (int64_t)sizeof(float), &count, &data_bytes) != 0 ||
        (uint64_t)data_bytes > (uint64_t)SIZE_MAX) {
        fxa_io_set_error(err, errlen, "%s: shape overflows: its size in bytes is too large", path);
        return FXA_ERR_INVALID_ARG;
    }
    if (data_bytes > 0 && data == NULL) {
        fxa_io_set_error(err, errlen, "%s: no data given for %" PRId64 " elements", path, count);
        return FXA_ERR_INVALID_ARG;
    }
    const size_t header_total = build_header(ndim, shape, header);
    return fxa_stage_file(path, header, header_total, data, (size_t)data_bytes, st, err, errlen);
}
