/*
 * Unit test of src/io/npy.c: valid and hostile .npy files for the reader, roundtrips
 * and failure clean-up for the atomic writer. Works in a fresh mkdtemp folder under /tmp,
 * removed at the end. Prints each failed check, then "test_npy: ok N checks" when all pass.
 */
#define _POSIX_C_SOURCE 200809L

#include "fxattn_npy.h"
#include "io/file_io.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_fixtures.h"
#include "testutil.h"

#define ERR_CAP 8192 /* room for the over-long path case */

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}

/* Entries of dir (without . and ..) whose name contains part ("" counts all). */
static int count_entries(const char *dir, const char *part)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        die(dir);
    }
    int n = 0;
    for (struct dirent *e = readdir(d); e != NULL; e = readdir(d)) {
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 &&
            strstr(e->d_name, part) != NULL) {
            n++;
        }
    }
    closedir(d);
    return n;
}

static void make_subdir(char out[PATH_CAP], const char *name)
{
    test_path_join(out, g_dir, name);
    if (mkdir(out, 0755) != 0) {
        die(out);
    }
}

static void write_file(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(bytes, 1, n, f) != n || fclose(f) != 0) {
        die(path);
    }
}

/* Whole file into a malloc'd buffer. */
static unsigned char *slurp(const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        die(path);
    }
    size_t cap = 4096;
    size_t len = 0;
    unsigned char *bytes = malloc(cap);
    size_t got;
    while (bytes != NULL && (got = fread(bytes + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            cap *= 2;
            unsigned char *grown = realloc(bytes, cap);
            if (grown == NULL) {
                free(bytes);
            }
            bytes = grown;
        }
    }
    fclose(f);
    if (bytes == NULL) {
        die("slurp");
    }
    *len_out = len;
    return bytes;
}

/*
 * A handcrafted .npy file in g_dir: magic, version major.minor, the header length field
 * (2 bytes little-endian for major 1, else 4), then text and data as given.
 */
static void write_npy_raw(const char *name, int major, int minor, uint32_t header_len_field,
                          const void *text, size_t text_len, const void *data, size_t data_len)
{
    size_t len_bytes = major == 1 ? 2 : 4;
    size_t total = 8 + len_bytes + text_len + data_len;
    unsigned char *bytes = malloc(total);
    if (bytes == NULL) {
        die("malloc");
    }
    memcpy(bytes, "\x93NUMPY", 6);
    bytes[6] = (unsigned char)major;
    bytes[7] = (unsigned char)minor;
    for (size_t i = 0; i < len_bytes; i++) {
        bytes[8 + i] = (unsigned char)(header_len_field >> (8 * i));
    }
    if (text_len > 0) {
        memcpy(bytes + 8 + len_bytes, text, text_len);
    }
    if (data_len > 0) {
        memcpy(bytes + 8 + len_bytes + text_len, data, data_len);
    }
    char path[PATH_CAP];
    test_path_join(path, g_dir, name);
    write_file(path, bytes, total);
    free(bytes);
}

/* Version major.0 with a correct header length for the given header text. */
static void write_npy(const char *name, int major, const char *text, const void *data,
                      size_t data_len)
{
    write_npy_raw(name, major, 0, (uint32_t)strlen(text), text, strlen(text), data, data_len);
}

/* "{'descr': <descr>, 'fortran_order': <fortran>, 'shape': <shape>, }\n" (static buffer). */
static const char *dict_text(const char *descr, const char *fortran, const char *shape)
{
    static char text[1024];
    snprintf(text, sizeof text, "{'descr': %s, 'fortran_order': %s, 'shape': %s, }\n", descr,
             fortran, shape);
    return text;
}

static int is_zeroed(const fxa_npy *a)
{
    fxa_npy zero;
    memset(&zero, 0, sizeof zero);
    return memcmp(a, &zero, sizeof zero) == 0;
}

/* Read g_dir/name and expect exactly this array. */
static void expect_array(const char *name, fxa_dtype dtype, int ndim, const int64_t *shape,
                         const void *data, size_t data_len)
{
    char path[PATH_CAP];
    char err[ERR_CAP] = "untouched";
    fxa_npy a;
    test_path_join(path, g_dir, name);
    fxa_status status = fxa_npy_read(path, &a, err, sizeof err);
    CHECK(status == FXA_OK, "%s: read failed (%d): %s", name, (int)status, err);
    if (status != FXA_OK) {
        return;
    }
    CHECK(err[0] == '\0', "%s: message left on success: %s", name, err);
    CHECK(a.dtype == dtype, "%s: dtype %d, want %d", name, (int)a.dtype, (int)dtype);
    CHECK(a.ndim == ndim, "%s: ndim %d, want %d", name, a.ndim, ndim);
    int64_t count = 1;
    for (int i = 0; i < ndim && i < a.ndim; i++) {
        CHECK(a.shape[i] == shape[i], "%s: shape[%d] = %" PRId64 ", want %" PRId64, name, i,
              a.shape[i], shape[i]);
        count *= shape[i];
    }
    size_t itemsize = dtype == FXA_F16 ? 2 : 4;
    CHECK(a.count == count, "%s: count %" PRId64 ", want %" PRId64, name, a.count, count);
    CHECK((size_t)count * itemsize == data_len, "%s: test data has the wrong size", name);
    CHECK(a.data != NULL, "%s: data is NULL", name);
    CHECK((uintptr_t)a.data % 64 == 0, "%s: data is not 64-byte aligned", name);
    if (a.data != NULL && (size_t)a.count * itemsize == data_len && data_len > 0) {
        CHECK(memcmp(a.data, data, data_len) == 0, "%s: data differs", name);
    }
    fxa_npy_free(&a);
    CHECK(is_zeroed(&a), "%s: fxa_npy_free did not zero the struct", name);
}

/* Read g_dir/name (or an absolute path) and expect a failure whose message holds keyword. */
static void expect_reject(const char *name, fxa_status want, const char *keyword)
{
    char path[PATH_CAP];
    char err[ERR_CAP];
    fxa_npy a;
    if (name[0] == '/') {
        snprintf(path, sizeof path, "%s", name);
    } else {
        test_path_join(path, g_dir, name);
    }
    memset(&a, 0xa5, sizeof a);
    memset(err, 0, sizeof err);
    fxa_status status = fxa_npy_read(path, &a, err, sizeof err);
    size_t path_len = strlen(path);
    CHECK(status == want, "%s: status %d, want %d (message: %s)", name, (int)status, (int)want,
          err);
    CHECK(err[0] != '\0', "%s: empty message", name);
    CHECK(strncmp(err, path, path_len) == 0 && err[path_len] == ':' && err[path_len + 1] == ' ',
          "%s: message does not start with the path: %s", name, err);
    CHECK(strchr(err, '\n') == NULL, "%s: message has a newline: %s", name, err);
    const char *reason = strlen(err) >= path_len ? err + path_len : err;
    CHECK(strstr(reason, keyword) != NULL, "%s: message lacks \"%s\": %s", name, keyword, err);
    CHECK(is_zeroed(&a), "%s: output not zeroed after a failure", name);
    if (status == FXA_OK) {
        fxa_npy_free(&a);
    }
}

/* ------------------------------------------------------------------------ */
/* Reader                                                                    */
/* ------------------------------------------------------------------------ */

static void test_reader_valid(void)
{
    const float three[3] = {1.5f, -2.0f, 3.25f};
    const int64_t shape3[1] = {3};
    const char *f4_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }\n";

    write_npy("v1.npy", 1, f4_dict, three, sizeof three);
    expect_array("v1.npy", FXA_F32, 1, shape3, three, sizeof three);
    write_npy("v2.npy", 2, f4_dict, three, sizeof three);
    expect_array("v2.npy", FXA_F32, 1, shape3, three, sizeof three);
    write_npy("v3.npy", 3, f4_dict, three, sizeof three);
    expect_array("v3.npy", FXA_F32, 1, shape3, three, sizeof three);

    /* '<f2' (2, 2): 1.0, -2.0, 65504, smallest subnormal, little-endian on disk. */
    const unsigned char halves[8] = {0x00, 0x3c, 0x00, 0xc0, 0xff, 0x7b, 0x01, 0x00};
    const int64_t shape22[2] = {2, 2};
    write_npy("f2.npy", 1, dict_text("'<f2'", "False", "(2, 2)"), halves, sizeof halves);
    expect_array("f2.npy", FXA_F16, 2, shape22, halves, sizeof halves);

    /* Keys in any order, double quotes, odd whitespace, no trailing comma, padding. */
    const int64_t shape21[2] = {2, 1};
    write_npy("loose.npy", 1,
              "{ \"shape\" :\t( 2 , 1 ) ,\n 'fortran_order':False,'descr':\"<f4\" }     \n", three,
              2 * sizeof(float));
    expect_array("loose.npy", FXA_F32, 2, shape21, three, 2 * sizeof(float));

    const float scalar = 42.0f;
    write_npy("scalar.npy", 1, dict_text("'<f4'", "False", "()"), &scalar, sizeof scalar);
    expect_array("scalar.npy", FXA_F32, 0, NULL, &scalar, sizeof scalar);

    const int64_t shape31[2] = {3, 1};
    write_npy("trailing_comma.npy", 1, dict_text("'<f4'", "False", "(3, 1,)"), three, sizeof three);
    expect_array("trailing_comma.npy", FXA_F32, 2, shape31, three, sizeof three);

    write_npy("py2_long.npy", 1, dict_text("'<f4'", "False", "(3L,)"), three, sizeof three);
    expect_array("py2_long.npy", FXA_F32, 1, shape3, three, sizeof three);

    const int64_t shape_empty[2] = {3, 0};
    write_npy("empty_array.npy", 1, dict_text("'<f4'", "False", "(3, 0)"), NULL, 0);
    expect_array("empty_array.npy", FXA_F32, 2, shape_empty, NULL, 0);

    /* A version 2.0 header longer than 65535 bytes (mostly padding). */
    size_t big_len = 200000;
    char *big = malloc(big_len);
    if (big == NULL) {
        die("malloc");
    }
    memset(big, ' ', big_len);
    memcpy(big, f4_dict, strlen(f4_dict) - 1);
    big[big_len - 1] = '\n';
    write_npy_raw("big_header.npy", 2, 0, (uint32_t)big_len, big, big_len, three, sizeof three);
    expect_array("big_header.npy", FXA_F32, 1, shape3, three, sizeof three);
    free(big);
}

static void test_reader_dtypes(void)
{
    const float one = 1.0f;
    write_npy("fortran.npy", 1, dict_text("'<f4'", "True", "(1,)"), &one, sizeof one);
    expect_reject("fortran.npy", FXA_ERR_INVALID_ARG, "Fortran-order arrays are not supported");
    write_npy("fortran_int.npy", 1, dict_text("'<f4'", "0", "(1,)"), &one, sizeof one);
    expect_reject("fortran_int.npy", FXA_ERR_INVALID_ARG, "True or False");

    write_npy("big_f4.npy", 1, dict_text("'>f4'", "False", "(1,)"), &one, sizeof one);
    expect_reject("big_f4.npy", FXA_ERR_INVALID_ARG, "big-endian");
    write_npy("big_f2.npy", 1, dict_text("'>f2'", "False", "(2,)"), &one, sizeof one);
    expect_reject("big_f2.npy", FXA_ERR_INVALID_ARG, "big-endian");

    static const char *const others[] = {"<f8", "<i4", "|u1", "|b1", "=f4", "<c8", "float32", ""};
    for (size_t i = 0; i < sizeof others / sizeof others[0]; i++) {
        char descr[32];
        char expected[64];
        snprintf(descr, sizeof descr, "'%s'", others[i]);
        snprintf(expected, sizeof expected, "dtype '%s' is not supported", others[i]);
        write_npy("other_dtype.npy", 1, dict_text(descr, "False", "(1,)"), &one, sizeof one);
        expect_reject("other_dtype.npy", FXA_ERR_INVALID_ARG, expected);
        expect_reject("other_dtype.npy", FXA_ERR_INVALID_ARG, "only <f4 and <f2 are supported");
    }

    write_npy("structured.npy", 1, dict_text("[('a', '<f4')]", "False", "(1,)"), &one, sizeof one);
    expect_reject("structured.npy", FXA_ERR_INVALID_ARG, "structured");
    write_npy("descr_number.npy", 1, dict_text("5", "False", "(1,)"), &one, sizeof one);
    expect_reject("descr_number.npy", FXA_ERR_INVALID_ARG, "'descr'");

    /* Bytes from the file are shown sanitised and cut short. */
    const char hostile_dtype[] = "{'descr': '<f\x01\xff', 'fortran_order': False, 'shape': (1,)}\n";
    write_npy("control_dtype.npy", 1, hostile_dtype, &one, sizeof one);
    expect_reject("control_dtype.npy", FXA_ERR_INVALID_ARG, "dtype '<f?\?'");
    char long_key[400];
    snprintf(long_key, sizeof long_key, "{'%0300d': 1}\n", 7);
    write_npy("long_key.npy", 1, long_key, NULL, 0);
    expect_reject("long_key.npy", FXA_ERR_INVALID_ARG, "0000...'");
}

static void test_reader_dict(void)
{
    const float one = 1.0f;
    /* Dicts that are not a valid header: missing, unknown or repeated keys, bad syntax. */
    static const bad_text cases[] = {
        {"unknown_key.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'extra': 1}\n",
         "unknown header key 'extra'"},
        {"duplicate_key.npy",
         "{'descr': '<f4', 'fortran_order': False, 'descr': '<f4', 'shape': (1,)}\n",
         "duplicate header key 'descr'"},
        {"no_descr.npy", "{'fortran_order': False, 'shape': (1,)}\n", "missing the 'descr' key"},
        {"no_fortran.npy", "{'descr': '<f4', 'shape': (1,)}\n", "missing the 'fortran_order' key"},
        {"no_shape.npy", "{'descr': '<f4', 'fortran_order': False}\n", "missing the 'shape' key"},
        {"no_newline.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
         "not terminated by a newline"},
        {"open_dict.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), \n",
         "malformed header"},
        {"open_string.npy", "{'descr': '<f4\n", "closing quote"},
        {"escape.npy", "{'descr': '<f\\x34', 'fortran_order': False, 'shape': (1,)}\n", "escape"},
        {"no_colon.npy", "{'descr' '<f4', 'fortran_order': False, 'shape': (1,)}\n",
         "expected ':'"},
        {"no_comma.npy", "{'descr': '<f4' 'fortran_order': False, 'shape': (1,)}\n",
         "expected ',' or '}'"},
        {"after_dict.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x\n",
         "only padding after"},
        {"vertical_tab.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}\v\n",
         "found byte 0x0b"},
        {"only_spaces.npy", "                \n", "expected '{'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_npy(cases[i].name, 1, cases[i].text, &one, sizeof one);
        expect_reject(cases[i].name, FXA_ERR_INVALID_ARG, cases[i].keyword);
    }
    write_npy("empty_dict.npy", 1, "{}\n", NULL, 0);
    expect_reject("empty_dict.npy", FXA_ERR_INVALID_ARG, "missing");

    const char key_with_nul[] = "{'des\0cr': '<f4', 'fortran_order': False, 'shape': (1,)}\n";
    write_npy_raw("nul_key.npy", 1, 0, sizeof key_with_nul - 1, key_with_nul,
                  sizeof key_with_nul - 1, &one, sizeof one);
    expect_reject("nul_key.npy", FXA_ERR_INVALID_ARG, "unknown header key 'des?cr'");

    const unsigned char garbage[] = {0xff, 0x00, 0x13, 'A', 0x80, '{', 0xfe, 0x7f, '\n'};
    write_npy_raw("garbage.npy", 1, 0, sizeof garbage, garbage, sizeof garbage, &one, sizeof one);
    expect_reject("garbage.npy", FXA_ERR_INVALID_ARG, "found byte 0xff");
}

static void test_reader_shapes(void)
{
    const float data[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    static const struct {
        const char *shape;
        const char *keyword;
    } cases[] = {
        {"(-1,)", "negative dimension -1"},
        {"(2.5,)", "'2.5' is not a non-negative integer"},
        {"('a',)", "is not a non-negative integer"},
        {"(1e3,)", "'1e3' is not a non-negative integer"},
        {"(True,)", "is not a non-negative integer"},
        {"(4)", "trailing comma"},
        {"(,)", "expected a dimension"},
        {"(2 2)", "expected ',' or ')'"},
        {"[4]", "expected '('"},
        {"(1, 1, 1, 1, 1, 1, 1, 1, 1)", "more than 8 dimensions"},
        {"(99999999999999999999,)", "too large"},
        {"(9223372036854775808,)", "too large"},
        {"(4611686018427387904, 4)", "overflow"},
        {"(2305843009213693952,)", "overflow"},
        {"(4611686018427387904, 4, 0)", "overflow"},
        {"(1099511627776,)", "truncated: header says 4398046511104 bytes of data, file has 16"},
        {"(3,)", "file has 16 bytes of data but header says 12 (trailing bytes)"},
        {"(2, 3)", "truncated: header says 24 bytes of data, file has 16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "shape_case_%zu.npy", i);
        write_npy(name, 1, dict_text("'<f4'", "False", cases[i].shape), data, sizeof data);
        expect_reject(name, FXA_ERR_INVALID_ARG, cases[i].keyword);
    }

    /* 2^62 halves is 2^63 bytes: the byte size overflows even though the count fits. */
    write_npy("f2_bytes_overflow.npy", 1, dict_text("'<f2'", "False", "(4611686018427387904,)"),
              NULL, 0);
    expect_reject("f2_bytes_overflow.npy", FXA_ERR_INVALID_ARG, "overflow");

    /* Eight dimensions are fine. */
    const int64_t shape8[8] = {1, 2, 1, 2, 1, 1, 1, 1};
    write_npy("eight_dims.npy", 1, dict_text("'<f4'", "False", "(1, 2, 1, 2, 1, 1, 1, 1)"), data,
              sizeof data);
    expect_array("eight_dims.npy", FXA_F32, 8, shape8, data, sizeof data);
}

static void test_reader_preamble(void)
{
    const float one = 1.0f;
    const char *dict = dict_text("'<f4'", "False", "(1,)");
    char path[PATH_CAP];

    /* Files too short for the preamble, or not .npy at all. */
    static const struct {
        const char *name;
        const char *bytes;
        size_t n;
        const char *keyword;
    } short_files[] = {
        {"empty.npy", "", 0, "file is empty"},
        {"text.npy", "hello world\n", 12, "magic"},
        {"short_magic.npy", "\x93NUM", 4, "magic"},
        {"no_version.npy", "\x93NUMPY\x01", 7, "truncated .npy preamble"},
        {"short_len.npy", "\x93NUMPY\x02\x00\x10\x00", 10, "truncated .npy preamble"},
    };
    for (size_t i = 0; i < sizeof short_files / sizeof short_files[0]; i++) {
        test_path_join(path, g_dir, short_files[i].name);
        write_file(path, short_files[i].bytes, short_files[i].n);
        expect_reject(short_files[i].name, FXA_ERR_INVALID_ARG, short_files[i].keyword);
    }

    /* A good dict behind a bad version or a bad header length field. */
    static const struct {
        const char *name;
        int major, minor;
        int64_t len_field; /* -1: the dict's own length */
        const char *keyword;
    } preambles[] = {
        {"v4.npy", 4, 0, -1, "version 4.0"},
        {"v0.npy", 0, 0, -1, "version 0.0"},
        {"v1_1.npy", 1, 1, -1, "version 1.1"},
        {"header_past_end.npy", 1, 0, 1000, "header length 1000 runs past the end of the file"},
        {"header_huge.npy", 2, 0, 0xffffffffu, "exceeds the limit"},
        {"header_over_limit.npy", 3, 0, FXA_NPY_MAX_HEADER_LEN + 1, "exceeds the limit"},
        {"header_zero.npy", 1, 0, 0, "header is empty"},
    };
    for (size_t i = 0; i < sizeof preambles / sizeof preambles[0]; i++) {
        const int64_t field = preambles[i].len_field;
        write_npy_raw(preambles[i].name, preambles[i].major, preambles[i].minor,
                      field < 0 ? (uint32_t)strlen(dict) : (uint32_t)field, dict, strlen(dict),
                      &one, sizeof one);
        expect_reject(preambles[i].name, FXA_ERR_INVALID_ARG, preambles[i].keyword);
    }

    expect_unreadable(expect_reject, ".npy", path);
}

static void test_reader_arguments(void)
{
    char path[PATH_CAP];
    char err[ERR_CAP];
    fxa_npy a;
    test_path_join(path, g_dir, "no_shape.npy");

    /* The message is cut to the buffer, still NUL-terminated. */
    char small[8];
    memset(small, 'x', sizeof small);
    CHECK(fxa_npy_read(path, &a, small, sizeof small) == FXA_ERR_INVALID_ARG,
          "small buffer: wrong status");
    CHECK(memchr(small, '\0', sizeof small) != NULL && strlen(small) == sizeof small - 1,
          "small buffer: message not cut to 7 characters");
    CHECK(fxa_npy_read(path, &a, NULL, 0) == FXA_ERR_INVALID_ARG, "NULL err: wrong status");
    CHECK(is_zeroed(&a), "NULL err: output not zeroed");
    CHECK(fxa_npy_read(NULL, &a, err, sizeof err) == FXA_ERR_INVALID_ARG && err[0] != '\0',
          "NULL path: wrong status or no message");
    CHECK(fxa_npy_read(path, NULL, err, sizeof err) == FXA_ERR_INVALID_ARG && err[0] != '\0',
          "NULL output: wrong status or no message");

    fxa_npy_free(NULL);
    memset(&a, 0x5a, sizeof a);
    a.data = NULL;
    fxa_npy_free(&a);
    CHECK(is_zeroed(&a), "fxa_npy_free with NULL data did not zero the struct");
}

/* ------------------------------------------------------------------------ */
/* Writer                                                                    */
/* ------------------------------------------------------------------------ */

/* Stage, commit and read back; also check the on-disk header against NumPy's layout. */
static void roundtrip(const char *name, int ndim, const int64_t *shape, const char *shape_repr)
{
    char path[PATH_CAP];
    char err[ERR_CAP];
    fxa_staged st;
    test_path_join(path, g_dir, name);

    int64_t count = 1;
    for (int i = 0; i < ndim; i++) {
        count *= shape[i];
    }
    size_t data_len = (size_t)count * sizeof(float);
    float *data = malloc(data_len > 0 ? data_len : 1);
    if (data == NULL) {
        die("malloc");
    }
    for (int64_t i = 0; i < count; i++) {
        data[i] = (float)i * 0.5f - 3.0f;
    }
    if (count > 2) {
        data[1] = -0.0f;
        data[2] = (float)NAN;
    }

    fxa_status status = fxa_npy_stage_f32(path, ndim, shape, data, &st, err, sizeof err);
    CHECK(status == FXA_OK, "%s: stage failed (%d): %s", name, (int)status, err);
    if (status != FXA_OK) {
        free(data);
        return;
    }
    CHECK(st.active == 1, "%s: staged struct not active", name);
    CHECK(strcmp(st.final_path, path) == 0, "%s: final path %s", name, st.final_path);
    CHECK(strncmp(st.tmp_path, path, strlen(path)) == 0 &&
              strncmp(st.tmp_path + strlen(path), ".tmp.", 5) == 0,
          "%s: temporary path %s not next to the final path", name, st.tmp_path);
    CHECK(exists(st.tmp_path), "%s: temporary file missing before commit", name);
    CHECK(!exists(path), "%s: final file exists before commit", name);
    status = fxa_staged_commit(&st, err, sizeof err);
    CHECK(status == FXA_OK, "%s: commit failed (%d): %s", name, (int)status, err);
    CHECK(st.active == 0, "%s: staged struct still active after commit", name);
    CHECK(count_entries(g_dir, ".tmp.") == 0, "%s: temporary file left after commit", name);

    expect_array(name, FXA_F32, ndim, shape, data, data_len);

    size_t file_len;
    unsigned char *bytes = slurp(path, &file_len);
    size_t header_total = 10 + (size_t)(bytes[8] | bytes[9] << 8);
    char expected_dict[256];
    snprintf(expected_dict, sizeof expected_dict,
             "{'descr': '<f4', 'fortran_order': False, 'shape': %s, }", shape_repr);
    size_t dict_len = strlen(expected_dict);
    CHECK(memcmp(bytes, "\x93NUMPY\x01\x00", 8) == 0, "%s: magic or version wrong", name);
    CHECK(header_total % 64 == 0, "%s: header of %zu bytes is not 64-aligned", name, header_total);
    CHECK(file_len == header_total + data_len, "%s: file has %zu bytes, want %zu", name, file_len,
          header_total + data_len);
    if (file_len >= header_total && header_total >= 10 + dict_len + 1) {
        CHECK(memcmp(bytes + 10, expected_dict, dict_len) == 0, "%s: header is not %s", name,
              expected_dict);
        size_t spaces = 0;
        while (bytes[10 + dict_len + spaces] == ' ') {
            spaces++;
        }
        CHECK(10 + dict_len + spaces == header_total - 1 && bytes[header_total - 1] == '\n',
              "%s: header padding is not spaces then a newline", name);
    }
    free(bytes);

    struct stat file_stat;
    mode_t mask = umask(0);
    umask(mask);
    CHECK(stat(path, &file_stat) == 0 && (file_stat.st_mode & 0777) == (0666 & ~mask),
          "%s: mode %o, want %o", name, (unsigned)(file_stat.st_mode & 0777),
          (unsigned)(0666 & ~mask));
    free(data);
}

static void test_writer_roundtrip(void)
{
    const int64_t s5[1] = {5};
    const int64_t s23[2] = {2, 3};
    const int64_t s234[3] = {2, 3, 4};
    const int64_t s0[1] = {0};
    const int64_t s302[3] = {3, 0, 2};
    const int64_t s8[8] = {1, 2, 1, 2, 1, 2, 1, 2};
    const int64_t s_big[2] = {1000, 257};
    roundtrip("w_scalar.npy", 0, NULL, "()");
    roundtrip("w_1d.npy", 1, s5, "(5,)");
    roundtrip("w_2d.npy", 2, s23, "(2, 3)");
    roundtrip("w_3d.npy", 3, s234, "(2, 3, 4)");
    roundtrip("w_empty.npy", 1, s0, "(0,)");
    roundtrip("w_empty3.npy", 3, s302, "(3, 0, 2)");
    roundtrip("w_8d.npy", 8, s8, "(1, 2, 1, 2, 1, 2, 1, 2)");
    roundtrip("w_big.npy", 2, s_big, "(1000, 257)");

    /* Committing replaces an existing file. */
    char path[PATH_CAP];
    char err[ERR_CAP];
    fxa_staged st;
    const float fresh[2] = {7.0f, 8.0f};
    const int64_t s2[1] = {2};
    test_path_join(path, g_dir, "w_replace.npy");
    write_file(path, "old contents", 12);
    CHECK(save_f32(path, 1, s2, fresh, err, sizeof err) == FXA_OK,
          "replace: stage or commit failed: %s", err);
    expect_array("w_replace.npy", FXA_F32, 1, s2, fresh, sizeof fresh);

    /* Staging then discarding leaves nothing behind. */
    char dir[PATH_CAP];
    make_subdir(dir, "discard");
    test_path_join(path, dir, "gone.npy");
    CHECK(fxa_npy_stage_f32(path, 1, s2, fresh, &st, err, sizeof err) == FXA_OK,
          "discard: stage failed: %s", err);
    CHECK(count_entries(dir, ".tmp.") == 1, "discard: no temporary file while staged");
    fxa_staged_discard(&st);
    CHECK(st.active == 0, "discard: struct still active");
    CHECK(count_entries(dir, "") == 0, "discard: files left in the folder");
    fxa_staged_discard(&st);
    fxa_staged_discard(NULL);
    CHECK(fxa_staged_commit(&st, err, sizeof err) == FXA_ERR_INVALID_ARG && err[0] != '\0',
          "commit after discard: not refused with a message");
    CHECK(fxa_staged_commit(NULL, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "commit of NULL: not refused");
}

/* Expect a refused stage that leaves the folder as it was and st inactive. */
static void expect_stage_failure(const char *label, const char *dir, const char *path, int ndim,
                                 const int64_t *shape, const float *data, fxa_status want,
                                 const char *keyword)
{
    char err[ERR_CAP] = "";
    fxa_staged st;
    int before = exists(dir) ? count_entries(dir, "") : 0;
    memset(&st, 0x11, sizeof st);
    fxa_status status = fxa_npy_stage_f32(path, ndim, shape, data, &st, err, sizeof err);
    CHECK(status == want, "%s: status %d, want %d (%s)", label, (int)status, (int)want, err);
    CHECK(strstr(err, keyword) != NULL, "%s: message lacks \"%s\": %s", label, keyword, err);
    CHECK(strchr(err, '\n') == NULL, "%s: message has a newline", label);
    CHECK(st.active == 0, "%s: staged struct active after a failure", label);
    if (exists(dir)) {
        CHECK(count_entries(dir, ".tmp.") == 0, "%s: temporary file left behind", label);
        CHECK(count_entries(dir, "") == before, "%s: folder contents changed", label);
    }
    if (status == FXA_OK) {
        fxa_staged_discard(&st);
    }
}

static void test_writer_failures(void)
{
    char dir[PATH_CAP];
    char path[PATH_CAP];
    char err[ERR_CAP];
    const float data[4] = {1.0f, 2.0f, 3.0f, 4.0f};
    const int64_t s4[1] = {4};

    /* A missing folder. */
    char missing[PATH_CAP];
    test_path_join(missing, g_dir, "no_such_folder");
    test_path_join(path, missing, "out.npy");
    expect_stage_failure("missing folder", g_dir, path, 1, s4, data, FXA_ERR_IO, path);
    expect_stage_failure("missing folder", g_dir, path, 1, s4, data, FXA_ERR_IO, strerror(ENOENT));
    CHECK(!exists(missing), "missing folder: it was created");

    /* A read-only folder (root ignores permissions). */
    make_subdir(dir, "read_only");
    test_path_join(path, dir, "out.npy");
    if (geteuid() == 0) {
        printf("skipped: read-only folder check (running as root)\n");
    } else {
        if (chmod(dir, 0555) != 0) {
            die(dir);
        }
        expect_stage_failure("read-only folder", dir, path, 1, s4, data, FXA_ERR_IO,
                             strerror(EACCES));
        chmod(dir, 0755);
    }

    /* Bad arguments. */
    make_subdir(dir, "arguments");
    test_path_join(path, dir, "out.npy");
    const int64_t s9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    const int64_t negative[2] = {2, -1};
    const int64_t overflow[2] = {INT64_MAX / 2, 4};
    expect_stage_failure("9 dims", dir, path, 9, s9, data, FXA_ERR_INVALID_ARG, "dimensions");
    expect_stage_failure("ndim -1", dir, path, -1, s4, data, FXA_ERR_INVALID_ARG, "dimensions");
    expect_stage_failure("NULL shape", dir, path, 1, NULL, data, FXA_ERR_INVALID_ARG, "dimensions");
    expect_stage_failure("negative dim", dir, path, 2, negative, data, FXA_ERR_INVALID_ARG,
                         "negative");
    expect_stage_failure("overflowing shape", dir, path, 2, overflow, data, FXA_ERR_INVALID_ARG,
                         "overflow");
    expect_stage_failure("NULL data", dir, path, 1, s4, NULL, FXA_ERR_INVALID_ARG, "no data");
    char long_path[PATH_CAP + 100];
    memset(long_path, 'a', sizeof long_path - 1);
    long_path[sizeof long_path - 1] = '\0';
    memcpy(long_path, dir, strlen(dir));
    long_path[strlen(dir)] = '/';
    expect_stage_failure("long path", dir, long_path, 1, s4, data, FXA_ERR_INVALID_ARG, "too long");
    CHECK(fxa_npy_stage_f32(path, 1, s4, data, NULL, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "NULL staging struct: not refused");

    /* A write that stops part-way (file size limit): the old file stays, no temp is left. */
    make_subdir(dir, "short_write");
    test_path_join(path, dir, "keep.npy");
    const float old_data[2] = {5.0f, 6.0f};
    const int64_t s2[1] = {2};
    CHECK(save_f32(path, 1, s2, old_data, err, sizeof err) == FXA_OK,
          "short write: writing the old file failed: %s", err);
    enum { BIG_COUNT = 4000 };
    float *big = calloc(BIG_COUNT, sizeof(float));
    const int64_t s_big[1] = {BIG_COUNT};
    struct rlimit saved_limit;
    if (big == NULL || getrlimit(RLIMIT_FSIZE, &saved_limit) != 0) {
        die("short write set-up");
    }
    struct rlimit small_limit = saved_limit;
    small_limit.rlim_cur = 1000;
    signal(SIGXFSZ, SIG_IGN);
    if (setrlimit(RLIMIT_FSIZE, &small_limit) != 0) {
        die("setrlimit");
    }
    /* The 128-byte header fits; the data stops at the 1000-byte limit. */
    expect_stage_failure("short write", dir, path, 1, s_big, big, FXA_ERR_IO,
                         "write failed after 872 of 16000 bytes");
    if (setrlimit(RLIMIT_FSIZE, &saved_limit) != 0) {
        die("setrlimit");
    }
    free(big);
    CHECK(count_entries(dir, "") == 1, "short write: folder should hold only keep.npy");
    expect_array("short_write/keep.npy", FXA_F32, 1, s2, old_data, sizeof old_data);

    /* A failed rename (the final path is a non-empty folder) removes the temporary file. */
    make_subdir(dir, "blocked");
    test_path_join(path, dir, "out.npy");
    fxa_staged st;
    CHECK(fxa_npy_stage_f32(path, 1, s4, data, &st, err, sizeof err) == FXA_OK,
          "failed commit: stage failed: %s", err);
    char blocker[PATH_CAP];
    if (mkdir(path, 0755) != 0) {
        die(path);
    }
    test_path_join(blocker, path, "occupied");
    write_file(blocker, "x", 1);
    fxa_status status = fxa_staged_commit(&st, err, sizeof err);
    CHECK(status == FXA_ERR_IO, "failed commit: status %d, want FXA_ERR_IO", (int)status);
    CHECK(strstr(err, "cannot rename") != NULL, "failed commit: message: %s", err);
    CHECK(st.active == 0, "failed commit: struct still active");
    CHECK(count_entries(dir, ".tmp.") == 0, "failed commit: temporary file left behind");
    CHECK(count_entries(dir, "") == 1, "failed commit: folder should hold only the blocker");
}

static void test_write_all(void)
{
    char err[ERR_CAP];
    unsigned char bytes[1000];
    for (size_t i = 0; i < sizeof bytes; i++) {
        bytes[i] = (unsigned char)(i * 7);
    }

    int fd = open("/dev/full", O_WRONLY);
    if (fd < 0) {
        printf("skipped: /dev/full check (cannot open /dev/full: %s)\n", strerror(errno));
    } else {
        err[0] = '\0';
        fxa_status status = fxa_io_write_all(fd, bytes, 100, "/dev/full", err, sizeof err);
        close(fd);
        CHECK(status == FXA_ERR_IO, "/dev/full: status %d, want FXA_ERR_IO", (int)status);
        CHECK(strstr(err, "/dev/full: write failed after 0 of 100 bytes") == err,
              "/dev/full: message: %s", err);
        CHECK(strstr(err, strerror(ENOSPC)) != NULL, "/dev/full: no ENOSPC reason: %s", err);
    }

    int fds[2];
    if (pipe(fds) != 0) {
        die("pipe");
    }
    CHECK(fxa_io_write_all(fds[1], bytes, sizeof bytes, "pipe", err, sizeof err) == FXA_OK,
          "pipe: write failed: %s", err);
    CHECK(fxa_io_write_all(fds[1], bytes, 0, "pipe", err, sizeof err) == FXA_OK,
          "pipe: empty write failed: %s", err);
    unsigned char back[sizeof bytes];
    size_t got = 0;
    while (got < sizeof back) {
        ssize_t n = read(fds[0], back + got, sizeof back - got);
        if (n <= 0) {
            break;
        }
        got += (size_t)n;
    }
    CHECK(got == sizeof back && memcmp(back, bytes, sizeof back) == 0, "pipe: bytes differ");
    close(fds[0]);

    /* A closed read end: EPIPE (SIGPIPE ignored). */
    signal(SIGPIPE, SIG_IGN);
    fxa_status status = fxa_io_write_all(fds[1], bytes, 10, "broken pipe", err, sizeof err);
    CHECK(status == FXA_ERR_IO && strstr(err, strerror(EPIPE)) != NULL,
          "broken pipe: status %d, message %s", (int)status, err);
    close(fds[1]);
}

/* Slices along each axis read exactly the elements a full read holds. */
static void test_reader_slices(void)
{
    char path[PATH_CAP];
    char err[ERR_CAP];
    const int64_t shape[4] = {2, 5, 3, 4};
    float data[120];
    for (int i = 0; i < 120; i++)
        data[i] = (float)i;
    test_path_join(path, g_dir, "slices.npy");
    CHECK(save_f32(path, 4, shape, data, err, sizeof err) == FXA_OK, "slices: write failed: %s",
          err);
    for (int axis = 0; axis < 4; axis++) {
        for (int64_t start = 0; start <= shape[axis]; start++) {
            for (int64_t len = 0; start + len <= shape[axis]; len++) {
                fxa_npy a;
                fxa_status rc = fxa_npy_read_slice(path, axis, start, len, &a, err, sizeof err);
                CHECK(rc == FXA_OK, "slice axis %d [%lld, +%lld): %s", axis, (long long)start,
                      (long long)len, err);
                if (rc != FXA_OK)
                    continue;
                int64_t sub[4] = {shape[0], shape[1], shape[2], shape[3]};
                sub[axis] = len;
                int ok = a.shape[axis] == shape[axis] && a.slice_axis == axis &&
                         a.slice_start == start && a.slice_len == len &&
                         a.count == sub[0] * sub[1] * sub[2] * sub[3];
                for (int64_t i = 0; ok && i < a.count; i++) {
                    int64_t idx[4];
                    int64_t r = i;
                    for (int d = 3; d >= 0; d--) {
                        idx[d] = r % sub[d];
                        r /= sub[d];
                    }
                    idx[axis] += start;
                    const int64_t flat = ((idx[0] * 5 + idx[1]) * 3 + idx[2]) * 4 + idx[3];
                    ok = ((const float *)a.data)[i] == data[flat];
                }
                CHECK(ok, "slice axis %d [%lld, +%lld) holds the wrong elements", axis,
                      (long long)start, (long long)len);
                fxa_npy_free(&a);
            }
        }
    }
    fxa_npy a;
    /* Shards: 5 rows over 3 parts are 2, 2, 1. */
    const int64_t want_start[3] = {0, 2, 4};
    const int64_t want_len[3] = {2, 2, 1};
    for (int part = 0; part < 3; part++) {
        CHECK(fxa_npy_read_shard(path, 1, 3, part, &a, err, sizeof err) == FXA_OK &&
                  a.slice_start == want_start[part] && a.slice_len == want_len[part] &&
                  ((const float *)a.data)[0] == data[want_start[part] * 12],
              "shard %d of 3: %s", part, err);
        fxa_npy_free(&a);
    }
    CHECK(fxa_npy_read_shard(path, 1, 3, 3, &a, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "a shard past the last is refused");
    CHECK(fxa_npy_read_slice(path, 1, 3, 3, &a, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "cannot take") != NULL,
          "a slice past the end is refused: %s", err);
    CHECK(fxa_npy_read_slice(path, 4, 0, 1, &a, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "an axis past the last is refused");
    CHECK(fxa_npy_read_slice(path, 1, -1, 1, &a, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "a negative start is refused");
    /* The whole-file checks still apply: a truncated file fails any slice. */
    FILE *f = fopen(path, "r+b");
    CHECK(f != NULL && ftruncate(fileno(f), 128 + 100 * 4) == 0, "truncate");
    if (f)
        fclose(f);
    CHECK(fxa_npy_read_slice(path, 1, 0, 1, &a, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "truncated") != NULL,
          "a truncated file fails a slice it would still cover: %s", err);
}

/* Empty paths, NULL lists and entries, axes outside the rank: a status and a
 * message, never a crash or a file outside the caller's folder. */
static void test_argument_audit(void)
{
    char path[PATH_CAP];
    char err[ERR_CAP];
    const int64_t shape[2] = {3, 4};
    float data[12] = {0};
    fxa_npy a;
    fxa_staged st;
    test_path_join(path, g_dir, "audit.npy");
    CHECK(save_f32(path, 2, shape, data, err, sizeof err) == FXA_OK, "audit: write failed: %s",
          err);

    /* Empty paths: refused by name, nothing created in the working folder
     * (an empty fresh one for these checks). */
    char cwd[PATH_CAP];
    char empty_dir[PATH_CAP];
    make_subdir(empty_dir, "audit_cwd");
    if (getcwd(cwd, sizeof cwd) == NULL || chdir(empty_dir) != 0)
        die("chdir");
    CHECK(fxa_npy_read("", &a, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "path is empty") != NULL,
          "empty read path: %s", err);
    CHECK(fxa_npy_read_slice("", 0, 0, 1, &a, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "path is empty") != NULL,
          "empty slice path: %s", err);
    CHECK(fxa_npy_read_shard("", 0, 2, 0, &a, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "path is empty") != NULL,
          "empty shard path: %s", err);
    memset(&st, 0x11, sizeof st);
    CHECK(fxa_npy_stage_f32("", 2, shape, data, &st, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "path is empty") != NULL && st.active == 0,
          "empty output path: %s", err);
    CHECK(count_entries(".", "") == 0, "an empty path created a file in the working folder");
    if (chdir(cwd) != 0)
        die("chdir back");

    /* NULL lists and entries of fxa_staged_commit_all. */
    CHECK(fxa_staged_commit_all(NULL, 2, err, sizeof err) == FXA_ERR_INVALID_ARG && err[0],
          "commit_all(NULL, 2): %s", err);
    CHECK(fxa_staged_commit_all(NULL, 0, err, sizeof err) == FXA_OK, "commit_all(NULL, 0)");
    char other[PATH_CAP];
    test_path_join(other, g_dir, "audit_other.npy");
    fxa_staged one;
    CHECK(fxa_npy_stage_f32(other, 2, shape, data, &one, err, sizeof err) == FXA_OK, "stage: %s",
          err);
    fxa_staged *const with_null[2] = {&one, NULL};
    CHECK(fxa_staged_commit_all(with_null, 2, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "NULL") != NULL,
          "commit_all with a NULL entry: %s", err);
    CHECK(!exists(other) && count_entries(g_dir, ".tmp.") == 0,
          "commit_all with a NULL entry committed or left its staged file");
    /* The same struct twice, or two structs for one path: the first would be lost. */
    fxa_staged s1, s2;
    CHECK(fxa_npy_stage_f32(other, 2, shape, data, &s1, err, sizeof err) == FXA_OK &&
              fxa_npy_stage_f32(other, 2, shape, data, &s2, err, sizeof err) == FXA_OK,
          "stage twice: %s", err);
    fxa_staged *const twice[2] = {&s1, &s1};
    CHECK(fxa_staged_commit_all(twice, 2, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "both target") != NULL,
          "commit_all with one struct twice: %s", err);
    CHECK(s1.active == 0 &&
              fxa_npy_stage_f32(other, 2, shape, data, &s1, err, sizeof err) == FXA_OK,
          "the refused list was discarded; stage again: %s", err);
    fxa_staged *const same_path[2] = {&s1, &s2};
    CHECK(fxa_staged_commit_all(same_path, 2, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "both target") != NULL,
          "commit_all with two structs for one path: %s", err);
    /* One path spelled two ways ("dir/x.npy", "dir/./x.npy"). */
    char other_dot[PATH_CAP];
    test_path_join(other_dot, g_dir, "./audit_other.npy");
    CHECK(fxa_npy_stage_f32(other, 2, shape, data, &s1, err, sizeof err) == FXA_OK &&
              fxa_npy_stage_f32(other_dot, 2, shape, data, &s2, err, sizeof err) == FXA_OK,
          "stage two spellings: %s", err);
    CHECK(fxa_staged_commit_all(same_path, 2, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "both target") != NULL,
          "commit_all with one path spelled two ways: %s", err);
    fxa_staged_discard(&s1);
    fxa_staged_discard(&s2);
    CHECK(!exists(other) && count_entries(g_dir, ".tmp.") == 0,
          "commit_all refused, yet committed or left a staged file");
    CHECK(fxa_same_output(NULL, path) == 0 && fxa_same_output(path, NULL) == 0,
          "fxa_same_output with NULL");

    /* Axes: -1 is the whole array (start and length 0), other negatives and
     * axes past the rank are refused, a shard needs an axis; the output
     * array is left empty. */
    memset(&a, 0x5a, sizeof a);
    CHECK(fxa_npy_read_slice(path, -2, 0, 1, &a, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "axis -2") != NULL && is_zeroed(&a),
          "axis -2: %s", err);
    CHECK(fxa_npy_read_slice(path, INT32_MIN, 0, 0, &a, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "axis INT_MIN: %s", err);
    CHECK(fxa_npy_read_slice(path, -1, 1, 1, &a, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "axis -1 with a range: %s", err);
    /* Ranges whose end overflows int64: refused, the message formed without overflow. */
    CHECK(fxa_npy_read_slice(path, 0, INT64_MAX, INT64_MAX, &a, err, sizeof err) ==
                  FXA_ERR_INVALID_ARG &&
              strstr(err, "9223372036854775807") != NULL,
          "a range past INT64_MAX: %s", err);
    CHECK(fxa_npy_read_slice(path, -3, INT64_MAX, 1, &a, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "axis -3 with a range past INT64_MAX: %s", err);
    CHECK(fxa_npy_read_slice(path, 2, 0, 1, &a, err, sizeof err) == FXA_ERR_INVALID_ARG,
          "axis 2 of a 2-D array: %s", err);
    CHECK(fxa_npy_read_shard(path, -1, 2, 0, &a, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "axis") != NULL,
          "shard of axis -1: %s", err);
    CHECK(fxa_npy_read_slice(path, -1, 0, 0, &a, err, sizeof err) == FXA_OK && a.count == 12,
          "axis -1 reads everything: %s", err);
    fxa_npy_free(&a);
}

/* fxa_output_check: what staging would certainly refuse, refused before any write. */
static void test_output_check(void)
{
    char path[PATH_CAP];
    char dir[PATH_CAP];
    char err[ERR_CAP];
    make_subdir(dir, "outcheck");
    test_path_join(path, dir, "new.npy");
    CHECK(fxa_output_check(path, err, sizeof err) == FXA_OK && err[0] == '\0',
          "a new file in a folder: %s", err);
    CHECK(fxa_output_check("/dev/null", err, sizeof err) == FXA_OK, "/dev/null: %s", err);
    CHECK(fxa_output_check("", err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "empty") != NULL,
          "empty: %s", err);
    CHECK(fxa_output_check(NULL, err, sizeof err) == FXA_ERR_INVALID_ARG, "NULL: %s", err);
    CHECK(fxa_output_check(dir, err, sizeof err) == FXA_ERR_IO && strstr(err, "folder") != NULL,
          "a folder: %s", err);
    test_path_join(path, dir, "x/");
    CHECK(fxa_output_check(path, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "'/'") != NULL,
          "a trailing slash: %s", err);
    test_path_join(path, dir, "no_such/l.npy");
    CHECK(fxa_output_check(path, err, sizeof err) == FXA_ERR_IO &&
              strstr(err, "does not exist") != NULL,
          "a missing folder: %s", err);
    char file[PATH_CAP];
    test_path_join(file, dir, "plain");
    write_file(file, "x", 1);
    test_path_join(path, file, "l.npy");
    CHECK(fxa_output_check(path, err, sizeof err) == FXA_ERR_IO, "a file as folder: %s", err);
    CHECK(fxa_output_check(file, err, sizeof err) == FXA_OK, "an existing file: %s", err);
    char longp[5000];
    memset(longp, 'a', sizeof longp - 1);
    longp[sizeof longp - 1] = '\0';
    CHECK(fxa_output_check(longp, err, sizeof err) == FXA_ERR_INVALID_ARG &&
              strstr(err, "too long") != NULL,
          "a 4999-byte path: %.80s", err);
    CHECK(count_entries(dir, "") == 1, "fxa_output_check created files");
}

/* The stamp comparison of the readers' changed-file check. */
static void test_stamps(void)
{
    struct stat sb;
    CHECK(stat(g_dir, &sb) == 0, "stat");
    const fxa_io_stamp a = fxa_io_stamp_of(&sb);
    fxa_io_stamp b = a;
    CHECK(fxa_io_stamp_same(&a, &b), "a stamp equals itself");
    b.mtime.tv_nsec = (a.mtime.tv_nsec + 1) % 1000000000;
    CHECK(!fxa_io_stamp_same(&a, &b), "one nanosecond of mtime apart");
    b = a;
    b.mtime.tv_sec++;
    CHECK(!fxa_io_stamp_same(&a, &b), "one second of mtime apart");
    b = a;
    b.size++;
    CHECK(!fxa_io_stamp_same(&a, &b), "one byte of size apart");
    b = a;
    b.ino++;
    CHECK(!fxa_io_stamp_same(&a, &b), "another inode");
    b = a;
    b.dev++;
    CHECK(!fxa_io_stamp_same(&a, &b), "another device");
}

int main(void)
{
    scratch_dir_create("test_npy");

    test_reader_valid();
    test_reader_dtypes();
    test_reader_dict();
    test_reader_shapes();
    test_reader_preamble();
    test_reader_arguments();
    test_reader_slices();
    test_writer_roundtrip();
    test_writer_failures();
    test_write_all();
    test_argument_audit();
    test_output_check();
    test_stamps();

    test_remove_tree(g_dir);
    return test_summary("test_npy");
}
