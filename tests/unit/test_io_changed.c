/*
 * Unit test of the readers' changed-file check (src/io/file_io.c,
 * fxa_io_check_unchanged): a .npy file, a .safetensors shard or a checkpoint
 * index rewritten while it is read is refused, never returned as a mix of old
 * and new bytes.
 *
 * The rewrite happens at a known point: this program defines pread, which the
 * readers (linked in statically) call instead of the C library's; it reads
 * with the system call and, on the chosen call, changes the file before
 * returning. The file's modification time is first set to a fixed time in the
 * past, so that an in-place rewrite of the same size changes it whatever the
 * clock's granularity.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "fxattn_checkpoint.h"
#include "fxattn_npy.h"
#include "fxattn_safetensors.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "file_fixtures.h"
#include "testutil.h"

/* The change to make, and on which pread call (1 = the first after arming). */
typedef enum { CHANGE_NONE, CHANGE_IN_PLACE, CHANGE_APPEND } change_kind;
static change_kind g_change;
static int g_calls_left;
static const char *g_target;

static void change_file(void)
{
    const int fd = open(g_target, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        die(g_target);
    }
    const char byte = 'x';
    const off_t at = g_change == CHANGE_APPEND ? lseek(fd, 0, SEEK_END) : 8;
    if (pwrite(fd, &byte, 1, at) != 1) {
        die("pwrite");
    }
    close(fd);
}

ssize_t pread(int fd, void *buf, size_t n, off_t offset)
{
    const ssize_t got = (ssize_t)syscall(SYS_pread64, fd, buf, n, offset);
    if (g_change != CHANGE_NONE && --g_calls_left == 0) {
        change_file();
        g_change = CHANGE_NONE;
    }
    return got;
}

/* Set path's modification time to 2001-01-01 and arm a change on the
 * call-th pread from now. */
static void arm(const char *path, change_kind kind, int call)
{
    const struct timespec times[2] = {{978307200, 0}, {978307200, 0}};
    if (utimensat(AT_FDCWD, path, times, 0) != 0) {
        die("utimensat");
    }
    g_target = path;
    g_change = kind;
    g_calls_left = call;
}

static void write_file(const char *path, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(bytes, 1, n, f) != n || fclose(f) != 0) {
        die(path);
    }
}

static void test_npy(void)
{
    char path[PATH_CAP];
    char err[512];
    float data[1024];
    for (int i = 0; i < 1024; i++)
        data[i] = (float)i;
    const int64_t shape[2] = {64, 16};
    fxa_npy a;
    test_path_join(path, g_dir, "x.npy");
    CHECK(save_f32(path, 2, shape, data, err, sizeof err) == FXA_OK, "write: %s", err);

    /* Unchanged: read as usual. */
    arm(path, CHANGE_NONE, 0);
    CHECK(fxa_npy_read(path, &a, err, sizeof err) == FXA_OK && a.count == 1024, "plain read: %s",
          err);
    fxa_npy_free(&a);

    /* Preamble, header, data: the change comes with the data read. */
    const change_kind kinds[2] = {CHANGE_IN_PLACE, CHANGE_APPEND};
    for (int i = 0; i < 2; i++) {
        CHECK(save_f32(path, 2, shape, data, err, sizeof err) == FXA_OK, "rewrite: %s", err);
        arm(path, kinds[i], 3);
        const fxa_status status = fxa_npy_read(path, &a, err, sizeof err);
        CHECK(status == FXA_ERR_IO && strstr(err, "changed while it was read") != NULL &&
                  strncmp(err, path, strlen(path)) == 0 && a.data == NULL,
              "npy %s during the read: status %d, %s", i ? "append" : "in-place write", (int)status,
              err);
        CHECK(save_f32(path, 2, shape, data, err, sizeof err) == FXA_OK, "rewrite: %s", err);
        arm(path, kinds[i], 3);
        CHECK(fxa_npy_read_slice(path, 0, 2, 3, &a, err, sizeof err) == FXA_ERR_IO &&
                  strstr(err, "changed while it was read") != NULL,
              "npy slice, %s during the read: %s", i ? "append" : "in-place write", err);
    }
    g_change = CHANGE_NONE;
}

/* A .safetensors file of one F32 tensor "w" of shape [4]. */
static void write_safetensors(const char *path)
{
    const char json[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
    const size_t n = sizeof json - 1;
    unsigned char bytes[8 + sizeof json + 16];
    for (int i = 0; i < 8; i++)
        bytes[i] = (unsigned char)(n >> (8 * i));
    memcpy(bytes + 8, json, n);
    const float w[4] = {1, 2, 3, 4};
    memcpy(bytes + 8 + n, w, sizeof w);
    write_file(path, bytes, 8 + n + sizeof w);
}

static void test_safetensors(void)
{
    char path[PATH_CAP];
    char err[512];
    float w[4];
    fxa_st_file *f = NULL;
    test_path_join(path, g_dir, "w.safetensors");
    write_safetensors(path);

    /* The header length, then the header: changed with the header read. */
    arm(path, CHANGE_IN_PLACE, 2);
    CHECK(fxa_st_open(path, &f, err, sizeof err) == FXA_ERR_IO && f == NULL &&
              strstr(err, "changed while it was read") != NULL,
          "safetensors header rewritten during the read: %s", err);
    g_change = CHANGE_NONE;

    /* Opened unchanged, then changed while a tensor is read. */
    write_safetensors(path);
    arm(path, CHANGE_NONE, 0);
    CHECK(fxa_st_open(path, &f, err, sizeof err) == FXA_OK, "open: %s", err);
    const fxa_st_tensor *t = fxa_st_find(f, "w");
    CHECK(t != NULL && fxa_st_read_f32(f, t, w, 4, err, sizeof err) == FXA_OK && w[3] == 4.0f,
          "plain tensor read: %s", err);
    g_target = path;
    g_change = CHANGE_IN_PLACE;
    g_calls_left = 1;
    CHECK(t != NULL && fxa_st_read_f32(f, t, w, 4, err, sizeof err) == FXA_ERR_IO &&
              strstr(err, "changed while it was read") != NULL,
          "tensor rewritten during the read: %s", err);
    g_change = CHANGE_NONE;
    fxa_st_close(f);
}

static void test_index(void)
{
    char shard[PATH_CAP];
    char index[PATH_CAP];
    char err[512];
    fxa_ckpt *c = NULL;
    test_path_join(shard, g_dir, "w.safetensors");
    write_safetensors(shard);
    test_path_join(index, g_dir, "model.safetensors.index.json");
    const char text[] = "{\"weight_map\": {\"w\": \"w.safetensors\"}}";
    write_file(index, text, sizeof text - 1);
    arm(index, CHANGE_NONE, 0);
    CHECK(fxa_ckpt_open(index, &c, err, sizeof err) == FXA_OK, "plain index: %s", err);
    fxa_ckpt_close(c);
    c = NULL;
    arm(index, CHANGE_APPEND, 1);
    CHECK(fxa_ckpt_open(index, &c, err, sizeof err) == FXA_ERR_IO && c == NULL &&
              strstr(err, "changed while it was read") != NULL,
          "index appended to during the read: %s", err);
    g_change = CHANGE_NONE;
}

int main(void)
{
    scratch_dir_create("test_io_changed");
    test_npy();
    test_safetensors();
    test_index();
    test_remove_tree(g_dir);
    return test_summary("test_io_changed");
}
