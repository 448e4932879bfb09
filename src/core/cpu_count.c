/* How many CPUs this process may use (see cpu_count.h). */
#include "cpu_count.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fxattn.h"

unsigned char *fxa_affinity_mask(size_t *n_bytes)
{
    /* Grow the set until the kernel accepts its size (EINVAL: too small). */
    for (size_t n_cpus = 1024; n_cpus <= ((size_t)1 << 20); n_cpus *= 2) {
        const size_t size = CPU_ALLOC_SIZE(n_cpus);
        cpu_set_t *set = CPU_ALLOC(n_cpus);
        if (!set)
            return NULL;
        CPU_ZERO_S(size, set);
        if (sched_getaffinity(0, size, set) == 0) {
            unsigned char *bits = calloc(size, 1);
            if (bits)
                for (size_t c = 0; c < size * 8; c++)
                    if (CPU_ISSET_S(c, size, set))
                        bits[c / 8] |= (unsigned char)(1u << (c % 8));
            CPU_FREE(set);
            *n_bytes = size;
            return bits;
        }
        CPU_FREE(set);
        if (errno != EINVAL)
            return NULL;
    }
    return NULL;
}

static int affinity_count(void)
{
    size_t n = 0;
    unsigned char *bits = fxa_affinity_mask(&n);
    int count = 0;
    if (!bits)
        return 0;
    for (size_t i = 0; i < n; i++)
        count += __builtin_popcount(bits[i]);
    free(bits);
    return count;
}

/* Whether the comma-separated list `list` holds `word`. */
static int has_word(const char *list, const char *word)
{
    const size_t n = strlen(word);
    for (const char *s = list; s && *s;) {
        const char *end = strchr(s, ',');
        const size_t len = end ? (size_t)(end - s) : strcspn(s, "\n");
        if (len == n && strncmp(s, word, n) == 0)
            return 1;
        s = end ? end + 1 : NULL;
    }
    return 0;
}

/* What a line scan looks for (which hierarchy) and where it puts what it finds (cap bytes
 * each). */
typedef struct line_find {
    int v2;
    char *first;
    char *second;
    size_t cap;
} line_find;

/* Scan file `path` line by line until match(line, find) takes one: 1 then, else 0. */
static int scan_lines(const char *path, int (*match)(char *line, const line_find *find),
                      const line_find *find)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    int found = 0;
    if (!f)
        return 0;
    while (!found && fgets(line, sizeof line, f))
        found = match(line, find);
    fclose(f);
    return found;
}

/* A /proc/self/cgroup line of the hierarchy: v2's (the "0::" line) or the v1 one holding the
 * cpu controller; its cgroup into find->first. */
static int cgroup_line(char *line, const line_find *find)
{
    char *c1 = strchr(line, ':');
    char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2)
        return 0;
    *c2 = '\0';
    const int is_v2 = c1 == line + 1 && line[0] == '0' && c2 == c1 + 1;
    if (!(find->v2 ? is_v2 : (!is_v2 && has_word(c1 + 1, "cpu"))))
        return 0;
    snprintf(find->first, find->cap, "%.*s", (int)strcspn(c2 + 1, "\n"), c2 + 1);
    return 1;
}

/* A /proc/self/mountinfo line of that hierarchy's mount: its root inside the hierarchy into
 * find->first, its mount point into find->second. */
static int mount_line(char *line, const line_find *find)
{
    /* id parent major:minor root point options [tags] - fstype source super */
    char r[1024];
    char p[1024];
    const char *dash = strstr(line, " - ");
    char fstype[64];
    char super[1024];
    if (!dash || sscanf(line, "%*s %*s %*s %1023s %1023s", r, p) != 2 ||
        sscanf(dash + 3, "%63s %*s %1023s", fstype, super) != 2)
        return 0;
    if (!(find->v2 ? strcmp(fstype, "cgroup2") == 0
                   : (strcmp(fstype, "cgroup") == 0 && has_word(super, "cpu"))))
        return 0;
    snprintf(find->first, find->cap, "%s", r);
    snprintf(find->second, find->cap, "%s", p);
    return 1;
}

/* The CPU quota set in one cgroup folder (0 when none): cpu.max (v2) or
 * cpu.cfs_quota_us / cpu.cfs_period_us (v1). */
static double folder_quota(const char *dir, int v2)
{
    char name[4200];
    double quota = 0;
    double period = 0;
    if (v2) {
        char q[32] = "";
        snprintf(name, sizeof name, "%s/cpu.max", dir);
        FILE *f = fopen(name, "r");
        if (!f)
            return 0;
        const int n = fscanf(f, "%31s %lf", q, &period);
        fclose(f);
        if (n != 2 || strcmp(q, "max") == 0)
            return 0;
        quota = strtod(q, NULL);
    } else {
        snprintf(name, sizeof name, "%s/cpu.cfs_quota_us", dir);
        FILE *f = fopen(name, "r");
        if (!f)
            return 0;
        const int n = fscanf(f, "%lf", &quota);
        fclose(f);
        snprintf(name, sizeof name, "%s/cpu.cfs_period_us", dir);
        f = fopen(name, "r");
        if (!f || n != 1)
            return f ? (fclose(f), 0) : 0;
        const int m = fscanf(f, "%lf", &period);
        fclose(f);
        if (m != 1)
            return 0;
    }
    return quota > 0 && period > 0 ? quota / period : 0;
}

/* The tightest quota from the process's cgroup up to the mount point. */
static double hierarchy_quota(const char *proc_cgroup, const char *mountinfo, int v2)
{
    char path[1024];
    char root[1024];
    char point[1024];
    char dir[2100];
    double best = 0;
    const line_find cgroup = {v2, path, NULL, sizeof path};
    const line_find mount = {v2, root, point, sizeof point};
    if (!scan_lines(proc_cgroup, cgroup_line, &cgroup) ||
        !scan_lines(mountinfo, mount_line, &mount))
        return 0;
    /* The mount shows the hierarchy from `root` down: strip that prefix. */
    const char *rel = path;
    const size_t rl = strlen(root);
    if (strcmp(root, "/") != 0 && strncmp(path, root, rl) == 0 &&
        (path[rl] == '/' || path[rl] == '\0'))
        rel = path + rl;
    snprintf(dir, sizeof dir, "%s%s", point, strcmp(rel, "/") == 0 ? "" : rel);
    const size_t floor_len = strlen(point);
    for (;;) {
        const double q = folder_quota(dir, v2);
        if (q > 0 && (best == 0 || q < best))
            best = q;
        char *slash = strrchr(dir, '/');
        if (strlen(dir) <= floor_len || !slash || (size_t)(slash - dir) < floor_len)
            break;
        *slash = '\0';
    }
    return best;
}

double fxa_cgroup_cpu_quota(const char *proc_cgroup, const char *mountinfo)
{
    const double q2 = hierarchy_quota(proc_cgroup, mountinfo, 1);
    const double q1 = hierarchy_quota(proc_cgroup, mountinfo, 0);
    if (q1 > 0 && (q2 == 0 || q1 < q2))
        return q1;
    return q2;
}

int fxa_cap_by_quota(int cpus, double quota)
{
    if (quota > 0 && floor(quota) < cpus)
        cpus = (int)floor(quota);
    return cpus < 1 ? 1 : (cpus > 1024 ? 1024 : cpus);
}

int fxa_available_cpus(void)
{
    int n = affinity_count();
    if (n == 0) { /* no affinity mask readable: the online CPUs */
        const long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = online > 1024 ? 1024 : (int)online;
    }
    return fxa_cap_by_quota(n, fxa_cgroup_cpu_quota("/proc/self/cgroup", "/proc/self/mountinfo"));
}
