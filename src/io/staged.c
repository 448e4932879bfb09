/*
 * The atomic file writer of libfxattn_io (fxattn_npy.h's writer contract): a file is staged
 * in a temporary file next to its target (through a symbolic link to the file it names),
 * written whole and synced, then committed by rename (fxa_staged_commit), several all or
 * nothing (fxa_staged_commit_all), or discarded. A target that is not a regular file (a
 * device, a FIFO) is written in place. The .npy writer (npy.c) stages through it.
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64

#include "fxattn_npy.h"

#include "io/file_io.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/*
 * A path whose last component is a symbolic link to a regular file (out.npy -> data/x.npy,
 * /dev/stdout -> /proc/self/fd/1 -> a file the shell redirected to) is written through the
 * link: the temporary file goes next to the file it names and is renamed onto that file,
 * never onto the link (which would replace /dev/stdout itself). Returns 1 with the file's
 * real path in out[cap], 0 when path is not such a link (out unused), -1 when the link
 * cannot be resolved (errno set).
 */
static int resolve_link(const char *path, char *out, size_t cap)
{
    struct stat link_stat;
    struct stat target;
    char real[PATH_MAX];
    if (lstat(path, &link_stat) != 0 || !S_ISLNK(link_stat.st_mode) || stat(path, &target) != 0 ||
        !S_ISREG(target.st_mode))
        return 0;
    if (realpath(path, real) == NULL)
        return -1;
    if (strlen(real) >= cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(out, real, strlen(real) + 1);
    return 1;
}

/* Write a whole file into an existing non-regular target (device, FIFO):
 * nothing there can be replaced atomically, and a device like /dev/full
 * must report its error rather than be replaced by a regular file. */
static fxa_status write_in_place(const char *path, const struct stat *target, const void *head,
                                 size_t head_len, const void *data, size_t data_len, fxa_staged *st,
                                 char *err, size_t errlen)
{
    if (S_ISDIR(target->st_mode)) {
        fxa_io_set_error(err, errlen, "%s: is a folder", path);
        memset(st, 0, sizeof *st);
        return FXA_ERR_IO;
    }
    /* Non-blocking open: a FIFO without a reader fails at once (ENXIO)
     * instead of blocking forever; the writes then block as usual. */
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENXIO && S_ISFIFO(target->st_mode))
            fxa_io_set_error(err, errlen, "%s: is a FIFO with no reader (nothing was written)",
                             path);
        else
            fxa_io_set_error(err, errlen, "%s: cannot open for writing: %s", path, strerror(errno));
        memset(st, 0, sizeof *st);
        return FXA_ERR_IO;
    }
    const int flags = fcntl(fd, F_GETFL);
    if (flags < 0 || fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        fxa_io_set_error(err, errlen, "%s: cannot make the output blocking: %s", path,
                         strerror(errno));
        close(fd);
        memset(st, 0, sizeof *st);
        return FXA_ERR_IO;
    }
    fxa_status status = fxa_io_write_all(fd, head, head_len, path, err, errlen);
    if (status == FXA_OK)
        status = fxa_io_write_all(fd, data, data_len, path, err, errlen);
    if (close(fd) != 0 && status == FXA_OK) {
        fxa_io_set_error(err, errlen, "%s: close failed: %s", path, strerror(errno));
        status = FXA_ERR_IO;
    }
    memset(st, 0, sizeof *st);
    st->direct = status == FXA_OK;
    return status;
}

fxa_status fxa_stage_file(const char *path, const void *head, size_t head_len, const void *data,
                          size_t data_len, fxa_staged *st, char *err, size_t errlen)
{
    memset(st, 0, sizeof *st);
    const char *target_path = path;
    char resolved[sizeof st->final_path];
    switch (resolve_link(path, resolved, sizeof resolved)) {
    case 1: target_path = resolved; break;
    case -1:
        fxa_io_set_error(err, errlen, "%s: cannot resolve the link to its file: %s", path,
                         strerror(errno));
        memset(st, 0, sizeof *st);
        return FXA_ERR_IO;
    default: break;
    }
    int final_len = snprintf(st->final_path, sizeof st->final_path, "%s", target_path);
    int tmp_len = snprintf(st->tmp_path, sizeof st->tmp_path, "%s.tmp.XXXXXX", target_path);
    if (final_len < 0 || tmp_len < 0 || (size_t)tmp_len >= sizeof st->tmp_path) {
        fxa_io_set_error(err, errlen, "%s: path is too long", path);
        memset(st, 0, sizeof *st);
        return FXA_ERR_INVALID_ARG;
    }
    struct stat target;
    if (stat(path, &target) == 0 && !S_ISREG(target.st_mode))
        return write_in_place(path, &target, head, head_len, data, data_len, st, err, errlen);

    /* mkstemp creates mode 0600; give the file the mode a plain create would get. Reading the
     * umask means setting it, which races only with threads creating files concurrently. */
    mode_t mask = umask(0);
    umask(mask);
    int fd = mkstemp(st->tmp_path);
    if (fd < 0) {
        fxa_io_set_error(err, errlen, "%s: cannot create a temporary file next to it: %s", path,
                         strerror(errno));
        memset(st, 0, sizeof *st);
        return FXA_ERR_IO;
    }
    fxa_status status = FXA_ERR_IO;
    if (fchmod(fd, 0666 & ~mask) != 0) {
        fxa_io_set_error(err, errlen, "%s: cannot set permissions of %s: %s", path, st->tmp_path,
                         strerror(errno));
        goto fail;
    }
    status = fxa_io_write_all(fd, head, head_len, path, err, errlen);
    if (status != FXA_OK) {
        goto fail;
    }
    status = fxa_io_write_all(fd, data, data_len, path, err, errlen);
    if (status != FXA_OK) {
        goto fail;
    }
    status = FXA_ERR_IO;
    if (fsync(fd) != 0) {
        fxa_io_set_error(err, errlen, "%s: fsync failed: %s", path, strerror(errno));
        goto fail;
    }
    int close_result = close(fd);
    fd = -1;
    if (close_result != 0) {
        fxa_io_set_error(err, errlen, "%s: close failed: %s", path, strerror(errno));
        goto fail;
    }
    st->active = 1;
    return FXA_OK;

fail:
    if (fd >= 0) {
        close(fd);
    }
    unlink(st->tmp_path);
    memset(st, 0, sizeof *st);
    return status;
}

/* The folder part of path ("." when there is none, "/" for "/x") into dir[cap];
 * 0 when it does not fit. */
static int folder_of(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    const size_t n = slash == NULL ? 1 : slash == path ? 1 : (size_t)(slash - path);
    if (n >= cap)
        return 0;
    memcpy(dir, slash == NULL ? "." : path, n);
    dir[n] = '\0';
    return 1;
}

/* The folder a new output file goes into exists, is a folder and takes new files. */
static fxa_status check_output_folder(const char *path, char *err, size_t errlen)
{
    char dir[sizeof((fxa_staged *)0)->tmp_path];
    struct stat sb;
    if (!folder_of(path, dir, sizeof dir)) {
        fxa_io_set_error(err, errlen, "%s: path is too long", path);
        return FXA_ERR_INVALID_ARG;
    }
    if (stat(dir, &sb) != 0) {
        fxa_io_set_error(err, errlen, "%s: its folder %s %s", path, dir,
                         errno == ENOENT ? "does not exist" : strerror(errno));
        return FXA_ERR_IO;
    }
    if (!S_ISDIR(sb.st_mode)) {
        fxa_io_set_error(err, errlen, "%s: %s is not a folder", path, dir);
        return FXA_ERR_IO;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        fxa_io_set_error(err, errlen, "%s: cannot create files in its folder %s: %s", path, dir,
                         strerror(errno));
        return FXA_ERR_IO;
    }
    return FXA_OK;
}

fxa_status fxa_output_check(const char *path, char *err, size_t errlen)
{
    fxa_io_clear_error(err, errlen);
    if (path == NULL || path[0] == '\0') {
        fxa_io_set_error(err, errlen, "npy writer: the output path is empty");
        return FXA_ERR_INVALID_ARG;
    }
    const size_t len = strlen(path);
    if (len + sizeof ".tmp.XXXXXX" > sizeof((fxa_staged *)0)->tmp_path) {
        fxa_io_set_error(err, errlen, "%.64s...: path is too long (%zu bytes)", path, len);
        return FXA_ERR_INVALID_ARG;
    }
    if (path[len - 1] == '/') {
        fxa_io_set_error(err, errlen, "%s: names a folder (ends with '/'), not a file", path);
        return FXA_ERR_INVALID_ARG;
    }
    char resolved[sizeof((fxa_staged *)0)->final_path];
    switch (resolve_link(path, resolved, sizeof resolved)) {
    case 1: return check_output_folder(resolved, err, errlen);
    case -1:
        fxa_io_set_error(err, errlen, "%s: cannot resolve the link to its file: %s", path,
                         strerror(errno));
        return FXA_ERR_IO;
    default: break;
    }
    struct stat sb;
    if (stat(path, &sb) != 0 && errno != ENOENT) {
        fxa_io_set_error(err, errlen, "%s: cannot use as an output: %s", path, strerror(errno));
        return FXA_ERR_IO;
    }
    if (stat(path, &sb) == 0) {
        if (S_ISDIR(sb.st_mode)) {
            fxa_io_set_error(err, errlen, "%s: is a folder", path);
            return FXA_ERR_IO;
        }
        if (!S_ISREG(sb.st_mode)) { /* written in place (the contract above) */
            if (access(path, W_OK) != 0) {
                fxa_io_set_error(err, errlen, "%s: cannot open for writing: %s", path,
                                 strerror(errno));
                return FXA_ERR_IO;
            }
            return FXA_OK;
        }
    }
    return check_output_folder(path, err, errlen);
}

fxa_status fxa_staged_commit(fxa_staged *st, char *err, size_t errlen)
{
    fxa_io_clear_error(err, errlen);
    if (st != NULL && st->direct) {
        memset(st, 0, sizeof *st);
        return FXA_OK;
    }
    if (st == NULL || !st->active) {
        fxa_io_set_error(err, errlen, "npy writer: nothing staged to commit");
        return FXA_ERR_INVALID_ARG;
    }
    fxa_status status = FXA_OK;
    if (rename(st->tmp_path, st->final_path) != 0) {
        fxa_io_set_error(err, errlen, "%s: cannot rename %s onto it: %s", st->final_path,
                         st->tmp_path, strerror(errno));
        unlink(st->tmp_path);
        status = FXA_ERR_IO;
    }
    memset(st, 0, sizeof *st);
    return status;
}

void fxa_staged_discard(fxa_staged *st)
{
    if (st == NULL) {
        return;
    }
    if (st->active) {
        unlink(st->tmp_path);
    }
    memset(st, 0, sizeof *st);
}

/* Keep the current content of a committed target under a fresh name in its
 * folder (a hard link, so the target itself never disappears). Returns 1 and
 * fills backup when there was a regular file, 0 when there was none, -1 on
 * failure. */
static int keep_backup(const char *path, char *backup, size_t backup_len)
{
    struct stat sb;
    if (lstat(path, &sb) != 0)
        return errno == ENOENT ? 0 : -1;
    if (!S_ISREG(sb.st_mode))
        return 0;
    int len = snprintf(backup, backup_len, "%s.bak.XXXXXX", path);
    if (len < 0 || (size_t)len >= backup_len)
        return -1;
    int fd = mkstemp(backup);
    if (fd < 0)
        return -1;
    close(fd);
    unlink(backup);
    return link(path, backup) == 0 ? 1 : -1;
}

fxa_status fxa_staged_commit_all(fxa_staged *const *st, int n, char *err, size_t errlen)
{
    enum { MAX_FILES = 8 };
    char backup[MAX_FILES][4096 + 16];
    int had_old[MAX_FILES] = {0};
    char final_path[MAX_FILES][4096];
    int done = 0;
    fxa_status status = FXA_OK;
    fxa_io_clear_error(err, errlen);
    if (st == NULL && n != 0) {
        fxa_io_set_error(err, errlen, "npy writer: no list of %d staged files given", n);
        return FXA_ERR_INVALID_ARG;
    }
    if (n < 0 || n > MAX_FILES) {
        fxa_io_set_error(err, errlen, "npy writer: cannot commit %d files at once (0..%d)", n,
                         MAX_FILES);
        status = FXA_ERR_INVALID_ARG;
        goto discard_rest;
    }
    for (int i = 0; i < n; i++) {
        if (st[i] == NULL) {
            fxa_io_set_error(err, errlen, "npy writer: staged file %d of %d is missing (NULL)", i,
                             n);
            status = FXA_ERR_INVALID_ARG;
            goto discard_rest;
        }
        for (int j = 0; j < i; j++) {
            if (st[j] == st[i] || (st[i]->final_path[0] != '\0' &&
                                   fxa_same_output(st[j]->final_path, st[i]->final_path))) {
                fxa_io_set_error(err, errlen, "npy writer: staged files %d and %d both target %s",
                                 j, i, st[i]->final_path);
                status = FXA_ERR_INVALID_ARG;
                goto discard_rest;
            }
        }
    }
    for (; done < n; done++) {
        if (st[done]->direct) {
            had_old[done] = -1; /* written in place: nothing to roll back */
            fxa_staged_commit(st[done], err, errlen);
            continue;
        }
        snprintf(final_path[done], sizeof final_path[done], "%s", st[done]->final_path);
        had_old[done] = keep_backup(final_path[done], backup[done], sizeof backup[done]);
        if (had_old[done] < 0) {
            fxa_io_set_error(err, errlen, "%s: cannot keep its previous content for a rollback: %s",
                             final_path[done], strerror(errno));
            status = FXA_ERR_IO;
            break;
        }
        status = fxa_staged_commit(st[done], err, errlen);
        if (status != FXA_OK) {
            if (had_old[done] == 1)
                unlink(backup[done]);
            break;
        }
    }
    for (int i = 0; i < done; i++) { /* roll back, or drop the backups */
        if (had_old[i] < 0)
            continue;
        if (status != FXA_OK) {
            if (had_old[i] == 1)
                rename(backup[i], final_path[i]);
            else
                unlink(final_path[i]);
        } else if (had_old[i] == 1) {
            unlink(backup[i]);
        }
    }
discard_rest:
    for (int i = done; i < n; i++)
        fxa_staged_discard(st[i]); /* NULL-safe */
    return status;
}
