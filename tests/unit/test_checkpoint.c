/*
 * Unit test of src/io/checkpoint.c (fxattn_checkpoint.h): a single .safetensors file, a
 * sharded checkpoint through its index and through its folder, lazy opening of the shards
 * (counted), and one clear error for each kind of bad checkpoint: an index that points at the
 * wrong shard or at a missing one, a tensor in two shards, shard names that leave the folder,
 * duplicates, malformed or oversized JSON, folders with no way to choose. Works in a fresh
 * mkdtemp folder under /tmp, removed at the end. Prints each failed check, then
 * "test_checkpoint: ok N checks" when all pass.
 */
#define _POSIX_C_SOURCE 200809L

#include "fxattn_checkpoint.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_fixtures.h"
#include "testutil.h"

#define ERR_CAP 1024

/* ---- building files ------------------------------------------------------------------ */

/* g_dir/sub (created), into out. */
static void make_dir(char out[PATH_CAP], const char *sub)
{
    test_path_join(out, g_dir, sub);
    if (mkdir(out, 0700) != 0) {
        die(out);
    }
}

static void write_file(const char *dir, const char *name, const void *data, size_t n)
{
    char path[PATH_CAP];
    test_path_join(path, dir, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        die(path);
    }
}

static void write_text(const char *dir, const char *name, const char *text)
{
    write_file(dir, name, text, strlen(text));
}

/* The value every element of tensor `name` holds: its first byte, so that a read shows which
 * tensor it came from. */
static float value_of(const char *name)
{
    return (float)(unsigned char)name[0];
}

/* dir/name: a .safetensors file of the tensors names[0..n), each F32 of shape [2] filled with
 * value_of(its name), in the given order. */
static void write_shard(const char *dir, const char *name, const char *const *names, int n)
{
    char header[4096];
    size_t len = 0;
    len += (size_t)snprintf(header + len, sizeof header - len, "{");
    for (int i = 0; i < n; i++) {
        len +=
            (size_t)snprintf(header + len, sizeof header - len,
                             "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%d,%d]}",
                             i > 0 ? "," : "", names[i], 8 * i, 8 * i + 8);
    }
    len += (size_t)snprintf(header + len, sizeof header - len, "}");
    while (len % 8 != 0) {
        header[len++] = ' ';
    }
    unsigned char *file = malloc(8 + len + 8 * (size_t)n);
    if (file == NULL) {
        die("malloc");
    }
    for (int i = 0; i < 8; i++) {
        file[i] = (unsigned char)((uint64_t)len >> (8 * i));
    }
    memcpy(file + 8, header, len);
    for (int i = 0; i < n; i++) {
        const float v[2] = {value_of(names[i]), value_of(names[i])};
        memcpy(file + 8 + len + 8 * (size_t)i, v, sizeof v);
    }
    write_file(dir, name, file, 8 + len + 8 * (size_t)n);
    free(file);
}

/* ---- expectations -------------------------------------------------------------------- */

static fxa_ckpt *open_ok(const char *path)
{
    char err[ERR_CAP] = "untouched";
    fxa_ckpt *c = NULL;
    const fxa_status status = fxa_ckpt_open(path, &c, err, sizeof err);
    CHECK(status == FXA_OK && c != NULL, "%s: open failed (%d): %s", path, (int)status, err);
    CHECK(err[0] == '\0', "%s: err not cleared on success: %s", path, err);
    return c;
}

/* err starts with prefix and contains want. */
static void check_message(const char *what, const char *err, const char *prefix, const char *want)
{
    CHECK(strncmp(err, prefix, strlen(prefix)) == 0 && err[strlen(prefix)] == ':',
          "%s: message does not start with '%s:': %s", what, prefix, err);
    CHECK(strstr(err, want) != NULL, "%s: message lacks '%s': %s", what, want, err);
    CHECK(strchr(err, '\n') == NULL, "%s: message has a newline: %s", what, err);
}

/* Opening path fails with status, a message starting with path (or prefix when not NULL) and
 * holding want; also with a 16-byte and a NULL err. */
static void open_fails(const char *path, const char *prefix, fxa_status want_status,
                       const char *want)
{
    char err[ERR_CAP] = "";
    char small[16];
    fxa_ckpt *c = (fxa_ckpt *)&err; /* must be set to NULL */
    fxa_status status = fxa_ckpt_open(path, &c, err, sizeof err);
    CHECK(status == want_status, "%s: status %d, want %d (%s)", path, (int)status, (int)want_status,
          err);
    CHECK(c == NULL, "%s: *out not NULL on failure", path);
    check_message(path, err, prefix != NULL ? prefix : path, want);
    fxa_ckpt_close(c);
    status = fxa_ckpt_open(path, &c, small, sizeof small);
    CHECK(status == want_status && strlen(small) < sizeof small &&
              strncmp(small, err, strlen(small)) == 0,
          "%s: with a small err: status %d, '%s'", path, (int)status, small);
    fxa_ckpt_close(c);
    status = fxa_ckpt_open(path, &c, NULL, 0);
    CHECK(status == want_status && c == NULL, "%s: with no err: status %d", path, (int)status);
    fxa_ckpt_close(c);
}

/* name is found in c, in a shard of that file name, and reads as value_of(name). */
static void find_ok(fxa_ckpt *c, const char *name, const char *shard)
{
    char err[ERR_CAP] = "untouched";
    const fxa_st_file *f = NULL;
    const fxa_st_tensor *t = NULL;
    const fxa_status status = fxa_ckpt_find(c, name, &f, &t, err, sizeof err);
    CHECK(status == FXA_OK && f != NULL && t != NULL, "find '%s': status %d, %s", name, (int)status,
          err);
    if (status != FXA_OK || t == NULL) {
        return;
    }
    CHECK(err[0] == '\0', "find '%s': err not cleared: %s", name, err);
    CHECK(strcmp(t->name, name) == 0 && fxa_st_find(f, name) == t, "find '%s': got '%s'", name,
          t->name);
    float v[2] = {-1.0f, -1.0f};
    const fxa_status read = fxa_st_read_f32(f, t, v, 2, err, sizeof err);
    CHECK(read == FXA_OK && v[0] == value_of(name) && v[1] == value_of(name),
          "find '%s': read %d gives %g %g: %s", name, (int)read, (double)v[0], (double)v[1], err);
    int in_shard = 0;
    for (int64_t i = 0; i < fxa_ckpt_shard_count(c); i++) {
        in_shard |= strcmp(fxa_ckpt_shard_name(c, i), shard) == 0;
    }
    CHECK(in_shard, "find '%s': no shard '%s'", name, shard);
}

/* name is not in c: FXA_OK, NULL outputs, "<prefix>: no tensor '<name>'". */
static void find_missing(fxa_ckpt *c, const char *name, const char *prefix)
{
    char err[ERR_CAP] = "";
    char want[256];
    const fxa_st_file *f = (const fxa_st_file *)err;
    const fxa_st_tensor *t = (const fxa_st_tensor *)err;
    const fxa_status status = fxa_ckpt_find(c, name, &f, &t, err, sizeof err);
    CHECK(status == FXA_OK && f == NULL && t == NULL, "find missing '%s': status %d", name,
          (int)status);
    snprintf(want, sizeof want, "no tensor '%s'", name);
    check_message(name, err, prefix, want);
}

/* Finding name fails with status and a message starting with prefix, holding want. */
static void find_fails(fxa_ckpt *c, const char *name, fxa_status want_status, const char *prefix,
                       const char *want)
{
    char err[ERR_CAP] = "";
    const fxa_st_file *f = (const fxa_st_file *)err;
    const fxa_st_tensor *t = (const fxa_st_tensor *)err;
    const fxa_status status = fxa_ckpt_find(c, name, &f, &t, err, sizeof err);
    CHECK(status == want_status && f == NULL && t == NULL, "find '%s': status %d, want %d: %s",
          name, (int)status, (int)want_status, err);
    check_message(name, err, prefix, want);
}

/* ---- cases --------------------------------------------------------------------------- */

static void test_single_file(void)
{
    char dir[PATH_CAP];
    char path[PATH_CAP];
    static const char *const names[] = {"blocks.0.attn1.to_q.weight", "blocks.0.attn1.to_k.weight"};
    make_dir(dir, "single");
    write_shard(dir, "diffusion_pytorch_model.safetensors", names, 2);
    write_text(dir, "config.json.txt", "{}"); /* neither an index nor a .safetensors file */
    test_path_join(path, dir, "diffusion_pytorch_model.safetensors");

    /* The file itself, then its folder. */
    for (int pass = 0; pass < 2; pass++) {
        fxa_ckpt *c = open_ok(pass == 0 ? path : dir);
        if (c == NULL) {
            continue;
        }
        CHECK(fxa_ckpt_shard_count(c) == 1 && fxa_ckpt_shards_opened(c) == 1,
              "single: %lld shards, %lld opened", (long long)fxa_ckpt_shard_count(c),
              (long long)fxa_ckpt_shards_opened(c));
        CHECK(strcmp(fxa_ckpt_shard_name(c, 0), "diffusion_pytorch_model.safetensors") == 0,
              "single: shard name '%s'", fxa_ckpt_shard_name(c, 0));
        CHECK(fxa_ckpt_shard_name(c, 1) == NULL && fxa_ckpt_shard_name(c, -1) == NULL,
              "single: shard name out of range");
        find_ok(c, names[0], "diffusion_pytorch_model.safetensors");
        find_ok(c, names[1], "diffusion_pytorch_model.safetensors");
        find_missing(c, "blocks.0.self_attn.q.weight", path);
        fxa_ckpt_close(c);
    }

    /* A bad single file gives the safetensors reader's own message. */
    write_text(dir, "bad.safetensors", "short");
    test_path_join(path, dir, "bad.safetensors");
    open_fails(path, NULL, FXA_ERR_INVALID_ARG, "too short");
}

/* The folder "sharded": three shards and their index. */
static void write_sharded(char dir[PATH_CAP])
{
    static const char *const s1[] = {"a.weight", "b.weight"};
    static const char *const s2[] = {"c.weight"};
    static const char *const s3[] = {"d.weight", "e.bias"};
    make_dir(dir, "sharded");
    write_shard(dir, "m-00001-of-00003.safetensors", s1, 2);
    write_shard(dir, "m-00002-of-00003.safetensors", s2, 1);
    write_shard(dir, "m-00003-of-00003.safetensors", s3, 2);
    write_text(dir, "model.safetensors.index.json",
               "{\n  \"metadata\": {\"total_size\": 40, \"format\": [\"pt\", {\"x\": null}]},\n"
               "  \"weight_map\": {\n"
               "    \"e.bias\": \"m-00003-of-00003.safetensors\",\n"
               "    \"c.weight\": \"m-00002-of-00003.safetensors\",\n"
               "    \"a.weight\": \"m-00001-of-00003.safetensors\",\n"
               "    \"d.weight\": \"m-00003-of-00003.safetensors\",\n"
               "    \"b.weight\": \"m-0000\\u0031-of-00003.safetensors\"\n"
               "  },\n  \"other\": [1, 2.5e3, true]\n}\n");
}

static void test_sharded(void)
{
    char dir[PATH_CAP];
    char index[PATH_CAP];
    write_sharded(dir);
    test_path_join(index, dir, "model.safetensors.index.json");

    /* Through the index, then through the folder (which chooses the index). */
    for (int pass = 0; pass < 2; pass++) {
        fxa_ckpt *c = open_ok(pass == 0 ? index : dir);
        if (c == NULL) {
            continue;
        }
        CHECK(fxa_ckpt_shard_count(c) == 3, "sharded: %lld shards",
              (long long)fxa_ckpt_shard_count(c));
        CHECK(fxa_ckpt_shards_opened(c) == 0, "sharded: %lld opened at open",
              (long long)fxa_ckpt_shards_opened(c));
        for (int i = 0; i < 3; i++) {
            char want[64];
            snprintf(want, sizeof want, "m-0000%d-of-00003.safetensors", i + 1);
            const char *got = fxa_ckpt_shard_name(c, i);
            CHECK(got != NULL && strcmp(got, want) == 0, "sharded: shard %d is '%s'", i,
                  got != NULL ? got : "(null)");
        }
        find_ok(c, "c.weight", "m-00002-of-00003.safetensors");
        CHECK(fxa_ckpt_shards_opened(c) == 1, "lazy: %lld opened after one tensor",
              (long long)fxa_ckpt_shards_opened(c));
        find_ok(c, "c.weight", "m-00002-of-00003.safetensors");
        find_ok(c, "a.weight", "m-00001-of-00003.safetensors");
        find_ok(c, "b.weight", "m-00001-of-00003.safetensors");
        CHECK(fxa_ckpt_shards_opened(c) == 2, "lazy: %lld opened after two shards' tensors",
              (long long)fxa_ckpt_shards_opened(c));
        find_missing(c, "f.weight", index);
        find_missing(c, "", index);
        CHECK(fxa_ckpt_shards_opened(c) == 2, "lazy: an unknown name opened a shard");
        find_ok(c, "e.bias", "m-00003-of-00003.safetensors");
        find_ok(c, "d.weight", "m-00003-of-00003.safetensors");
        CHECK(fxa_ckpt_shards_opened(c) == 3, "lazy: %lld opened after all",
              (long long)fxa_ckpt_shards_opened(c));
        fxa_ckpt_close(c);
    }

    /* A relative path to the index: shards are found next to it. */
    char cwd[PATH_CAP];
    if (getcwd(cwd, sizeof cwd) == NULL || chdir(dir) != 0) {
        die("chdir");
    }
    fxa_ckpt *c = open_ok("model.safetensors.index.json");
    if (c != NULL) {
        find_ok(c, "d.weight", "m-00003-of-00003.safetensors");
        fxa_ckpt_close(c);
    }
    if (chdir(cwd) != 0) {
        die("chdir back");
    }
}

/* An index in its own folder `sub` with the given weight_map text, and one shard "s1.safetensors"
 * holding a.weight and b.weight; into index. */
static void write_case(const char *sub, const char *index_text, char index[PATH_CAP])
{
    static const char *const s1[] = {"a.weight", "b.weight"};
    char dir[PATH_CAP];
    make_dir(dir, sub);
    write_shard(dir, "s1.safetensors", s1, 2);
    write_text(dir, "model.safetensors.index.json", index_text);
    test_path_join(index, dir, "model.safetensors.index.json");
}

static void test_bad_shards(void)
{
    char index[PATH_CAP];
    char gone[PATH_CAP];

    /* The index puts x.weight in s1, which does not hold it. */
    write_case("wrong_shard",
               "{\"weight_map\": {\"a.weight\": \"s1.safetensors\", \"x.weight\": "
               "\"s1.safetensors\"}}",
               index);
    fxa_ckpt *c = open_ok(index);
    if (c != NULL) {
        find_ok(c, "a.weight", "s1.safetensors");
        find_fails(c, "x.weight", FXA_ERR_INVALID_ARG, index,
                   "tensor 'x.weight': the index puts it in shard 's1.safetensors', which does "
                   "not hold it");
        fxa_ckpt_close(c);
    }

    /* A missing shard: open succeeds (nothing but the index is read), find names the file. */
    write_case("missing_shard",
               "{\"weight_map\": {\"a.weight\": \"s1.safetensors\", \"z.weight\": "
               "\"gone.safetensors\"}}",
               index);
    c = open_ok(index);
    if (c != NULL) {
        test_path_join(gone, g_dir, "missing_shard/gone.safetensors: cannot open");
        find_fails(c, "z.weight", FXA_ERR_IO, index, gone);
        find_fails(c, "z.weight", FXA_ERR_IO, index, "No such file");
        CHECK(fxa_ckpt_shards_opened(c) == 0, "missing shard: %lld opened",
              (long long)fxa_ckpt_shards_opened(c));
        find_ok(c, "a.weight", "s1.safetensors");
        fxa_ckpt_close(c);
    }

    /* b.weight is in s1 and in s2; the index puts it in s1. */
    static const char *const s2[] = {"b.weight", "c.weight"};
    write_case("two_shards",
               "{\"weight_map\": {\"a.weight\": \"s1.safetensors\", \"b.weight\": "
               "\"s1.safetensors\", \"c.weight\": \"s2.safetensors\"}}",
               index);
    char dir[PATH_CAP];
    test_path_join(dir, g_dir, "two_shards");
    write_shard(dir, "s2.safetensors", s2, 2);
    c = open_ok(index);
    if (c != NULL) {
        find_ok(c, "a.weight", "s1.safetensors");
        find_fails(c, "c.weight", FXA_ERR_INVALID_ARG, index,
                   "tensor 'b.weight' is in two shards: the index puts it in 's1.safetensors', "
                   "and 's2.safetensors' holds it too");
        CHECK(fxa_ckpt_shards_opened(c) == 1, "two shards: %lld opened",
              (long long)fxa_ckpt_shards_opened(c));
        fxa_ckpt_close(c);
    }

    /* A shard that is a bad .safetensors file: its own message after the index's path. */
    write_case("bad_shard", "{\"weight_map\": {\"a.weight\": \"model.safetensors.index.json\"}}",
               index);
    c = open_ok(index);
    if (c != NULL) {
        find_fails(c, "a.weight", FXA_ERR_INVALID_ARG, index,
                   "model.safetensors.index.json: "
                   "header length");
        fxa_ckpt_close(c);
    }
}

static void test_shard_names(void)
{
    static const struct {
        const char *json; /* the shard name as written in the index */
        const char *want;
    } cases[] = {
        {"../s1.safetensors", "contains '/'"},
        {"/tmp/s1.safetensors", "contains '/'"},
        {"sub/s1.safetensors", "contains '/'"},
        {"..", "is not a file name"},
        {".", "is not a file name"},
        {"", "is empty"},
        {"s1\\u0000.safetensors", "contains the character U+0000"},
        {"..\\/s1.safetensors", "contains '/'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char sub[32];
        char text[256];
        char index[PATH_CAP];
        snprintf(sub, sizeof sub, "name%zu", i);
        snprintf(text, sizeof text, "{\"weight_map\": {\"a.weight\": \"%s\"}}", cases[i].json);
        write_case(sub, text, index);
        open_fails(index, NULL, FXA_ERR_INVALID_ARG, cases[i].want);
        open_fails(index, NULL, FXA_ERR_INVALID_ARG, "weight_map: tensor 'a.weight': shard file");
    }
    char longname[300];
    char text[400];
    char index[PATH_CAP];
    memset(longname, 'x', 256);
    longname[256] = '\0';
    snprintf(text, sizeof text, "{\"weight_map\": {\"a.weight\": \"%s\"}}", longname);
    write_case("long_name", text, index);
    open_fails(index, NULL, FXA_ERR_INVALID_ARG, "is longer than 255 bytes");
}

static void test_index_content(void)
{
    static const struct {
        const char *text;
        const char *want;
    } cases[] = {
        {"", "malformed JSON index at byte 0: expected a JSON value, found the end of the index"},
        {"{", "malformed JSON index at byte 1"},
        {"{\"weight_map\": {\"a.weight\": \"s1.safetensors\",}}", "malformed JSON index at byte"},
        {"{\"weight_map\": {\"a.weight\": \"s1.safetensors\"}} x",
         "'x' after the end of the JSON object (only whitespace may pad the index)"},
        {"{\"weight_map\": {\"a.weight\": \"s1\xff.safetensors\"}}", "invalid UTF-8"},
        {"{\"weight_map\": {\"a.weight\": \"\\ud800\"}}", "unpaired surrogate"},
        {"{\"metadata\": {\"n\": 01}, \"weight_map\": {}}", "leading zero"},
        {"[]", "index must be a JSON object, found an array"},
        {"{}", "no \"weight_map\""},
        {"{\"metadata\": {}}", "no \"weight_map\""},
        {"{\"weight_map\": {}}", "weight_map lists no tensors"},
        {"{\"weight_map\": []}", "weight_map must be an object mapping tensor names to shard "
                                 "file names, found an array"},
        {"{\"weight_map\": {\"a.weight\": 3}}",
         "weight_map: tensor 'a.weight': the shard must be a file name string, found a number"},
        {"{\"weight_map\": {\"a.weight\": null}}", "found null"},
        {"{\"weight_map\": {\"a.weight\": \"s1.safetensors\", \"a.weight\": "
         "\"s1.safetensors\"}}",
         "weight_map: duplicate tensor name 'a.weight'"},
        {"{\"weight_map\": {\"a.weight\": \"s1.safetensors\"}, \"weight_map\": {\"b.weight\": "
         "\"s1.safetensors\"}}",
         "duplicate key 'weight_map'"},
        {"{\"metadata\": {}, \"metadata\": {}, \"weight_map\": {\"a.weight\": "
         "\"s1.safetensors\"}}",
         "duplicate key 'metadata'"},
        {"{\"metadata\": \"x\", \"weight_map\": {\"a.weight\": \"s1.safetensors\"}}",
         "metadata must be an object, found a string"},
        {"{\"weight_map\": {\"a\\u0000b\": \"s1.safetensors\"}}",
         "tensor name 'a?b' contains the character U+0000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char sub[32];
        char index[PATH_CAP];
        snprintf(sub, sizeof sub, "json%zu", i);
        write_case(sub, cases[i].text, index);
        open_fails(index, NULL, FXA_ERR_INVALID_ARG, cases[i].want);
    }

    /* Nesting beyond FXA_ST_MAX_DEPTH inside metadata. */
    char deep[512];
    char index[PATH_CAP];
    size_t n = (size_t)snprintf(deep, sizeof deep, "{\"metadata\": ");
    for (int i = 0; i < FXA_ST_MAX_DEPTH; i++) {
        deep[n++] = '[';
    }
    for (int i = 0; i < FXA_ST_MAX_DEPTH; i++) {
        deep[n++] = ']';
    }
    snprintf(deep + n, sizeof deep - n, ", \"weight_map\": {\"a.weight\": \"s1.safetensors\"}}");
    write_case("deep", deep, index);
    open_fails(index, NULL, FXA_ERR_INVALID_ARG, "nesting deeper than 64 levels");

    /* A tensor name longer than FXA_ST_MAX_NAME_LEN. */
    char *text = malloc(FXA_ST_MAX_NAME_LEN + 100);
    if (text == NULL) {
        die("malloc");
    }
    n = (size_t)snprintf(text, 100, "{\"weight_map\": {\"");
    memset(text + n, 'w', FXA_ST_MAX_NAME_LEN + 1);
    n += FXA_ST_MAX_NAME_LEN + 1;
    snprintf(text + n, 60, "\": \"s1.safetensors\"}}");
    write_case("long_tensor", text, index);
    free(text);
    open_fails(index, NULL, FXA_ERR_INVALID_ARG, "bytes long; the limit is 4096");

    /* Larger than FXA_CKPT_MAX_INDEX_LEN (a sparse file): refused before it is read. */
    write_case("huge", "{}", index);
    if (truncate(index, (off_t)FXA_CKPT_MAX_INDEX_LEN + 1) != 0) {
        die("truncate");
    }
    open_fails(index, NULL, FXA_ERR_INVALID_ARG, "bytes; the limit is 67108864");
}

static void test_paths(void)
{
    char dir[PATH_CAP];
    char path[PATH_CAP];
    static const char *const s1[] = {"a.weight"};

    test_path_join(path, g_dir, "nothing_here");
    open_fails(path, NULL, FXA_ERR_IO, "cannot open: No such file or directory");
    test_path_join(path, g_dir, "nothing_here.json");
    open_fails(path, NULL, FXA_ERR_IO, "cannot open: No such file or directory");

    make_dir(dir, "empty");
    write_text(dir, "README.md", "not a checkpoint");
    open_fails(dir, NULL, FXA_ERR_INVALID_ARG,
               "no *.safetensors.index.json index and no *.safetensors file in the folder");

    make_dir(dir, "two_files");
    write_shard(dir, "b.safetensors", s1, 1);
    write_shard(dir, "a.safetensors", s1, 1);
    open_fails(dir, NULL, FXA_ERR_INVALID_ARG,
               "2 .safetensors files in the folder and no way to choose: 'a.safetensors' and "
               "'b.safetensors'");

    make_dir(dir, "two_indexes");
    write_shard(dir, "s1.safetensors", s1, 1);
    write_text(dir, "x.safetensors.index.json",
               "{\"weight_map\": {\"a.weight\": \"s1.safetensors\"}}");
    write_text(dir, "y.safetensors.index.json",
               "{\"weight_map\": {\"a.weight\": \"s1.safetensors\"}}");
    write_text(dir, "z.safetensors.index.json",
               "{\"weight_map\": {\"a.weight\": \"s1.safetensors\"}}");
    open_fails(dir, NULL, FXA_ERR_INVALID_ARG,
               "3 checkpoint indexes in the folder and no way to choose: "
               "'x.safetensors.index.json', 'y.safetensors.index.json' and "
               "'z.safetensors.index.json'");

    /* Many candidates: the first 8 named, then a count. */
    make_dir(dir, "many");
    for (int i = 0; i < 11; i++) {
        char name[32];
        snprintf(name, sizeof name, "w%02d.safetensors", i);
        write_shard(dir, name, s1, 1);
    }
    open_fails(dir, NULL, FXA_ERR_INVALID_ARG, "'w07.safetensors' and 3 more");

    /* An index given as a folder, and a shard that is a folder. */
    make_dir(dir, "dir.safetensors.index.json");
    open_fails(dir, NULL, FXA_ERR_INVALID_ARG, "no *.safetensors.index.json index");
    char index[PATH_CAP];
    write_case("shard_is_dir", "{\"weight_map\": {\"a.weight\": \"sub.safetensors\"}}", index);
    test_path_join(dir, g_dir, "shard_is_dir/sub.safetensors");
    if (mkdir(dir, 0700) != 0) {
        die(dir);
    }
    fxa_ckpt *c = open_ok(index);
    if (c != NULL) {
        find_fails(c, "a.weight", FXA_ERR_IO, index, "not a regular file");
        fxa_ckpt_close(c);
    }

    /* Arguments. */
    char err[ERR_CAP];
    const fxa_st_file *f = NULL;
    const fxa_st_tensor *t = NULL;
    CHECK(fxa_ckpt_open(NULL, &c, err, sizeof err) == FXA_ERR_INVALID_ARG, "open(NULL)");
    CHECK(fxa_ckpt_open(index, NULL, err, sizeof err) == FXA_ERR_INVALID_ARG, "open(out NULL)");
    CHECK(fxa_ckpt_find(NULL, "a", &f, &t, err, sizeof err) == FXA_ERR_INVALID_ARG, "find(NULL)");
    CHECK(fxa_ckpt_shard_count(NULL) == 0 && fxa_ckpt_shards_opened(NULL) == 0 &&
              fxa_ckpt_shard_name(NULL, 0) == NULL,
          "NULL queries");
    fxa_ckpt_close(NULL);
}

int main(void)
{
    scratch_dir_create("test_checkpoint");
    test_single_file();
    test_sharded();
    test_bad_shards();
    test_shard_names();
    test_index_content();
    test_paths();
    test_remove_tree(g_dir);
    return test_summary("test_checkpoint");
}
