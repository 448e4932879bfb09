/*
 * D. Option values: every string option of every command given '' is
 * refused by name before anything runs (the tables the CLI parses with),
 * and each refused number says why while values in range are taken.
 */
#include <stdio.h>

#include "cli_fail.h"
#include "cli_harness.h"
#include "cli_tests.h"
#include "cmd_opts.h"
#include "testutil.h"

/* D1: each option with a value, given '', is refused naming it. An unknown
 * option follows, so that a tool that took '' would still stop before
 * writing. D2, D3: whole command lines refuse the empty path as such. */
void test_empty_values(void)
{
    attn_opts ao;
    check_opts co;
    bench_args bo;
    demo_opts dmo;
    layer_opts lo;
    plan_opts po;
    info_opts io;
    fxt_opt t[FXT_MAX_OPTS];
    const char *cmds[7] = {"attn", "check", "bench", "demo", "layer", "plan", "info"};
    int tried = 0;
    for (int c = 0; c < 7; c++) {
        switch (c) {
        case 0: fxt_attn_opts_table(&ao, t); break;
        case 1: fxt_check_opts_table(&co, t); break;
        case 2: fxt_bench_args_table(&bo, t); break;
        case 3: fxt_demo_opts_table(&dmo, t); break;
        case 4: fxt_layer_opts_table(&lo, t); break;
        case 5: fxt_plan_opts_table(&po, t); break;
        default: fxt_info_opts_table(&io, t); break;
        }
        for (int i = 0; t[i].name; i++) {
            if (t[i].kind == FXT_OPT_FLAG)
                continue;
            char label[128];
            snprintf(label, sizeof label, "D1 %s %s ''", cmds[c], t[i].name);
            const fail_case fc = {label, 2, t[i].name, NULL};
            expect_fail(&fc, ARGV(cmds[c], t[i].name, "", "--no-such-option"));
            tried++;
        }
    }
    CHECK(tried >= 30, "[D1] only %d options with values were tried", tried);

    const char *q = IN("q.npy"), *k = IN("k.npy"), *v = IN("v.npy");
    clear_dir(g_out_dir);
    run_expect("D2 attn -o ''", 2, "-o: the value is empty", 30.0, NULL,
               ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", ""));
    run_expect("D3 attn --lse ''", 2, "--lse: the value is empty", 30.0, NULL,
               ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", g_out, "--lse", ""));
    CHECK(!file_exists(g_out), "[D2, D3] an output was written");
}

/* D11-D16: a number option of attn refused with the reason mentioned. */
typedef struct number_case {
    const char *label;
    const char *mention;
    const char *option;
    const char *value;
} number_case;

void test_number_messages(void)
{
    static const number_case attn_numbers[] = {
        {"D11 --scale subnormal", "too small", "--scale", "4.9e-324"},
        {"D12 --scale 1e999", "too large", "--scale", "1e999"},
        {"D13 --scale 0.5x", "characters follow", "--scale", "0.5x"},
        {"D14 --scale inf", "not a finite number", "--scale", "inf"},
        {"D15 --threads 2x", "characters follow", "--threads", "2x"},
        {"D16 --threads 1e30", "out of range", "--threads", "99999999999999999999"},
    };
    const char *q = IN("q.npy"), *k = IN("k.npy"), *v = IN("v.npy");
    clear_dir(g_out_dir);
    for (size_t i = 0; i < sizeof attn_numbers / sizeof attn_numbers[0]; i++) {
        const number_case *c = &attn_numbers[i];
        run_expect(c->label, 2, c->mention, 30.0, NULL, ARGV(ATTN3(q, k, v), c->option, c->value));
    }
    CHECK(!file_exists(g_out), "[D11..D16] an output was written");
    run_expect("D17 plan --link-gbps 1e308", 2, "out of range", 30.0, NULL,
               ARGV("plan", "--ranks", "8", "--gflops", "100", "--link-gbps", "1e308"));
    run_expect("D18 plan --gflops 1e308", 2, "out of range", 30.0, NULL,
               ARGV("plan", "--ranks", "8", "--gflops", "1e308"));
    /* A path with a newline and an escape: still one error line. */
    run_expect("D20 a newline in a path", 2, "no_such?fxattn: error: forged.npy", 30.0, NULL,
               ARGV(ATTN3(IN("no_such\nfxattn: error: forged.npy"), k, v)));
    run_expect("D21 an escape in an option value", 2, "?[2J", 30.0, NULL,
               ARGV(ATTN3(q, k, v), "--mode", "\033[2J"));
    run_ok("D19 plan --link-gbps 1e300", NULL,
           ARGV("plan", "--ranks", "8", "--hosts", "2", "--gflops", "100", "--link-gbps", "1e300"));
}
