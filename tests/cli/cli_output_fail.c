/*
 * C. Output failures (missing folder, /dev/full): non-zero exit, the error
 * line, nothing left behind, and /dev/full still a character device. The
 * /dev/full case runs in a private mount namespace with its own /dev/full
 * when it can (so a tool that renames a file onto /dev/full cannot damage
 * the machine), else on the real /dev/full when this user cannot create
 * files in /dev, else on a copy of the device node in the temporary folder.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_fail.h"
#include "cli_harness.h"
#include "cli_tests.h"
#include "testutil.h"

/* -o target, a character device whose writes fail with ENOSPC, in folder. */
static void devfull_case(const char *label, const char *target, const char *folder)
{
    struct stat before;
    struct stat after;
    run_result r;
    char cmd[4096];
    char how[128];
    const char *base = strrchr(target, '/') ? strrchr(target, '/') + 1 : target;
    const char *const args[] = {"attn", "-q",        IN("q.npy"), "-k",   IN("k.npy"),
                                "-v",   IN("v.npy"), "-o",        target, NULL};
    char tmp_prefix[256];
    snprintf(tmp_prefix, sizeof tmp_prefix, "%s.tmp.", base);
    if (stat(target, &before) != 0 || !S_ISCHR(before.st_mode))
        die("%s is not a character device before the test", target);
    format_cmd(args, cmd, sizeof cmd);
    run_tool(args, &r);
    CHECK(!r.timed_out && !r.sig && r.code != 0,
          "[%s] %s\n    expected a non-zero exit (writing fails with ENOSPC), got %s\n"
          "    stdout: %s    stderr: %s",
          label, cmd, describe_exit(&r, how, sizeof how), r.out, r.err);
    CHECK(has_error_line(r.err),
          "[%s] %s\n    stderr has no line starting with \"" ERR_PREFIX "\": '%s'", label, cmd,
          r.err);
    const int still =
        lstat(target, &after) == 0 && S_ISCHR(after.st_mode) && after.st_rdev == before.st_rdev;
    CHECK(still,
          "[%s] %s\n    %s is no longer the character device %u,%u: it is now %s (the tool "
          "renamed its temporary file onto the device)",
          label, cmd, target, major(before.st_rdev), minor(before.st_rdev),
          lstat(target, &after) != 0 ? "missing"
          : S_ISREG(after.st_mode)   ? "a regular file"
          : S_ISCHR(after.st_mode)   ? "another character device"
                                     : "something else");
    DIR *dp = opendir(folder);
    struct dirent *e;
    while (dp && (e = readdir(dp)) != NULL)
        CHECK(!starts_with(e->d_name, tmp_prefix), "[%s] %s\n    temporary file left: %s/%s", label,
              cmd, folder, e->d_name);
    if (dp)
        closedir(dp);
    if (!still && S_ISREG(after.st_mode))
        fprintf(stderr, "    [%s] %s now holds %lld bytes (a complete .npy file)\n", label, target,
                (long long)after.st_size);
    run_free(&r);
}

/* Whether writes to path fail with ENOSPC (a working /dev/full). */
static int writes_fail_enospc(const char *path)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    const ssize_t w = write(fd, "x", 1);
    const int e = errno;
    close(fd);
    return w < 0 && e == ENOSPC;
}

/* In a child: a private mount namespace whose /dev is a fresh tmpfs with
 * its own /dev/full, so the tool can rename nothing onto the real one. */
static int isolate_dev(void)
{
    if (unshare(CLONE_NEWNS) != 0)
        return 1;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
        return 2;
    if (mount("test_cli_dev", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755") != 0)
        return 3;
    if (mknod("/dev/full", S_IFCHR | 0666, makedev(1, 7)) != 0)
        return 4;
    if (chmod("/dev/full", 0666) != 0 || !writes_fail_enospc("/dev/full"))
        return 5;
    return 0;
}

static void test_dev_full(void)
{
    int pfd[2];
    int msg[3] = {-1, 0, 0};
    if (pipe(pfd) != 0)
        die("pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        die("fork: %s", strerror(errno));
    if (pid == 0) {
        close(pfd[0]);
        g_checks = g_failures = 0;
        msg[0] = isolate_dev();
        if (msg[0] == 0)
            devfull_case("C3 -o /dev/full (private /dev)", "/dev/full", "/dev");
        msg[1] = g_checks;
        msg[2] = g_failures;
        fflush(stdout);
        fflush(stderr);
        if (write(pfd[1], msg, sizeof msg) != (ssize_t)sizeof msg)
            _exit(3);
        _exit(0);
    }
    close(pfd[1]);
    ssize_t got = read(pfd[0], msg, sizeof msg);
    close(pfd[0]);
    int status;
    waitpid(pid, &status, 0);
    if (got == (ssize_t)sizeof msg && msg[0] == 0) {
        g_checks += msg[1];
        g_failures += msg[2];
        return;
    }
    if (got != (ssize_t)sizeof msg) {
        CHECK(0, "[C3 -o /dev/full] the isolated test process died (status 0x%x)", status);
        return;
    }
    /* No private namespace here. */
    if (faccessat(AT_FDCWD, "/dev", W_OK, AT_EACCESS) != 0) {
        /* The tool cannot create anything in /dev: the real device is safe. */
        devfull_case("C3 -o /dev/full", "/dev/full", "/dev");
        return;
    }
    /* /dev is writable but cannot be isolated: use a copy of the device node. */
    const char *node = join(g_out_dir, "full");
    clear_dir(g_out_dir);
    if (mknod(node, S_IFCHR | 0666, makedev(1, 7)) == 0 && writes_fail_enospc(node)) {
        devfull_case("C3 -o <copy of /dev/full in the temporary folder>", node, g_out_dir);
    } else {
        printf("test_cli: SKIP -o /dev/full: no private mount namespace (step %d failed), /dev "
               "is writable and no usable copy of the device node could be made\n",
               msg[0]);
    }
    clear_dir(g_out_dir);
}

void test_output_failures(void)
{
    const char *q = IN("q.npy");
    const char *k = IN("k.npy");
    const char *v = IN("v.npy");
    const fail_case c1 = {"C1 -o into a missing folder", -1, NULL, NULL};
    const fail_case c2 = {"C2 --lse into a missing folder", -1, NULL, NULL};
    const fail_case c4 = {"C4 --lse names an existing folder", -1, NULL, "lse_is_a_folder"};
    expect_fail(&c1, ARGV("attn", "-q", q, "-k", k, "-v", v, "-o",
                          join(g_out_dir, "no_such_folder/out.npy"), "--lse", g_lse));
    expect_fail(&c2, ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", g_out, "--lse",
                          join(g_out_dir, "no_such_folder/lse.npy")));
    expect_fail(&c4, ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", g_out, "--lse",
                          join(g_out_dir, "lse_is_a_folder")));
    clear_dir(g_out_dir);
    test_dev_full();
    struct stat st;
    CHECK(stat("/dev/full", &st) == 0 && S_ISCHR(st.st_mode),
          "[C3] the real /dev/full is no longer a character device");
}
