/* Failed runs of test_cli (cli_fail.h). */
#include "cli_fail.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "testfiles.h"
#include "testutil.h"

static unsigned char *g_old_out;
static size_t g_old_out_len;
static unsigned char *g_old_lse;
static size_t g_old_lse_len;

void fail_set_old_files(unsigned char *out, size_t out_len, unsigned char *lse, size_t lse_len)
{
    static const char stand_in[] = "old output file\n";
    fail_free_old_files();
    if (out && lse) {
        g_old_out = out;
        g_old_lse = lse;
        g_old_out_len = out_len;
        g_old_lse_len = lse_len;
        return;
    }
    free(out);
    free(lse);
    g_old_out = (unsigned char *)strdup(stand_in);
    g_old_lse = (unsigned char *)strdup(stand_in);
    if (!g_old_out || !g_old_lse)
        die("out of memory");
    g_old_out_len = g_old_lse_len = strlen(stand_in);
}

void fail_free_old_files(void)
{
    free(g_old_out);
    free(g_old_lse);
    g_old_out = g_old_lse = NULL;
}

/* The number of entries of the folder path other than . and ..; -1 when it
 * cannot be listed. */
static int count_entries(const char *path)
{
    DIR *dp = opendir(path);
    struct dirent *e;
    int entries = 0;
    if (!dp)
        return -1;
    while ((e = readdir(dp)) != NULL)
        entries += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(dp);
    return entries;
}

/* After the run: out/ holds exactly what was put there (nothing, or old
 * out.npy and lse.npy, plus make_dir), old files byte for byte unchanged. */
static void check_out_dir(const fail_case *fc, int with_old, const char *ctx)
{
    DIR *dp = opendir(g_out_dir);
    struct dirent *e;
    if (!dp)
        die("cannot list %s", g_out_dir);
    while ((e = readdir(dp)) != NULL) {
        const char *n = e->d_name;
        if (strcmp(n, ".") == 0 || strcmp(n, "..") == 0)
            continue;
        if (with_old && (strcmp(n, "out.npy") == 0 || strcmp(n, "lse.npy") == 0))
            continue;
        if (fc->make_dir && strcmp(n, fc->make_dir) == 0)
            continue;
        CHECK(0, "%s\n    the failed run left %s in the output folder%s", ctx, n,
              strstr(n, ".tmp.") ? " (a temporary file)" : "");
    }
    closedir(dp);
    if (fc->make_dir) {
        char sub[TEST_PATH_CAP];
        test_path_join(sub, g_out_dir, fc->make_dir);
        CHECK(count_entries(sub) == 0, "%s\n    the folder out/%s is gone or no longer empty", ctx,
              fc->make_dir);
    }
    if (with_old) {
        CHECK(file_holds(g_out, g_old_out, g_old_out_len),
              "%s\n    the old out.npy was %s by the failed run", ctx,
              file_exists(g_out) ? "changed" : "removed");
        CHECK(file_holds(g_lse, g_old_lse, g_old_lse_len),
              "%s\n    the old lse.npy was %s by the failed run", ctx,
              file_exists(g_lse) ? "changed" : "removed");
    }
}

/* Empty out/, then the old output files when with_old, and fc's folder. */
static void prepare_out_dir(const fail_case *fc, int with_old)
{
    clear_dir(g_out_dir);
    if (with_old) {
        write_bytes(g_out, g_old_out, g_old_out_len);
        write_bytes(g_lse, g_old_lse, g_old_lse_len);
    }
    if (fc->make_dir) {
        char sub[TEST_PATH_CAP];
        test_path_join(sub, g_out_dir, fc->make_dir);
        if (mkdir(sub, 0755) != 0)
            die("mkdir %s: %s", sub, strerror(errno));
    }
}

void expect_fail(const fail_case *fc, const char *const *args)
{
    char cmd[4096];
    char ctx[4600];
    char how[128];
    format_cmd(args, cmd, sizeof cmd);
    for (int with_old = 0; with_old < 2; with_old++) {
        run_result r;
        prepare_out_dir(fc, with_old);
        run_tool(args, &r);
        snprintf(ctx, sizeof ctx, "[%s; %s] %s", fc->label,
                 with_old ? "old output files in place" : "no output files before", cmd);
        const int code_ok =
            !r.timed_out && !r.sig && (fc->want < 0 ? r.code != 0 : r.code == fc->want);
        CHECK(code_ok, "%s\n    expected exit %s, got %s\n    stderr: %s", ctx,
              fc->want < 0 ? "non-zero (1)" : "2", describe_exit(&r, how, sizeof how), r.err);
        CHECK(has_error_line(r.err),
              "%s\n    stderr has no line starting with \"" ERR_PREFIX "\": '%s'", ctx, r.err);
        if (fc->mention)
            CHECK(mentions(r.err, fc->mention), "%s\n    the error does not mention %s: %s", ctx,
                  fc->mention, r.err);
        check_out_dir(fc, with_old, ctx);
        run_free(&r);
    }
}
