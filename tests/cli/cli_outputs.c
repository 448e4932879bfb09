/*
 * D. Outputs checked before any is written: a link output is written
 * through the link, a device output is not streamed when another output
 * cannot be written, and no output may be an input (of attn, of layer, or
 * a file of layer's --weights folder) or a file demo --save-inputs cannot
 * write, whatever path names it.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_harness.h"
#include "cli_npy.h"
#include "cli_tests.h"
#include "testutil.h"

/* D23, D24: an output that is a link to a file is written through the
 * link, which stays: also a link to /proc/self/fd/1 (what /dev/stdout is)
 * while stdout goes to a file. */
static void test_link_outputs(const char *q, const char *k, const char *v)
{
    run_result r;
    struct stat ls;
    fxa_npy got;
    clear_dir(g_out_dir);
    const char *real = join(g_out_dir, "real.npy");
    const char *via = join(g_out_dir, "via_link.npy");
    const char *fd1 = join(g_out_dir, "fd1.npy");
    write_bytes(real, "old", 3);
    CHECK(symlink("real.npy", via) == 0 && symlink("/proc/self/fd/1", fd1) == 0, "symlink: %s",
          strerror(errno));
    if (run_ok("D23 -o a link to a file", NULL,
               ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", via)) &&
        read_output("D23", real, 4, g_qshape, &got))
        fxa_npy_free(&got);
    CHECK(lstat(via, &ls) == 0 && S_ISLNK(ls.st_mode), "[D23] the link was replaced");
    if (run_ok("D24 -o a link to /proc/self/fd/1, stdout a file", &r,
               ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", fd1)))
        CHECK(memcmp(r.out, "\x93NUMPY", 6) == 0, "[D24] stdout does not hold the .npy");
    CHECK(lstat(fd1, &ls) == 0 && S_ISLNK(ls.st_mode), "[D24] the link was replaced");
    run_free(&r);
    clear_dir(g_out_dir);
}

/* D4, D5: -o /dev/stdout writes nothing when --lse cannot be written. */
static void test_device_output_waits(const char *q, const char *k, const char *v)
{
    run_result r;
    if (run_expect("D4 -o /dev/stdout --lse into a missing folder", 2, "nodir", 30.0, &r,
                   ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", "/dev/stdout", "--lse",
                        join(g_out_dir, "nodir/l.npy"))))
        CHECK(r.out[0] == 0, "[D4] something was written to stdout before the error (%zu bytes)",
              strlen(r.out));
    run_free(&r);
    const char *lse_dir = join(g_out_dir, "a_folder");
    CHECK(mkdir(lse_dir, 0755) == 0, "mkdir: %s", strerror(errno));
    if (run_expect("D5 -o /dev/stdout --lse a folder", 2, "folder", 30.0, &r,
                   ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", "/dev/stdout", "--lse", lse_dir)))
        CHECK(r.out[0] == 0, "[D5] something was written to stdout before the error");
    run_free(&r);
}

/* D6-D8: an output that is an input, under any name, is refused and the
 * input stays unchanged. */
static void test_output_is_input(const char *q, const char *k, const char *v)
{
    size_t n0 = 0;
    unsigned char *before = read_bytes(q, &n0);
    const char *q_other = join(g_in_dir, "../in/./q.npy");
    const char *q_link = join(g_out_dir, "q_link.npy");
    CHECK(symlink(q, q_link) == 0, "symlink: %s", strerror(errno));
    const char *aliases[3] = {q, q_other, q_link};
    for (int i = 0; i < 3; i++) {
        run_expect("D6 -o names the input -q", 2, "is the input -q", 30.0, NULL,
                   ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", aliases[i]));
        run_expect("D7 --lse names an input", 2, i ? "is the input -q" : "is the input -v", 30.0,
                   NULL,
                   ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", g_out, "--lse",
                        aliases[i] == q ? v : aliases[i]));
    }
    CHECK(before && file_holds(q, before, n0), "[D6] the input q.npy was changed");
    free(before);
    CHECK(!file_exists(g_out), "[D7] -o was written although --lse was refused");
    run_expect("D8 layer -o names -x", 2, "is the input -x", 30.0, NULL,
               ARGV("layer", "-x", q, "--grid", "1,1,37", "-o", q_other));
}

/* D22: layer -o onto the checkpoint file a --weights folder holds. */
static void test_layer_onto_checkpoint(void)
{
    const char *ck_dir = join(g_out_dir, "ckpt");
    const char *ck_file = join(ck_dir, "model.safetensors");
    const char json[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    unsigned char ck[8 + sizeof json + 4] = {0};
    const size_t ck_len = 8 + sizeof json - 1 + 4;
    ck[0] = (unsigned char)(sizeof json - 1);
    memcpy(ck + 8, json, sizeof json - 1);
    CHECK(mkdir(ck_dir, 0755) == 0, "mkdir: %s", strerror(errno));
    write_bytes(ck_file, ck, ck_len);
    run_expect("D22 layer -o onto a file of the --weights folder", 2, "of the checkpoint", 30.0,
               NULL, ARGV("layer", "--weights", ck_dir, "-o", join(ck_dir, "./model.safetensors")));
    CHECK(file_holds(ck_file, ck, ck_len), "[D22] the checkpoint file was changed");
}

/* D9, D10: demo --save-inputs needs an existing folder in which every file
 * can be written, and writes none otherwise. */
static void test_demo_save_inputs(void)
{
    run_expect("D9 demo --save-inputs into a missing folder", 2, "--save-inputs", 30.0, NULL,
               ARGV("demo", "--frames", "1", "--height", "2", "--width", "2", "--heads", "1",
                    "--dim", "8", "--save-inputs", join(g_out_dir, "nodir")));
    clear_dir(g_out_dir);
    CHECK(mkdir(join(g_out_dir, "v.npy"), 0755) == 0, "mkdir: %s", strerror(errno));
    run_expect("D10 demo --save-inputs where v.npy is a folder", 2, "v.npy", 30.0, NULL,
               ARGV("demo", "--frames", "1", "--height", "2", "--width", "2", "--heads", "1",
                    "--dim", "8", "--save-inputs", g_out_dir));
    CHECK(!file_exists(join(g_out_dir, "q.npy")) && !file_exists(join(g_out_dir, "k.npy")),
          "[D10] q.npy or k.npy was written");
    clear_dir(g_out_dir);
}

void test_outputs_checked_first(void)
{
    const char *q = IN("q.npy"), *k = IN("k.npy"), *v = IN("v.npy");
    test_link_outputs(q, k, v);
    test_device_output_waits(q, k, v);
    test_output_is_input(q, k, v);
    test_layer_onto_checkpoint();
    test_demo_save_inputs();
}
