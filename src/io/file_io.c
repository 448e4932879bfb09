/* Reading and writing files exactly, quoting them in messages (file_io.h). */
#include "io/file_io.h"
#include "fxattn_npy.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define IO_CHUNK ((size_t)1 << 30)

fxa_status fxa_io_pread_all(int fd, void *buf, size_t n, int64_t offset, const char *what,
                            char *why, size_t why_len)
{
    unsigned char *bytes = buf;
    size_t done = 0;
    while (done < n) {
        const size_t chunk = n - done < IO_CHUNK ? n - done : IO_CHUNK;
        const ssize_t got = pread(fd, bytes + done, chunk, (off_t)(offset + (int64_t)done));
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            snprintf(why, why_len, "read failed (%s): %s", what, strerror(errno));
            return FXA_ERR_IO;
        }
        if (got == 0) {
            snprintf(why, why_len, "unexpected end of file while reading %s (did the file change?)",
                     what);
            return FXA_ERR_IO;
        }
        done += (size_t)got;
    }
    return FXA_OK;
}

/* err may be NULL or errlen 0 (npy.h's convention). */
fxa_status fxa_io_write_all(int fd, const void *buf, size_t n, const char *what, char *err,
                            size_t errlen)
{
    const unsigned char *bytes = buf;
    size_t done = 0;
    while (done < n) {
        size_t chunk = n - done < IO_CHUNK ? n - done : IO_CHUNK;
        ssize_t written = write(fd, bytes + done, chunk);
        if (written < 0 && errno == EINTR) {
            continue;
        }
        if (written <= 0) {
            if (err && errlen)
                snprintf(err, errlen, "%s: write failed after %zu of %zu bytes: %s", what, done, n,
                         written < 0 ? strerror(errno) : "no progress");
            return FXA_ERR_IO;
        }
        done += (size_t)written;
    }
    return FXA_OK;
}

fxa_io_stamp fxa_io_stamp_of(const struct stat *sb)
{
    fxa_io_stamp s;
    memset(&s, 0, sizeof s);
    s.dev = sb->st_dev;
    s.ino = sb->st_ino;
    s.size = sb->st_size;
    s.mtime = sb->st_mtim;
    return s;
}

int fxa_io_stamp_same(const fxa_io_stamp *a, const fxa_io_stamp *b)
{
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
           a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec;
}

fxa_status fxa_io_check_unchanged(int fd, const fxa_io_stamp *before, char *why, size_t why_len)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        snprintf(why, why_len, "cannot stat after reading: %s", strerror(errno));
        return FXA_ERR_IO;
    }
    const fxa_io_stamp now = fxa_io_stamp_of(&sb);
    if (fxa_io_stamp_same(before, &now))
        return FXA_OK;
    if (now.size != before->size)
        snprintf(why, why_len,
                 "the file changed while it was read (its size went from %lld to %lld bytes); "
                 "nothing was used",
                 (long long)before->size, (long long)now.size);
    else if (now.dev != before->dev || now.ino != before->ino)
        snprintf(why, why_len,
                 "the file changed while it was read (another file took its "
                 "place); nothing was used");
    else
        snprintf(why, why_len,
                 "the file changed while it was read (it was modified in place); "
                 "nothing was used");
    return FXA_ERR_IO;
}

/* path's directory entry as "<realpath of its folder>/<last component>";
 * 0 when the folder cannot be resolved. */
static int entry_path(const char *path, char *out, size_t cap)
{
    char dir[PATH_MAX];
    char real[PATH_MAX];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!slash) {
        snprintf(dir, sizeof dir, ".");
    } else {
        const size_t n = slash == path ? 1 : (size_t)(slash - path);
        if (n >= sizeof dir)
            return 0;
        memcpy(dir, path, n);
        dir[n] = '\0';
    }
    if (!realpath(dir, real))
        return 0;
    return snprintf(out, cap, "%s/%s", real, base) < (int)cap;
}

int fxa_same_output(const char *a, const char *b)
{
    if (a == NULL || b == NULL)
        return 0;
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino)
        return 1;
    char ea[PATH_MAX + 256];
    char eb[PATH_MAX + 256];
    if (entry_path(a, ea, sizeof ea) && entry_path(b, eb, sizeof eb))
        return strcmp(ea, eb) == 0;
    return strcmp(a, b) == 0;
}

void fxa_io_clear_error(char *err, size_t errlen)
{
    if (err != NULL && errlen > 0)
        err[0] = '\0';
}

void fxa_io_set_error(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list args;
    va_start(args, fmt);
    vsnprintf(err, errlen, fmt, args);
    va_end(args);
}

int fxa_io_open_regular(const char *path, struct stat *sb, char *why, size_t why_len)
{
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_len, "cannot open: %s", strerror(errno));
        return -1;
    }
    if (fstat(fd, sb) != 0) {
        snprintf(why, why_len, "cannot stat: %s", strerror(errno));
        close(fd);
        return -1;
    }
    if (!S_ISREG(sb->st_mode)) {
        snprintf(why, why_len, "not a regular file");
        close(fd);
        return -1;
    }
    return fd;
}

int fxa_io_shape_total(const int64_t *shape, int ndim, int64_t unit, int64_t *total)
{
    int64_t nonzero = unit;
    int has_zero = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) {
            has_zero = 1;
        } else if (nonzero > INT64_MAX / shape[i]) {
            return -1;
        } else {
            nonzero *= shape[i];
        }
    }
    *total = has_zero ? 0 : nonzero;
    return 0;
}

void fxa_io_format_shape(const int64_t *shape, int ndim, char open, char buf[FXA_IO_SHAPE_TEXT_CAP])
{
    size_t len = 0;
    buf[len++] = open;
    for (int i = 0; i < ndim; i++) {
        int n = snprintf(buf + len, FXA_IO_SHAPE_TEXT_CAP - len, i > 0 ? ", %" PRId64 : "%" PRId64,
                         shape[i]);
        len += (size_t)n;
    }
    if (open == '(' && ndim == 1) {
        buf[len++] = ',';
    }
    buf[len++] = open == '(' ? ')' : ']';
    buf[len] = '\0';
}

void fxa_io_snippet(const char *text, size_t len, char *out, size_t cap)
{
    const size_t keep = cap - 4; /* room for "..." and NUL */
    size_t n = len < keep ? len : keep;
    for (size_t i = 0; i < n; i++) {
        const unsigned char c = (unsigned char)text[i];
        out[i] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (len > keep) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
}
