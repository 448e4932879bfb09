/*
 * Memory this process may still use (fxa_available_memory, fxattn.h):
 * /proc/meminfo's MemAvailable, capped by the cgroup memory limit where one
 * is set (v2 memory.max - memory.current, v1 memory.limit_in_bytes -
 * memory.usage_in_bytes, each plus the cgroup's reclaimable inactive file
 * pages; the tightest from the process's cgroup up to the root).
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn.h"

/* The first number in file path (after key when key is not NULL: a line
 * "key value"); 0 when there is none ("max" included). */
static int read_u64(const char *path, const char *key, uint64_t *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[256];
    int ok = 0;
    const size_t klen = key ? strlen(key) : 0;
    while (!ok && fgets(line, sizeof line, f)) {
        const char *at = line;
        if (key) {
            if (strncmp(line, key, klen) != 0 || (line[klen] != ' ' && line[klen] != ':'))
                continue;
            at = line + klen + 1;
        }
        while (*at == ' ' || *at == '\t')
            at++;
        char *end;
        const unsigned long long v = strtoull(at, &end, 10);
        if (end != at) {
            *out = (uint64_t)v;
            ok = 1;
        }
        if (!key)
            break;
    }
    fclose(f);
    return ok;
}

/* limit - usage + inactive file pages for one cgroup folder, or UINT64_MAX
 * when it sets no limit. */
static uint64_t cgroup_room(const char *dir, int v2)
{
    char path[PATH_MAX + 64];
    uint64_t limit, usage = 0, inactive = 0;
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.max" : "memory.limit_in_bytes");
    if (!read_u64(path, NULL, &limit) || limit >= ((uint64_t)1 << 62))
        return UINT64_MAX;
    snprintf(path, sizeof path, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
    read_u64(path, NULL, &usage);
    snprintf(path, sizeof path, "%s/memory.stat", dir);
    read_u64(path, v2 ? "inactive_file" : "total_inactive_file", &inactive);
    usage = usage > inactive ? usage - inactive : 0;
    return limit > usage ? limit - usage : 0;
}

/* The tightest room from the cgroup folder root + rel up to root. */
static uint64_t cgroup_chain(const char *root, const char *rel, int v2)
{
    char dir[PATH_MAX];
    uint64_t room = UINT64_MAX;
    snprintf(dir, sizeof dir, "%s%s", root, rel);
    for (;;) {
        const uint64_t r = cgroup_room(dir, v2);
        room = r < room ? r : room;
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < strlen(root))
            break;
        *slash = '\0';
    }
    return room;
}

uint64_t fxa_available_memory(void)
{
    uint64_t kib;
    uint64_t room = read_u64("/proc/meminfo", "MemAvailable", &kib) ? kib * 1024 : UINT64_MAX;
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f)
        return room;
    char line[PATH_MAX];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':');
        char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *controllers = c1 + 1;
        const char *rel = c2 + 1;
        uint64_t r = UINT64_MAX;
        if (strcmp(line, "0") == 0 && *controllers == '\0')
            r = cgroup_chain("/sys/fs/cgroup", rel, 1);
        else if (strstr(controllers, "memory"))
            r = cgroup_chain("/sys/fs/cgroup/memory", rel, 0);
        room = r < room ? r : room;
    }
    fclose(f);
    return room;
}
