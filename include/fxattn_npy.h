/*
 * fxattn_npy.h (libfxattn_io): NumPy .npy files.
 *
 * Reader contract (fxa_npy_read)
 *  - Accepts format versions 1.0, 2.0 and 3.0, C order, dtype '<f4' (FXA_F32)
 *    or '<f2' (FXA_F16), up to FXA_NPY_MAX_DIMS dimensions.
 *  - The file is treated as hostile: the header is parsed with bounds checks
 *    (at most FXA_NPY_MAX_HEADER_LEN bytes), every product of the shape and
 *    the data size are checked for int64 overflow, and the data size must
 *    match the file size exactly (checked with fstat before allocating).
 *  - On failure *out is zeroed (nothing allocated) and err holds one line that
 *    starts with the path, e.g. "q.npy: Fortran-order arrays are not
 *    supported". Status: FXA_ERR_INVALID_ARG for bad file content,
 *    FXA_ERR_IO when the file cannot be opened or read, FXA_ERR_NO_MEMORY when
 *    a valid array does not fit in memory.
 *  - Data is returned as stored (little-endian), 64-byte aligned, and is
 *    non-NULL even when count is 0.
 *  - A file whose size, modification time (to the nanosecond), device or
 *    inode differ after the read from before it (rewritten while it was
 *    read) is refused with FXA_ERR_IO: "the file changed while it was read".
 *  - An empty path is FXA_ERR_INVALID_ARG ("the path is empty").
 *
 * Writer contract (fxa_npy_stage_f32 + fxa_staged_commit / _discard)
 *  - Staging writes a complete '<f4' file (version 1.0, header padded to a
 *    multiple of 64 bytes as NumPy does) to "<path>.tmp.XXXXXX" in the same
 *    folder and fsyncs it; commit renames it onto path, so readers see either
 *    the old file or the new one, never a partial file.
 *  - Every failure removes the temporary file and leaves path untouched.
 *  - A path that is a symbolic link to a regular file is written through the
 *    link: staged next to the file it names and renamed onto that file, the
 *    link kept (so /dev/stdout redirected to a file fills that file and is
 *    never replaced itself).
 *  - A target that exists and is not a regular file (a device such as
 *    /dev/full or /dev/stdout, a FIFO) cannot be replaced atomically: it is
 *    written in place at staging time (errors such as ENOSPC are reported
 *    there) and commit is a no-op. A folder is refused.
 *  - fxa_staged_commit_all commits several staged files all or nothing: if
 *    one rename fails, the files already committed are rolled back to their
 *    previous content (or removed when there was none).
 *  - An empty path is FXA_ERR_INVALID_ARG; NULL lists or entries, and two
 *    entries that are the same struct or target the same path, are
 *    FXA_ERR_INVALID_ARG (every staged file removed), never a crash.
 *
 * err may be NULL or errlen 0; messages are truncated to errlen - 1 bytes and
 * never end with a newline. The host must be little-endian.
 */
#ifndef FXATTN_NPY_H
#define FXATTN_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FXA_NPY_MAX_DIMS 8
#define FXA_NPY_MAX_HEADER_LEN (1 << 20) /* bytes of the header dict, padding included */

typedef struct fxa_npy {
    int ndim;
    int64_t shape[FXA_NPY_MAX_DIMS];
    fxa_dtype dtype; /* FXA_F32 for '<f4', FXA_F16 for '<f2' */
    int64_t count;   /* elements held: the product of shape (1 for a scalar ()), or of the slice */
    void *data;      /* count elements, 64-byte aligned (aligned_alloc), little-endian */
    /* A slice holds [slice_start, slice_start + slice_len) of dimension
     * slice_axis (the other dimensions whole); shape is the file's. */
    int slice_axis; /* -1: the whole array */
    int64_t slice_start;
    int64_t slice_len;
} fxa_npy;

/* Read a whole .npy file into *out (see the contract above). */
FXA_API fxa_status fxa_npy_read(const char *path, fxa_npy *out, char *err, size_t errlen);

/* Read only [start, start + len) of dimension `axis` (the other dimensions
 * whole), with every check of fxa_npy_read made against the whole file;
 * out->shape stays the file's. axis -1 with start and len 0 reads
 * everything. Another negative axis, an axis >= the file's ndim or a range
 * outside the shape is FXA_ERR_INVALID_ARG. */
FXA_API fxa_status fxa_npy_read_slice(const char *path, int axis, int64_t start, int64_t len,
                                      fxa_npy *out, char *err, size_t errlen);

/* Read shard `part` of `parts` of dimension `axis` (0..ndim-1): contiguous,
 * the first shape[axis] mod parts shards one longer (fxa_mpi_shard's split).
 * A negative axis, parts < 1 or part outside [0, parts) is
 * FXA_ERR_INVALID_ARG. */
FXA_API fxa_status fxa_npy_read_shard(const char *path, int axis, int parts, int part, fxa_npy *out,
                                      char *err, size_t errlen);

/* Free the data and zero the struct. NULL-safe. */
FXA_API void fxa_npy_free(fxa_npy *a);

typedef struct fxa_staged {
    char tmp_path[4096];
    char final_path[4096];
    int active; /* 1 while a temporary file is waiting for commit or discard */
    int direct; /* 1: the target is not a regular file and was written in place */
} fxa_staged;

/*
 * Write a '<f4' C-order array of ndim (0..FXA_NPY_MAX_DIMS) dimensions to a
 * temporary file next to path. *st is overwritten. Bad arguments give
 * FXA_ERR_INVALID_ARG; create, write, fsync or close failures give
 * FXA_ERR_IO. On failure the temporary file is removed and st is inactive.
 */
FXA_API fxa_status fxa_npy_stage_f32(const char *path, int ndim, const int64_t *shape,
                                     const float *data, fxa_staged *st, char *err, size_t errlen);

/* Rename the staged file onto its final path. On failure the temporary file
 * is removed (FXA_ERR_IO); committing an inactive st is FXA_ERR_INVALID_ARG.
 * st is inactive afterwards either way. */
FXA_API fxa_status fxa_staged_commit(fxa_staged *st, char *err, size_t errlen);

/* Remove the staged temporary file, if any. NULL-safe. */
FXA_API void fxa_staged_discard(fxa_staged *st);

/* Commit n staged files, all or nothing (see the contract above). On
 * failure every staged temporary file is removed. */
FXA_API fxa_status fxa_staged_commit_all(fxa_staged *const *st, int n, char *err, size_t errlen);

/*
 * Check before any work that path can take an output as far as can be
 * known without writing: not empty, not ending with '/', short enough for
 * its temporary name, not a folder; an existing device or FIFO (written in
 * place) writable; otherwise its folder exists, is a folder and takes new
 * files. FXA_ERR_INVALID_ARG for a path that can never work (empty, too
 * long, ending with '/'), FXA_ERR_IO for the rest; err names the path.
 * Staging can still fail later (a full disk); this only refuses early what
 * would certainly fail, so that a command with several outputs writes none.
 */
FXA_API fxa_status fxa_output_check(const char *path, char *err, size_t errlen);

/*
 * 1 when output paths a and b name the same file: both exist and share
 * device and inode (a symlink, a hard link, ./x and x), or their directory
 * entries are the same (the folder resolved with realpath, then the last
 * component). Two outputs for which this holds are refused up front.
 * 0 when either is NULL.
 */
FXA_API int fxa_same_output(const char *a, const char *b);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_NPY_H */
