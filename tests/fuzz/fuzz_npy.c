/*
 * libFuzzer target for the .npy reader (include/fxattn_npy.h, fxa_npy_read).
 *
 * Contract: each input is the whole content of a .npy file. It is written to one file in a
 * private temporary folder (created once under $TMPDIR or /tmp, removed at exit; one fd kept
 * open, rewritten with pwrite + ftruncate) and read back with fxa_npy_read. Any violation of
 * the reader's contract stops the run with __builtin_trap:
 *  - success: ndim in 0..FXA_NPY_MAX_DIMS, no negative dimension, count == product of the
 *    shape, dtype FXA_F32 or FXA_F16, data non-NULL and 64-byte aligned, the data size equals
 *    the file size minus the preamble and header, the data bytes equal the file's bytes as
 *    stored, err is empty; and the input really starts with a 1.0/2.0/3.0 preamble;
 *  - failure: the status is FXA_ERR_INVALID_ARG (the file is a readable regular file that
 *    does not change), *out is all zero bytes, err is one line "<path>: ..." shorter than
 *    errlen; for inputs of size 4k+1 a second read with a small errlen (or err NULL / errlen
 *    0) gives the same status and a prefix of that message and writes nothing past errlen;
 *  - fxa_npy_free zeroes the struct.
 * The target never writes any file other than its own temporary one.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fxattn_npy.h"

#define FUZZ_NAME "fuzz_npy"
#include "fuzz_check.h"

#define ERR_CAP 1024
#define GUARD 16

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_dir[4096];
static char g_path[4096 + 16];
static size_t g_path_len;
static int g_fd = -1;

static void cleanup(void)
{
    if (g_fd >= 0) {
        close(g_fd);
        g_fd = -1;
    }
    if (g_path[0] != '\0') {
        unlink(g_path);
    }
    if (g_dir[0] != '\0') {
        rmdir(g_dir);
    }
}

static void setup(void)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0') {
        tmp = "/tmp";
    }
    int n = snprintf(g_dir, sizeof g_dir, "%s/fxattn-fuzz-npy.XXXXXX", tmp);
    if (n < 0 || (size_t)n >= sizeof g_dir || mkdtemp(g_dir) == NULL) {
        fprintf(stderr, "fuzz_npy: cannot create a temporary folder under %s: %s\n", tmp,
                strerror(errno));
        exit(1);
    }
    snprintf(g_path, sizeof g_path, "%s/input.npy", g_dir);
    g_path_len = strlen(g_path);
    g_fd = open(g_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (g_fd < 0) {
        fprintf(stderr, "fuzz_npy: cannot create %s: %s\n", g_path, strerror(errno));
        rmdir(g_dir);
        exit(1);
    }
    atexit(cleanup);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setup();
    return 0;
}

/* Replace the file's content by data[0..size). */
static void write_input(const uint8_t *data, size_t size)
{
    size_t done = 0;
    while (done < size) {
        ssize_t w = pwrite(g_fd, data + done, size - done, (off_t)done);
        if (w < 0 && errno == EINTR) {
            continue;
        }
        if (w <= 0) {
            fprintf(stderr, "fuzz_npy: pwrite %s: %s\n", g_path, strerror(errno));
            exit(1);
        }
        done += (size_t)w;
    }
    if (ftruncate(g_fd, (off_t)size) != 0) {
        fprintf(stderr, "fuzz_npy: ftruncate %s: %s\n", g_path, strerror(errno));
        exit(1);
    }
}

static int is_zero(const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        if (b[i] != 0) {
            return 0;
        }
    }
    return 1;
}

/* Data offset implied by the preamble (the reader accepted it), or -1 if it is not one. */
static int64_t data_offset(const uint8_t *data, size_t size)
{
    if (size < 10 || memcmp(data, "\x93NUMPY", 6) != 0 || data[7] != 0 || data[6] < 1 ||
        data[6] > 3) {
        return -1;
    }
    if (data[6] == 1) {
        return 10 + (int64_t)(data[8] | (uint32_t)data[9] << 8);
    }
    if (size < 12) {
        return -1;
    }
    uint32_t len =
        data[8] | (uint32_t)data[9] << 8 | (uint32_t)data[10] << 16 | (uint32_t)data[11] << 24;
    return 12 + (int64_t)len;
}

static void check_success(const fxa_npy *a, const uint8_t *data, size_t size, const char *err)
{
    CHECK(err[0] == '\0');
    CHECK(a->ndim >= 0 && a->ndim <= FXA_NPY_MAX_DIMS);
    CHECK(a->dtype == FXA_F32 || a->dtype == FXA_F16);
    CHECK(a->data != NULL);
    CHECK(((uintptr_t)a->data & 63u) == 0);
    int64_t product = 1;
    for (int i = 0; i < a->ndim; i++) {
        CHECK(a->shape[i] >= 0);
        /* The reader guarantees the byte size fits in int64, so no step can overflow. */
        CHECK(a->shape[i] == 0 || product <= INT64_MAX / a->shape[i]);
        product *= a->shape[i];
    }
    CHECK(a->count == product);
    const int64_t offset = data_offset(data, size);
    CHECK(offset >= 0 && offset <= (int64_t)size);
    CHECK(data[offset - 1] == '\n');
    const int64_t itemsize = a->dtype == FXA_F32 ? 4 : 2;
    CHECK(a->count * itemsize == (int64_t)size - offset);
    CHECK(memcmp(a->data, data + offset, (size_t)(a->count * itemsize)) == 0);
}

/* Read again with a small error buffer (or none): same status, a prefix of the full
 * message, nothing written past errlen. */
static void check_truncation(size_t size, fxa_status status, const char *full)
{
    char small[64 + GUARD];
    size_t errlen = size % (g_path_len + 24);
    const int use_null = size % 7 == 3;
    memset(small, 0x5a, sizeof small);
    fxa_npy a;
    memset(&a, 0xa5, sizeof a);
    const size_t cap = errlen < 64 ? errlen : 64;
    fxa_status again = fxa_npy_read(g_path, &a, use_null ? NULL : small, use_null ? 0 : cap);
    CHECK(again == status);
    CHECK(is_zero(&a, sizeof a));
    check_small_message(small, sizeof small, cap, use_null, full);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (g_fd < 0) {
        setup(); /* a driver that does not call LLVMFuzzerInitialize */
    }
    write_input(data, size);

    char err[ERR_CAP + GUARD];
    memset(err, 0x5a, sizeof err);
    fxa_npy a;
    memset(&a, 0xa5, sizeof a);
    const fxa_status status = fxa_npy_read(g_path, &a, err, ERR_CAP);
    for (size_t i = ERR_CAP; i < sizeof err; i++) {
        CHECK(err[i] == 0x5a);
    }
    if (status == FXA_OK) {
        check_success(&a, data, size, err);
    } else {
        CHECK(status == FXA_ERR_INVALID_ARG);
        CHECK(is_zero(&a, sizeof a));
        check_message(err, ERR_CAP, g_path, g_path_len); /* about the whole path */
        if (size % 4 == 1) { /* one failure in four: it costs a second read */
            check_truncation(size, status, err);
        }
    }
    fxa_npy_free(&a);
    CHECK(is_zero(&a, sizeof a));
    return 0;
}
