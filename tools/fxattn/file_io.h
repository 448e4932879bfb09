/* Reading and writing files exactly, and quoting their content in messages,
 * for the hostile-file readers (npy.c, safetensors.c) and the staged writer. */
#ifndef FXT_FILE_IO_H
#define FXT_FILE_IO_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"

/* Read exactly n bytes at offset, retrying short reads and EINTR, in chunks
 * of at most 1 GiB. On failure returns FXA_ERR_IO with the reason in why
 * ("read failed (<what>): <errno text>", or "unexpected end of file while
 * reading <what> (did the file change?)"). */
fxa_status fxt_pread_all(int fd, void *buf, size_t n, int64_t offset, const char *what, char *why,
                         size_t why_len);

/*
 * Write all n bytes of buf to fd, retrying partial writes and EINTR.
 * On failure returns FXA_ERR_IO with "<what>: write failed after K of n
 * bytes: <reason>" in err.
 */
fxa_status fxt_write_all(int fd, const void *buf, size_t n, const char *what, char *err,
                         size_t errlen);

/*
 * 1 when output paths a and b name the same file: both exist and share
 * device and inode (a symlink, a hard link, ./x and x), or their directory
 * entries are the same (the folder resolved with realpath, then the last
 * component). Two outputs for which this holds are refused up front.
 */
int fxt_same_output(const char *a, const char *b);

/* Messages about file content, shared by the readers: */

/* Empty err (when not NULL and errlen > 0). */
void fxt_clear_error(char *err, size_t errlen);

/* Copy file text into a message of at most cap bytes (cap >= 5): printable
 * ASCII kept, other bytes as '?', text too long cut and ended with "...". */
void fxt_snippet(const char *text, size_t len, char *out, size_t cap);

#endif
