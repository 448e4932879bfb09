/*
 * npy: NumPy .npy files for the fxattn tools.
 *
 * Reader contract (fxt_npy_read)
 *  - Accepts format versions 1.0, 2.0 and 3.0, C order, dtype '<f4' (FXA_F32)
 *    or '<f2' (FXA_F16), up to FXT_NPY_MAX_DIMS dimensions.
 *  - The file is treated as hostile: the header is parsed with bounds checks
 *    (at most FXT_NPY_MAX_HEADER_LEN bytes), every product of the shape and
 *    the data size are checked for int64 overflow, and the data size must
 *    match the file size exactly (checked with fstat before allocating).
 *  - On failure *out is zeroed (nothing allocated) and err holds one line that
 *    starts with the path, e.g. "q.npy: Fortran-order arrays are not
 *    supported". Status: FXA_ERR_INVALID_ARG for bad file content,
 *    FXA_ERR_IO when the file cannot be opened or read, FXA_ERR_NO_MEMORY when
 *    a valid array does not fit in memory.
 *  - Data is returned as stored (little-endian), 64-byte aligned, and is
 *    non-NULL even when count is 0.
 *
 * Writer contract (fxt_npy_stage_f32 + fxt_staged_commit / _discard)
 *  - Staging writes a complete '<f4' file (version 1.0, header padded to a
 *    multiple of 64 bytes as NumPy does) to "<path>.tmp.XXXXXX" in the same
 *    folder and fsyncs it; commit renames it onto path, so readers see either
 *    the old file or the new one, never a partial file.
 *  - Every failure removes the temporary file and leaves path untouched.
 *  - A target that exists and is not a regular file (a device such as
 *    /dev/full or /dev/stdout, a FIFO) cannot be replaced atomically: it is
 *    written in place at staging time (errors such as ENOSPC are reported
 *    there) and commit is a no-op. A folder is refused.
 *  - fxt_staged_commit_all commits several staged files all or nothing: if
 *    one rename fails, the files already committed are rolled back to their
 *    previous content (or removed when there was none).
 *
 * err may be NULL or errlen 0; messages are truncated to errlen - 1 bytes and
 * never end with a newline. The host must be little-endian.
 */
#ifndef FXT_NPY_H
#define FXT_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "file_io.h"
#include "fxattn.h"

#define FXT_NPY_MAX_DIMS 8
#define FXT_NPY_MAX_HEADER_LEN (1 << 20) /* bytes of the header dict, padding included */

typedef struct fxt_npy {
    int ndim;
    int64_t shape[FXT_NPY_MAX_DIMS];
    fxa_dtype dtype; /* FXA_F32 for '<f4', FXA_F16 for '<f2' */
    int64_t count;   /* elements held: the product of shape (1 for a scalar ()), or of the slice */
    void *data;      /* count elements, 64-byte aligned (aligned_alloc), little-endian */
    /* A slice holds [slice_start, slice_start + slice_len) of dimension
     * slice_axis (the other dimensions whole); shape is the file's. */
    int slice_axis; /* -1: the whole array */
    int64_t slice_start;
    int64_t slice_len;
} fxt_npy;

/* Read a whole .npy file into *out (see the contract above). */
fxa_status fxt_npy_read(const char *path, fxt_npy *out, char *err, size_t errlen);

/* Read only [start, start + len) of dimension `axis` (the other dimensions
 * whole), with every check of fxt_npy_read made against the whole file;
 * out->shape stays the file's. axis < 0 reads everything. A range outside
 * the shape is FXA_ERR_INVALID_ARG. */
fxa_status fxt_npy_read_slice(const char *path, int axis, int64_t start, int64_t len, fxt_npy *out,
                              char *err, size_t errlen);

/* Read shard `part` of `parts` of dimension `axis`: contiguous, the first
 * shape[axis] mod parts shards one longer (fxa_mpi_shard's split). */
fxa_status fxt_npy_read_shard(const char *path, int axis, int parts, int part, fxt_npy *out,
                              char *err, size_t errlen);

/* Free the data and zero the struct. NULL-safe. */
void fxt_npy_free(fxt_npy *a);

typedef struct fxt_staged {
    char tmp_path[4096];
    char final_path[4096];
    int active; /* 1 while a temporary file is waiting for commit or discard */
    int direct; /* 1: the target is not a regular file and was written in place */
} fxt_staged;

/*
 * Write a '<f4' C-order array of ndim (0..FXT_NPY_MAX_DIMS) dimensions to a
 * temporary file next to path. *st is overwritten. Bad arguments give
 * FXA_ERR_INVALID_ARG; create, write, fsync or close failures give
 * FXA_ERR_IO. On failure the temporary file is removed and st is inactive.
 */
fxa_status fxt_npy_stage_f32(const char *path, int ndim, const int64_t *shape, const float *data,
                             fxt_staged *st, char *err, size_t errlen);

/* Rename the staged file onto its final path. On failure the temporary file
 * is removed (FXA_ERR_IO); committing an inactive st is FXA_ERR_INVALID_ARG.
 * st is inactive afterwards either way. */
fxa_status fxt_staged_commit(fxt_staged *st, char *err, size_t errlen);

/* Remove the staged temporary file, if any. NULL-safe. */
void fxt_staged_discard(fxt_staged *st);

/* Commit n staged files, all or nothing (see the contract above). On
 * failure every staged temporary file is removed. */
fxa_status fxt_staged_commit_all(fxt_staged *const *st, int n, char *err, size_t errlen);

#endif /* FXT_NPY_H */
