/*
 * libFuzzer target for the .safetensors reader (include/fxattn_safetensors.h, fxa_st_parse).
 *
 * Contract: each input is the whole content of a .safetensors file, parsed from memory (no
 * file is written). Any violation of the reader's contract stops the run with
 * __builtin_trap:
 *  - success: the input holds the 8-byte length N with N <= FXA_ST_MAX_HEADER_LEN and
 *    8 + N <= size, its JSON starts with '{' after whitespace; err is empty. Tensors come in
 *    data order and tile the data buffer exactly (the first at offset 0, each where the one
 *    before ended, the last ending at size - 8 - N); each has a non-NULL unique name of at
 *    most FXA_ST_MAX_NAME_LEN bytes that fxa_st_find returns it for, ndim 0..FXA_ST_MAX_DIMS,
 *    non-negative dimensions whose product is count, nbytes consistent with its dtype,
 *    file_offset == 8 + N + offset. fxa_st_read of a supported tensor gives exactly the
 *    input's bytes, of another dtype FXA_ERR_UNSUPPORTED; a destination one byte off is
 *    FXA_ERR_INVALID_ARG and left untouched; fxa_st_read_f32 gives the exact widening of
 *    F32/BF16/F16 and FXA_ERR_UNSUPPORTED for F8_E4M3. Metadata keys come in strictly
 *    increasing byte order and each looks up its value.
 *  - failure: the status is FXA_ERR_INVALID_ARG (inputs are small: no FXA_ERR_NO_MEMORY),
 *    *out is NULL, err is one line "<name>: ..." shorter than errlen; for inputs of size
 *    4k+1 a second parse with a small errlen (or err NULL / errlen 0) gives the same status
 *    and a prefix of that message and writes nothing past errlen.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_safetensors.h"

#define FUZZ_NAME "fuzz_safetensors"
#include "fuzz_check.h"

#define NAME "fuzz.safetensors"
#define NAME_LEN (sizeof NAME - 1)
#define ERR_CAP 1024
#define GUARD 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int is_zero_or(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++) {
        if (p[i] != v) {
            return 0;
        }
    }
    return 1;
}

static int bits_of(const char *dtype)
{
    static const struct {
        const char *name;
        int bits;
    } table[] = {{"F32", 32},    {"BF16", 16},       {"F16", 16},        {"F8_E4M3", 8},
                 {"BOOL", 8},    {"U8", 8},          {"I8", 8},          {"F8_E5M2", 8},
                 {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
                 {"U16", 16},    {"I32", 32},        {"U32", 32},        {"I64", 64},
                 {"U64", 64},    {"F64", 64},        {"C64", 64},        {"F4", 4},
                 {"F6_E2M3", 6}, {"F6_E3M2", 6}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(table[i].name, dtype) == 0) {
            return table[i].bits;
        }
    }
    return 0;
}

static uint64_t load_le64(const uint8_t *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = v << 8 | b[i];
    }
    return v;
}

/* err holds a failure message: "<NAME>: <reason>", one line. */
static void check_st_message(const char *err, size_t errlen)
{
    check_message(err, errlen, NAME, NAME_LEN);
}

/* Parse again with a small error buffer (or none): same status, a prefix of the full
 * message, nothing written past errlen. */
static void check_truncation(const uint8_t *data, size_t size, fxa_status status, const char *full)
{
    char small[64 + GUARD];
    const size_t errlen = size % (NAME_LEN + 40);
    const int use_null = size % 7 == 3;
    const size_t cap = errlen < 64 ? errlen : 64;
    memset(small, 0x5a, sizeof small);
    fxa_st_file *f = (fxa_st_file *)&f;
    fxa_status again =
        fxa_st_parse(data, size, NAME, &f, use_null ? NULL : small, use_null ? 0 : cap);
    CHECK(again == status);
    CHECK(f == NULL);
    check_small_message(small, sizeof small, cap, use_null, full);
}

/* Rows [shape0 / 2, shape0) give exactly those bytes of the tensor; a range one row past
 * the end is refused before anything is written; a scalar has no rows. */
static void check_row_reads(const fxa_st_file *f, const fxa_st_tensor *t, const uint8_t *data)
{
    char err[ERR_CAP];
    unsigned char probe[GUARD];
    if (t->ndim == 0) {
        CHECK(fxa_st_read_rows(f, t, 0, 1, probe, 0, err, sizeof err) == FXA_ERR_INVALID_ARG);
        check_st_message(err, sizeof err);
        return;
    }
    const int64_t rows = t->shape[0];
    const size_t row_bytes = rows > 0 ? (size_t)(t->nbytes / rows) : 0;
    const int64_t row0 = rows / 2;
    const size_t nbytes = (size_t)(rows - row0) * row_bytes;
    unsigned char *buf = malloc(nbytes + GUARD);
    CHECK(buf != NULL);
    memset(buf, 0xa5, nbytes + GUARD);
    fxa_status status = fxa_st_read_rows(f, t, row0, rows - row0, buf, nbytes, err, sizeof err);
    if (t->supported) {
        CHECK(status == FXA_OK);
        CHECK(nbytes == 0 ||
              memcmp(buf, data + t->file_offset + (size_t)row0 * row_bytes, nbytes) == 0);
    } else {
        CHECK(status == FXA_ERR_UNSUPPORTED);
    }
    CHECK(is_zero_or(buf + nbytes, GUARD, 0xa5));
    memset(buf, 0xa5, nbytes + GUARD);
    status = fxa_st_read_rows(f, t, row0 + 1, rows - row0, buf, nbytes, err, sizeof err);
    CHECK(status == FXA_ERR_INVALID_ARG || status == FXA_ERR_UNSUPPORTED);
    check_st_message(err, sizeof err);
    CHECK(is_zero_or(buf, nbytes + GUARD, 0xa5));
    free(buf);
}

static void check_tensor_reads(const fxa_st_file *f, const fxa_st_tensor *t, const uint8_t *data)
{
    char err[ERR_CAP];
    const size_t nbytes = (size_t)t->nbytes;
    unsigned char *buf = malloc(nbytes + GUARD);
    CHECK(buf != NULL);
    memset(buf, 0xa5, nbytes + GUARD);
    fxa_status status = fxa_st_read(f, t, buf, nbytes, err, sizeof err);
    if (t->supported) {
        CHECK(status == FXA_OK);
        CHECK(err[0] == '\0');
        CHECK(nbytes == 0 || memcmp(buf, data + t->file_offset, nbytes) == 0);
    } else {
        CHECK(status == FXA_ERR_UNSUPPORTED);
        check_st_message(err, sizeof err);
    }
    CHECK(is_zero_or(buf + nbytes, GUARD, 0xa5));

    /* One byte off: refused before anything is written. */
    memset(buf, 0xa5, nbytes + GUARD);
    status = fxa_st_read(f, t, buf, nbytes + 1, err, sizeof err);
    CHECK(status == (t->supported ? FXA_ERR_INVALID_ARG : FXA_ERR_UNSUPPORTED));
    check_st_message(err, sizeof err);
    CHECK(is_zero_or(buf, nbytes + GUARD, 0xa5));
    free(buf);

    const size_t count = (size_t)t->count;
    float *out = malloc(count * sizeof(float) + GUARD);
    CHECK(out != NULL);
    memset(out, 0xa5, count * sizeof(float) + GUARD);
    status = fxa_st_read_f32(f, t, out, count, err, sizeof err);
    if (!t->supported || t->dtype == FXA_ST_F8_E4M3) {
        CHECK(status == FXA_ERR_UNSUPPORTED);
        check_st_message(err, sizeof err);
    } else {
        CHECK(status == FXA_OK);
        const uint8_t *src = data + t->file_offset;
        for (size_t i = 0; i < count; i++) {
            uint32_t got;
            uint32_t want;
            memcpy(&got, &out[i], sizeof got);
            if (t->dtype == FXA_ST_F32) {
                memcpy(&want, src + 4 * i, sizeof want);
            } else {
                const uint16_t h = (uint16_t)(src[2 * i] | src[2 * i + 1] << 8);
                const float w = t->dtype == FXA_ST_BF16 ? fxa_bf16_to_f32(h) : fxa_f16_to_f32(h);
                memcpy(&want, &w, sizeof want);
                if (t->dtype == FXA_ST_BF16) {
                    CHECK(want == (uint32_t)h << 16 || (h & 0x7fffu) > 0x7f80u);
                }
            }
            CHECK(got == want);
        }
    }
    CHECK(is_zero_or((unsigned char *)out + count * sizeof(float), GUARD, 0xa5));
    free(out);
    check_row_reads(f, t, data);
}

static void check_success(const fxa_st_file *f, const uint8_t *data, size_t size, const char *err)
{
    CHECK(err[0] == '\0');
    CHECK(size >= 8);
    const uint64_t n = load_le64(data);
    CHECK(n <= FXA_ST_MAX_HEADER_LEN);
    CHECK(n >= 2 && n <= size - 8);
    size_t first = 8;
    while (first < 8 + n && (data[first] == ' ' || data[first] == '\t' || data[first] == '\n' ||
                             data[first] == '\r')) {
        first++;
    }
    CHECK(first < 8 + n && data[first] == '{');
    const int64_t data_start = 8 + (int64_t)n;
    const int64_t data_size = (int64_t)size - data_start;

    const int64_t count = fxa_st_count(f);
    CHECK(count >= 0 && count <= FXA_ST_MAX_TENSORS);
    CHECK(fxa_st_at(f, -1) == NULL);
    CHECK(fxa_st_at(f, count) == NULL);
    int64_t expected = 0;
    for (int64_t i = 0; i < count; i++) {
        const fxa_st_tensor *t = fxa_st_at(f, i);
        CHECK(t != NULL);
        CHECK(t->name != NULL);
        CHECK(strlen(t->name) <= FXA_ST_MAX_NAME_LEN);
        CHECK(fxa_st_find(f, t->name) == t);
        CHECK(t->dtype_name != NULL);
        const int bits = bits_of(t->dtype_name);
        CHECK(bits > 0);
        CHECK(t->supported ==
              (bits_of(t->dtype_name) > 0 &&
               (strcmp(t->dtype_name, "F32") == 0 || strcmp(t->dtype_name, "BF16") == 0 ||
                strcmp(t->dtype_name, "F16") == 0 || strcmp(t->dtype_name, "F8_E4M3") == 0)));
        if (t->supported) {
            static const char *const names[] = {"F32", "BF16", "F16", "F8_E4M3"};
            CHECK((int)t->dtype >= 0 && (int)t->dtype < 4);
            CHECK(strcmp(names[t->dtype], t->dtype_name) == 0);
        }
        CHECK(t->ndim >= 0 && t->ndim <= FXA_ST_MAX_DIMS);
        int64_t product = 1;
        for (int d = 0; d < t->ndim; d++) {
            CHECK(t->shape[d] >= 0 && t->shape[d] <= ((int64_t)1 << 53));
            /* The reader guarantees the size in bits fits in int64 (for non-zero dims). */
            CHECK(t->shape[d] == 0 || product <= INT64_MAX / t->shape[d]);
            product *= t->shape[d];
        }
        CHECK(t->count == product);
        CHECK(t->count <= INT64_MAX / bits);
        CHECK(t->count * bits % 8 == 0);
        CHECK(t->nbytes == t->count * bits / 8);
        CHECK(t->offset == expected);
        CHECK(t->file_offset == data_start + t->offset);
        CHECK(t->nbytes <= data_size - t->offset);
        expected = t->offset + t->nbytes;
        check_tensor_reads(f, t, data);
    }
    CHECK(expected == data_size);

    /* Lookups of names that may be absent: NULL or an exact match. */
    static const char *const probes[] = {"",       "w",    "a",
                                         "format", "\xff", "blocks.0.self_attn.q.weight"};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++) {
        const fxa_st_tensor *t = fxa_st_find(f, probes[i]);
        CHECK(t == NULL || strcmp(t->name, probes[i]) == 0);
        const char *v = fxa_st_metadata(f, probes[i]);
        int listed = 0;
        for (int64_t k = 0; k < fxa_st_metadata_count(f); k++) {
            listed |= strcmp(fxa_st_metadata_key(f, k), probes[i]) == 0;
        }
        CHECK((v != NULL) == listed);
    }

    const int64_t m = fxa_st_metadata_count(f);
    CHECK(m >= 0);
    CHECK(m == 0 || m * 6 <= (int64_t)n); /* each entry takes at least "":"", */
    CHECK(fxa_st_metadata_key(f, -1) == NULL);
    CHECK(fxa_st_metadata_key(f, m) == NULL);
    for (int64_t i = 0; i < m; i++) {
        const char *key = fxa_st_metadata_key(f, i);
        CHECK(key != NULL);
        CHECK(fxa_st_metadata(f, key) != NULL);
        if (i > 0) {
            CHECK(strcmp(fxa_st_metadata_key(f, i - 1), key) < 0);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERR_CAP + GUARD];
    memset(err, 0x5a, sizeof err);
    fxa_st_file *f = (fxa_st_file *)&f; /* not NULL: the call must set it */
    const fxa_status status = fxa_st_parse(data, size, NAME, &f, err, ERR_CAP);
    for (size_t i = ERR_CAP; i < sizeof err; i++) {
        CHECK(err[i] == 0x5a);
    }
    if (status == FXA_OK) {
        CHECK(f != NULL);
        check_success(f, data, size, err);
    } else {
        CHECK(status == FXA_ERR_INVALID_ARG);
        CHECK(f == NULL);
        check_st_message(err, ERR_CAP);
        if (size % 4 == 1) { /* one failure in four: it costs a second parse */
            check_truncation(data, size, status, err);
        }
    }
    fxa_st_close(f);
    return 0;
}
