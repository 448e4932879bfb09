/* .npy files of test_cli (cli_npy.h). */
#include "cli_npy.h"

#include <stdlib.h>
#include <string.h>

#include "cli_harness.h"
#include "testutil.h"

void write_npy(const char *path, int version, const char *descr, int fortran, int ndim,
               const int64_t *shape, const void *data, size_t data_bytes)
{
    char shape_text[256];
    char dict[512];
    unsigned char *buf;
    format_shape(shape, ndim, shape_text, sizeof shape_text);
    const int dict_len =
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr,
                 fortran ? "True" : "False", shape_text);
    const size_t pre = version == 1 ? 10 : 12;
    const size_t total = (pre + (size_t)dict_len + 1 + 63) / 64 * 64;
    const size_t header_len = total - pre;
    buf = malloc(total + data_bytes);
    if (!buf)
        die("out of memory");
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)version;
    buf[7] = 0;
    if (version == 1) {
        buf[8] = (unsigned char)(header_len & 0xff);
        buf[9] = (unsigned char)(header_len >> 8);
    } else {
        for (int i = 0; i < 4; i++)
            buf[8 + i] = (unsigned char)((header_len >> (8 * i)) & 0xff);
    }
    memcpy(buf + pre, dict, (size_t)dict_len);
    memset(buf + pre + (size_t)dict_len, ' ', total - 1 - pre - (size_t)dict_len);
    buf[total - 1] = '\n';
    if (data_bytes)
        memcpy(buf + total, data, data_bytes);
    write_bytes(path, buf, total + data_bytes);
    free(buf);
}

void write_f32(const char *path, int ndim, const int64_t *shape, const float *data)
{
    fxa_staged st;
    char err[600];
    if (fxa_npy_stage_f32(path, ndim, shape, data, &st, err, sizeof err) != FXA_OK ||
        fxa_staged_commit(&st, err, sizeof err) != FXA_OK)
        die("%s", err);
}

void write_f16(const char *path, int ndim, const int64_t *shape, const uint16_t *data, size_t n)
{
    write_npy(path, 1, "<f2", 0, ndim, shape, data, n * sizeof(uint16_t));
}

int read_output(const char *label, const char *path, int ndim, const int64_t *shape, fxa_npy *a)
{
    char err[600];
    char got[256];
    char want[256];
    fxa_status st = fxa_npy_read(path, a, err, sizeof err);
    CHECK(st == FXA_OK, "[%s] cannot read the output %s: %s", label, path, err);
    if (st != FXA_OK)
        return 0;
    int same = a->dtype == FXA_F32 && a->ndim == ndim;
    for (int i = 0; same && i < ndim; i++)
        same = a->shape[i] == shape[i];
    format_shape(a->shape, a->ndim, got, sizeof got);
    format_shape(shape, ndim, want, sizeof want);
    CHECK(same, "[%s] %s has shape %s dtype %s, expected %s <f4", label, path, got,
          a->dtype == FXA_F32 ? "<f4" : "<f2", want);
    if (!same)
        fxa_npy_free(a);
    return same;
}
