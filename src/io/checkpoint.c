/*
 * Hugging Face checkpoints, single-file or sharded (fxattn_checkpoint.h). The index is read
 * with the strict JSON parser of io/json.h: a syntax pass, then a schema walk that decodes the
 * weight_map's names into one arena; the shards are fxa_st_file objects opened on first use.
 */
#define _POSIX_C_SOURCE 200809L
#define _FILE_OFFSET_BITS 64

#include "fxattn_checkpoint.h"

#include "io/file_io.h"
#include "io/json.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SNIPPET_CAP 80
#define MAX_SHARD_NAME 255 /* NAME_MAX of Linux file systems */
#define MAX_LISTED 8       /* candidates named in a message about a folder */
#define INDEX_SUFFIX ".safetensors.index.json"
#define ST_SUFFIX ".safetensors"

typedef struct ck_entry {
    const char *name;  /* tensor name (in the arena) */
    const char *shard; /* its shard's file name (in the arena) */
    int64_t shard_i;   /* index into shards */
} ck_entry;

typedef struct ck_shard {
    const char *name; /* file name (in the arena, or in path for a single file) */
    char *path;       /* the index's folder joined with name */
    fxa_st_file *file;
} ck_shard;

struct fxa_ckpt {
    char *path;        /* the index or the single file, for messages */
    char *arena;       /* the index's decoded strings */
    ck_entry *entries; /* sorted by name; none for a single file */
    int64_t count;
    size_t cap;
    ck_shard *shards; /* sorted by name */
    int64_t shard_count;
    int64_t opened;
    int single; /* one .safetensors file: shards[0], opened at fxa_ckpt_open */
};

static int ends_with(const char *s, const char *suffix)
{
    const size_t n = strlen(s);
    const size_t m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

/* dir "/" name in new memory (no "/" when dir is empty, none doubled), or NULL. */
static char *join_path(const char *dir, size_t dir_len, const char *name)
{
    const int slash = dir_len > 0 && dir[dir_len - 1] != '/';
    const size_t n = strlen(name);
    char *out = malloc(dir_len + (size_t)slash + n + 1);
    if (out != NULL) {
        memcpy(out, dir, dir_len);
        if (slash) {
            out[dir_len] = '/';
        }
        memcpy(out + dir_len + (size_t)slash, name, n + 1);
    }
    return out;
}

static char *copy_string(const char *s)
{
    return join_path("", 0, s);
}

/* Length of path's folder part, with its last '/' (0 when path has none). */
static size_t dir_len(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash != NULL ? (size_t)(slash - path) + 1 : 0;
}

static int cmp_strings(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int cmp_entries(const void *a, const void *b)
{
    return strcmp(((const ck_entry *)a)->name, ((const ck_entry *)b)->name);
}

static const ck_entry *find_entry(const fxa_ckpt *c, const char *name)
{
    const ck_entry key = {name, NULL, 0};
    return bsearch(&key, c->entries, (size_t)c->count, sizeof *c->entries, cmp_entries);
}

/* ------------------------------------------------------------------------ */
/* The index                                                                 */
/* ------------------------------------------------------------------------ */

/* A tensor name of the weight_map (decoded, len bytes). */
static int check_tensor_name(fxa_jp *p, const char *name, size_t len)
{
    char shown[SNIPPET_CAP];
    fxa_io_snippet(name, len, shown, sizeof shown);
    if (len > FXA_ST_MAX_NAME_LEN) {
        return fxa_jp_fail(p, "weight_map: tensor name '%s' is %zu bytes long; the limit is %d",
                           shown, len, FXA_ST_MAX_NAME_LEN);
    }
    if (memchr(name, '\0', len) != NULL) {
        return fxa_jp_fail(p, "weight_map: tensor name '%s' contains the character U+0000", shown);
    }
    return 0;
}

/* The shard file name of tensor `tensor` (decoded, len bytes): a plain name in the index's
 * folder. */
static int check_shard_name(fxa_jp *p, const char *tensor, const char *name, size_t len)
{
    char shown[SNIPPET_CAP];
    const char *why = NULL;
    fxa_io_snippet(name, len, shown, sizeof shown);
    if (len == 0) {
        why = "is empty";
    } else if (memchr(name, '\0', len) != NULL) {
        why = "contains the character U+0000";
    } else if (memchr(name, '/', len) != NULL) {
        why = "contains '/' (a shard must be a file in the index's folder)";
    } else if (strcmp(name, ".") == 0 || strcmp(name, "..") == 0) {
        why = "is not a file name";
    } else if (len > MAX_SHARD_NAME) {
        why = "is longer than 255 bytes";
    }
    if (why != NULL) {
        return fxa_jp_fail(p, "weight_map: tensor '%s': shard file name '%s' %s", tensor, shown,
                           why);
    }
    return 0;
}

/* One weight_map member: tensor name -> shard file name. */
static int weight_map_member(fxa_jp *p, const char *name, size_t name_len, void *user)
{
    fxa_ckpt *c = user;
    const char *shard;
    size_t shard_len;
    char shown[SNIPPET_CAP];
    if (check_tensor_name(p, name, name_len) != 0) {
        return -1;
    }
    fxa_jp_keep(p, name_len);
    fxa_io_snippet(name, name_len, shown, sizeof shown);
    if (c->count == FXA_CKPT_MAX_TENSORS) {
        return fxa_jp_fail(p, "weight_map lists more than %d tensors", FXA_CKPT_MAX_TENSORS);
    }
    if (fxa_jp_peek(p) != '"') {
        return fxa_jp_fail(p,
                           "weight_map: tensor '%s': the shard must be a file name string, "
                           "found %s",
                           shown, fxa_json_value_kind(fxa_jp_peek(p)));
    }
    if (fxa_jp_string(p, &shard, &shard_len) != 0 ||
        check_shard_name(p, shown, shard, shard_len) != 0) {
        return -1;
    }
    fxa_jp_keep(p, shard_len);
    if (c->count == (int64_t)c->cap) {
        const size_t cap = c->cap == 0 ? 64 : c->cap * 2;
        ck_entry *grown = realloc(c->entries, cap * sizeof *grown);
        if (grown == NULL) {
            return fxa_jp_out_of_memory(p);
        }
        c->entries = grown;
        c->cap = cap;
    }
    c->entries[c->count].name = name;
    c->entries[c->count].shard = shard;
    c->entries[c->count].shard_i = -1;
    c->count++;
    return 0;
}

typedef struct index_walk {
    fxa_ckpt *c;
    int seen_map;
    int seen_meta;
} index_walk;

/* One member of the index object: weight_map read, metadata and the rest skipped. The key is
 * not kept: the value's strings may overwrite it. */
static int index_member(fxa_jp *p, const char *key, size_t key_len, void *user)
{
    index_walk *w = user;
    const int is_map = key_len == 10 && memcmp(key, "weight_map", 10) == 0;
    const int is_meta = key_len == 8 && memcmp(key, "metadata", 8) == 0;
    if ((is_map && w->seen_map) || (is_meta && w->seen_meta)) {
        return fxa_jp_fail(p, "duplicate key '%s'", is_map ? "weight_map" : "metadata");
    }
    w->seen_map |= is_map;
    w->seen_meta |= is_meta;
    if (is_meta && fxa_jp_peek(p) != '{') {
        return fxa_jp_fail(p, "metadata must be an object, found %s",
                           fxa_json_value_kind(fxa_jp_peek(p)));
    }
    if (is_map) {
        return fxa_jp_object(p,
                             "weight_map must be an object mapping tensor names to shard file "
                             "names",
                             weight_map_member, w->c);
    }
    return fxa_jp_skip_value(p);
}

/* Schema pass over the whole index (its syntax already checked). */
static int parse_index(fxa_jp *p, fxa_ckpt *c)
{
    index_walk w = {.c = c};
    fxa_jp_skip_ws(p);
    if (fxa_jp_object(p, "index must be a JSON object", index_member, &w) != 0) {
        return -1;
    }
    if (!w.seen_map) {
        return fxa_jp_fail(p, "no \"weight_map\" (not a sharded checkpoint index)");
    }
    if (c->count == 0) {
        return fxa_jp_fail(p, "weight_map lists no tensors");
    }
    return 0;
}

/* After the schema pass: unique names, the distinct shards (sorted) with their paths, and each
 * entry's shard. */
static fxa_status finish_index(const fxa_msg *msg, fxa_ckpt *c)
{
    const size_t n = (size_t)c->count;
    char shown[SNIPPET_CAP];
    qsort(c->entries, n, sizeof *c->entries, cmp_entries);
    for (size_t i = 1; i < n; i++) {
        if (strcmp(c->entries[i - 1].name, c->entries[i].name) == 0) {
            fxa_io_snippet(c->entries[i].name, strlen(c->entries[i].name), shown, sizeof shown);
            fxa_msg_fail(msg, "weight_map: duplicate tensor name '%s'", shown);
            return FXA_ERR_INVALID_ARG;
        }
    }
    const char **names = malloc(n * sizeof *names);
    if (names == NULL) {
        fxa_msg_fail(msg, "out of memory for %zu tensors", n);
        return FXA_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < n; i++) {
        names[i] = c->entries[i].shard;
    }
    qsort(names, n, sizeof *names, cmp_strings);
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++) {
        if (distinct == 0 || strcmp(names[distinct - 1], names[i]) != 0) {
            names[distinct++] = names[i];
        }
    }
    c->shards = calloc(distinct, sizeof *c->shards);
    fxa_status status = c->shards != NULL ? FXA_OK : FXA_ERR_NO_MEMORY;
    const size_t folder = dir_len(c->path);
    for (size_t i = 0; status == FXA_OK && i < distinct; i++) {
        c->shards[i].name = names[i];
        c->shards[i].path = join_path(c->path, folder, names[i]);
        c->shard_count++;
        if (c->shards[i].path == NULL) {
            status = FXA_ERR_NO_MEMORY;
        }
    }
    for (size_t i = 0; status == FXA_OK && i < n; i++) {
        const char *const *at =
            bsearch(&c->entries[i].shard, names, distinct, sizeof *names, cmp_strings);
        c->entries[i].shard_i = (int64_t)(at - names);
    }
    free(names);
    if (status != FXA_OK) {
        fxa_msg_fail(msg, "out of memory for %zu shards", distinct);
    }
    return status;
}

/* Read the index at c->path and build the tensor and shard tables. */
static fxa_status open_index(fxa_ckpt *c, char *err, size_t errlen)
{
    const fxa_msg msg = {c->path, err, errlen};
    struct stat st;
    unsigned char *text = NULL;
    fxa_status status = FXA_ERR_IO;
    char open_why[128];
    const int fd = fxa_io_open_regular(c->path, &st, open_why, sizeof open_why);
    if (fd < 0) {
        fxa_msg_fail(&msg, "%s", open_why);
        return FXA_ERR_IO;
    }
    status = FXA_ERR_INVALID_ARG;
    if (st.st_size > FXA_CKPT_MAX_INDEX_LEN) {
        fxa_msg_fail(&msg, "index is %" PRId64 " bytes; the limit is %d", (int64_t)st.st_size,
                     FXA_CKPT_MAX_INDEX_LEN);
        goto done;
    }
    const size_t len = (size_t)st.st_size;
    text = malloc(len + 1);
    c->arena = malloc(len + 1);
    if (text == NULL || c->arena == NULL) {
        fxa_msg_fail(&msg, "out of memory for a %zu-byte index", len);
        status = FXA_ERR_NO_MEMORY;
        goto done;
    }
    char why[256];
    status = fxa_io_pread_all(fd, text, len, 0, "the index", why, sizeof why);
    if (status == FXA_OK) {
        const fxa_io_stamp before = fxa_io_stamp_of(&st);
        status = fxa_io_check_unchanged(fd, &before, why, sizeof why);
    }
    if (status != FXA_OK) {
        fxa_msg_fail(&msg, "%s", why);
        goto done;
    }
    fxa_jp p;
    fxa_jp_init(&p, &msg, "index", FXA_ST_MAX_DEPTH, text, len);
    if (fxa_jp_check_syntax(&p) != 0) {
        status = p.status;
        goto done;
    }
    p.pos = 0;
    p.arena = c->arena;
    p.arena_cap = len + 1;
    if (parse_index(&p, c) != 0) {
        status = p.status;
        goto done;
    }
    status = finish_index(&msg, c);

done:
    free(text);
    close(fd);
    return status;
}

/* ------------------------------------------------------------------------ */
/* Folders                                                                   */
/* ------------------------------------------------------------------------ */

/* "'a', 'b' and 'c'" (the first MAX_LISTED, then "and N more") into out[cap]. */
static void list_names(char *const *names, size_t n, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n && i < MAX_LISTED && len < cap; i++) {
        char shown[SNIPPET_CAP];
        fxa_io_snippet(names[i], strlen(names[i]), shown, sizeof shown);
        const char *sep = i == 0 ? "" : (i + 1 == n ? " and " : ", ");
        const int w = snprintf(out + len, cap - len, "%s'%s'", sep, shown);
        len += w > 0 ? (size_t)w : 0;
    }
    if (n > MAX_LISTED && len < cap) {
        snprintf(out + len, cap - len, " and %zu more", n - MAX_LISTED);
    }
}

/* The file of folder `dir` to open: its only index, else its only .safetensors file
 * (*chosen: new memory holding dir "/" name). */
static fxa_status choose_in_folder(const char *dir, char **chosen, char *err, size_t errlen)
{
    const fxa_msg msg = {dir, err, errlen};
    char **found[2] = {NULL, NULL}; /* indexes, .safetensors files */
    size_t count[2] = {0, 0};
    size_t cap[2] = {0, 0};
    fxa_status status = FXA_OK;
    DIR *d = opendir(dir);
    if (d == NULL) {
        fxa_msg_fail(&msg, "cannot open the folder: %s", strerror(errno));
        return FXA_ERR_IO;
    }
    for (;;) {
        errno = 0;
        const struct dirent *e = readdir(d);
        if (e == NULL) {
            if (errno != 0) {
                fxa_msg_fail(&msg, "cannot read the folder: %s", strerror(errno));
                status = FXA_ERR_IO;
            }
            break;
        }
        const int kind = ends_with(e->d_name, INDEX_SUFFIX) ? 0
                         : ends_with(e->d_name, ST_SUFFIX)  ? 1
                                                            : -1;
        if (kind < 0) {
            continue;
        }
        if (count[kind] == cap[kind]) {
            const size_t grown_cap = cap[kind] == 0 ? 8 : cap[kind] * 2;
            char **grown = realloc(found[kind], grown_cap * sizeof *grown);
            if (grown == NULL) {
                status = FXA_ERR_NO_MEMORY;
                break;
            }
            found[kind] = grown;
            cap[kind] = grown_cap;
        }
        found[kind][count[kind]] = copy_string(e->d_name);
        if (found[kind][count[kind]] == NULL) {
            status = FXA_ERR_NO_MEMORY;
            break;
        }
        count[kind]++;
    }
    closedir(d);
    if (status == FXA_ERR_NO_MEMORY) {
        fxa_msg_fail(&msg, "out of memory while listing the folder");
    }
    const int kind = count[0] > 0 ? 0 : 1;
    if (status == FXA_OK && count[kind] == 0) {
        fxa_msg_fail(&msg, "no *%s index and no *%s file in the folder", INDEX_SUFFIX, ST_SUFFIX);
        status = FXA_ERR_INVALID_ARG;
    } else if (status == FXA_OK && count[kind] > 1) {
        char listed[1024];
        qsort(found[kind], count[kind], sizeof *found[kind], cmp_strings);
        list_names(found[kind], count[kind], listed, sizeof listed);
        fxa_msg_fail(&msg, "%zu %s in the folder and no way to choose: %s (give the file)",
                     count[kind], kind == 0 ? "checkpoint indexes" : ".safetensors files", listed);
        status = FXA_ERR_INVALID_ARG;
    }
    if (status == FXA_OK) {
        *chosen = join_path(dir, strlen(dir), found[kind][0]);
        if (*chosen == NULL) {
            fxa_msg_fail(&msg, "out of memory");
            status = FXA_ERR_NO_MEMORY;
        }
    }
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < count[k]; i++) {
            free(found[k][i]);
        }
        free(found[k]);
    }
    return status;
}

/* ------------------------------------------------------------------------ */
/* Open, find, close                                                         */
/* ------------------------------------------------------------------------ */

fxa_status fxa_ckpt_open(const char *path, fxa_ckpt **out, char *err, size_t errlen)
{
    const fxa_msg msg = {path != NULL ? path : "(null)", err, errlen};
    struct stat st;
    fxa_io_clear_error(err, errlen);
    if (out == NULL || path == NULL) {
        fxa_msg_fail(&msg, "no path or no output given");
        return FXA_ERR_INVALID_ARG;
    }
    *out = NULL;
    if (path[0] == '\0') {
        fxa_msg_fail(&msg, "the path is empty");
        return FXA_ERR_INVALID_ARG;
    }
    fxa_ckpt *c = calloc(1, sizeof *c);
    if (c == NULL) {
        fxa_msg_fail(&msg, "out of memory");
        return FXA_ERR_NO_MEMORY;
    }
    fxa_status status = FXA_OK;
    if (stat(path, &st) != 0) {
        fxa_msg_fail(&msg, "cannot open: %s", strerror(errno));
        status = FXA_ERR_IO;
    } else if (S_ISDIR(st.st_mode)) {
        status = choose_in_folder(path, &c->path, err, errlen);
    } else {
        c->path = copy_string(path);
        if (c->path == NULL) {
            fxa_msg_fail(&msg, "out of memory");
            status = FXA_ERR_NO_MEMORY;
        }
    }
    if (status == FXA_OK && ends_with(c->path, ".json")) {
        status = open_index(c, err, errlen);
    } else if (status == FXA_OK) {
        c->single = 1;
        c->shards = calloc(1, sizeof *c->shards);
        if (c->shards == NULL) {
            fxa_msg_fail(&msg, "out of memory");
            status = FXA_ERR_NO_MEMORY;
        } else {
            c->shard_count = 1;
            c->shards[0].name = c->path + dir_len(c->path);
            status = fxa_st_open(c->path, &c->shards[0].file, err, errlen);
            c->opened = status == FXA_OK ? 1 : 0;
        }
    }
    if (status != FXA_OK) {
        fxa_ckpt_close(c);
        return status;
    }
    fxa_io_clear_error(err, errlen);
    *out = c;
    return FXA_OK;
}

/* Open shard i and check it against the index: every tensor it holds that the index lists is
 * listed under it. Messages: "<index>: <the shard's own message>" or "<index>: ...". */
static fxa_status open_shard(fxa_ckpt *c, int64_t i, char *err, size_t errlen)
{
    const fxa_msg msg = {c->path, err, errlen};
    ck_shard *s = &c->shards[i];
    char *tail = NULL;
    size_t tail_len = 0;
    if (err != NULL && errlen > 0) {
        const int n = snprintf(err, errlen, "%s: ", c->path);
        if (n > 0 && (size_t)n < errlen) {
            tail = err + n;
            tail_len = errlen - (size_t)n;
        }
    }
    fxa_st_file *f = NULL;
    const fxa_status status = fxa_st_open(s->path, &f, tail, tail_len);
    if (status != FXA_OK) {
        return status;
    }
    for (int64_t k = 0; k < fxa_st_count(f); k++) {
        const fxa_st_tensor *t = fxa_st_at(f, k);
        const ck_entry *e = find_entry(c, t->name);
        if (e != NULL && e->shard_i != i) {
            char name[SNIPPET_CAP];
            char listed[SNIPPET_CAP];
            char holder[SNIPPET_CAP];
            fxa_io_snippet(t->name, strlen(t->name), name, sizeof name);
            fxa_io_snippet(e->shard, strlen(e->shard), listed, sizeof listed);
            fxa_io_snippet(s->name, strlen(s->name), holder, sizeof holder);
            fxa_msg_fail(&msg,
                         "tensor '%s' is in two shards: the index puts it in '%s', and '%s' "
                         "holds it too",
                         name, listed, holder);
            fxa_st_close(f);
            return FXA_ERR_INVALID_ARG;
        }
    }
    fxa_io_clear_error(err, errlen);
    s->file = f;
    c->opened++;
    return FXA_OK;
}

fxa_status fxa_ckpt_find(fxa_ckpt *c, const char *name, const fxa_st_file **file,
                         const fxa_st_tensor **t, char *err, size_t errlen)
{
    const fxa_msg msg = {c != NULL ? c->path : "(null)", err, errlen};
    char shown[SNIPPET_CAP];
    fxa_io_clear_error(err, errlen);
    if (file != NULL) {
        *file = NULL;
    }
    if (t != NULL) {
        *t = NULL;
    }
    if (c == NULL || name == NULL || file == NULL || t == NULL) {
        fxa_msg_fail(&msg, "no checkpoint, name or output given");
        return FXA_ERR_INVALID_ARG;
    }
    fxa_io_snippet(name, strlen(name), shown, sizeof shown);
    const ck_entry *e = c->single ? NULL : find_entry(c, name);
    const int64_t i = c->single ? 0 : e != NULL ? e->shard_i : -1;
    if (i < 0) {
        fxa_msg_fail(&msg, "no tensor '%s'", shown);
        return FXA_OK;
    }
    if (c->shards[i].file == NULL) {
        const fxa_status status = open_shard(c, i, err, errlen);
        if (status != FXA_OK) {
            return status;
        }
    }
    const fxa_st_tensor *found = fxa_st_find(c->shards[i].file, name);
    if (found == NULL && c->single) {
        fxa_msg_fail(&msg, "no tensor '%s'", shown);
        return FXA_OK;
    }
    if (found == NULL) {
        char shard[SNIPPET_CAP];
        fxa_io_snippet(e->shard, strlen(e->shard), shard, sizeof shard);
        fxa_msg_fail(&msg, "tensor '%s': the index puts it in shard '%s', which does not hold it",
                     shown, shard);
        return FXA_ERR_INVALID_ARG;
    }
    *file = c->shards[i].file;
    *t = found;
    return FXA_OK;
}

int64_t fxa_ckpt_shard_count(const fxa_ckpt *c)
{
    return c != NULL ? c->shard_count : 0;
}

const char *fxa_ckpt_shard_name(const fxa_ckpt *c, int64_t i)
{
    if (c == NULL || i < 0 || i >= c->shard_count) {
        return NULL;
    }
    return c->shards[i].name;
}

int64_t fxa_ckpt_shards_opened(const fxa_ckpt *c)
{
    return c != NULL ? c->opened : 0;
}

void fxa_ckpt_close(fxa_ckpt *c)
{
    if (c == NULL) {
        return;
    }
    for (int64_t i = 0; i < c->shard_count; i++) {
        fxa_st_close(c->shards[i].file);
        free(c->shards[i].path);
    }
    free(c->shards);
    free(c->entries);
    free(c->arena);
    free(c->path);
    free(c);
}
