/* Fixtures of the file tests (test_npy, test_safetensors, test_checkpoint, test_io_changed): a
 * scratch folder, fresh under /tmp and removed with test_remove_tree at the end; set-up
 * failures; fp32 .npy files written through the atomic writer; files no reader can read. */
#ifndef FXA_UNIT_FILE_FIXTURES_H
#define FXA_UNIT_FILE_FIXTURES_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fxattn_npy.h"
#include "testfiles.h"

#define PATH_CAP TEST_PATH_CAP

static char g_dir[PATH_CAP];        /* the scratch folder */
static const char *g_test = "test"; /* the test's name, for die() */

/* Test set-up that cannot go on (not a check of the code under test): prints what failed
 * with errno's message and exits 2. */
static inline _Noreturn void die(const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", g_test, what, strerror(errno));
    exit(2);
}

/* Makes g_dir a fresh folder /tmp/<test>.XXXXXX (dies when it cannot). */
static inline void scratch_dir_create(const char *test)
{
    g_test = test;
    snprintf(g_dir, sizeof g_dir, "/tmp/%s.XXXXXX", test);
    if (mkdtemp(g_dir) == NULL)
        die("mkdtemp");
}

/* data written to path as an fp32 .npy file of the given shape (fxa_npy_stage_f32, then
 * fxa_staged_commit): FXA_OK, or the first failure with its message in err. */
static inline fxa_status save_f32(const char *path, int ndim, const int64_t *shape,
                                  const float *data, char *err, size_t errlen)
{
    fxa_staged st;
    const fxa_status s = fxa_npy_stage_f32(path, ndim, shape, data, &st, err, errlen);
    return s == FXA_OK ? fxa_staged_commit(&st, err, errlen) : s;
}

/* A file a reader must refuse: its name in g_dir, the text that makes it bad (a header, a
 * dict) and a phrase the reader's message holds. */
typedef struct bad_text {
    const char *name;
    const char *text;
    const char *keyword;
} bad_text;

/* A reader's check that opening g_dir/name (or an absolute name) fails with status want and
 * a message holding keyword. */
typedef void (*reject_check)(const char *name, fxa_status want, const char *keyword);

/* What is not a readable regular file is refused with FXA_ERR_IO, saying why, by the reader
 * that expect_reject checks: a missing g_dir/does_not_exist<ext>, g_dir itself and a FIFO
 * g_dir/fifo<ext> (made here; its path into fifo). */
static inline void expect_unreadable(reject_check expect_reject, const char *ext,
                                     char fifo[PATH_CAP])
{
    char name[64];
    snprintf(name, sizeof name, "does_not_exist%s", ext);
    expect_reject(name, FXA_ERR_IO, strerror(ENOENT));
    expect_reject(g_dir, FXA_ERR_IO, "not a regular file");
    snprintf(name, sizeof name, "fifo%s", ext);
    test_path_join(fifo, g_dir, name);
    if (mkfifo(fifo, 0600) != 0)
        die(fifo);
    expect_reject(name, FXA_ERR_IO, "not a regular file");
}

#endif
