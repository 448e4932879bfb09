/* Reading and writing files exactly, and quoting their content in messages,
 * for the hostile-file readers (npy.c, safetensors.c) and the staged writer. */
#ifndef FXA_IO_FILE_IO_H
#define FXA_IO_FILE_IO_H

#include <stddef.h>
#include <stdint.h>

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

/* Messages about file content, shared by the readers: */

/* Empty err (when not NULL and errlen > 0). */
void fxa_io_clear_error(char *err, size_t errlen);

/* Copy file text into a message of at most cap bytes (cap >= 5): printable
 * ASCII kept, other bytes as '?', text too long cut and ended with "...". */
void fxa_io_snippet(const char *text, size_t len, char *out, size_t cap);

#endif
