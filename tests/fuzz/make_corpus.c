/*
 * Writes the seed corpus of the fuzz targets (tests/fuzz/fuzz_npy.c, fuzz_args.c).
 *
 * Usage: make_corpus OUT_DIR   (creates OUT_DIR/npy and OUT_DIR/args, which must exist or be
 * creatable; existing files of the same names are overwritten, others are left alone).
 * Contract: the output is deterministic (same bytes on every run and host), every file is
 * under 4 KiB, and the whole corpus is under 100 KiB. npy/ holds valid files (versions 1.0,
 * 2.0 and 3.0; '<f4' and '<f2'; scalar, empty, 1-D to 8-D shapes; NumPy's own header layout
 * and hand-written variants) named ok_*, and files the reader must refuse, named bad_*.
 * args/ holds command lines after "fxattn", each argument ended by a NUL byte.
 * Regenerate with tests/fuzz/make_corpus.sh.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CAP 4096

static char g_out[4096];
static size_t g_total;

static void die(const char *what, const char *path)
{
    fprintf(stderr, "make_corpus: %s %s: %s\n", what, path, strerror(errno));
    exit(1);
}

static void write_file(const char *sub, const char *name, const unsigned char *bytes, size_t n)
{
    char path[8192];
    snprintf(path, sizeof path, "%s/%s/%s", g_out, sub, name);
    if (n >= CAP) {
        fprintf(stderr, "make_corpus: %s would be %zu bytes (limit %d)\n", path, n, CAP);
        exit(1);
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        die("cannot create", path);
    }
    if (fwrite(bytes, 1, n, f) != n || fclose(f) != 0) {
        die("cannot write", path);
    }
    g_total += n;
}

/* ---- .npy files ---------------------------------------------------------------------- */

typedef struct npy_spec {
    int major;           /* 1, 2 or 3 (written as major.0) */
    int minor;           /* normally 0 */
    const char *dict;    /* header dict text, without padding or newline */
    int numpy_padding;   /* 1: pad with spaces to a multiple of 64 like NumPy; 0: no padding */
    int no_newline;      /* 1: the header does not end with '\n' */
    int64_t itemsize;    /* 4 or 2 (data pattern width) */
    int64_t count;       /* elements of data written */
    int64_t extra_bytes; /* > 0: bytes appended after the data; < 0: bytes cut from the end */
    int64_t len_delta;   /* added to the header length field (a lying header) */
} npy_spec;

/* IEEE binary16 bits of small values: 0, 1, -2, 0.5, 65504, inf, NaN, denormal. */
static const uint16_t g_f16[] = {0x0000, 0x3c00, 0xc000, 0x3800, 0x7bff, 0x7c00, 0x7e00, 0x0001};

static size_t build_npy(const npy_spec *s, unsigned char *buf)
{
    const size_t pre = s->major == 1 ? 10 : 12;
    size_t dict_len = strlen(s->dict);
    size_t header_len = dict_len + (s->no_newline ? 0 : 1);
    if (s->numpy_padding) {
        header_len = (pre + dict_len + 1 + 63) / 64 * 64 - pre;
    }
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)s->major;
    buf[7] = (unsigned char)s->minor;
    const uint32_t field = (uint32_t)((int64_t)header_len + s->len_delta);
    for (size_t i = 0; i < pre - 8; i++) {
        buf[8 + i] = (unsigned char)(field >> (8 * i));
    }
    memcpy(buf + pre, s->dict, dict_len);
    memset(buf + pre + dict_len, ' ', header_len - dict_len);
    if (!s->no_newline) {
        buf[pre + header_len - 1] = '\n';
    }
    size_t n = pre + header_len;
    for (int64_t i = 0; i < s->count; i++) {
        if (s->itemsize == 4) {
            float v = (float)i * 0.5f - 1.0f;
            memcpy(buf + n, &v, 4); /* little-endian host, as npy.c requires */
            n += 4;
        } else {
            uint16_t v = g_f16[i % (int64_t)(sizeof g_f16 / sizeof g_f16[0])];
            buf[n++] = (unsigned char)(v & 0xff);
            buf[n++] = (unsigned char)(v >> 8);
        }
    }
    if (s->extra_bytes > 0) {
        memset(buf + n, 0xab, (size_t)s->extra_bytes);
        n += (size_t)s->extra_bytes;
    } else {
        n -= (size_t)(-s->extra_bytes);
    }
    return n;
}

static void npy(const char *name, npy_spec s)
{
    unsigned char buf[CAP * 2];
    if (s.itemsize == 0) {
        s.itemsize = 4;
    }
    write_file("npy", name, buf, build_npy(&s, buf));
}

#define F4(shape) "{'descr': '<f4', 'fortran_order': False, 'shape': " shape ", }"
#define F2(shape) "{'descr': '<f2', 'fortran_order': False, 'shape': " shape ", }"

static void make_npy(void)
{
    /* Valid: exactly as NumPy writes them (np.save, version 1.0 unless noted). */
    npy("ok_v1_f4_2x3.npy", (npy_spec){.major = 1, .dict = F4("(2, 3)"), .numpy_padding = 1,
                                       .count = 6});
    npy("ok_v1_f4_scalar.npy", (npy_spec){.major = 1, .dict = F4("()"), .numpy_padding = 1,
                                          .count = 1});
    npy("ok_v1_f4_empty.npy", (npy_spec){.major = 1, .dict = F4("(0,)"), .numpy_padding = 1});
    npy("ok_v1_f4_2x0x3.npy", (npy_spec){.major = 1, .dict = F4("(2, 0, 3)"),
                                         .numpy_padding = 1});
    npy("ok_v1_f4_1x4x2x8.npy", (npy_spec){.major = 1, .dict = F4("(1, 4, 2, 8)"),
                                           .numpy_padding = 1, .count = 64});
    npy("ok_v1_f2_5.npy", (npy_spec){.major = 1, .dict = F2("(5,)"), .numpy_padding = 1,
                                     .itemsize = 2, .count = 5});
    npy("ok_v1_f2_scalar.npy", (npy_spec){.major = 1, .dict = F2("()"), .numpy_padding = 1,
                                          .itemsize = 2, .count = 1});
    npy("ok_v1_f2_1x2x3x4.npy", (npy_spec){.major = 1, .dict = F2("(1, 2, 3, 4)"),
                                           .numpy_padding = 1, .itemsize = 2, .count = 24});
    npy("ok_v2_f4_1x2x2x4.npy", (npy_spec){.major = 2, .dict = F4("(1, 2, 2, 4)"),
                                           .numpy_padding = 1, .count = 16});
    npy("ok_v2_f2_empty.npy", (npy_spec){.major = 2, .dict = F2("(3, 0)"), .numpy_padding = 1,
                                         .itemsize = 2});
    npy("ok_v3_f2_3x2.npy", (npy_spec){.major = 3, .dict = F2("(3, 2)"), .numpy_padding = 1,
                                       .itemsize = 2, .count = 6});
    npy("ok_v3_f4_scalar.npy", (npy_spec){.major = 3, .dict = F4("()"), .numpy_padding = 1,
                                          .count = 1});
    /* Valid, hand-written: other key order, double quotes, no padding, Python 2 'L',
     * no trailing commas, the most dimensions allowed. */
    npy("ok_v1_f4_keys_reordered.npy",
        (npy_spec){.major = 1,
                   .dict = "{\"shape\": (3,), \"fortran_order\": False, \"descr\": \"<f4\"}",
                   .count = 3});
    npy("ok_v1_f4_long_dims.npy",
        (npy_spec){.major = 1,
                   .dict = "{'descr':'<f4','fortran_order':False,'shape':(2L, 2L)}\t\r ",
                   .count = 4});
    npy("ok_v1_f4_8d.npy", (npy_spec){.major = 1, .dict = F4("(1, 1, 1, 2, 1, 1, 1, 2)"),
                                      .numpy_padding = 1, .count = 4});

    /* Refused. */
    npy("bad_fortran.npy",
        (npy_spec){.major = 1, .dict = "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                   .numpy_padding = 1, .count = 6});
    npy("bad_big_endian.npy",
        (npy_spec){.major = 1, .dict = "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }",
                   .numpy_padding = 1, .count = 4});
    npy("bad_f8.npy",
        (npy_spec){.major = 1, .dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }",
                   .numpy_padding = 1, .count = 4});
    npy("bad_structured.npy",
        (npy_spec){.major = 1,
                   .dict = "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }",
                   .numpy_padding = 1, .count = 2});
    npy("bad_truncated_data.npy", (npy_spec){.major = 1, .dict = F4("(4, 4)"),
                                             .numpy_padding = 1, .count = 16, .extra_bytes = -5});
    npy("bad_truncated_header.npy", (npy_spec){.major = 1, .dict = F4("(4, 4)"),
                                               .numpy_padding = 1, .extra_bytes = -40});
    npy("bad_trailing_bytes.npy", (npy_spec){.major = 1, .dict = F4("(2, 2)"),
                                             .numpy_padding = 1, .count = 4, .extra_bytes = 3});
    npy("bad_lying_header_len.npy", (npy_spec){.major = 1, .dict = F4("(2, 2)"),
                                               .numpy_padding = 1, .count = 4, .len_delta = 700});
    npy("bad_lying_header_short.npy", (npy_spec){.major = 2, .dict = F4("(2, 2)"),
                                                 .numpy_padding = 1, .count = 4, .len_delta = -9});
    npy("bad_header_len_huge.npy", (npy_spec){.major = 2, .dict = F4("(1,)"), .numpy_padding = 1,
                                              .count = 1, .len_delta = 0x7fffff00});
    npy("bad_lying_shape.npy", (npy_spec){.major = 1, .dict = F4("(1000000, 1000000)"),
                                          .numpy_padding = 1, .count = 8});
    npy("bad_shape_overflow.npy",
        (npy_spec){.major = 1, .dict = F4("(4611686018427387904, 4, 0)"), .numpy_padding = 1});
    npy("bad_dim_too_large.npy",
        (npy_spec){.major = 1, .dict = F4("(99999999999999999999,)"), .numpy_padding = 1});
    npy("bad_negative_dim.npy", (npy_spec){.major = 1, .dict = F4("(-1, 2)"), .numpy_padding = 1});
    npy("bad_9d.npy", (npy_spec){.major = 1, .dict = F4("(1, 1, 1, 1, 1, 1, 1, 1, 1)"),
                                 .numpy_padding = 1, .count = 1});
    npy("bad_1d_no_comma.npy",
        (npy_spec){.major = 1, .dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}",
                   .numpy_padding = 1, .count = 3});
    npy("bad_no_newline.npy", (npy_spec){.major = 1, .dict = F4("(2,)"), .no_newline = 1,
                                         .count = 2});
    npy("bad_version_4.npy", (npy_spec){.major = 4, .dict = F4("(2,)"), .numpy_padding = 1,
                                        .count = 2});
    npy("bad_version_1_1.npy", (npy_spec){.major = 1, .minor = 1, .dict = F4("(2,)"),
                                          .numpy_padding = 1, .count = 2});
    npy("bad_duplicate_key.npy",
        (npy_spec){.major = 1,
                   .dict = "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}",
                   .count = 1});
    npy("bad_unknown_key.npy",
        (npy_spec){.major = 1,
                   .dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}",
                   .numpy_padding = 1, .count = 1});
    npy("bad_missing_shape.npy",
        (npy_spec){.major = 1, .dict = "{'descr': '<f4', 'fortran_order': False}",
                   .numpy_padding = 1});
    npy("bad_escape.npy",
        (npy_spec){.major = 1, .dict = "{'descr': '<f\\x34', 'fortran_order': False, 'shape': ()}",
                   .numpy_padding = 1, .count = 1});
    npy("bad_garbage_after_dict.npy",
        (npy_spec){.major = 3,
                   .dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (1,)} x",
                   .itemsize = 2, .count = 1});

    static const unsigned char bad_magic[] = "\x93NUMPZ\x01\x00\x04\x00{}  \n";
    write_file("npy", "bad_magic.npy", bad_magic, sizeof bad_magic - 1);
    static const unsigned char short_preamble[] = "\x93NUMPY\x02\x00\x10";
    write_file("npy", "bad_short_preamble.npy", short_preamble, sizeof short_preamble - 1);
    write_file("npy", "bad_empty.npy", (const unsigned char *)"", 0);
}

/* ---- command lines ------------------------------------------------------------------- */

static void args(const char *name, const char *const *argv)
{
    unsigned char buf[CAP];
    size_t n = 0;
    for (; *argv != NULL; argv++) {
        size_t len = strlen(*argv) + 1; /* with its NUL */
        memcpy(buf + n, *argv, len);
        n += len;
    }
    write_file("args", name, buf, n);
}

#define ARGS(name, ...) args(name, (const char *const[]){__VA_ARGS__, NULL})

static void make_args(void)
{
    ARGS("attn_min", "attn", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "-o", "out.npy");
    ARGS("attn_all", "attn", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy",
         "--lse", "lse.npy", "--layout", "bhsd", "--scale", "0.125", "--mode", "online",
         "--center", "off", "--dtype", "f16", "--compute", "bf16", "--threads", "4",
         "--heads-per-tile", "2", "--block-q", "64", "--repeats", "3", "--stats", "--verify");
    ARGS("attn_bf16", "attn", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "-o", "o.npy",
         "--dtype", "bf16", "--mode", "auto", "--center", "on", "--compute", "fp32", "--scale",
         "1e-3", "--layout", "bshd");
    ARGS("attn_bad_range", "attn", "--threads", "1025", "--repeats", "0", "--block-q", "-1");
    ARGS("attn_bad_scale", "attn", "--scale", "nan", "--scale", "inf", "--scale", "0x1p-3");
    ARGS("attn_grid", "attn", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "-o", "o.npy",
         "--ulysses", "2", "--ring", "2", "--prefetch", "1");
    ARGS("attn_bad_grid", "attn", "--ulysses", "0", "--ring", "1048577", "--prefetch", "-3");
    ARGS("attn_missing_value", "attn", "-q");
    ARGS("check_json", "check", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "--json",
         "--threads", "2", "--layout", "bshd", "--dtype", "bf16", "--scale", "0.1");
    ARGS("check_plot", "check", "-q", "q.npy", "-k", "k.npy", "--plot", "p.png");
    ARGS("check_unknown", "check", "--bogus", "1");
    ARGS("bench_default", "bench", "--seq", "4096", "--heads", "40", "--dim", "128", "--dtype",
         "bf16", "--compute", "fp32", "--threads", "0", "--repeats", "3", "--json");
    ARGS("bench_bad_int", "bench", "--repeats", "abc", "--dim", "5", "--seq", "16777217");
    ARGS("bench_grid", "bench", "--seq", "1024", "--ring", "4", "--ulysses", "1", "--prefetch",
         "3");
    ARGS("demo_all", "demo", "--frames", "4", "--height", "32", "--width", "32", "--heads",
         "40", "--dim", "128", "--seed", "9223372036854775807", "--threads", "1", "--json",
         "--save-inputs", "dir");
    ARGS("demo_overflow", "demo", "--seed", "9223372036854775808", "--dim", " 64");
    ARGS("info_threads", "info", "--threads", "8");
    ARGS("no_command", "--threads", "+12", "--layout", "bhsd");
}

static void make_dir(const char *sub)
{
    char path[8192];
    snprintf(path, sizeof path, "%s%s%s", g_out, sub[0] ? "/" : "", sub);
    if (mkdir(path, 0777) != 0 && errno != EEXIST) {
        die("cannot create", path);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_corpus OUT_DIR\n");
        return 2;
    }
    snprintf(g_out, sizeof g_out, "%s", argv[1]);
    make_dir("");
    make_dir("npy");
    make_dir("args");
    make_npy();
    make_args();
    if (g_total >= 100 * 1024) {
        fprintf(stderr, "make_corpus: corpus is %zu bytes (limit 100 KiB)\n", g_total);
        return 1;
    }
    printf("make_corpus: %zu bytes written under %s\n", g_total, g_out);
    return 0;
}
