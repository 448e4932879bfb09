/* .npy files of test_cli: inputs written by hand or through the tools'
 * writer, and outputs read back with their dtype and shape checked. */
#ifndef FXA_CLI_NPY_H
#define FXA_CLI_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn_npy.h"

/* A .npy file written by hand: any descr, order and version; data_bytes of
 * data may disagree with the shape on purpose. */
void write_npy(const char *path, int version, const char *descr, int fortran, int ndim,
               const int64_t *shape, const void *data, size_t data_bytes);
/* A valid '<f4' file through the tools' own atomic writer. */
void write_f32(const char *path, int ndim, const int64_t *shape, const float *data);
/* A valid '<f2' file of the n values of data. */
void write_f16(const char *path, int ndim, const int64_t *shape, const uint16_t *data, size_t n);

/* Read an output and check that it is '<f4' of the given shape; 1 when it
 * is (a then holds it, for fxa_npy_free). */
int read_output(const char *label, const char *path, int ndim, const int64_t *shape, fxa_npy *a);

#endif
