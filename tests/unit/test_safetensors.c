/*
 * Unit test of src/io/safetensors.c: valid files of every supported dtype (and an
 * unsupported one), shapes, names and metadata, reading and fp32 conversion bit for bit, and
 * one clear error for each kind of hostile file, through both fxa_st_open and fxa_st_parse.
 * Works in a fresh mkdtemp folder under /tmp, removed at the end. Prints each failed check,
 * then "test_safetensors: ok N checks" when all pass.
 */
#define _POSIX_C_SOURCE 200809L

#include "fxattn_safetensors.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "file_fixtures.h"
#include "testutil.h"

#define ERR_CAP 1024

/* ---- building files ------------------------------------------------------------------ */

typedef struct bytes {
    unsigned char *b;
    size_t n;
    size_t cap;
} bytes;

static void add(bytes *x, const void *p, size_t n)
{
    if (x->n + n > x->cap) {
        size_t cap = x->cap ? x->cap : 256;
        while (cap < x->n + n) {
            cap *= 2;
        }
        unsigned char *grown = realloc(x->b, cap);
        if (grown == NULL) {
            die("realloc");
        }
        x->b = grown;
        x->cap = cap;
    }
    if (n > 0) {
        memcpy(x->b + x->n, p, n);
    }
    x->n += n;
}

static void add_str(bytes *x, const char *s)
{
    add(x, s, strlen(s));
}

static void add_fmt(bytes *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add_fmt(bytes *x, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(NULL, 0, fmt, args);
    va_end(args);
    char *tmp = n < 0 ? NULL : malloc((size_t)n + 1);
    if (tmp == NULL) {
        die("add_fmt");
    }
    va_start(args, fmt);
    vsnprintf(tmp, (size_t)n + 1, fmt, args);
    va_end(args);
    add(x, tmp, (size_t)n);
    free(tmp);
}

static void add_le64(bytes *x, uint64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++) {
        b[i] = (unsigned char)(v >> (8 * i));
    }
    add(x, b, 8);
}

static void write_path(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        die(path);
    }
}

/* g_dir/name holds exactly data[0..n). */
static void write_bytes(const char *name, const void *data, size_t n)
{
    char path[PATH_CAP];
    test_path_join(path, g_dir, name);
    write_path(path, data, n);
}

/* A file whose header is the text given verbatim (N = its length), then data. */
static void write_raw(const char *name, const char *header, const void *data, size_t data_len)
{
    bytes x = {0};
    add_le64(&x, strlen(header));
    add_str(&x, header);
    add(&x, data, data_len);
    write_bytes(name, x.b, x.n);
    free(x.b);
}

typedef struct tspec {
    const char *json_name; /* as written between the quotes (escapes allowed) */
    const char *dtype;
    int ndim;
    int64_t shape[FXA_ST_MAX_DIMS];
    const void *data;
    size_t nbytes;
} tspec;

/*
 * A correct file as the reference writer makes it: the tensors in the given order with
 * consecutive data_offsets, meta_json (an object's text, or NULL) as "__metadata__", the
 * header padded with spaces to a multiple of 8 bytes.
 */
static void write_st(const char *name, const tspec *t, int n, const char *meta_json)
{
    bytes header = {0};
    bytes file = {0};
    uint64_t offset = 0;
    add_str(&header, "{");
    if (meta_json != NULL) {
        add_fmt(&header, "\"__metadata__\":%s%s", meta_json, n > 0 ? "," : "");
    }
    for (int i = 0; i < n; i++) {
        add_fmt(&header, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i > 0 ? "," : "", t[i].json_name,
                t[i].dtype);
        for (int d = 0; d < t[i].ndim; d++) {
            add_fmt(&header, "%s%" PRId64, d > 0 ? "," : "", t[i].shape[d]);
        }
        add_fmt(&header, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset,
                offset + t[i].nbytes);
        offset += t[i].nbytes;
    }
    add_str(&header, "}");
    while (header.n % 8 != 0) {
        add_str(&header, " ");
    }
    add_le64(&file, header.n);
    add(&file, header.b, header.n);
    for (int i = 0; i < n; i++) {
        add(&file, t[i].data, t[i].nbytes);
    }
    write_bytes(name, file.b, file.n);
    free(header.b);
    free(file.b);
}

static unsigned char *slurp(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        die(path);
    }
    bytes x = {0};
    unsigned char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        add(&x, chunk, got);
    }
    fclose(f);
    add(&x, "", 1); /* never NULL, even for an empty file */
    *len_out = x.n - 1;
    return x.b;
}

/* ---- expectations -------------------------------------------------------------------- */

static fxa_st_file *open_ok(const char *name)
{
    char path[PATH_CAP];
    char err[ERR_CAP] = "untouched";
    fxa_st_file *f = NULL;
    test_path_join(path, g_dir, name);
    fxa_status status = fxa_st_open(path, &f, err, sizeof err);
    CHECK(status == FXA_OK && f != NULL, "%s: open failed (%d): %s", name, (int)status, err);
    CHECK(err[0] == '\0', "%s: message left on success: %s", name, err);
    return status == FXA_OK ? f : NULL;
}

/* The message is one line "<prefix>: ..." holding keyword. */
static void check_message(const char *what, const char *err, const char *prefix,
                          const char *keyword)
{
    size_t plen = strlen(prefix);
    CHECK(strncmp(err, prefix, plen) == 0 && err[plen] == ':' && err[plen + 1] == ' ',
          "%s: message does not start with '%s: ': %s", what, prefix, err);
    CHECK(strstr(err, keyword) != NULL, "%s: message lacks '%s': %s", what, keyword, err);
    CHECK(strchr(err, '\n') == NULL, "%s: message has a newline: %s", what, err);
}

/* Opening g_dir/name (or an absolute path) fails with want and a message holding keyword;
 * for bad content, parsing the same bytes from memory fails the same way. */
static void expect_reject(const char *name, fxa_status want, const char *keyword)
{
    char path[PATH_CAP];
    char err[ERR_CAP];
    if (name[0] == '/') {
        snprintf(path, sizeof path, "%s", name);
    } else {
        test_path_join(path, g_dir, name);
    }
    fxa_st_file *f = (fxa_st_file *)&f; /* not NULL: the call must clear it */
    fxa_status status = fxa_st_open(path, &f, err, sizeof err);
    CHECK(status == want, "%s: status %d, want %d (%s)", name, (int)status, (int)want, err);
    CHECK(f == NULL, "%s: *out not cleared on failure", name);
    check_message(name, err, path, keyword);
    if (status == FXA_OK) {
        fxa_st_close(f);
    }
    if (want != FXA_ERR_INVALID_ARG) {
        return;
    }
    size_t n;
    unsigned char *data = slurp(path, &n);
    f = (fxa_st_file *)&f;
    status = fxa_st_parse(data, n, "mem.safetensors", &f, err, sizeof err);
    CHECK(status == want, "%s (memory): status %d, want %d (%s)", name, (int)status, (int)want,
          err);
    CHECK(f == NULL, "%s (memory): *out not cleared on failure", name);
    check_message(name, err, "mem.safetensors", keyword);
    if (status == FXA_OK) {
        fxa_st_close(f);
    }
    free(data);
}

/* A header text refused with keyword (no data after it). */
static void reject_header(const char *name, const char *header, const char *keyword)
{
    write_raw(name, header, NULL, 0);
    expect_reject(name, FXA_ERR_INVALID_ARG, keyword);
}

static void expect_tensor(const fxa_st_file *f, const char *name, const char *dtype_name,
                          int supported, int ndim, const int64_t *shape, int64_t nbytes)
{
    const fxa_st_tensor *t = fxa_st_find(f, name);
    CHECK(t != NULL, "tensor '%s' not found", name);
    if (t == NULL) {
        return;
    }
    CHECK(strcmp(t->name, name) == 0, "tensor '%s': name '%s'", name, t->name);
    CHECK(strcmp(t->dtype_name, dtype_name) == 0, "tensor '%s': dtype %s, want %s", name,
          t->dtype_name, dtype_name);
    CHECK(t->supported == supported, "tensor '%s': supported %d", name, t->supported);
    CHECK(t->ndim == ndim, "tensor '%s': ndim %d, want %d", name, t->ndim, ndim);
    int64_t count = 1;
    for (int i = 0; i < ndim && i < t->ndim; i++) {
        CHECK(t->shape[i] == shape[i], "tensor '%s': shape[%d] = %" PRId64, name, i, t->shape[i]);
        count *= shape[i];
    }
    CHECK(t->count == count, "tensor '%s': count %" PRId64 ", want %" PRId64, name, t->count,
          count);
    CHECK(t->nbytes == nbytes, "tensor '%s': nbytes %" PRId64 ", want %" PRId64, name, t->nbytes,
          nbytes);
}

/* ---- valid files --------------------------------------------------------------------- */

/* fp32 bit patterns: 1, -0, inf, a NaN with a payload, the smallest denormal, -3.5. */
static const uint32_t k_f32[6] = {0x3f800000u, 0x80000000u, 0x7f800000u,
                                  0x7fc12345u, 0x00000001u, 0xc0600000u};
/* bf16 codes: 1, -3, -inf, smallest denormal, a quiet NaN. */
static const uint16_t k_bf16[5] = {0x3f80u, 0xc040u, 0xff80u, 0x0001u, 0x7fc1u};
/* fp16 codes and their exact fp32 bits: 1, -2, 2^-24, 65504, inf, -0. */
static const uint16_t k_f16[6] = {0x3c00u, 0xc000u, 0x0001u, 0x7bffu, 0x7c00u, 0x8000u};
static const uint32_t k_f16_f32[6] = {0x3f800000u, 0xc0000000u, 0x33800000u,
                                      0x477fe000u, 0x7f800000u, 0x80000000u};
static const uint8_t k_e4m3[3] = {0x38u, 0x7eu, 0xffu};
static const int64_t k_i64[2] = {-1, INT64_MAX};

static void write_dtypes_file(const char *name)
{
    const tspec t[] = {
        {"f32", "F32", 2, {2, 3}, k_f32, sizeof k_f32},
        {"bf16", "BF16", 1, {5}, k_bf16, sizeof k_bf16},
        {"f16", "F16", 3, {1, 2, 3}, k_f16, sizeof k_f16},
        {"e4m3", "F8_E4M3", 1, {3}, k_e4m3, sizeof k_e4m3},
        {"i64", "I64", 1, {2}, k_i64, sizeof k_i64},
    };
    write_st(name, t, 5, "{\"format\":\"pt\",\"source\":\"test\"}");
}

static void check_dtypes_file(fxa_st_file *f, const char *what)
{
    char err[ERR_CAP];
    unsigned char raw[64];
    float out[8];

    CHECK(fxa_st_count(f) == 5, "%s: %" PRId64 " tensors", what, fxa_st_count(f));
    static const char *const order[] = {"f32", "bf16", "f16", "e4m3", "i64"};
    int64_t offset = 0;
    for (int64_t i = 0; i < 5; i++) {
        const fxa_st_tensor *t = fxa_st_at(f, i);
        CHECK(t != NULL && strcmp(t->name, order[i]) == 0, "%s: tensor %" PRId64 " is %s", what, i,
              t ? t->name : "NULL");
        if (t != NULL) {
            CHECK(t->offset == offset, "%s: %s at %" PRId64, what, t->name, t->offset);
            offset += t->nbytes;
        }
    }
    CHECK(fxa_st_at(f, -1) == NULL && fxa_st_at(f, 5) == NULL, "%s: at() out of range", what);
    CHECK(fxa_st_find(f, "nope") == NULL && fxa_st_find(f, "f3") == NULL &&
              fxa_st_find(f, NULL) == NULL,
          "%s: find of a missing name", what);

    expect_tensor(f, "f32", "F32", 1, 2, (const int64_t[]){2, 3}, 24);
    expect_tensor(f, "bf16", "BF16", 1, 1, (const int64_t[]){5}, 10);
    expect_tensor(f, "f16", "F16", 1, 3, (const int64_t[]){1, 2, 3}, 12);
    expect_tensor(f, "e4m3", "F8_E4M3", 1, 1, (const int64_t[]){3}, 3);
    expect_tensor(f, "i64", "I64", 0, 1, (const int64_t[]){2}, 16);
    CHECK(fxa_st_find(f, "f32")->dtype == FXA_ST_F32 &&
              fxa_st_find(f, "bf16")->dtype == FXA_ST_BF16 &&
              fxa_st_find(f, "f16")->dtype == FXA_ST_F16 &&
              fxa_st_find(f, "e4m3")->dtype == FXA_ST_F8_E4M3,
          "%s: dtype enums", what);

    /* Raw reads: the bytes as stored. */
    const fxa_st_tensor *t = fxa_st_find(f, "f32");
    CHECK(fxa_st_read(f, t, raw, 24, err, sizeof err) == FXA_OK && err[0] == '\0' &&
              memcmp(raw, k_f32, 24) == 0,
          "%s: raw F32: %s", what, err);
    CHECK(fxa_st_read_f32(f, t, out, 6, err, sizeof err) == FXA_OK && memcmp(out, k_f32, 24) == 0,
          "%s: F32 as fp32 not bit-exact: %s", what, err);

    t = fxa_st_find(f, "bf16");
    CHECK(fxa_st_read(f, t, raw, 10, err, sizeof err) == FXA_OK && memcmp(raw, k_bf16, 10) == 0,
          "%s: raw BF16: %s", what, err);
    memset(out, 0xee, sizeof out);
    CHECK(fxa_st_read_f32(f, t, out, 5, err, sizeof err) == FXA_OK, "%s: BF16: %s", what, err);
    for (int i = 0; i < 5; i++) {
        CHECK(test_f32_bits(out[i]) == (uint32_t)k_bf16[i] << 16,
              "%s: BF16 %04x -> %08x, want %08x", what, k_bf16[i], test_f32_bits(out[i]),
              (uint32_t)k_bf16[i] << 16);
    }
    CHECK(test_f32_bits(out[5]) == 0xeeeeeeeeu, "%s: BF16 read wrote past its elements", what);

    t = fxa_st_find(f, "f16");
    CHECK(fxa_st_read_f32(f, t, out, 6, err, sizeof err) == FXA_OK, "%s: F16: %s", what, err);
    for (int i = 0; i < 6; i++) {
        CHECK(test_f32_bits(out[i]) == k_f16_f32[i], "%s: F16 %04x -> %08x, want %08x", what,
              k_f16[i], test_f32_bits(out[i]), k_f16_f32[i]);
    }

    /* F8_E4M3: raw only for now. */
    t = fxa_st_find(f, "e4m3");
    CHECK(fxa_st_read(f, t, raw, 3, err, sizeof err) == FXA_OK && memcmp(raw, k_e4m3, 3) == 0,
          "%s: raw F8_E4M3: %s", what, err);
    CHECK(fxa_st_read_f32(f, t, out, 3, err, sizeof err) == FXA_ERR_UNSUPPORTED &&
              strstr(err, "F8_E4M3") != NULL && strstr(err, "'e4m3'") != NULL,
          "%s: F8_E4M3 as fp32: %s", what, err);

    /* A dtype of the format that fxattn does not support. */
    t = fxa_st_find(f, "i64");
    CHECK(fxa_st_read(f, t, raw, 16, err, sizeof err) == FXA_ERR_UNSUPPORTED &&
              strstr(err, "dtype I64 is not supported") != NULL,
          "%s: I64 read: %s", what, err);
    CHECK(fxa_st_read_f32(f, t, out, 2, err, sizeof err) == FXA_ERR_UNSUPPORTED,
          "%s: I64 as fp32: %s", what, err);

    /* The destination must have exactly the tensor's size. */
    t = fxa_st_find(f, "f32");
    memset(raw, 0x5a, sizeof raw);
    CHECK(fxa_st_read(f, t, raw, 23, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "destination holds 23 bytes but the tensor has 24") != NULL &&
              raw[0] == 0x5a,
          "%s: short destination: %s", what, err);
    CHECK(fxa_st_read(f, t, raw, 25, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "%s: long destination: %s", what, err);
    CHECK(fxa_st_read_f32(f, t, out, 7, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "7 elements") != NULL,
          "%s: fp32 destination size: %s", what, err);
    CHECK(fxa_st_read(f, t, NULL, 24, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "%s: NULL destination: %s", what, err);
    CHECK(fxa_st_read(f, NULL, raw, 24, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "%s: NULL tensor: %s", what, err);
    fxa_st_tensor copy = *t;
    CHECK(fxa_st_read(f, &copy, raw, 24, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "not one of this file's") != NULL,
          "%s: a tensor of another file: %s", what, err);
    CHECK(fxa_st_read(NULL, t, raw, 24, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "%s: NULL file: %s", what, err);

    /* Row ranges: only those rows, as stored or widened; ranges checked. */
    CHECK(fxa_st_read_rows(f, t, 1, 1, raw, 12, err, sizeof err) == FXA_OK &&
              memcmp(raw, k_f32 + 3, 12) == 0,
          "%s: F32 row 1: %s", what, err);
    CHECK(fxa_st_read_rows(f, t, 0, 2, raw, 24, err, sizeof err) == FXA_OK &&
              memcmp(raw, k_f32, 24) == 0,
          "%s: F32 rows 0..2: %s", what, err);
    CHECK(fxa_st_read_rows(f, t, 1, 2, raw, 24, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              fxa_st_read_rows(f, t, -1, 1, raw, 12, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              fxa_st_read_rows(f, t, 0, 1, raw, 11, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "%s: F32 rows past the end, negative, or a wrong size are refused", what);
    CHECK(fxa_st_read_rows(f, t, INT64_MAX, INT64_MAX, raw, 12, err, sizeof err) ==
                  FXA_ERR_INVALID_ARG &&
              strstr(err, "9223372036854775807") != NULL,
          "%s: rows past INT64_MAX refused, the message formed without overflow: %s", what, err);
    const fxa_st_tensor *tb = fxa_st_find(f, "bf16");
    CHECK(fxa_st_read_rows_f32(f, tb, 2, 2, out, 2, err, sizeof err) == FXA_OK &&
              out[0] == fxa_bf16_to_f32(k_bf16[2]) && out[1] == fxa_bf16_to_f32(k_bf16[3]),
          "%s: BF16 rows 2..4 widened: %s", what, err);
    CHECK(fxa_st_read_rows_f32(f, tb, 4, 2, out, 2, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "%s: BF16 rows past the end: %s", what, err);

    /* Metadata. */
    CHECK(fxa_st_metadata_count(f) == 2, "%s: %" PRId64 " metadata entries", what,
          fxa_st_metadata_count(f));
    const char *v = fxa_st_metadata(f, "format");
    CHECK(v != NULL && strcmp(v, "pt") == 0, "%s: metadata format = %s", what, v ? v : "NULL");
    v = fxa_st_metadata(f, "source");
    CHECK(v != NULL && strcmp(v, "test") == 0, "%s: metadata source", what);
    CHECK(fxa_st_metadata(f, "missing") == NULL && fxa_st_metadata(f, NULL) == NULL,
          "%s: missing metadata key", what);
    CHECK(fxa_st_metadata_key(f, 0) != NULL && strcmp(fxa_st_metadata_key(f, 0), "format") == 0 &&
              fxa_st_metadata_key(f, 1) != NULL &&
              strcmp(fxa_st_metadata_key(f, 1), "source") == 0 &&
              fxa_st_metadata_key(f, 2) == NULL && fxa_st_metadata_key(f, -1) == NULL,
          "%s: metadata keys in order", what);
}

static void test_dtypes(void)
{
    write_dtypes_file("dtypes.safetensors");
    fxa_st_file *f = open_ok("dtypes.safetensors");
    if (f != NULL) {
        check_dtypes_file(f, "file");
        fxa_st_close(f);
    }

    /* The same checks on the bytes in memory. */
    char path[PATH_CAP];
    char err[ERR_CAP];
    size_t n;
    test_path_join(path, g_dir, "dtypes.safetensors");
    unsigned char *data = slurp(path, &n);
    f = NULL;
    CHECK(fxa_st_parse(data, n, "mem", &f, err, sizeof err) == FXA_OK && f != NULL,
          "parse from memory: %s", err);
    if (f != NULL) {
        check_dtypes_file(f, "memory");
        fxa_st_close(f);
    }
    free(data);

    fxa_st_close(NULL);
    CHECK(fxa_st_count(NULL) == 0 && fxa_st_at(NULL, 0) == NULL && fxa_st_find(NULL, "a") == NULL &&
              fxa_st_metadata(NULL, "a") == NULL && fxa_st_metadata_count(NULL) == 0 &&
              fxa_st_metadata_key(NULL, 0) == NULL,
          "queries on NULL");
}

static void test_shapes(void)
{
    const float scalar = 2.5f;
    const uint16_t eight[4] = {0x3c00u, 0x4000u, 0x4200u, 0x4400u}; /* 1, 2, 3, 4 */
    const uint8_t f4[2] = {0x12u, 0x34u};
    const tspec t[] = {
        {"empty_first", "F32", 1, {0}, NULL, 0},
        {"scalar", "F32", 0, {0}, &scalar, 4},
        {"empty_3x0x2", "BF16", 3, {3, 0, 2}, NULL, 0},
        {"eight_dims", "F16", 8, {1, 1, 1, 2, 1, 1, 1, 2}, eight, 8},
        {"f4", "F4", 2, {2, 2}, f4, 2},
        {"huge_but_empty", "F32", 2, {9007199254740992, 0}, NULL, 0},
        {"empty_last", "F8_E4M3", 2, {0, 7}, NULL, 0},
    };
    write_st("shapes.safetensors", t, 7, NULL);
    fxa_st_file *f = open_ok("shapes.safetensors");
    if (f == NULL) {
        return;
    }
    char err[ERR_CAP];
    float out[4];
    CHECK(fxa_st_count(f) == 7, "shapes: %" PRId64 " tensors", fxa_st_count(f));
    CHECK(fxa_st_metadata_count(f) == 0 && fxa_st_metadata(f, "format") == NULL,
          "shapes: no metadata");
    expect_tensor(f, "scalar", "F32", 1, 0, NULL, 4);
    expect_tensor(f, "empty_first", "F32", 1, 1, (const int64_t[]){0}, 0);
    expect_tensor(f, "empty_3x0x2", "BF16", 1, 3, (const int64_t[]){3, 0, 2}, 0);
    expect_tensor(f, "eight_dims", "F16", 1, 8, (const int64_t[]){1, 1, 1, 2, 1, 1, 1, 2}, 8);
    expect_tensor(f, "f4", "F4", 0, 2, (const int64_t[]){2, 2}, 2);
    expect_tensor(f, "huge_but_empty", "F32", 1, 2, (const int64_t[]){9007199254740992, 0}, 0);
    expect_tensor(f, "empty_last", "F8_E4M3", 1, 2, (const int64_t[]){0, 7}, 0);
    /* Data order: the empty tensors at offset 0 first, in header order. */
    CHECK(strcmp(fxa_st_at(f, 0)->name, "empty_first") == 0 &&
              strcmp(fxa_st_at(f, 1)->name, "scalar") == 0,
          "shapes: data order");

    const fxa_st_tensor *s = fxa_st_find(f, "scalar");
    CHECK(fxa_st_read_f32(f, s, out, 1, err, sizeof err) == FXA_OK && out[0] == 2.5f,
          "scalar read: %s", err);
    const fxa_st_tensor *e = fxa_st_find(f, "empty_3x0x2");
    CHECK(fxa_st_read(f, e, NULL, 0, err, sizeof err) == FXA_OK, "empty read: %s", err);
    CHECK(fxa_st_read_f32(f, e, NULL, 0, err, sizeof err) == FXA_OK, "empty fp32 read: %s", err);
    CHECK(fxa_st_read_f32(f, fxa_st_find(f, "eight_dims"), out, 4, err, sizeof err) == FXA_OK &&
              out[0] == 1.0f && out[1] == 2.0f && out[2] == 3.0f && out[3] == 4.0f,
          "eight_dims read: %s", err);
    CHECK(fxa_st_read(f, fxa_st_find(f, "f4"), out, 2, err, sizeof err) == FXA_ERR_UNSUPPORTED,
          "F4 read: %s", err);
    fxa_st_close(f);

    /* No tensors at all, with or without metadata. */
    write_raw("no_tensors.safetensors", "{}", NULL, 0);
    f = open_ok("no_tensors.safetensors");
    CHECK(f != NULL && fxa_st_count(f) == 0 && fxa_st_at(f, 0) == NULL &&
              fxa_st_find(f, "") == NULL,
          "no tensors");
    fxa_st_close(f);
    write_raw("only_metadata.safetensors", "{\"__metadata__\":{}}   ", NULL, 0);
    f = open_ok("only_metadata.safetensors");
    CHECK(f != NULL && fxa_st_count(f) == 0 && fxa_st_metadata_count(f) == 0, "only metadata");
    fxa_st_close(f);
}

static void test_names(void)
{
    const float one = 1.0f;
    const tspec t[] = {
        {"blocks.0.self_attn.q.weight", "F32", 0, {0}, &one, 4},
        {"blocks.0.self_attn.norm_q.weight", "F32", 0, {0}, &one, 4},
        {"q\\\"u\\\\o\\/te\\b\\f\\n\\r\\t", "F32", 0, {0}, &one, 4},
        {"\\u00e9t\\u00E9", "F32", 0, {0}, &one, 4},
        {"\xe5\x90\x8d\xe5\x89\x8d", "F32", 0, {0}, &one, 4}, /* raw UTF-8 */
        {"\\ud83d\\ude00 \xf0\x9f\x98\x81", "F32", 0, {0}, &one, 4},
        {"", "F32", 0, {0}, &one, 4},
        {"\\u0041\\u0800\\uFFFD\\uffff", "F32", 0, {0}, &one, 4},
    };
    write_st("names.safetensors", t, 8,
             "{\"\\u005f\\u005f\":\"under\",\"text\":\"line\\none \\\"\\u00e9\\\"\","
             "\"empty\":\"\",\"json\":\"{\\\"a\\\": [1, 2]}\"}");
    fxa_st_file *f = open_ok("names.safetensors");
    if (f == NULL) {
        return;
    }
    static const char *const decoded[] = {
        "blocks.0.self_attn.q.weight",
        "blocks.0.self_attn.norm_q.weight",
        "q\"u\\o/te\b\f\n\r\t",
        "\xc3\xa9t\xc3\xa9",
        "\xe5\x90\x8d\xe5\x89\x8d",
        "\xf0\x9f\x98\x80 \xf0\x9f\x98\x81",
        "",
        "A\xe0\xa0\x80\xef\xbf\xbd\xef\xbf\xbf",
    };
    for (int i = 0; i < 8; i++) {
        const fxa_st_tensor *x = fxa_st_find(f, decoded[i]);
        CHECK(x != NULL && x == fxa_st_at(f, i), "name %d (%s) not found in place", i,
              t[i].json_name);
    }
    CHECK(fxa_st_find(f, "blocks.0.self_attn.q") == NULL, "no prefix match");
    const char *v = fxa_st_metadata(f, "__");
    CHECK(v != NULL && strcmp(v, "under") == 0, "escaped metadata key");
    v = fxa_st_metadata(f, "text");
    CHECK(v != NULL && strcmp(v, "line\none \"\xc3\xa9\"") == 0, "escaped metadata value");
    v = fxa_st_metadata(f, "empty");
    CHECK(v != NULL && v[0] == '\0', "empty metadata value");
    v = fxa_st_metadata(f, "json");
    CHECK(v != NULL && strcmp(v, "{\"a\": [1, 2]}") == 0, "JSON text in a metadata value");
    fxa_st_close(f);

    /* Whitespace between every token, other field and key orders, "__metadata__" spelled
     * with escapes, tensors listed out of data order, a longest name. */
    const unsigned char data[12] = {0, 0, 0x80, 0x3f, 0, 0, 0, 0x40, 0, 0, 0x40, 0x40};
    write_raw("spaced.safetensors",
              " \t\r\n{ \"b\" : { \"data_offsets\" : [ 4 , 12 ] , \"shape\" : [ 2 ] ,\n"
              "\"dtype\" : \"F32\" } ,\r\n \"\\u005f_metadata__\" : { \"k\" : \"v\" } , \"a\":"
              "{\"shape\":[],\"dtype\":\"F32\",\"data_offsets\":[0,4]}}\n\t\r ",
              data, sizeof data);
    f = open_ok("spaced.safetensors");
    if (f != NULL) {
        float out[2];
        char err[ERR_CAP];
        CHECK(fxa_st_count(f) == 2 && strcmp(fxa_st_at(f, 0)->name, "a") == 0 &&
                  strcmp(fxa_st_at(f, 1)->name, "b") == 0,
              "spaced: data order");
        CHECK(fxa_st_metadata(f, "k") != NULL && strcmp(fxa_st_metadata(f, "k"), "v") == 0,
              "spaced: escaped __metadata__ key is the metadata");
        CHECK(fxa_st_read_f32(f, fxa_st_find(f, "b"), out, 2, err, sizeof err) == FXA_OK &&
                  out[0] == 2.0f && out[1] == 3.0f,
              "spaced: read b: %s", err);
        fxa_st_close(f);
    }

    char longest[FXA_ST_MAX_NAME_LEN + 2];
    memset(longest, 'n', FXA_ST_MAX_NAME_LEN);
    longest[FXA_ST_MAX_NAME_LEN] = '\0';
    const tspec lt = {longest, "F32", 0, {0}, &one, 4};
    write_st("longest_name.safetensors", &lt, 1, NULL);
    f = open_ok("longest_name.safetensors");
    CHECK(f != NULL && fxa_st_find(f, longest) != NULL, "a name of %d bytes", FXA_ST_MAX_NAME_LEN);
    fxa_st_close(f);
    longest[FXA_ST_MAX_NAME_LEN] = 'n';
    longest[FXA_ST_MAX_NAME_LEN + 1] = '\0';
    write_st("too_long_name.safetensors", &lt, 1, NULL);
    expect_reject("too_long_name.safetensors", FXA_ERR_INVALID_ARG, "is 4097 bytes long");
}

/* ---- hostile files ------------------------------------------------------------------- */

static void test_length_field(void)
{
    bytes x = {0};
    write_bytes("empty.safetensors", "", 0);
    expect_reject("empty.safetensors", FXA_ERR_INVALID_ARG, "file is 0 bytes, too short");
    write_bytes("seven.safetensors", "\x02\0\0\0\0\0\0", 7);
    expect_reject("seven.safetensors", FXA_ERR_INVALID_ARG, "file is 7 bytes, too short");

    add_le64(&x, 1000);
    add_str(&x, "{}");
    write_bytes("past_end.safetensors", x.b, x.n);
    expect_reject("past_end.safetensors", FXA_ERR_INVALID_ARG,
                  "header length 1000 runs past the end of the file (10 bytes)");
    x.n = 0;
    add_le64(&x, 3);
    add_str(&x, "{}");
    write_bytes("past_end_by_one.safetensors", x.b, x.n);
    expect_reject("past_end_by_one.safetensors", FXA_ERR_INVALID_ARG, "runs past the end");

    x.n = 0;
    add_le64(&x, (uint64_t)FXA_ST_MAX_HEADER_LEN + 1);
    add_str(&x, "{}");
    write_bytes("over_limit.safetensors", x.b, x.n);
    expect_reject("over_limit.safetensors", FXA_ERR_INVALID_ARG,
                  "header length 104857601 exceeds the limit of 104857600 bytes");
    x.n = 0;
    add_le64(&x, UINT64_MAX);
    add_str(&x, "{}");
    write_bytes("max_u64.safetensors", x.b, x.n);
    expect_reject("max_u64.safetensors", FXA_ERR_INVALID_ARG, "exceeds the limit");

    x.n = 0;
    add_le64(&x, 0);
    add_str(&x, "{}");
    write_bytes("zero_len.safetensors", x.b, x.n);
    expect_reject("zero_len.safetensors", FXA_ERR_INVALID_ARG, "header is empty");
    free(x.b);
}

static void test_json_syntax(void)
{
    /* Syntax. */
    static const bad_text cases[] = {
        {"truncated_string.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offs",
         "at byte 32: unterminated string"},
        {"truncated_object.safetensors",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}",
         "expected ',' or '}', found the end of the header"},
        {"truncated_number.safetensors", "{\"a\":{\"shape\":[1",
         "expected ',' or ']', found the end of the header"},
        {"only_brace.safetensors", "{", "expected a string key"},
        {"spaces_only.safetensors", "        ", "expected a JSON value"},
        {"top_array.safetensors", "[]", "header must be a JSON object, found an array"},
        {"top_string.safetensors", "\"{}\"", "must be a JSON object, found a string"},
        {"top_number.safetensors", "42", "must be a JSON object, found a number"},
        {"top_null.safetensors", "null", "must be a JSON object, found null"},
        {"bom.safetensors", "\xef\xbb\xbf{}", "expected a JSON value, found byte 0xef"},
        {"single_quotes.safetensors", "{'a':1}", "expected a string key, found '''"},
        {"unquoted_key.safetensors", "{a:1}", "expected a string key, found 'a'"},
        {"missing_colon.safetensors", "{\"a\" 1}", "expected ':' after a key"},
        {"trailing_comma.safetensors",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[0,],\"data_offsets\":[0,0]}}",
         "expected a JSON value, found ']'"},
        {"trailing_comma_obj.safetensors", "{\"__metadata__\":{},}",
         "expected a string key, found '}'"},
        {"bad_literal.safetensors", "{\"a\":tru}", "expected a JSON value"},
        {"leading_zero.safetensors",
         "{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}",
         "number with a leading zero"},
        {"bare_minus.safetensors", "{\"a\":[-]}", "expected a digit"},
        {"bad_fraction.safetensors", "{\"a\":[1.]}", "expected a digit after '.'"},
        {"bad_exponent.safetensors", "{\"a\":[1e]}", "expected a digit in the exponent"},
        {"plus_sign.safetensors", "{\"a\":[+1]}", "expected a JSON value, found '+'"},
        /* Escapes and UTF-8. */
        {"bad_escape.safetensors", "{\"a\\x\":1}", "invalid escape: '\\' followed by 'x'"},
        {"bad_escape_end.safetensors", "{\"a\\", "invalid escape"},
        {"short_u_escape.safetensors", "{\"\\u12\":1}", "\\u must be followed by 4 hex digits"},
        {"bad_u_escape.safetensors", "{\"\\u12g4\":1}", "4 hex digits"},
        {"lone_high.safetensors", "{\"\\ud800\":1}", "unpaired surrogate \\uD800"},
        {"high_then_char.safetensors", "{\"\\uD834x\":1}", "unpaired surrogate \\uD834"},
        {"high_high.safetensors", "{\"\\ud800\\ud800\":1}", "unpaired surrogate"},
        {"lone_low.safetensors", "{\"\\udc00\":1}", "unpaired surrogate \\uDC00 (a low surrogate"},
        {"invalid_utf8.safetensors", "{\"a\xff\":1}", "invalid UTF-8 (byte 0xff)"},
        {"overlong_utf8.safetensors", "{\"\xc0\x80\":1}", "invalid UTF-8 (byte 0xc0)"},
        {"surrogate_utf8.safetensors", "{\"\xed\xa0\x80\":1}", "invalid UTF-8 (byte 0xed)"},
        {"above_max_utf8.safetensors", "{\"\xf4\x90\x80\x80\":1}", "invalid UTF-8"},
        {"cut_utf8.safetensors", "{\"\xe2\x82\":1}", "invalid UTF-8 (byte 0xe2)"},
        {"control_char.safetensors", "{\"a\nb\":1}", "control character 0x0a"},
        {"utf8_outside.safetensors", "{\"a\":1\xc3\xa9}", "found byte 0xc3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        reject_header(cases[i].name, cases[i].text, cases[i].keyword);
    }

    /* Nesting. */
    char deep[256];
    size_t n = (size_t)snprintf(deep, sizeof deep, "{\"a\":{\"dtype\":");
    for (int i = 0; i < 70; i++) {
        deep[n++] = '[';
    }
    deep[n] = '\0';
    reject_header("deep.safetensors", deep, "nesting deeper than 64 levels");

    /* After the object. */
    reject_header("garbage.safetensors", "{}x", "'x' after the end of the JSON object");
    reject_header("two_objects.safetensors", "{}{}", "'{' after the end of the JSON object");
    const char nul_pad[] = "{}  \0\0\0";
    {
        bytes x = {0};
        add_le64(&x, sizeof nul_pad - 1);
        add(&x, nul_pad, sizeof nul_pad - 1);
        write_bytes("nul_pad.safetensors", x.b, x.n);
        free(x.b);
    }
    expect_reject("nul_pad.safetensors", FXA_ERR_INVALID_ARG,
                  "byte 0x00 after the end of the JSON object");
}

#define T(fields) "{\"t\":{" fields "}}"

static void test_schema(void)
{
    const unsigned char zeros[64] = {0};

    /* Names, keys and duplicates. */
    write_raw("dup_name.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]},"
              "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
              zeros, 12);
    expect_reject("dup_name.safetensors", FXA_ERR_INVALID_ARG, "duplicate tensor name 'a'");
    write_raw("dup_name_escaped.safetensors",
              "{\"ab\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
              "\"a\\u0062\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}",
              NULL, 0);
    expect_reject("dup_name_escaped.safetensors", FXA_ERR_INVALID_ARG,
                  "duplicate tensor name 'ab'");
    reject_header("dup_field.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[0],\"dtype\":\"F32\",\"data_offsets\":[0,0]"),
                  "tensor 't': duplicate field 'dtype'");
    reject_header("dup_metadata.safetensors", "{\"__metadata__\":{},\"__metadata__\":{}}",
                  "duplicate key '__metadata__'");
    reject_header("dup_metadata_key.safetensors",
                  "{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}}",
                  "duplicate __metadata__ key 'k'");
    reject_header("nul_name.safetensors",
                  "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}",
                  "tensor name 'a?b' contains the character U+0000");
    reject_header("nul_meta_key.safetensors", "{\"__metadata__\":{\"\\u0000\":\"v\"}}",
                  "__metadata__ key '?' contains the character U+0000");
    reject_header("nul_meta_value.safetensors", "{\"__metadata__\":{\"k\":\"v\\u0000\"}}",
                  "__metadata__ value of 'k' contains the character U+0000");

    /* Fields. */
    reject_header("missing_offsets.safetensors", T("\"dtype\":\"F32\",\"shape\":[0]"),
                  "tensor 't': missing field 'data_offsets'");
    reject_header("missing_dtype.safetensors", T("\"shape\":[0],\"data_offsets\":[0,0]"),
                  "tensor 't': missing field 'dtype'");
    reject_header("missing_shape.safetensors", T("\"dtype\":\"F32\",\"data_offsets\":[0,0]"),
                  "tensor 't': missing field 'shape'");
    reject_header("empty_tensor_object.safetensors", T(""), "missing field 'dtype'");
    reject_header("extra_field.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0],\"extra\":1"),
                  "tensor 't': unknown field 'extra'");

    /* Types. */
    reject_header("tensor_not_object.safetensors", "{\"t\":[1,2]}",
                  "tensor 't': expected an object with dtype, shape and data_offsets, found an "
                  "array");
    reject_header("dtype_number.safetensors",
                  T("\"dtype\":32,\"shape\":[0],\"data_offsets\":[0,0]"),
                  "tensor 't': dtype must be a string, found a number");
    reject_header("shape_string.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":\"[1]\",\"data_offsets\":[0,4]"),
                  "tensor 't': shape must be an array of integers, found a string");
    reject_header("shape_nested.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[[1]],\"data_offsets\":[0,4]"),
                  "shape entry 0 must be a non-negative integer, found an array");
    reject_header("shape_bool.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[1,true],\"data_offsets\":[0,4]"),
                  "shape entry 1 must be a non-negative integer, found a boolean");
    reject_header("offsets_object.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":{}"),
                  "data_offsets must be an array [begin, end], found an object");
    reject_header("offsets_null.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":null"), "found null");
    reject_header("offsets_one.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0]"),
                  "data_offsets has 1 entry");
    reject_header("offsets_none.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[]"),
                  "data_offsets has 0 entries");
    reject_header("offsets_three.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0,0]"),
                  "data_offsets has more than 2 entries");
    reject_header("offsets_string.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[\"0\",0]"),
                  "data_offsets entry 0 must be a non-negative integer, found a string");
    reject_header("metadata_array.safetensors", "{\"__metadata__\":[]}",
                  "__metadata__ must be an object of strings, found an array");
    reject_header("metadata_number.safetensors", "{\"__metadata__\":{\"k\":1}}",
                  "__metadata__ value of 'k' must be a string, found a number");
    reject_header("metadata_nested.safetensors", "{\"__metadata__\":{\"k\":{\"a\":\"b\"}}}",
                  "__metadata__ value of 'k' must be a string, found an object");
    reject_header("metadata_null.safetensors", "{\"__metadata__\":null}",
                  "__metadata__ must be an object of strings, found null");

    /* dtypes. */
    reject_header("unknown_dtype.safetensors",
                  T("\"dtype\":\"F33\",\"shape\":[0],\"data_offsets\":[0,0]"),
                  "tensor 't': unknown dtype 'F33'");
    reject_header("lowercase_dtype.safetensors",
                  T("\"dtype\":\"bf16\",\"shape\":[0],\"data_offsets\":[0,0]"),
                  "unknown dtype 'bf16'");
    reject_header("f4_odd.safetensors", T("\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]"),
                  "3 elements of F4 (shape [3]) are not a whole number of bytes");

    /* Shape entries. */
    reject_header("negative_dim.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,0]"),
                  "tensor 't': shape entry 1 is negative (-1)");
    reject_header("minus_zero_dim.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[-0],\"data_offsets\":[0,0]"),
                  "shape entry 0 is negative (-0)");
    reject_header("fraction_dim.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]"),
                  "shape entry 0 is not an integer (1.5)");
    reject_header("whole_fraction_dim.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]"),
                  "shape entry 0 is not an integer (1.0)");
    reject_header("exponent_dim.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[1e2],\"data_offsets\":[0,400]"),
                  "shape entry 0 is not an integer (1e2)");
    reject_header("huge_dim.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[9007199254740993],\"data_offsets\":[0,0]"),
                  "shape entry 0 (9007199254740993) is larger than 2^53");
    reject_header("huger_dim.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[123456789012345678901234567890],"
                    "\"data_offsets\":[0,0]"),
                  "is larger than 2^53");
    reject_header("huge_offset.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,18446744073709551616]"),
                  "data_offsets entry 1 (18446744073709551616) is larger than 2^53");
    reject_header("negative_offset.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]"),
                  "data_offsets entry 0 is negative (-4)");
    reject_header("overflow.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],"
                    "\"data_offsets\":[0,0]"),
                  "tensor 't': shape [4294967296, 4294967296] of F32 overflows");
    reject_header("overflow_with_zero.safetensors",
                  T("\"dtype\":\"I64\",\"shape\":[9007199254740992,9007199254740992,0],"
                    "\"data_offsets\":[0,0]"),
                  "overflows");
    reject_header("nine_dims.safetensors",
                  T("\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]"),
                  "tensor 't': shape has more than 8 dimensions");

    /* Offsets. */
    write_raw("reversed.safetensors", T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]"),
              zeros, 8);
    expect_reject("reversed.safetensors", FXA_ERR_INVALID_ARG,
                  "data_offsets [8, 4] end before they begin");
    write_raw("size_mismatch.safetensors",
              T("\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]"), zeros, 8);
    expect_reject("size_mismatch.safetensors", FXA_ERR_INVALID_ARG,
                  "data_offsets [0, 8] span 8 bytes but F32 with shape [3] needs 12");
    write_raw("past_data.safetensors",
              T("\"dtype\":\"BF16\",\"shape\":[2,2],\"data_offsets\":[4,12]"), zeros, 8);
    expect_reject("past_data.safetensors", FXA_ERR_INVALID_ARG,
                  "data_offsets [4, 12] run past the end of the data buffer (8 bytes)");
    write_raw("overlap.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}",
              zeros, 24);
    expect_reject("overlap.safetensors", FXA_ERR_INVALID_ARG,
                  "tensors 'a' [0, 16) and 'b' [8, 24) overlap");
    write_raw("same_range.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}",
              zeros, 8);
    expect_reject("same_range.safetensors", FXA_ERR_INVALID_ARG, "overlap");
    write_raw("empty_inside.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
              "\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}",
              zeros, 16);
    expect_reject("empty_inside.safetensors", FXA_ERR_INVALID_ARG,
                  "tensors 'a' [0, 16) and 'e' [8, 8) overlap");
    write_raw("hole.safetensors",
              "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
              zeros, 12);
    expect_reject("hole.safetensors", FXA_ERR_INVALID_ARG,
                  "hole in the data buffer: bytes [4, 8) belong to no tensor (between 'a' and "
                  "'b')");
    write_raw("hole_first.safetensors", T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]"),
              zeros, 8);
    expect_reject("hole_first.safetensors", FXA_ERR_INVALID_ARG,
                  "bytes [0, 4) belong to no tensor (before 't')");
    write_raw("extra_data.safetensors", T("\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]"),
              zeros, 9);
    expect_reject("extra_data.safetensors", FXA_ERR_INVALID_ARG,
                  "5 bytes of data follow the last tensor (the tensors end at 4, the data buffer "
                  "holds 9)");
    write_raw("data_no_tensors.safetensors", "{\"__metadata__\":{\"a\":\"b\"}}", zeros, 3);
    expect_reject("data_no_tensors.safetensors", FXA_ERR_INVALID_ARG,
                  "the header lists no tensors but 3 bytes of data follow it");
}

static void test_paths_and_messages(void)
{
    char path[PATH_CAP];
    char err[ERR_CAP];
    fxa_st_file *f = NULL;

    expect_unreadable(expect_reject, ".safetensors", path);

    CHECK(fxa_st_open(NULL, &f, err, sizeof err) == FXA_ERR_INVALID_ARG, "NULL path: %s", err);
    CHECK(fxa_st_open(path, NULL, err, sizeof err) == FXA_ERR_INVALID_ARG, "NULL out: %s", err);
    CHECK(fxa_st_parse(NULL, 8, "x", &f, err, sizeof err) == FXA_ERR_INVALID_ARG && f == NULL,
          "NULL bytes: %s", err);
    CHECK(fxa_st_parse(NULL, 0, NULL, &f, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strncmp(err, "(memory): file is 0 bytes", 25) == 0,
          "no name for errors: %s", err);

    /* Truncated and absent messages: same status, a prefix of the full message. */
    write_raw("msg.safetensors", T("\"dtype\":\"F33\",\"shape\":[0],\"data_offsets\":[0,0]"), NULL,
              0);
    test_path_join(path, g_dir, "msg.safetensors");
    char full[ERR_CAP];
    fxa_status want = fxa_st_open(path, &f, full, sizeof full);
    CHECK(want == FXA_ERR_INVALID_ARG, "msg: %s", full);
    for (size_t len = 0; len < 40; len += 7) {
        char small[48];
        memset(small, 0x5a, sizeof small);
        CHECK(fxa_st_open(path, &f, len ? small : NULL, len) == want && f == NULL,
              "errlen %zu: status", len);
        if (len > 0) {
            CHECK(strlen(small) == len - 1 && strncmp(small, full, len - 1) == 0,
                  "errlen %zu: '%s' is not a prefix of '%s'", len, small, full);
        }
        for (size_t i = len; i < sizeof small; i++) {
            CHECK(small[i] == 0x5a, "errlen %zu: byte %zu written", len, i);
        }
    }

    /* A file that shrinks after it was opened: the read reports I/O. */
    float big[16] = {0};
    const tspec t = {"w", "F32", 1, {16}, big, sizeof big};
    write_st("shrinks.safetensors", &t, 1, NULL);
    test_path_join(path, g_dir, "shrinks.safetensors");
    f = open_ok("shrinks.safetensors");
    if (f != NULL) {
        const fxa_st_tensor *w = fxa_st_find(f, "w");
        CHECK(truncate(path, (off_t)(w->file_offset + 10)) == 0, "truncate");
        CHECK(fxa_st_read(f, w, big, sizeof big, err, sizeof err) == FXA_ERR_IO &&
                  strstr(err, "unexpected end of file while reading tensor 'w'") != NULL,
              "shrunk file: %s", err);
        CHECK(fxa_st_read_f32(f, w, big, 16, err, sizeof err) == FXA_ERR_IO, "shrunk fp32: %s",
              err);
        fxa_st_close(f);
    }
}

int main(void)
{
    scratch_dir_create("test_safetensors");
    test_dtypes();
    test_shapes();
    test_names();
    test_length_field();
    test_json_syntax();
    test_schema();
    test_paths_and_messages();
    test_remove_tree(g_dir);
    return test_summary("test_safetensors");
}
