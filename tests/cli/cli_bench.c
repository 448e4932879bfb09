/*
 * `fxattn bench` and `info`: bench's JSON lines, its --backward, --causal
 * and --seq-kv runs, the compute it times (--compute, FXA_AUTO_COMPUTE),
 * and the option combinations it refuses.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_harness.h"
#include "cli_json.h"
#include "cli_tests.h"
#include "testutil.h"

/* bench args (with --json): stdout is one JSON object in which key_a and
 * key_b are numbers above 0. */
static void bench_object_positive(const char *label, const char *key_a, const char *key_b,
                                  const char *const *args)
{
    run_result r;
    if (run_ok(label, &r, args)) {
        size_t at;
        CHECK(json_one_object_line(r.out, &at), "[%s] not one JSON object (offset %zu): %s", label,
              at, r.out);
        CHECK(json_positive(r.out, key_a) && json_positive(r.out, key_b),
              "[%s] no positive %s and %s: %s", label, key_a, key_b, r.out);
    }
    run_free(&r);
}

/* bench args (with --json) reports "compute": "bf16", and a positive
 * positive_key unless it is NULL. */
static void bench_in_bf16(const char *label, const char *positive_key, const char *const *args)
{
    run_result r;
    if (run_ok(label, &r, args))
        CHECK(json_string_is(r.out, "compute", "bf16") &&
                  (!positive_key || json_positive(r.out, positive_key)),
              "[%s] not timed in bf16 compute%s%s: %s", label,
              positive_key ? " with a positive " : "", positive_key ? positive_key : "", r.out);
    run_free(&r);
}

/* bench --json: one JSON object per line; the last gives the bound pass's
 * median time (> 0: it was run) and its share of the auto run. */
static void test_bench_json_lines(void)
{
    run_result r;
    if (run_ok("bench --json", &r,
               ARGV("bench", "--seq", "256", "--heads", "2", "--dim", "64", "--repeats", "3",
                    "--json"))) {
        int lines = 0;
        const char *last = NULL;
        for (char *line = r.out; *line; lines++) {
            char *nl = strchr(line, '\n');
            CHECK(nl != NULL, "[bench --json] output does not end with a newline: %s", r.out);
            if (!nl)
                break;
            const char saved = nl[1];
            nl[1] = 0;
            size_t at;
            CHECK(json_one_object_line(line, &at),
                  "[bench --json] line %d is not one JSON object (offset %zu): %s", lines + 1, at,
                  line);
            nl[1] = saved;
            last = line;
            line = nl + 1;
        }
        CHECK(lines == 3, "[bench --json] %d lines, want auto, online and the summary: %s", lines,
              r.out);
        CHECK(last && json_positive(last, "bound_pass_seconds_median") &&
                  json_positive(last, "bound_pass_share"),
              "[bench --json] no positive bound_pass_seconds_median and bound_pass_share: %s",
              r.out);
    }
    run_free(&r);
}

/* The automatic compute: `info` names what bf16 inputs compute in;
 * FXA_AUTO_COMPUTE=bf16 makes bench's default (--compute auto) run bf16
 * compute, and an unknown value exits 2 naming it. */
static void test_compute_auto(void)
{
    run_result r;
    if (run_ok("info compute", &r, ARGV("info")))
        CHECK(strstr(r.out, "compute auto: bf16 inputs compute in ") != NULL,
              "[info] no compute choice: %s", r.out);
    run_free(&r);
    setenv("FXA_AUTO_COMPUTE", "bf16", 1);
    bench_in_bf16("bench pinned bf16", NULL,
                  ARGV("bench", "--dtype", "bf16", "--seq", "64", "--heads", "1", "--dim", "16",
                       "--repeats", "1", "--json"));
    setenv("FXA_AUTO_COMPUTE", "fast", 1);
    run_expect("FXA_AUTO_COMPUTE=fast", 2, "FXA_AUTO_COMPUTE=fast", 30, NULL, ARGV("info"));
    unsetenv("FXA_AUTO_COMPUTE");
}

/* bench --seq-kv: cross-attention rows with Skv keys, positive rates; more
 * keys than queries or with --backward exits 2 naming the option. */
static void test_bench_seq_kv(void)
{
    run_result r;
    if (run_ok("bench --seq-kv", &r,
               ARGV("bench", "--seq", "300", "--seq-kv", "40", "--heads", "1", "--dim", "16",
                    "--repeats", "1", "--json"))) {
        const char *kv = json_field(r.out, "seq_kv");
        CHECK(kv && strtol(kv, NULL, 10) == 40 && json_positive(r.out, "gflops"),
              "[bench --seq-kv] not 40 keys with a positive rate: %s", r.out);
    }
    run_free(&r);
    run_expect("bench --seq-kv > --seq", 2, "--seq-kv", 30, NULL,
               ARGV("bench", "--seq", "10", "--seq-kv", "20"));
    run_expect("bench --seq-kv --backward", 2, "--seq-kv", 30, NULL,
               ARGV("bench", "--seq", "64", "--seq-kv", "20", "--backward"));
}

void test_bench(void)
{
    test_bench_json_lines();
    /* --backward: positive forward and backward rates, in fp32 and in bf16
     * compute. */
    bench_object_positive("bench --backward --json", "forward_gflops", "backward_gflops",
                          ARGV("bench", "--backward", "--seq", "200", "--heads", "2", "--dim", "40",
                               "--repeats", "1", "--json"));
    bench_in_bf16("bench --backward bf16 compute", "backward_gflops",
                  ARGV("bench", "--backward", "--dtype", "bf16", "--compute", "bf16", "--seq", "64",
                       "--heads", "1", "--dim", "16", "--repeats", "1", "--json"));
    test_compute_auto();
    test_bench_seq_kv();

    /* --causal: positive medians and speedup; with --backward the
     * backward's, timed in the compute asked for (bf16 inputs: bf16 unless
     * --compute fp32); bf16 compute of fp32 inputs is refused. */
    bench_object_positive("bench --causal --json", "causal_seconds_median", "causal_speedup",
                          ARGV("bench", "--causal", "--seq", "200", "--heads", "2", "--dim", "40",
                               "--repeats", "1", "--json"));
    bench_object_positive("bench --backward --causal --json", "causal_backward_seconds_median",
                          "causal_backward_speedup",
                          ARGV("bench", "--backward", "--causal", "--seq", "200", "--heads", "2",
                               "--dim", "40", "--repeats", "1", "--json"));
    bench_in_bf16("bench --backward --causal bf16 compute", NULL,
                  ARGV("bench", "--backward", "--causal", "--dtype", "bf16", "--compute", "bf16",
                       "--seq", "64", "--heads", "1", "--dim", "16", "--repeats", "1", "--json"));
    run_expect("bench --backward --causal bf16 compute of f32", 2, "bf16 inputs", 10.0, NULL,
               ARGV("bench", "--backward", "--causal", "--compute", "bf16", "--seq", "64",
                    "--heads", "1", "--dim", "16", "--repeats", "1"));
    run_expect("bench --backward --proj", 2, "pass one of them", 10.0, NULL,
               ARGV("bench", "--backward", "--proj", "--seq", "64", "--heads", "1", "--dim", "16"));
    run_expect("bench --causal --proj", 2, "not with --proj", 10.0, NULL,
               ARGV("bench", "--causal", "--proj", "--seq", "64", "--heads", "1", "--dim", "16"));
}
