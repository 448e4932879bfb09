/*
 * Hostile inputs of `fxattn attn` and `check`: finite values whose scores
 * leave the fp32 range (exact or refused naming the bound), -o and --lse
 * naming one file, a FIFO output without a reader, and problems larger than
 * the machine's memory, refused up front.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_harness.h"
#include "cli_json.h"
#include "cli_npy.h"
#include "cli_tests.h"
#include "testutil.h"

/* The output (one row of 4) and the LSE (one value) of a 1-query run. */
static void check_one_row(const char *label, const char *out, const char *lse, float want_out,
                          double want_lse)
{
    fxa_npy a, l;
    const int64_t os[4] = {1, 1, 1, 4}, ls[3] = {1, 1, 1};
    if (read_output(label, out, 4, os, &a)) {
        for (int c = 0; c < 4; c++)
            CHECK(((const float *)a.data)[c] == want_out, "[%s] out[%d] = %.9g, exact %.9g", label,
                  c, (double)((const float *)a.data)[c], (double)want_out);
        fxa_npy_free(&a);
    }
    if (lse && read_output(label, lse, 3, ls, &l)) {
        const double got = ((const float *)l.data)[0];
        CHECK(fabs(got - want_lse) <= 0x1p-20 * want_lse, "[%s] lse = %.9g, exact %.9g", label, got,
              want_lse);
        fxa_npy_free(&l);
    }
}

/* Scores past fp32: q.k = 4e38 overflows fp32 while the scaled scores
 * (2e38, 1e38) and the LSE (2e38) fit: out = v_0 = 1 exactly, in every
 * mode and centring. --scale 3e38 on q = 0.5: the natural scores (3e38,
 * 1.5e38) fit, the base-2 ones do not; centring forms them (exact), without
 * it the run is refused naming the bound; 1e300 is refused. */
static void test_scores_past_fp32(void)
{
    run_result r;
    size_t where;
    const int64_t qs[4] = {1, 1, 1, 4}, ks[4] = {1, 2, 1, 4};
    const float q1[4] = {1e19f, 1e19f, 1e19f, 1e19f};
    const float k1[8] = {1e19f, 1e19f, 1e19f, 1e19f, 0.5e19f, 0.5e19f, 0.5e19f, 0.5e19f};
    const float v1[8] = {1, 1, 1, 1, 2, 2, 2, 2};
    const float q2[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    const float k2[8] = {0.5f, 0.5f, 0.5f, 0.5f, 0.25f, 0.25f, 0.25f, 0.25f};
    write_f32(IN("h_q1.npy"), 4, qs, q1);
    write_f32(IN("h_k1.npy"), 4, ks, k1);
    write_f32(IN("h_v1.npy"), 4, ks, v1);
    write_f32(IN("h_q2.npy"), 4, qs, q2);
    write_f32(IN("h_k2.npy"), 4, ks, k2);
    static const char *const centers[2] = {"on", "off"};
    static const char *const modes[2] = {"auto", "online"};
    for (int c = 0; c < 2; c++)
        for (int m = 0; m < 2; m++) {
            char label[96];
            snprintf(label, sizeof label, "q.k overflows fp32 (center %s, mode %s)", centers[c],
                     modes[m]);
            clear_dir(g_out_dir);
            if (run_ok(label, &r,
                       ARGV(ATTN3(IN("h_q1.npy"), IN("h_k1.npy"), IN("h_v1.npy")), "--scale", "0.5",
                            "--center", centers[c], "--mode", modes[m], "--verify", "--stats"))) {
                check_one_row(label, g_out, g_lse, 1.0f, 0.5 * 4e38);
                CHECK(json_one_object_line(r.out, &where),
                      "[%s] --stats is not one JSON object: %s", label, r.out);
            }
            run_free(&r);
        }
    clear_dir(g_out_dir);
    if (run_ok("--scale 3e38, centred", NULL,
               ARGV(ATTN3(IN("h_q2.npy"), IN("h_k2.npy"), IN("h_v1.npy")), "--scale", "3e38")))
        check_one_row("--scale 3e38, centred", g_out, g_lse, 1.0f, 3e38);
    static const char *const big[2][2] = {{"3e38", "off"}, {"1e300", "on"}};
    for (int i = 0; i < 2; i++) {
        char label[64];
        snprintf(label, sizeof label, "--scale %s, center %s", big[i][0], big[i][1]);
        clear_dir(g_out_dir);
        run_expect(label, 2, "exceeds the fp32 range", 30.0, NULL,
                   ARGV("attn", "-q", IN("h_q2.npy"), "-k", IN("h_k2.npy"), "-v", IN("h_v1.npy"),
                        "-o", g_out, "--scale", big[i][0], "--center", big[i][1]));
        CHECK(!file_exists(g_out), "[%s] an output was written", label);
    }
    /* check --json on these inputs: valid JSON. */
    if (run_ok(
            "check --json, q.k past fp32", &r,
            ARGV("check", "-q", IN("h_q1.npy"), "-k", IN("h_k1.npy"), "--scale", "0.5", "--json")))
        CHECK(json_one_object_line(r.out, &where), "[check --json] not one JSON object: %s", r.out);
    run_free(&r);
}

/* -o and --lse naming one file, also through other paths, are refused
 * before anything is written; -o a FIFO with no reader fails at once
 * instead of blocking. */
static void test_output_names(void)
{
    clear_dir(g_out_dir);
    write_bytes(g_out, "old", 3);
    const char *link = join(g_out_dir, "link.npy");
    const char *fresh = join(g_out_dir, "fresh.npy");
    CHECK(symlink("out.npy", link) == 0, "symlink: %s", strerror(errno));
    const char *pairs[4][2] = {{g_out, g_out},
                               {g_out, join(g_out_dir, "./out.npy")},
                               {g_out, link},
                               {fresh, join(g_out_dir, "../out/fresh.npy")}};
    for (int i = 0; i < 4; i++)
        run_expect("-o and --lse name one file", 2, "name the same file", 30.0, NULL,
                   ARGV("attn", "-q", IN("q.npy"), "-k", IN("k.npy"), "-v", IN("v.npy"), "-o",
                        pairs[i][0], "--lse", pairs[i][1]));
    CHECK(file_holds(g_out, "old", 3) && !file_exists(fresh),
          "[-o and --lse name one file] an output was written");

    clear_dir(g_out_dir);
    const char *fifo = join(g_out_dir, "fifo");
    CHECK(mkfifo(fifo, 0644) == 0, "mkfifo: %s", strerror(errno));
    run_expect("FIFO without a reader", 1, "no reader", 20.0, NULL,
               ARGV("attn", "-q", IN("q.npy"), "-k", IN("k.npy"), "-v", IN("v.npy"), "-o", fifo));
}

/* More memory than any machine has: bench, demo, layer and attn (three
 * sparse files of 4 TiB, refused before any is read) exit 1 up front. */
static void test_beyond_memory(void)
{
    run_result r;
    run_expect("bench beyond memory", 1, "GiB available", 10.0, &r,
               ARGV("bench", "--seq", "16777216", "--heads", "1024", "--dim", "256"));
    CHECK(strstr(r.err, "needs ") != NULL, "[bench beyond memory] %s", r.err);
    run_free(&r);
    run_expect(
        "demo beyond memory", 1, "GiB available", 10.0, NULL,
        ARGV("demo", "--frames", "1024", "--height", "1024", "--width", "1024", "--heads", "1024"));
    run_expect("layer beyond memory", 1, "GiB available", 10.0, NULL,
               ARGV("layer", "--heads", "1024", "--dim", "256"));
    const char *names[3] = {"h_big_q.npy", "h_big_k.npy", "h_big_v.npy"};
    for (int i = 0; i < 3; i++) {
        const int fd = open(IN(names[i]), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        CHECK(fd >= 0 && ftruncate(fd, (off_t)1 << 42) == 0, "sparse file: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
    }
    clear_dir(g_out_dir);
    run_expect(
        "attn beyond memory", 1, "GiB available", 10.0, NULL,
        ARGV("attn", "-q", IN(names[0]), "-k", IN(names[1]), "-v", IN(names[2]), "-o", g_out));
    CHECK(!file_exists(g_out), "[attn beyond memory] an output was written");
    for (int i = 0; i < 3; i++)
        remove(IN(names[i]));
}

void test_hostile(void)
{
    test_scores_past_fp32();
    test_output_names();
    test_beyond_memory();
}
