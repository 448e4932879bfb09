/*
 * Writes the seed corpus of the fuzz targets (tests/fuzz/fuzz_npy.c, fuzz_args.c,
 * fuzz_safetensors.c).
 *
 * Usage: make_corpus OUT_DIR   (creates OUT_DIR/npy, OUT_DIR/args and OUT_DIR/safetensors,
 * which must exist or be creatable; existing files of the same names are overwritten, others
 * are left alone).
 * Contract: the output is deterministic (same bytes on every run and host), every file is
 * under 4 KiB, and the whole corpus is under 100 KiB. npy/ holds valid files (versions 1.0,
 * 2.0 and 3.0; '<f4' and '<f2'; scalar, empty, 1-D to 8-D shapes; NumPy's own header layout
 * and hand-written variants) named ok_*, and files the reader must refuse, named bad_*.
 * args/ holds command lines after "fxattn", each argument ended by a NUL byte.
 * safetensors/ holds valid files (every supported dtype and some others, scalar, empty and
 * 8-D shapes, metadata, escaped and UTF-8 names, Wan2.2-style names, out-of-order listings)
 * named ok_*, and files the reader must refuse (bad lengths, JSON and schema errors,
 * overlapping, holed or overlong data) named bad_*.
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

/* A file whose header is padded as NumPy pads it (np.save): version major.0, then count
 * elements of itemsize bytes. */
static void numpy_padded(const char *name, int major, const char *dict, int64_t itemsize,
                         int64_t count)
{
    npy(name, (npy_spec){.major = major,
                         .dict = dict,
                         .numpy_padding = 1,
                         .itemsize = itemsize,
                         .count = count});
}

#define F4(shape) "{'descr': '<f4', 'fortran_order': False, 'shape': " shape ", }"
#define F2(shape) "{'descr': '<f2', 'fortran_order': False, 'shape': " shape ", }"

static void make_npy(void)
{
    /* Valid: exactly as NumPy writes them (np.save, version 1.0 unless noted). */
    numpy_padded("ok_v1_f4_2x3.npy", 1, F4("(2, 3)"), 4, 6);
    numpy_padded("ok_v1_f4_scalar.npy", 1, F4("()"), 4, 1);
    numpy_padded("ok_v1_f4_empty.npy", 1, F4("(0,)"), 4, 0);
    numpy_padded("ok_v1_f4_2x0x3.npy", 1, F4("(2, 0, 3)"), 4, 0);
    numpy_padded("ok_v1_f4_1x4x2x8.npy", 1, F4("(1, 4, 2, 8)"), 4, 64);
    numpy_padded("ok_v1_f2_5.npy", 1, F2("(5,)"), 2, 5);
    numpy_padded("ok_v1_f2_scalar.npy", 1, F2("()"), 2, 1);
    numpy_padded("ok_v1_f2_1x2x3x4.npy", 1, F2("(1, 2, 3, 4)"), 2, 24);
    numpy_padded("ok_v2_f4_1x2x2x4.npy", 2, F4("(1, 2, 2, 4)"), 4, 16);
    numpy_padded("ok_v2_f2_empty.npy", 2, F2("(3, 0)"), 2, 0);
    numpy_padded("ok_v3_f2_3x2.npy", 3, F2("(3, 2)"), 2, 6);
    numpy_padded("ok_v3_f4_scalar.npy", 3, F4("()"), 4, 1);
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
    numpy_padded("ok_v1_f4_8d.npy", 1, F4("(1, 1, 1, 2, 1, 1, 1, 2)"), 4, 4);

    /* Refused. */
    numpy_padded("bad_fortran.npy", 1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                 4, 6);
    numpy_padded("bad_big_endian.npy", 1,
                 "{'descr': '>f4', 'fortran_order': False, 'shape': (4,), }", 4, 4);
    numpy_padded("bad_f8.npy", 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 4,
                 4);
    numpy_padded("bad_structured.npy", 1,
                 "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 4, 2);
    npy("bad_truncated_data.npy",
        (npy_spec){
            .major = 1, .dict = F4("(4, 4)"), .numpy_padding = 1, .count = 16, .extra_bytes = -5});
    npy("bad_truncated_header.npy",
        (npy_spec){.major = 1, .dict = F4("(4, 4)"), .numpy_padding = 1, .extra_bytes = -40});
    npy("bad_trailing_bytes.npy",
        (npy_spec){
            .major = 1, .dict = F4("(2, 2)"), .numpy_padding = 1, .count = 4, .extra_bytes = 3});
    npy("bad_lying_header_len.npy",
        (npy_spec){
            .major = 1, .dict = F4("(2, 2)"), .numpy_padding = 1, .count = 4, .len_delta = 700});
    npy("bad_lying_header_short.npy",
        (npy_spec){
            .major = 2, .dict = F4("(2, 2)"), .numpy_padding = 1, .count = 4, .len_delta = -9});
    npy("bad_header_len_huge.npy", (npy_spec){.major = 2,
                                              .dict = F4("(1,)"),
                                              .numpy_padding = 1,
                                              .count = 1,
                                              .len_delta = 0x7fffff00});
    numpy_padded("bad_lying_shape.npy", 1, F4("(1000000, 1000000)"), 4, 8);
    numpy_padded("bad_shape_overflow.npy", 1, F4("(4611686018427387904, 4, 0)"), 4, 0);
    numpy_padded("bad_dim_too_large.npy", 1, F4("(99999999999999999999,)"), 4, 0);
    numpy_padded("bad_negative_dim.npy", 1, F4("(-1, 2)"), 4, 0);
    numpy_padded("bad_9d.npy", 1, F4("(1, 1, 1, 1, 1, 1, 1, 1, 1)"), 4, 1);
    numpy_padded("bad_1d_no_comma.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3)}",
                 4, 3);
    npy("bad_no_newline.npy",
        (npy_spec){.major = 1, .dict = F4("(2,)"), .no_newline = 1, .count = 2});
    numpy_padded("bad_version_4.npy", 4, F4("(2,)"), 4, 2);
    npy("bad_version_1_1.npy",
        (npy_spec){.major = 1, .minor = 1, .dict = F4("(2,)"), .numpy_padding = 1, .count = 2});
    npy("bad_duplicate_key.npy",
        (npy_spec){.major = 1,
                   .dict = "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}",
                   .count = 1});
    numpy_padded("bad_unknown_key.npy", 1,
                 "{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}", 4, 1);
    numpy_padded("bad_missing_shape.npy", 1, "{'descr': '<f4', 'fortran_order': False}", 4, 0);
    numpy_padded("bad_escape.npy", 1, "{'descr': '<f\\x34', 'fortran_order': False, 'shape': ()}",
                 4, 1);
    npy("bad_garbage_after_dict.npy",
        (npy_spec){.major = 3,
                   .dict = "{'descr': '<f2', 'fortran_order': False, 'shape': (1,)} x",
                   .itemsize = 2,
                   .count = 1});

    static const unsigned char bad_magic[] = "\x93NUMPZ\x01\x00\x04\x00{}  \n";
    write_file("npy", "bad_magic.npy", bad_magic, sizeof bad_magic - 1);
    static const unsigned char short_preamble[] = "\x93NUMPY\x02\x00\x10";
    write_file("npy", "bad_short_preamble.npy", short_preamble, sizeof short_preamble - 1);
    write_file("npy", "bad_empty.npy", (const unsigned char *)"", 0);
}

/* ---- .safetensors files -------------------------------------------------------------- */

/*
 * A .safetensors file: the 8-byte little-endian length (the padded header's length, or
 * len_field when it is not UINT64_MAX: a lying length), the header text padded with spaces
 * to a multiple of 8 bytes when pad is set (as the reference writer does), then data_len
 * bytes of a fixed pattern.
 */
static void st_file(const char *name, const char *header, int pad, size_t data_len,
                    uint64_t len_field)
{
    unsigned char buf[CAP];
    const size_t hlen = strlen(header);
    const size_t padded = pad ? (hlen + 7) / 8 * 8 : hlen;
    if (8 + padded + data_len >= CAP) {
        fprintf(stderr, "make_corpus: safetensors/%s would be too large\n", name);
        exit(1);
    }
    const uint64_t field = len_field == UINT64_MAX ? (uint64_t)padded : len_field;
    for (int i = 0; i < 8; i++) {
        buf[i] = (unsigned char)(field >> (8 * i));
    }
    memcpy(buf + 8, header, hlen);
    memset(buf + 8 + hlen, ' ', padded - hlen);
    size_t n = 8 + padded;
    for (size_t i = 0; i < data_len; i++) {
        buf[n++] = (unsigned char)(i * 37 + 11);
    }
    write_file("safetensors", name, buf, n);
}

#define ST(name, header, data_len) st_file(name, header, 1, data_len, UINT64_MAX)
/* One tensor entry: "name":{"dtype":"D","shape":S,"data_offsets":[B,E]} */
#define TS(name, dtype, shape, b, e)                                                               \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

static void make_safetensors(void)
{
    /* Valid. */
    ST("ok_f32_2x3.safetensors", "{" TS("w", "F32", "[2,3]", 0, 24) "}", 24);
    ST("ok_wan_block.safetensors",
       "{\"__metadata__\":{\"format\":\"pt\"}," TS(
           "blocks.0.self_attn.q.weight", "BF16", "[4,4]", 0,
           32) "," TS("blocks.0.self_attn.k.weight", "BF16", "[4,4]", 32,
                      64) "," TS("blocks.0.self_attn.v.weight", "BF16", "[4,4]", 64,
                                 96) "," TS("blocks.0.self_attn.q.bias", "BF16", "[4]", 96,
                                            104) "," TS("blocks.0.self_attn.norm_q.weight", "F32",
                                                        "[4]", 104,
                                                        120) "," TS("blocks.0.self_attn.norm_k."
                                                                    "weight",
                                                                    "F32", "[4]", 120, 136) "}",
       136);
    ST("ok_f16_scalar.safetensors", "{" TS("s", "F16", "[]", 0, 2) "}", 2);
    ST("ok_empty_tensors.safetensors",
       "{" TS("a", "F32", "[0]", 0, 0) "," TS("b", "BF16", "[3,0,2]", 0, 0) "," TS(
           "c", "F16", "[1]", 0, 2) "," TS("d", "F8_E4M3", "[0,9007199254740992]", 2, 2) "}",
       2);
    ST("ok_e4m3_and_others.safetensors",
       "{" TS("e4m3", "F8_E4M3", "[8]", 0, 8) "," TS("i64", "I64", "[1]", 8, 16) "," TS(
           "f4", "F4", "[2]", 16, 17) "," TS("f6", "F6_E2M3", "[4]", 17,
                                             20) "," TS("c64", "C64", "[1]", 20,
                                                        28) "," TS("bool", "BOOL", "[3]", 28,
                                                                   31) "}",
       31);
    ST("ok_no_tensors.safetensors", "{}", 0);
    ST("ok_metadata_keys.safetensors",
       "{\"__metadata__\":{\"format\":\"pt\",\"b\":\"\",\"a\":\"{\\\"x\\\": 1}\","
       "\"\":\"empty key\"}," TS("w", "F32", "[1]", 0, 4) "}",
       4);
    ST("ok_8d.safetensors", "{" TS("x", "F32", "[1,1,1,2,1,1,1,2]", 0, 16) "}", 16);
    ST("ok_names_escaped.safetensors",
       "{\"__metadata__\":{\"k\\n\":\"v \\\"q\\\" \\u00e9\",\"\\u005f\":\"\"}," TS(
           "q\\\"\\\\\\/\\b\\f\\n\\r\\t", "F32", "[1]", 0,
           4) "," TS("\\u00e9t\\u00E9 \\ud83d\\ude00", "F32", "[1]", 4,
                     8) "," TS("\xe5\x90\x8d\xe5\x89\x8d", "F32", "[1]", 8,
                               12) "," TS("", "F32", "[1]", 12, 16) "}",
       16);
    ST("ok_unsorted_spaced.safetensors",
       " \t\r\n{ \"b\" : { \"data_offsets\" : [ 4 , 12 ] , \"shape\" : [ 2 ] , \"dtype\" : "
       "\"F32\" } ,\n \"\\u005f_metadata__\" : { } , \"a\" : {\"shape\":[],\"dtype\":\"F32\","
       "\"data_offsets\":[0,4]}}\n",
       12);

    /* Refused: the length field. */
    write_file("safetensors", "bad_short.safetensors", (const unsigned char *)"\x02\0\0\0\0", 5);
    st_file("bad_len_past_end.safetensors", "{}", 0, 0, 4);
    st_file("bad_len_huge.safetensors", "{}", 0, 0, 0xffffffffffffull);
    st_file("bad_len_zero.safetensors", "{}", 0, 0, 0);

    /* Refused: JSON. */
    st_file("bad_truncated.safetensors", "{" TS("w", "F32", "[2,3]", 0, 24), 0, 24, UINT64_MAX);
    ST("bad_top_array.safetensors", "[{}]", 0);
    ST("bad_lone_surrogate.safetensors", "{\"\\ud800x\":{}}", 0);
    ST("bad_utf8.safetensors", "{\"\xc0\xaf\":{}}", 0);
    ST("bad_escape.safetensors", "{\"\\x41\":{}}", 0);
    ST("bad_trailing_garbage.safetensors", "{}\x01", 0);
    ST("bad_leading_zero.safetensors", "{" TS("w", "F32", "[02]", 0, 8) "}", 8);
    {
        char deep[128 + 16];
        size_t n = (size_t)snprintf(deep, sizeof deep, "{\"w\":");
        for (int i = 0; i < 100; i++) {
            deep[n++] = '[';
        }
        deep[n] = '\0';
        ST("bad_deep.safetensors", deep, 0);
    }

    /* Refused: schema. */
    ST("bad_dup_name.safetensors",
       "{" TS("w", "F32", "[1]", 0, 4) "," TS("w", "F32", "[1]", 4, 8) "}", 8);
    ST("bad_dup_field.safetensors",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"shape\":[1],\"data_offsets\":[0,4]}}", 4);
    ST("bad_extra_field.safetensors",
       "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":0}}", 4);
    ST("bad_unknown_dtype.safetensors", "{" TS("w", "F31", "[1]", 0, 4) "}", 4);
    ST("bad_negative_dim.safetensors", "{" TS("w", "F32", "[-1]", 0, 0) "}", 0);
    ST("bad_fraction_dim.safetensors", "{" TS("w", "F32", "[1.5]", 0, 4) "}", 4);
    ST("bad_huge_dim.safetensors", "{" TS("w", "F32", "[9007199254740993]", 0, 4) "}", 4);
    ST("bad_overflow.safetensors", "{" TS("w", "F64", "[4294967296,4294967296]", 0, 0) "}", 0);
    ST("bad_9d.safetensors", "{" TS("w", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4);
    ST("bad_metadata_value.safetensors", "{\"__metadata__\":{\"k\":1}}", 0);
    ST("bad_dup_metadata.safetensors", "{\"__metadata__\":{},\"__metadata__\":{}}", 0);
    ST("bad_dup_metadata_key.safetensors",
       "{\"__metadata__\":{\"b\":\"1\",\"a\":\"2\",\"b\":\"3\"}}", 0);

    /* Refused: data layout. */
    ST("bad_size_mismatch.safetensors", "{" TS("w", "BF16", "[3]", 0, 8) "}", 8);
    ST("bad_reversed.safetensors", "{" TS("w", "F32", "[0]", 8, 4) "}", 8);
    ST("bad_overlap.safetensors",
       "{" TS("a", "F32", "[4]", 0, 16) "," TS("b", "F32", "[4]", 8, 24) "}", 24);
    ST("bad_hole.safetensors", "{" TS("a", "F32", "[1]", 0, 4) "," TS("b", "F32", "[1]", 8, 12) "}",
       12);
    ST("bad_past_end.safetensors", "{" TS("w", "F32", "[4]", 0, 16) "}", 12);
    ST("bad_trailing_data.safetensors", "{" TS("w", "F32", "[1]", 0, 4) "}", 12);
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
         "--lse", "lse.npy", "--layout", "bhsd", "--scale", "0.125", "--mode", "online", "--center",
         "off", "--dtype", "f16", "--compute", "bf16", "--threads", "4", "--heads-per-tile", "2",
         "--block-q", "64", "--repeats", "3", "--stats", "--verify");
    ARGS("attn_bf16", "attn", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "-o", "o.npy", "--dtype",
         "bf16", "--mode", "auto", "--center", "on", "--compute", "fp32", "--scale", "1e-3",
         "--layout", "bshd");
    ARGS("attn_bad_range", "attn", "--threads", "1025", "--repeats", "0", "--block-q", "-1");
    ARGS("attn_bad_scale", "attn", "--scale", "nan", "--scale", "inf", "--scale", "0x1p-3");
    ARGS("attn_grid", "attn", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "-o", "o.npy",
         "--ulysses", "2", "--ring", "2", "--prefetch", "1");
    ARGS("attn_bad_grid", "attn", "--ulysses", "0", "--ring", "1048577", "--prefetch", "-3");
    ARGS("attn_missing_value", "attn", "-q");
    ARGS("check_json", "check", "-q", "q.npy", "-k", "k.npy", "-v", "v.npy", "--json", "--threads",
         "2", "--layout", "bshd", "--dtype", "bf16", "--scale", "0.1");
    ARGS("check_unknown", "check", "--bogus", "1");
    ARGS("bench_default", "bench", "--seq", "4096", "--heads", "40", "--dim", "128", "--dtype",
         "bf16", "--compute", "fp32", "--threads", "0", "--repeats", "3", "--json");
    ARGS("bench_bad_int", "bench", "--repeats", "abc", "--dim", "5", "--seq", "16777217");
    ARGS("bench_grid", "bench", "--seq", "1024", "--ring", "4", "--ulysses", "1", "--prefetch",
         "3");
    ARGS("demo_all", "demo", "--frames", "4", "--height", "32", "--width", "32", "--heads", "40",
         "--dim", "128", "--seed", "9223372036854775807", "--threads", "1", "--json",
         "--save-inputs", "dir");
    ARGS("demo_overflow", "demo", "--seed", "9223372036854775808", "--dim", " 64");
    ARGS("layer_all", "layer", "--weights", "w.safetensors", "--block", "39", "-x", "x.npy",
         "--grid", "4,32,32", "-o", "y.npy", "--heads", "40", "--dim", "128", "--rope-layout",
         "half", "--fp8", "--seed", "7", "--threads", "2", "--stats", "--verify");
    ARGS("layer_parallel", "layer", "--x", "x.npy", "--out", "y.npy", "--grid", "1,2,3", "--tp",
         "2", "--ulysses", "2", "--ring", "1", "--rope-layout", "interleaved");
    ARGS("layer_bad", "layer", "--block", "-1", "--heads", "0", "--dim", "5", "--tp", "x");
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
    make_dir("safetensors");
    make_npy();
    make_args();
    make_safetensors();
    if (g_total >= 100 * 1024) {
        fprintf(stderr, "make_corpus: corpus is %zu bytes (limit 100 KiB)\n", g_total);
        return 1;
    }
    printf("make_corpus: %zu bytes written under %s\n", g_total, g_out);
    return 0;
}
