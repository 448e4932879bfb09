/* Reading and writing files exactly, and quoting their content in messages,
 * for the hostile-file readers (npy.c, safetensors.c) and the staged writer
 * (staged.c). */
#ifndef FXA_IO_FILE_IO_H
#define FXA_IO_FILE_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "fxattn.h"

/* Read exactly n bytes at offset, retrying short reads and EINTR, in chunks
 * of at most 1 GiB. On failure returns FXA_ERR_IO with the reason in why
 * ("read failed (<what>): <errno text>", or "unexpected end of file while
 * reading <what> (did the file change?)"). */
fxa_status fxa_io_pread_all(int fd, void *buf, size_t n, int64_t offset, const char *what,
                            char *why, size_t why_len);

/*
 * Write all n bytes of buf to fd, retrying partial writes and EINTR.
 * On failure returns FXA_ERR_IO with "<what>: write failed after K of n
 * bytes: <reason>" in err.
 */
fxa_status fxa_io_write_all(int fd, const void *buf, size_t n, const char *what, char *err,
                            size_t errlen);

/* Open path for reading, as a regular file: O_NONBLOCK, so that a FIFO cannot hang the open
 * (it is refused as not regular). Returns the descriptor, with *sb from fstat, or -1 with the
 * reason in why ("cannot open: <errno text>", "cannot stat: <errno text>", "not a regular
 * file") and nothing left open. */
int fxa_io_open_regular(const char *path, struct stat *sb, char *why, size_t why_len);

/* What tells one state of a file's content from another: device, inode,
 * size and modification time (nanoseconds). */
typedef struct fxa_io_stamp {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
} fxa_io_stamp;

/* The stamp of a file as fstat or stat described it. */
fxa_io_stamp fxa_io_stamp_of(const struct stat *sb);

/* 1 when a and b describe the same content (every field equal), else 0. */
int fxa_io_stamp_same(const fxa_io_stamp *a, const fxa_io_stamp *b);

/* After a read from fd: FXA_OK when fstat(fd) still gives `before`; else
 * FXA_ERR_IO with "the file changed while it was read (<what differs>)"
 * or the fstat failure in why. Readers call it after their last read, so
 * that a file rewritten in place during the read is refused instead of
 * returning a mix of old and new bytes. */
fxa_status fxa_io_check_unchanged(int fd, const fxa_io_stamp *before, char *why, size_t why_len);

/*
 * Stage a file of head[0..head_len) then data[0..data_len) for path (staged.c): in a
 * temporary file next to path's file (a symbolic link's file), synced, for
 * fxa_staged_commit or fxa_staged_discard; a path that names an existing non-regular file
 * (a device, a FIFO) is written in place (st->direct). Returns FXA_ERR_INVALID_ARG or
 * FXA_ERR_IO with the reason in err, st zeroed, nothing left behind.
 */
struct fxa_staged;
fxa_status fxa_stage_file(const char *path, const void *head, size_t head_len, const void *data,
                          size_t data_len, struct fxa_staged *st, char *err, size_t errlen);

/* unit times the product of the ndim dimensions of shape (each >= 0) into *total. Fails (-1,
 * *total untouched) unless unit times the product of the non-zero dimensions fits in int64, so
 * that every partial product a caller may form is safe too. */
int fxa_io_shape_total(const int64_t *shape, int ndim, int64_t unit, int64_t *total);

/* Messages about file content, shared by the readers: */

/* Room for a shape's text: "(" + 8 dimensions * (20 characters + ", ") + ",)" + NUL. */
#define FXA_IO_SHAPE_TEXT_CAP 192

/* A shape of at most 8 dimensions as text: a Python tuple with open '(' ((), (5,), (2, 3)), a
 * JSON array with open '[' ([], [5], [2, 3]). */
void fxa_io_format_shape(const int64_t *shape, int ndim, char open,
                         char buf[FXA_IO_SHAPE_TEXT_CAP]);

/* Empty err (when not NULL and errlen > 0). */
void fxa_io_clear_error(char *err, size_t errlen);

/* The formatted message into err[errlen], truncated to fit (nothing when err is NULL or
 * errlen 0). */
void fxa_io_set_error(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Copy file text into a message of at most cap bytes (cap >= 5): printable
 * ASCII kept, other bytes as '?', text too long cut and ended with "...". */
void fxa_io_snippet(const char *text, size_t len, char *out, size_t cap);

#endif
