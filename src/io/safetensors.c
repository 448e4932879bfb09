/*
 * .safetensors reader (hostile-input safe). See safetensors.h.
 * Format reference: the README of github.com/huggingface/safetensors and its Rust reader
 * (safetensors/src/tensor.rs), whose checks this reader makes and tightens (strict JSON,
 * exactly three fields per tensor, no duplicate keys).
 *
 * The header is parsed twice (io/json.h): a syntax pass checks that it is one strict JSON value
 * with only whitespace around it (and bounds the recursion), then a schema pass walks it
 * again, decoding the strings it keeps into one arena no larger than the header.
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64

#include "fxattn_safetensors.h"
#include "base/alloc.h"

#include "io/file_io.h"
#include "io/json.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c returns data in file order (little-endian) and needs a little-endian host"
#endif

/* Longest text copied from a file into a message. */
#define SNIPPET_CAP 80
/* Largest shape entry or offset: integers beyond 2^53 are not exact in JSON readers that use
 * doubles, so a file holding one is refused. */
#define MAX_JSON_INT ((int64_t)1 << 53)
#define LEN_FIELD 8 /* the u64 header length at the start of the file */

/* ------------------------------------------------------------------------ */
/* dtypes                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct dtype_info {
    const char *name;
    int bits; /* per element */
    int supported;
    fxa_st_dtype dtype;
} dtype_info;

/* Every dtype of the format (the Dtype enum of the Rust reader). */
static const dtype_info g_dtypes[] = {
    {"F32", 32, 1, FXA_ST_F32},        {"BF16", 16, 1, FXA_ST_BF16},
    {"F16", 16, 1, FXA_ST_F16},        {"F8_E4M3", 8, 1, FXA_ST_F8_E4M3},
    {"BOOL", 8, 0, FXA_ST_F32},        {"U8", 8, 0, FXA_ST_F32},
    {"I8", 8, 0, FXA_ST_F32},          {"F8_E5M2", 8, 0, FXA_ST_F32},
    {"F8_E8M0", 8, 0, FXA_ST_F32},     {"F8_E4M3FNUZ", 8, 0, FXA_ST_F32},
    {"F8_E5M2FNUZ", 8, 0, FXA_ST_F32}, {"I16", 16, 0, FXA_ST_F32},
    {"U16", 16, 0, FXA_ST_F32},        {"I32", 32, 0, FXA_ST_F32},
    {"U32", 32, 0, FXA_ST_F32},        {"I64", 64, 0, FXA_ST_F32},
    {"U64", 64, 0, FXA_ST_F32},        {"F64", 64, 0, FXA_ST_F32},
    {"C64", 64, 0, FXA_ST_F32},        {"F4", 4, 0, FXA_ST_F32},
    {"F6_E2M3", 6, 0, FXA_ST_F32},     {"F6_E3M2", 6, 0, FXA_ST_F32},
};

static const dtype_info *find_dtype(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof g_dtypes / sizeof g_dtypes[0]; i++) {
        if (strlen(g_dtypes[i].name) == len && memcmp(g_dtypes[i].name, name, len) == 0) {
            return &g_dtypes[i];
        }
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* The file object                                                           */
/* ------------------------------------------------------------------------ */

typedef struct st_meta {
    const char *key;
    const char *value;
} st_meta;

struct fxa_st_file {
    char *path;               /* for messages */
    int fd;                   /* -1 for a file in memory */
    const unsigned char *mem; /* the whole file when in memory */
    int64_t data_start;       /* 8 + N */
    int64_t data_size;        /* bytes after the header */
    fxa_io_stamp stamp;       /* the file as opened: reads check it has not changed */
    char *arena;              /* every name, key and value, NUL-terminated */
    fxa_st_tensor *tensors;   /* data order once parsed */
    int64_t count;
    size_t cap;
    const fxa_st_tensor **by_name; /* sorted by strcmp of the names */
    st_meta *meta;                 /* sorted by key */
    int64_t meta_count;
    size_t meta_cap;
    int has_meta;
};

/* items (*cap elements of size bytes) grown to hold more than used, or NULL (items is then
 * unchanged and still owned by the caller). */
static void *grow(void *items, size_t *cap, size_t used, size_t size)
{
    if (used < *cap) {
        return items;
    }
    size_t new_cap = *cap == 0 ? 16 : *cap * 2;
    if (new_cap > SIZE_MAX / size) {
        return NULL;
    }
    void *bigger = realloc(items, new_cap * size);
    if (bigger != NULL) {
        *cap = new_cap;
    }
    return bigger;
}

/* ------------------------------------------------------------------------ */
/* Schema (io/json.h reads the JSON)                                         */
/* ------------------------------------------------------------------------ */

/* A byte of a JSON number token. */
static int is_number_char(int c)
{
    return fxa_json_is_digit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* Entry `index` of a tensor's shape or data_offsets (field): an integer 0..2^53 written
 * without sign, fraction or exponent. */
static int parse_count(fxa_jp *p, const char *tensor, const char *field, int index, int64_t *out)
{
    const int c = fxa_jp_peek(p);
    if (c != '-' && !fxa_json_is_digit(c)) {
        return fxa_jp_fail(p, "tensor '%s': %s entry %d must be a non-negative integer, found %s",
                           tensor, field, index, fxa_json_value_kind(c));
    }
    const size_t begin = p->pos;
    int64_t value = 0;
    int too_large = 0;
    int integer = 1;
    while (is_number_char(fxa_jp_peek(p))) {
        const int d = fxa_jp_peek(p);
        if (!fxa_json_is_digit(d)) {
            integer = 0;
        } else if (integer && !too_large) {
            value = value * 10 + (d - '0');
            too_large = value > MAX_JSON_INT;
        }
        p->pos++;
    }
    char shown[SNIPPET_CAP];
    fxa_io_snippet((const char *)p->s + begin, p->pos - begin, shown, sizeof shown);
    if (c == '-') {
        return fxa_jp_fail(p, "tensor '%s': %s entry %d is negative (%s)", tensor, field, index,
                           shown);
    }
    if (!integer) {
        return fxa_jp_fail(p, "tensor '%s': %s entry %d is not an integer (%s)", tensor, field,
                           index, shown);
    }
    if (too_large) {
        return fxa_jp_fail(p, "tensor '%s': %s entry %d (%s) is larger than 2^53", tensor, field,
                           index, shown);
    }
    *out = value;
    return 0;
}

/* The integers of a tensor's shape or data_offsets: at most cap of them into values, *n set
 * to how many. */
typedef struct count_walk {
    const char *tensor;   /* its name, shown */
    const char *field;    /* "shape" or "data_offsets" */
    const char *too_many; /* the message past cap */
    int64_t *values;
    int cap;
    int *n;
} count_walk;

static int count_element(fxa_jp *p, int index, void *user)
{
    const count_walk *w = user;
    if (index == w->cap) {
        return fxa_jp_fail(p, "tensor '%s': %s", w->tensor, w->too_many);
    }
    if (parse_count(p, w->tensor, w->field, index, &w->values[index]) != 0) {
        return -1;
    }
    *w->n = index + 1;
    return 0;
}

/* Read the array at p->pos as a tensor's field; must: what it must be, in messages. */
static int parse_counts(fxa_jp *p, const count_walk *w, const char *must)
{
    char text[SNIPPET_CAP + 64];
    snprintf(text, sizeof text, "tensor '%s': %s %s", w->tensor, w->field, must);
    return fxa_jp_array(p, text, count_element, (void *)w);
}

static int parse_shape(fxa_jp *p, const char *tensor, fxa_st_tensor *t)
{
    char too_many[64];
    snprintf(too_many, sizeof too_many, "shape has more than %d dimensions", FXA_ST_MAX_DIMS);
    const count_walk w = {tensor, "shape", too_many, t->shape, FXA_ST_MAX_DIMS, &t->ndim};
    return parse_counts(p, &w, "must be an array of integers");
}

static int parse_offsets(fxa_jp *p, const char *tensor, int64_t offsets[2])
{
    int n = 0;
    const count_walk w = {tensor,
                          "data_offsets",
                          "data_offsets has more than 2 entries (must be [begin, end])",
                          offsets,
                          2,
                          &n};
    if (parse_counts(p, &w, "must be an array [begin, end]") != 0) {
        return -1;
    }
    if (n != 2) {
        return fxa_jp_fail(p, "tensor '%s': data_offsets has %d entr%s (must be [begin, end])",
                           tensor, n, n == 1 ? "y" : "ies");
    }
    return 0;
}

enum { FIELD_DTYPE = 1, FIELD_SHAPE = 2, FIELD_OFFSETS = 4 };

/* Sizes of a shape of elements of `bits` bits. -1: the size in bits overflows int64 (so
 * does any partial product of the non-zero dimensions); 1: not a whole number of bytes. */
static int shape_size(const int64_t *shape, int ndim, int bits, int64_t *count_out,
                      int64_t *bytes_out)
{
    int64_t total_bits;
    if (fxa_io_shape_total(shape, ndim, bits, &total_bits) != 0)
        return -1;
    *count_out = total_bits / bits;
    *bytes_out = total_bits / 8;
    return total_bits % 8 != 0 ? 1 : 0;
}

/* A tensor's fields as they are read. */
typedef struct tensor_walk {
    const char *shown; /* its name, shown */
    fxa_st_tensor *t;
    const dtype_info *dtype;
    int64_t offsets[2];
    unsigned seen;
} tensor_walk;

static int parse_dtype(fxa_jp *p, tensor_walk *w)
{
    const char *text;
    size_t text_len;
    char text_shown[SNIPPET_CAP];
    if (fxa_jp_peek(p) != '"') {
        return fxa_jp_fail(p, "tensor '%s': dtype must be a string, found %s", w->shown,
                           fxa_json_value_kind(fxa_jp_peek(p)));
    }
    if (fxa_jp_string(p, &text, &text_len) != 0) {
        return -1;
    }
    w->dtype = find_dtype(text, text_len);
    if (w->dtype == NULL) {
        fxa_io_snippet(text, text_len, text_shown, sizeof text_shown);
        return fxa_jp_fail(p, "tensor '%s': unknown dtype '%s'", w->shown, text_shown);
    }
    return 0;
}

/* One field of a tensor's object: dtype, shape or data_offsets, each once. */
static int tensor_member(fxa_jp *p, const char *field, size_t field_len, void *user)
{
    tensor_walk *w = user;
    char field_shown[SNIPPET_CAP];
    fxa_io_snippet(field, field_len, field_shown, sizeof field_shown);
    unsigned bit = 0;
    if (field_len == 5 && memcmp(field, "dtype", 5) == 0) {
        bit = FIELD_DTYPE;
    } else if (field_len == 5 && memcmp(field, "shape", 5) == 0) {
        bit = FIELD_SHAPE;
    } else if (field_len == 12 && memcmp(field, "data_offsets", 12) == 0) {
        bit = FIELD_OFFSETS;
    } else {
        return fxa_jp_fail(p,
                           "tensor '%s': unknown field '%s' (a tensor has exactly dtype, shape "
                           "and data_offsets)",
                           w->shown, field_shown);
    }
    if (w->seen & bit) {
        return fxa_jp_fail(p, "tensor '%s': duplicate field '%s'", w->shown, field_shown);
    }
    w->seen |= bit;
    if (bit == FIELD_DTYPE) {
        return parse_dtype(p, w);
    }
    return bit == FIELD_SHAPE ? parse_shape(p, w->shown, w->t)
                              : parse_offsets(p, w->shown, w->offsets);
}

/* A tensor name or __metadata__ key (`what`), shown into shown[SNIPPET_CAP]; fails unless it
 * is at most FXA_ST_MAX_NAME_LEN bytes long and free of U+0000. */
static int check_name(fxa_jp *p, const char *what, const char *name, size_t len,
                      char shown[SNIPPET_CAP])
{
    fxa_io_snippet(name, len, shown, SNIPPET_CAP);
    if (len > FXA_ST_MAX_NAME_LEN) {
        return fxa_jp_fail(p, "%s '%s' is %zu bytes long; the limit is %d", what, shown, len,
                           FXA_ST_MAX_NAME_LEN);
    }
    if (memchr(name, '\0', len) != NULL) {
        return fxa_jp_fail(p, "%s '%s' contains the character U+0000", what, shown);
    }
    return 0;
}

/* The value of tensor `name` (decoded, in the arena). */
static int parse_tensor(fxa_jp *p, fxa_st_file *f, const char *name, size_t name_len)
{
    char shown[SNIPPET_CAP];
    if (check_name(p, "tensor name", name, name_len, shown) != 0) {
        return -1;
    }
    if (f->count == FXA_ST_MAX_TENSORS) {
        return fxa_jp_fail(p, "more than %d tensors", FXA_ST_MAX_TENSORS);
    }
    fxa_st_tensor t;
    memset(&t, 0, sizeof t);
    t.name = name;
    tensor_walk w = {.shown = shown, .t = &t};
    char must[SNIPPET_CAP + 80];
    snprintf(must, sizeof must,
             "tensor '%s': expected an object with dtype, shape and data_offsets", shown);
    if (fxa_jp_object(p, must, tensor_member, &w) != 0) {
        return -1;
    }
    const dtype_info *dtype = w.dtype;
    const int64_t *offsets = w.offsets;
    const unsigned seen = w.seen;
    static const char *const field_names[] = {"dtype", "shape", "data_offsets"};
    for (int i = 0; i < 3; i++) {
        if (!(seen & (1u << i))) {
            return fxa_jp_fail(p, "tensor '%s': missing field '%s'", shown, field_names[i]);
        }
    }

    char shape_text[FXA_IO_SHAPE_TEXT_CAP];
    fxa_io_format_shape(t.shape, t.ndim, '[', shape_text);
    const int size_status = shape_size(t.shape, t.ndim, dtype->bits, &t.count, &t.nbytes);
    if (size_status < 0) {
        return fxa_jp_fail(p,
                           "tensor '%s': shape %s of %s overflows: its size does not fit in int64",
                           shown, shape_text, dtype->name);
    }
    if (size_status > 0) {
        return fxa_jp_fail(p,
                           "tensor '%s': %" PRId64 " elements of %s (shape %s) are not a whole "
                           "number of bytes",
                           shown, t.count, dtype->name, shape_text);
    }
    if (offsets[0] > offsets[1]) {
        return fxa_jp_fail(p,
                           "tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] end before they "
                           "begin",
                           shown, offsets[0], offsets[1]);
    }
    if (offsets[1] - offsets[0] != t.nbytes) {
        return fxa_jp_fail(p,
                           "tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] span %" PRId64
                           " bytes but %s with shape %s needs %" PRId64,
                           shown, offsets[0], offsets[1], offsets[1] - offsets[0], dtype->name,
                           shape_text, t.nbytes);
    }
    if (offsets[1] > f->data_size) {
        return fxa_jp_fail(p,
                           "tensor '%s': data_offsets [%" PRId64 ", %" PRId64 "] run past the end "
                           "of the data buffer (%" PRId64 " bytes)",
                           shown, offsets[0], offsets[1], f->data_size);
    }
    t.dtype_name = dtype->name;
    t.supported = dtype->supported;
    t.dtype = dtype->dtype;
    t.offset = offsets[0];
    t.file_offset = f->data_start + offsets[0];
    fxa_st_tensor *tensors = grow(f->tensors, &f->cap, (size_t)f->count, sizeof *f->tensors);
    if (tensors == NULL) {
        return fxa_jp_out_of_memory(p);
    }
    f->tensors = tensors;
    f->tensors[f->count++] = t;
    return 0;
}

/* One __metadata__ member: a string key and a string value, both kept. */
static int metadata_member(fxa_jp *p, const char *key, size_t key_len, void *user)
{
    fxa_st_file *f = user;
    const char *value;
    size_t value_len;
    char key_shown[SNIPPET_CAP];
    if (check_name(p, "__metadata__ key", key, key_len, key_shown) != 0) {
        return -1;
    }
    fxa_jp_keep(p, key_len);
    if (fxa_jp_peek(p) != '"') {
        return fxa_jp_fail(p, "__metadata__ value of '%s' must be a string, found %s", key_shown,
                           fxa_json_value_kind(fxa_jp_peek(p)));
    }
    if (fxa_jp_string(p, &value, &value_len) != 0) {
        return -1;
    }
    if (memchr(value, '\0', value_len) != NULL) {
        return fxa_jp_fail(p, "__metadata__ value of '%s' contains the character U+0000",
                           key_shown);
    }
    fxa_jp_keep(p, value_len);
    st_meta *meta = grow(f->meta, &f->meta_cap, (size_t)f->meta_count, sizeof *f->meta);
    if (meta == NULL) {
        return fxa_jp_out_of_memory(p);
    }
    f->meta = meta;
    f->meta[f->meta_count].key = key;
    f->meta[f->meta_count].value = value;
    f->meta_count++;
    return 0;
}

/* One member of the header: __metadata__ or a tensor (its name kept). */
static int top_member(fxa_jp *p, const char *key, size_t key_len, void *user)
{
    fxa_st_file *f = user;
    if (key_len == 12 && memcmp(key, "__metadata__", 12) == 0) {
        if (f->has_meta) {
            return fxa_jp_fail(p, "duplicate key '__metadata__'");
        }
        f->has_meta = 1;
        return fxa_jp_object(p, "__metadata__ must be an object of strings", metadata_member, f);
    }
    fxa_jp_keep(p, key_len);
    return parse_tensor(p, f, key, key_len);
}

/* Schema pass over the whole header (its syntax already checked). */
static int parse_top(fxa_jp *p, fxa_st_file *f)
{
    fxa_jp_skip_ws(p);
    return fxa_jp_object(p, "header must be a JSON object", top_member, f);
}

static int by_name(const void *a, const void *b)
{
    const fxa_st_tensor *const *x = a;
    const fxa_st_tensor *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Data order: by (begin, end), ties in header order (the array's order). */
static int by_offsets(const void *a, const void *b)
{
    const fxa_st_tensor *const *x = a;
    const fxa_st_tensor *const *y = b;
    const int64_t xe = (*x)->offset + (*x)->nbytes;
    const int64_t ye = (*y)->offset + (*y)->nbytes;
    if ((*x)->offset != (*y)->offset) {
        return (*x)->offset < (*y)->offset ? -1 : 1;
    }
    if (xe != ye) {
        return xe < ye ? -1 : 1;
    }
    return (*x > *y) - (*x < *y);
}

static int by_key(const void *a, const void *b)
{
    return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

/* Whole-file checks after the schema pass: unique names and keys, tensors tiling the data
 * buffer. Puts the tensors in data order and builds the name index. */
static fxa_status finish(const fxa_msg *ctx, fxa_st_file *f)
{
    char a_shown[SNIPPET_CAP];
    char b_shown[SNIPPET_CAP];
    const size_t n = (size_t)f->count;
    const fxa_st_tensor **order = NULL;
    fxa_st_tensor *sorted = NULL;
    fxa_status status = FXA_ERR_INVALID_ARG;

    if (f->meta_count > 1) {
        qsort(f->meta, (size_t)f->meta_count, sizeof *f->meta, by_key);
        for (int64_t i = 1; i < f->meta_count; i++) {
            if (strcmp(f->meta[i - 1].key, f->meta[i].key) == 0) {
                fxa_io_snippet(f->meta[i].key, strlen(f->meta[i].key), a_shown, sizeof a_shown);
                fxa_msg_fail(ctx, "duplicate __metadata__ key '%s'", a_shown);
                return FXA_ERR_INVALID_ARG;
            }
        }
    }

    order = malloc((n > 0 ? n : 1) * sizeof *order);
    f->by_name = malloc((n > 0 ? n : 1) * sizeof *f->by_name);
    sorted = malloc((n > 0 ? n : 1) * sizeof *sorted);
    if (order == NULL || f->by_name == NULL || sorted == NULL) {
        fxa_msg_fail(ctx, "out of memory for %zu tensors", n);
        status = FXA_ERR_NO_MEMORY;
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        order[i] = &f->tensors[i];
    }
    qsort(order, n, sizeof *order, by_name);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(order[i - 1]->name, order[i]->name) == 0) {
            fxa_io_snippet(order[i]->name, strlen(order[i]->name), a_shown, sizeof a_shown);
            fxa_msg_fail(ctx, "duplicate tensor name '%s'", a_shown);
            goto done;
        }
    }

    qsort(order, n, sizeof *order, by_offsets);
    int64_t expected = 0; /* where the next tensor must begin */
    const fxa_st_tensor *prev = NULL;
    for (size_t i = 0; i < n; i++) {
        const fxa_st_tensor *t = order[i];
        if (t->offset != expected) {
            fxa_io_snippet(t->name, strlen(t->name), b_shown, sizeof b_shown);
            fxa_io_snippet(prev != NULL ? prev->name : "", prev != NULL ? strlen(prev->name) : 0,
                           a_shown, sizeof a_shown);
        }
        if (t->offset < expected && prev != NULL) { /* prev: the last non-empty tensor */
            fxa_msg_fail(ctx,
                         "tensors '%s' [%" PRId64 ", %" PRId64 ") and '%s' [%" PRId64 ", %" PRId64
                         ") overlap in the data buffer",
                         a_shown, prev->offset, prev->offset + prev->nbytes, b_shown, t->offset,
                         t->offset + t->nbytes);
            goto done;
        }
        if (t->offset != expected) {
            fxa_msg_fail(ctx,
                         "hole in the data buffer: bytes [%" PRId64 ", %" PRId64 ") belong to no "
                         "tensor (%s%s%s'%s')",
                         expected, t->offset, prev != NULL ? "between '" : "",
                         prev != NULL ? a_shown : "", prev != NULL ? "' and " : "before ", b_shown);
            goto done;
        }
        if (t->nbytes > 0 || prev == NULL) {
            prev = t;
        }
        expected = t->offset + t->nbytes;
    }
    if (expected != f->data_size) {
        if (n == 0) {
            fxa_msg_fail(ctx, "the header lists no tensors but %" PRId64 " bytes of data follow it",
                         f->data_size);
        } else {
            fxa_msg_fail(ctx,
                         "%" PRId64
                         " bytes of data follow the last tensor (the tensors end at %" PRId64
                         ", the data buffer holds %" PRId64 ")",
                         f->data_size - expected, expected, f->data_size);
        }
        goto done;
    }

    for (size_t i = 0; i < n; i++) {
        sorted[i] = *order[i];
    }
    free(f->tensors);
    f->tensors = sorted;
    f->cap = n;
    sorted = NULL;
    for (size_t i = 0; i < n; i++) {
        f->by_name[i] = &f->tensors[i];
    }
    qsort(f->by_name, n, sizeof *f->by_name, by_name);
    status = FXA_OK;

done:
    free(order);
    free(sorted);
    return status;
}

/* ------------------------------------------------------------------------ */
/* Open                                                                      */
/* ------------------------------------------------------------------------ */

/* The header length field against the limit and the file size (at least 8). */
static int check_header_len(const fxa_msg *ctx, uint64_t n, int64_t file_size)
{
    if (n > FXA_ST_MAX_HEADER_LEN) {
        fxa_msg_fail(ctx, "header length %" PRIu64 " exceeds the limit of %d bytes", n,
                     FXA_ST_MAX_HEADER_LEN);
        return -1;
    }
    if (n > (uint64_t)(file_size - LEN_FIELD)) {
        fxa_msg_fail(ctx,
                     "header length %" PRIu64 " runs past the end of the file (%" PRId64 " bytes)",
                     n, file_size);
        return -1;
    }
    if (n == 0) {
        fxa_msg_fail(ctx, "header is empty (length 0)");
        return -1;
    }
    return 0;
}

static int check_file_size(const fxa_msg *ctx, int64_t size)
{
    if (size < LEN_FIELD) {
        fxa_msg_fail(ctx,
                     "file is %" PRId64 " bytes, too short for the 8-byte header length (not a "
                     ".safetensors file)",
                     size);
        return -1;
    }
    return 0;
}

static uint64_t load_le64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = v << 8 | b[i];
    }
    return v;
}

/* Read exactly n bytes at offset (fxa_io_pread_all), then check that the file is still as
 * stamped when it was opened; the reason goes into the reader's error with the path. */
static fxa_status read_at(const fxa_msg *ctx, int fd, const fxa_io_stamp *stamp, void *buf,
                          size_t n, int64_t offset, const char *what)
{
    char why[256];
    fxa_status st = fxa_io_pread_all(fd, buf, n, offset, what, why, sizeof why);
    if (st == FXA_OK)
        st = fxa_io_check_unchanged(fd, stamp, why, sizeof why);
    if (st != FXA_OK)
        fxa_msg_fail(ctx, "%s", why);
    return st;
}

static fxa_st_file *new_file(const fxa_msg *ctx)
{
    fxa_st_file *f = calloc(1, sizeof *f);
    if (f != NULL) {
        f->fd = -1;
        f->path = malloc(strlen(ctx->path) + 1);
        if (f->path == NULL) {
            free(f);
            return NULL;
        }
        strcpy(f->path, ctx->path);
    }
    if (f == NULL) {
        fxa_msg_fail(ctx, "out of memory");
    }
    return f;
}

/* Both passes over the header; fills f. */
static fxa_status parse_header(const fxa_msg *ctx, const unsigned char *header, size_t len,
                               fxa_st_file *f)
{
    fxa_jp p;
    fxa_jp_init(&p, ctx, "header", FXA_ST_MAX_DEPTH, header, len);
    if (fxa_jp_check_syntax(&p) != 0) {
        return p.status;
    }
    f->arena = malloc(len + 1);
    if (f->arena == NULL) {
        fxa_msg_fail(ctx, "out of memory for a %zu-byte header", len);
        return FXA_ERR_NO_MEMORY;
    }
    p.pos = 0;
    p.arena = f->arena;
    p.arena_cap = len + 1;
    if (parse_top(&p, f) != 0) {
        return p.status;
    }
    return finish(ctx, f);
}

fxa_status fxa_st_open(const char *path, fxa_st_file **out, char *err, size_t errlen)
{
    const fxa_msg ctx = {path != NULL ? path : "(null)", err, errlen};
    fxa_st_file *f = NULL;
    unsigned char *header = NULL;
    fxa_status status = FXA_ERR_INVALID_ARG;
    struct stat st;
    unsigned char len_field[LEN_FIELD];

    fxa_io_clear_error(err, errlen);
    if (out == NULL || path == NULL) {
        fxa_msg_fail(&ctx, "no path or no output given");
        return FXA_ERR_INVALID_ARG;
    }
    *out = NULL;
    if (path[0] == '\0') {
        fxa_msg_fail(&ctx, "the path is empty");
        return FXA_ERR_INVALID_ARG;
    }
    f = new_file(&ctx);
    if (f == NULL) {
        return FXA_ERR_NO_MEMORY;
    }
    char open_why[128];
    f->fd = fxa_io_open_regular(path, &st, open_why, sizeof open_why);
    if (f->fd < 0) {
        fxa_msg_fail(&ctx, "%s", open_why);
        status = FXA_ERR_IO;
        goto error;
    }
    f->stamp = fxa_io_stamp_of(&st);
    const int64_t file_size = (int64_t)st.st_size;
    if (check_file_size(&ctx, file_size) != 0) {
        goto error;
    }
    status = read_at(&ctx, f->fd, &f->stamp, len_field, LEN_FIELD, 0, "the header length");
    if (status != FXA_OK) {
        goto error;
    }
    status = FXA_ERR_INVALID_ARG;
    const uint64_t n = load_le64(len_field);
    if (check_header_len(&ctx, n, file_size) != 0) {
        goto error;
    }
    header = malloc((size_t)n);
    if (header == NULL) {
        fxa_msg_fail(&ctx, "out of memory for a %" PRIu64 "-byte header", n);
        status = FXA_ERR_NO_MEMORY;
        goto error;
    }
    status = read_at(&ctx, f->fd, &f->stamp, header, (size_t)n, LEN_FIELD, "the header");
    if (status != FXA_OK) {
        goto error;
    }
    f->data_start = LEN_FIELD + (int64_t)n;
    f->data_size = file_size - f->data_start;
    status = parse_header(&ctx, header, (size_t)n, f);
    if (status != FXA_OK) {
        goto error;
    }
    free(header);
    fxa_io_clear_error(err, errlen);
    *out = f;
    return FXA_OK;

error:
    free(header);
    fxa_st_close(f);
    return status;
}

fxa_status fxa_st_parse(const unsigned char *bytes, size_t n, const char *name_for_errors,
                        fxa_st_file **out, char *err, size_t errlen)
{
    const fxa_msg ctx = {name_for_errors != NULL ? name_for_errors : "(memory)", err, errlen};
    fxa_io_clear_error(err, errlen);
    if (out == NULL || (bytes == NULL && n > 0)) {
        fxa_msg_fail(&ctx, "no bytes or no output given");
        return FXA_ERR_INVALID_ARG;
    }
    *out = NULL;
    if ((uint64_t)n > (uint64_t)INT64_MAX) {
        fxa_msg_fail(&ctx, "%zu bytes are too many", n);
        return FXA_ERR_INVALID_ARG;
    }
    const int64_t size = (int64_t)n;
    if (check_file_size(&ctx, size) != 0) {
        return FXA_ERR_INVALID_ARG;
    }
    const uint64_t header_len = load_le64(bytes);
    if (check_header_len(&ctx, header_len, size) != 0) {
        return FXA_ERR_INVALID_ARG;
    }
    fxa_st_file *f = new_file(&ctx);
    if (f == NULL) {
        return FXA_ERR_NO_MEMORY;
    }
    f->mem = bytes;
    f->data_start = LEN_FIELD + (int64_t)header_len;
    f->data_size = size - f->data_start;
    fxa_status status = parse_header(&ctx, bytes + LEN_FIELD, (size_t)header_len, f);
    if (status != FXA_OK) {
        fxa_st_close(f);
        return status;
    }
    fxa_io_clear_error(err, errlen);
    *out = f;
    return FXA_OK;
}

void fxa_st_close(fxa_st_file *f)
{
    if (f == NULL) {
        return;
    }
    if (f->fd >= 0) {
        close(f->fd);
    }
    FXA_FREE_EACH(f->path, f->arena, f->tensors, f->by_name, f->meta, f);
}

/* ------------------------------------------------------------------------ */
/* Queries                                                                   */
/* ------------------------------------------------------------------------ */

int64_t fxa_st_count(const fxa_st_file *f)
{
    return f != NULL ? f->count : 0;
}

const fxa_st_tensor *fxa_st_at(const fxa_st_file *f, int64_t i)
{
    if (f == NULL || i < 0 || i >= f->count) {
        return NULL;
    }
    return &f->tensors[i];
}

/* bsearch keys: a name against a tensor pointer of by_name, and against a metadata entry. */
static int find_by_name(const void *key, const void *elem)
{
    return strcmp(key, (*(const fxa_st_tensor *const *)elem)->name);
}

static int find_by_key(const void *key, const void *elem)
{
    return strcmp(key, ((const st_meta *)elem)->key);
}

const fxa_st_tensor *fxa_st_find(const fxa_st_file *f, const char *name)
{
    if (f == NULL || name == NULL || f->count == 0) {
        return NULL;
    }
    const fxa_st_tensor *const *at =
        bsearch(name, f->by_name, (size_t)f->count, sizeof *f->by_name, find_by_name);
    return at != NULL ? *at : NULL;
}

const char *fxa_st_metadata(const fxa_st_file *f, const char *key)
{
    if (f == NULL || key == NULL || f->meta_count == 0) {
        return NULL;
    }
    const st_meta *at = bsearch(key, f->meta, (size_t)f->meta_count, sizeof *f->meta, find_by_key);
    return at != NULL ? at->value : NULL;
}

int64_t fxa_st_metadata_count(const fxa_st_file *f)
{
    return f != NULL ? f->meta_count : 0;
}

const char *fxa_st_metadata_key(const fxa_st_file *f, int64_t i)
{
    if (f == NULL || i < 0 || i >= f->meta_count) {
        return NULL;
    }
    return f->meta[i].key;
}

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */
/* ------------------------------------------------------------------------ */

/* 1 when t points at one of f's tensors. */
static int owns(const fxa_st_file *f, const fxa_st_tensor *t)
{
    const uintptr_t base = (uintptr_t)f->tensors;
    const uintptr_t at = (uintptr_t)t;
    if (f->count == 0 || at < base) {
        return 0;
    }
    const uintptr_t delta = at - base;
    return delta % sizeof *t == 0 && delta / sizeof *t < (uintptr_t)f->count;
}

/* The tensor checks shared by the readers: t is f's, of a dtype fxattn supports (and that fp32
 * reads can convert when to_f32). Messages are "<path>: tensor '<name>': ...". */
static fxa_status check_tensor(const fxa_msg *ctx, const fxa_st_file *f, const fxa_st_tensor *t,
                               int to_f32)
{
    char shown[SNIPPET_CAP];
    if (f == NULL || t == NULL || !owns(f, t)) {
        fxa_msg_fail(ctx, "no file, or a tensor that is not one of this file's");
        return FXA_ERR_INVALID_ARG;
    }
    fxa_io_snippet(t->name, strlen(t->name), shown, sizeof shown);
    if (!t->supported) {
        fxa_msg_fail(ctx,
                     "tensor '%s': dtype %s is not supported (only F32, BF16, F16 and F8_E4M3 are)",
                     shown, t->dtype_name);
        return FXA_ERR_UNSUPPORTED;
    }
    if (to_f32 && t->dtype == FXA_ST_F8_E4M3) {
        fxa_msg_fail(ctx,
                     "tensor '%s': converting F8_E4M3 to fp32 is not supported yet (read it raw)",
                     shown);
        return FXA_ERR_UNSUPPORTED;
    }
    return FXA_OK;
}

/* The destination of a read of t (checked by check_tensor) has exactly the size of what is read
 * (want == have, counted in `unit`s); `what` names it in the message ("the tensor has"). */
static fxa_status check_size(const fxa_msg *ctx, const fxa_st_tensor *t, const void *dst,
                             uint64_t have, uint64_t want, const char *unit, const char *what)
{
    char shown[SNIPPET_CAP];
    fxa_io_snippet(t->name, strlen(t->name), shown, sizeof shown);
    if (have != want) {
        fxa_msg_fail(ctx, "tensor '%s': destination holds %" PRIu64 " %s but %s %" PRIu64, shown,
                     have, unit, what, want);
        return FXA_ERR_INVALID_ARG;
    }
    if (dst == NULL && want > 0) {
        fxa_msg_fail(ctx, "tensor '%s': no destination given", shown);
        return FXA_ERR_INVALID_ARG;
    }
    return FXA_OK;
}

/* A row read of t (checked by check_tensor): t has rows (ndim >= 1) and [row0, row0 + n_rows)
 * lies within its shape[0] rows. *per_row: the elements of one row (the product of the other
 * dimensions; 0 when t has no elements). */
static fxa_status check_rows(const fxa_msg *ctx, const fxa_st_tensor *t, int64_t row0,
                             int64_t n_rows, int64_t *per_row)
{
    char shown[SNIPPET_CAP];
    fxa_io_snippet(t->name, strlen(t->name), shown, sizeof shown);
    if (t->ndim < 1) {
        fxa_msg_fail(ctx, "tensor '%s': a scalar has no rows to read", shown);
        return FXA_ERR_INVALID_ARG;
    }
    if (row0 < 0 || n_rows < 0 || row0 > t->shape[0] - n_rows) {
        fxa_msg_fail(ctx,
                     "tensor '%s': %" PRId64 " rows from row %" PRId64 " are outside its %" PRId64
                     " rows",
                     shown, n_rows, row0, t->shape[0]);
        return FXA_ERR_INVALID_ARG;
    }
    *per_row = t->shape[0] > 0 ? t->count / t->shape[0] : 0;
    return FXA_OK;
}

/* Copy bytes [begin, begin + nbytes) of t's data from the file or memory into dst. */
static fxa_status copy_range(const fxa_msg *ctx, const fxa_st_file *f, const fxa_st_tensor *t,
                             int64_t begin, int64_t nbytes, void *dst)
{
    if (nbytes == 0) {
        return FXA_OK;
    }
    if (f->mem != NULL) {
        memcpy(dst, f->mem + t->file_offset + begin, (size_t)nbytes);
        return FXA_OK;
    }
    char what[SNIPPET_CAP + 16];
    char shown[SNIPPET_CAP];
    fxa_io_snippet(t->name, strlen(t->name), shown, sizeof shown);
    snprintf(what, sizeof what, "tensor '%s'", shown);
    return read_at(ctx, f->fd, &f->stamp, dst, (size_t)nbytes, t->file_offset + begin, what);
}

/* Elements [first, first + count) of an F32, BF16 or F16 tensor as fp32 into dst[count]. */
static fxa_status copy_f32(const fxa_msg *ctx, const fxa_st_file *f, const fxa_st_tensor *t,
                           int64_t first, int64_t count, float *dst)
{
    if (t->dtype == FXA_ST_F32) {
        return copy_range(ctx, f, t, first * 4, count * 4, dst);
    }
    /* 16-bit codes: read them into the upper half of dst, then widen front to back. Element i
     * lands on bytes [4i, 4i + 4), below the code of element i + 1 at 2 * count + 2i + 2. */
    unsigned char *codes = (unsigned char *)dst + 2 * (size_t)count;
    const fxa_status status = copy_range(ctx, f, t, first * 2, count * 2, codes);
    if (status != FXA_OK) {
        return status;
    }
    const int bf16 = t->dtype == FXA_ST_BF16;
    for (size_t i = 0; i < (size_t)count; i++) {
        uint16_t h;
        memcpy(&h, codes + 2 * i, sizeof h);
        dst[i] = bf16 ? fxa_bf16_to_f32(h) : fxa_f16_to_f32(h);
    }
    return FXA_OK;
}

/* Tensor t, whole or rows [row0, row0 + n_rows) of it, into dst of dst_size bytes or, as_f32,
 * fp32 elements: the file and the tensor checked (check_tensor, check_rows), then dst's room,
 * then the copy. */
static fxa_status read_tensor(const fxa_st_file *f, const fxa_st_tensor *t, int as_f32, int whole,
                              int64_t row0, int64_t n_rows, void *dst, size_t dst_size, char *err,
                              size_t errlen)
{
    const fxa_msg ctx = {f != NULL ? f->path : "(null)", err, errlen};
    fxa_io_clear_error(err, errlen);
    int64_t per_row = 0;
    fxa_status status = check_tensor(&ctx, f, t, as_f32);
    if (status == FXA_OK && !whole) {
        status = check_rows(&ctx, t, row0, n_rows, &per_row);
    }
    if (status != FXA_OK) {
        return status;
    }
    /* Elements, or bytes: supported dtypes fill whole bytes, so a row is nbytes / shape[0]. */
    const int64_t row = as_f32 || per_row == 0 ? per_row : t->nbytes / t->shape[0];
    const int64_t first = whole ? 0 : row0 * row;
    const int64_t n = whole ? (as_f32 ? t->count : t->nbytes) : n_rows * row;
    status = check_size(&ctx, t, dst, (uint64_t)dst_size, (uint64_t)n,
                        as_f32 ? "elements" : "bytes", whole ? "the tensor has" : "the rows have");
    if (status != FXA_OK || (as_f32 && n == 0)) {
        return status;
    }
    return as_f32 ? copy_f32(&ctx, f, t, first, n, dst) : copy_range(&ctx, f, t, first, n, dst);
}

fxa_status fxa_st_read(const fxa_st_file *f, const fxa_st_tensor *t, void *dst, size_t dst_bytes,
                       char *err, size_t errlen)
{
    return read_tensor(f, t, 0, 1, 0, 0, dst, dst_bytes, err, errlen);
}

fxa_status fxa_st_read_rows(const fxa_st_file *f, const fxa_st_tensor *t, int64_t row0,
                            int64_t n_rows, void *dst, size_t dst_bytes, char *err, size_t errlen)
{
    return read_tensor(f, t, 0, 0, row0, n_rows, dst, dst_bytes, err, errlen);
}

fxa_status fxa_st_read_f32(const fxa_st_file *f, const fxa_st_tensor *t, float *dst,
                           size_t dst_count, char *err, size_t errlen)
{
    return read_tensor(f, t, 1, 1, 0, 0, dst, dst_count, err, errlen);
}

fxa_status fxa_st_read_rows_f32(const fxa_st_file *f, const fxa_st_tensor *t, int64_t row0,
                                int64_t n_rows, float *dst, size_t dst_count, char *err,
                                size_t errlen)
{
    return read_tensor(f, t, 1, 0, row0, n_rows, dst, dst_count, err, errlen);
}
