/*
 * The CPU count behind the default thread count (src/core/cpu_count.c):
 * cgroup quotas read from fake /proc/self/cgroup and mountinfo files and
 * fake cgroup folders (v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us;
 * the tightest along the ancestors, mounts whose root is not "/"), the cap,
 * and fxa_available_cpus() against this process's affinity mask. The real
 * thing (taskset, a real cgroup, mpirun) is tests/cli/threads_default.sh.
 */
#include <sched.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cpu_count.h"
#include "testutil.h"

static char g_dir[64];

static void put(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void folder(const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    CHECK(mkdir(path, 0700) == 0, "mkdir %s", path);
}

static double quota(void)
{
    char cg[512];
    char mi[512];
    snprintf(cg, sizeof cg, "%s/cgroup", g_dir);
    snprintf(mi, sizeof mi, "%s/mountinfo", g_dir);
    return fxa_cgroup_cpu_quota(cg, mi);
}

/* A mountinfo with one cgroup2 mount of hierarchy root `root` at g_dir/v2
 * and one v1 cpu,cpuacct mount at g_dir/v1 (another v1 mount first). */
static void mounts(const char *root2, const char *root1)
{
    char text[2048];
    snprintf(text, sizeof text,
             "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
             "30 25 0:26 / %s/mem rw,relatime shared:9 - cgroup cgroup rw,memory\n"
             "31 25 0:27 %s %s/v1 rw,relatime shared:10 - cgroup cgroup rw,cpu,cpuacct\n"
             "32 25 0:28 %s %s/v2 rw,relatime shared:11 - cgroup2 cgroup2 rw\n",
             g_dir, root1, g_dir, root2, g_dir);
    put("mountinfo", text);
}

/* After g_dir/rel is written with text, the quota is want CPUs (0: none). */
static void expect_quota(const char *rel, const char *text, double want, const char *what)
{
    put(rel, text);
    const double got = quota();
    CHECK(got == want, "%s: want %g, got %g", what, want, got);
}

static void test_v2(void)
{
    folder("v2");
    folder("v2/job");
    folder("v2/job/step");
    mounts("/", "/");
    expect_quota("cgroup", "0::/job/step\n", 0, "no cpu.max anywhere: no quota");
    expect_quota("v2/job/step/cpu.max", "max 100000\n", 0, "cpu.max 'max': no quota");
    expect_quota("v2/job/cpu.max", "150000 100000\n", 1.5, "parent's 1.5 CPUs apply to the child");
    expect_quota("v2/job/step/cpu.max", "300000 100000\n", 1.5,
                 "the tightest of child (3) and parent (1.5)");
    expect_quota("v2/job/step/cpu.max", "50000 100000\n", 0.5, "child's 0.5 is tighter");
    expect_quota("v2/job/step/cpu.max", "garbage\n", 1.5, "an unreadable cpu.max counts as none");
    /* A container sees its own cgroup as the mount's root. */
    mounts("/job", "/");
    put("cgroup", "0::/job/step\n");
    folder("v2/step");
    expect_quota("v2/step/cpu.max", "200000 100000\n", 2.0, "path relative to the mount's root");
}

static void test_v1(void)
{
    folder("v1");
    folder("v1/a");
    mounts("/", "/");
    put("cgroup", "3:memory:/x\n2:cpu,cpuacct:/a\n0::/\n");
    put("v1/cpu.cfs_quota_us", "-1\n");
    put("v1/cpu.cfs_period_us", "100000\n");
    put("v1/a/cpu.cfs_quota_us", "-1\n");
    expect_quota("v1/a/cpu.cfs_period_us", "100000\n", 0, "quota -1: none");
    expect_quota("v1/a/cpu.cfs_quota_us", "250000\n", 2.5, "v1 quota / period");
    expect_quota("v1/a/cpu.cfs_period_us", "50000\n", 5.0, "the period counts");
    expect_quota("v1/cpu.cfs_quota_us", "100000\n", 1.0, "the parent's tighter 1 CPU");
    expect_quota("cgroup", "3:memory:/x\n0::/\n", 0, "no cpu hierarchy line: none");
}

static void test_cap(void)
{
    static const struct {
        int mask;
        double quota;
        int want;
        const char *what;
    } cases[] = {
        {8, 0, 8, "no quota"},
        {8, 2.9, 2, "rounded down"},
        {8, 0.5, 1, "at least 1"},
        {2, 16, 2, "a quota above the mask does not add CPUs"},
        {0, 0, 1, "at least 1 without a mask"},
        {5000, 0, 1024, "at most 1024"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int got = fxa_cap_by_quota(cases[i].mask, cases[i].quota);
        CHECK(got == cases[i].want, "%s: fxa_cap_by_quota(%d, %g) = %d", cases[i].what,
              cases[i].mask, cases[i].quota, got);
    }
}

static void test_affinity(void)
{
    cpu_set_t set;
    CHECK(sched_getaffinity(0, sizeof set, &set) == 0, "sched_getaffinity");
    const int mask = CPU_COUNT(&set);
    const int got = fxa_available_cpus();
    CHECK(got >= 1 && got <= mask, "fxa_available_cpus %d within [1, mask %d]", got, mask);
    size_t n = 0;
    unsigned char *bits = fxa_affinity_mask(&n);
    CHECK(bits != NULL && n >= sizeof set / 8, "affinity bitmap of %zu bytes", n);
    if (bits) {
        for (size_t c = 0; c < CPU_SETSIZE; c++)
            CHECK(((bits[c / 8] >> (c % 8)) & 1) == (CPU_ISSET(c, &set) != 0), "cpu %zu", c);
        free(bits);
    }
    /* One CPU of the mask: the count follows. */
    cpu_set_t one;
    CPU_ZERO(&one);
    for (size_t c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set)) {
            CPU_SET(c, &one);
            break;
        }
    CHECK(sched_setaffinity(0, sizeof one, &one) == 0, "sched_setaffinity");
    CHECK(fxa_available_cpus() == 1, "pinned to one CPU: %d", fxa_available_cpus());
    sched_setaffinity(0, sizeof set, &set);
}

int main(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/fxa_cpu_count_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_v2();
    test_v1();
    test_cap();
    test_affinity();
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g_dir);
    return test_summary("test_cpu_count");
}
