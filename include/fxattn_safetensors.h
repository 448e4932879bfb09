/*
 * fxattn_safetensors.h (libfxattn_io): Hugging Face .safetensors files (read only).
 *
 * Layout: an 8-byte little-endian u64 N, N bytes of UTF-8 JSON (the header), then the data
 * buffer. The header is an object mapping each tensor name to
 * {"dtype": "BF16", "shape": [5120, 5120], "data_offsets": [begin, end]} (byte offsets from the
 * start of the data buffer), plus an optional "__metadata__" object of string values.
 *
 * Reader contract (fxa_st_open, fxa_st_parse)
 *  - The file is treated as hostile. The whole header is checked before anything is returned:
 *    N <= FXA_ST_MAX_HEADER_LEN and N <= file size - 8 (checked before allocating); the header
 *    is strict JSON (RFC 8259) parsed by a recursive-descent parser: valid UTF-8, every escape
 *    including \uXXXX with surrogate pairs (an unpaired surrogate is refused), no leading
 *    zeros, nesting at most FXA_ST_MAX_DEPTH deep, only JSON whitespace (the format pads with
 *    spaces) after the top-level object, which must be an object.
 *  - Schema: every tensor holds exactly the fields dtype (a dtype name of the format), shape
 *    (at most FXA_ST_MAX_DIMS integers) and data_offsets ([begin, end]); "__metadata__" (at
 *    most once) maps strings to strings. Shape entries and offsets are integers written
 *    without sign, fraction or exponent, at most 2^53. Duplicate tensor names, duplicate
 *    fields and duplicate metadata keys are refused, and so is the character U+0000 in a
 *    name, key or value (the strings are returned NUL-terminated). Names are at most
 *    FXA_ST_MAX_NAME_LEN bytes, tensors at most FXA_ST_MAX_TENSORS.
 *  - Sizes: the element count and the byte size of each shape must fit in int64;
 *    end - begin equals count * the dtype's size (sub-byte dtypes such as F4 must fill whole
 *    bytes); begin <= end <= the data buffer size. Sorted by (begin, end), the tensors must
 *    tile the data buffer exactly: no overlap, no hole, nothing after the last one.
 *  - dtypes: F32, BF16, F16 and F8_E4M3 are supported (fxa_st_dtype). The other dtypes the
 *    format defines (BOOL, U8, I8, F8_E5M2, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, I16, U16, I32,
 *    U32, I64, U64, F64, C64, F4, F6_E2M3, F6_E3M2) are checked like the others and listed
 *    with supported == 0; reading one is FXA_ERR_UNSUPPORTED. An unknown dtype name is a
 *    format error.
 *  - An empty path is FXA_ERR_INVALID_ARG ("the path is empty").
 *  - On failure *out is NULL (nothing allocated) and err holds one line that starts with the
 *    path, e.g. "w.safetensors: tensor 'blocks.0.self_attn.q.weight': data_offsets span 8
 *    bytes but BF16 with shape [2, 3] needs 12". Status: FXA_ERR_INVALID_ARG for bad file
 *    content, FXA_ERR_IO when the path cannot be opened or read or is not a regular file (a
 *    folder, a FIFO: opened with O_NONBLOCK so that nothing blocks), FXA_ERR_NO_MEMORY when
 *    the header does not fit in memory. "malformed JSON header at byte K" counts K from the
 *    start of the JSON text (file offset K + 8).
 *  - Tensors are listed in data order (by data_offsets); fxa_st_find looks names up by exact
 *    byte comparison. The file stays open (one descriptor) until fxa_st_close.
 *
 * Reading (fxa_st_read, fxa_st_read_f32, and fxa_st_read_rows(_f32) for a range of rows)
 *  - Reads one tensor, or a range of its rows (along the first axis), with pread, retrying
 *    short reads and EINTR; a file that changed since it was opened (its size or modification
 *    time, to the nanosecond: rewritten in place) gives FXA_ERR_IO, "the file changed while
 *    it was read". dst must
 *    hold exactly what is read (bytes for fxa_st_read(_rows), elements for the _f32 readers),
 *    and the rows must lie within the tensor, else FXA_ERR_INVALID_ARG; nothing is read then.
 *  - Data comes as stored (little-endian); fxa_st_read_f32 widens BF16 and F16 exactly and
 *    copies F32 bit for bit (NaN payloads kept). F8_E4M3 is read raw only: fxa_st_read_f32
 *    refuses it with FXA_ERR_UNSUPPORTED for now.
 *  - A file object is read-only after open: several threads may read from it at once.
 *
 * err may be NULL or errlen 0; messages are truncated to errlen - 1 bytes and never end with
 * a newline. Text from the file is quoted with bytes outside printable ASCII shown as '?' and
 * long text cut. The host must be little-endian.
 */
#ifndef FXATTN_SAFETENSORS_H
#define FXATTN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FXA_ST_MAX_DIMS 8
#define FXA_ST_MAX_HEADER_LEN (100 * 1024 * 1024) /* bytes of JSON, padding included */
#define FXA_ST_MAX_TENSORS (1 << 20)
#define FXA_ST_MAX_NAME_LEN 4096 /* bytes of a tensor name or metadata key, UTF-8 decoded */
#define FXA_ST_MAX_DEPTH 64      /* nested objects and arrays in the header */

typedef enum fxa_st_dtype {
    FXA_ST_F32 = 0,
    FXA_ST_BF16 = 1,
    FXA_ST_F16 = 2,
    FXA_ST_F8_E4M3 = 3,
} fxa_st_dtype;

typedef struct fxa_st_tensor {
    const char *name;       /* NUL-terminated UTF-8, unique in the file */
    const char *dtype_name; /* the format's name, e.g. "BF16", "I64" (static storage) */
    int supported;          /* 1: dtype below is the tensor's; 0: another dtype (see dtype_name) */
    fxa_st_dtype dtype;     /* meaningful only when supported */
    int ndim;               /* 0..FXA_ST_MAX_DIMS; 0 is a scalar of one element */
    int64_t shape[FXA_ST_MAX_DIMS];
    int64_t count;       /* elements: the product of the shape */
    int64_t nbytes;      /* data_offsets end - begin */
    int64_t offset;      /* data_offsets begin, from the start of the data buffer */
    int64_t file_offset; /* 8 + N + offset: from the start of the file */
} fxa_st_tensor;

typedef struct fxa_st_file fxa_st_file;

/* Open path and check its whole header (see the contract above). */
FXA_API fxa_status fxa_st_open(const char *path, fxa_st_file **out, char *err, size_t errlen);

/*
 * The same checks on a whole file held in memory, bytes[0..n); name_for_errors starts the
 * messages (NULL: "(memory)"). Reads then copy from bytes, which must stay valid and
 * unchanged until fxa_st_close.
 */
FXA_API fxa_status fxa_st_parse(const unsigned char *bytes, size_t n, const char *name_for_errors,
                                fxa_st_file **out, char *err, size_t errlen);

/* Number of tensors (0 for NULL). */
FXA_API int64_t fxa_st_count(const fxa_st_file *f);

/* Tensor i in data order, or NULL when i is out of range. */
FXA_API const fxa_st_tensor *fxa_st_at(const fxa_st_file *f, int64_t i);

/* The tensor of that name, or NULL. */
FXA_API const fxa_st_tensor *fxa_st_find(const fxa_st_file *f, const char *name);

/* The "__metadata__" value of key, or NULL when there is none. */
FXA_API const char *fxa_st_metadata(const fxa_st_file *f, const char *key);

/* Number of "__metadata__" entries, and the key of entry i in byte order (NULL when i is out
 * of range). */
FXA_API int64_t fxa_st_metadata_count(const fxa_st_file *f);
FXA_API const char *fxa_st_metadata_key(const fxa_st_file *f, int64_t i);

/*
 * Copy tensor t (one of f's, from fxa_st_at or fxa_st_find) into dst, whose size dst_bytes
 * must equal t->nbytes (dst may be NULL when both are 0). Errors: FXA_ERR_INVALID_ARG (t not
 * from f, wrong size), FXA_ERR_UNSUPPORTED (a dtype that is not fxa_st_dtype), FXA_ERR_IO.
 */
FXA_API fxa_status fxa_st_read(const fxa_st_file *f, const fxa_st_tensor *t, void *dst,
                               size_t dst_bytes, char *err, size_t errlen);

/*
 * Read an F32, BF16 or F16 tensor as fp32 into dst, which holds exactly dst_count == t->count
 * elements (exact conversion). F8_E4M3 and unsupported dtypes give FXA_ERR_UNSUPPORTED; other
 * errors as fxa_st_read.
 */
FXA_API fxa_status fxa_st_read_f32(const fxa_st_file *f, const fxa_st_tensor *t, float *dst,
                                   size_t dst_count, char *err, size_t errlen);

/*
 * Rows [row0, row0 + n_rows) of tensor t along its first axis (a row is the product of the
 * other dimensions: one element of a 1-D tensor, shape[1] elements of a 2-D one), as
 * fxa_st_read (dst_bytes must equal the rows' bytes) and fxa_st_read_f32 (dst_count must equal
 * their elements) read the whole tensor. Only those bytes are read from the file. Errors as the
 * whole-tensor readers, and FXA_ERR_INVALID_ARG for a scalar (no rows), row0 < 0, n_rows < 0
 * or row0 + n_rows > shape[0].
 */
FXA_API fxa_status fxa_st_read_rows(const fxa_st_file *f, const fxa_st_tensor *t, int64_t row0,
                                    int64_t n_rows, void *dst, size_t dst_bytes, char *err,
                                    size_t errlen);
FXA_API fxa_status fxa_st_read_rows_f32(const fxa_st_file *f, const fxa_st_tensor *t, int64_t row0,
                                        int64_t n_rows, float *dst, size_t dst_count, char *err,
                                        size_t errlen);

/* Close the file and free everything. NULL-safe. */
FXA_API void fxa_st_close(fxa_st_file *f);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_SAFETENSORS_H */
