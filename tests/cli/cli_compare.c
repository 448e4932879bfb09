/*
 * `fxattn compare A.npy B.npy`: two runs of attn with --reproducible at 1
 * and 2 threads are identical (exit 0); one changed element is named with
 * its index and both values (exit 1); other shapes and dtypes differ (exit
 * 1); a missing file and bad usage are refused (exit 2, one error line).
 */
#include <stdio.h>
#include <string.h>

#include "cli_harness.h"
#include "cli_npy.h"
#include "cli_tests.h"
#include "testutil.h"

/* Run compare on a and b: exit want and stdout starting with `says`. */
static void compare_says(const char *label, const char *a, const char *b, int want,
                         const char *says)
{
    run_result r;
    run_tool(ARGV("compare", a, b), &r);
    CHECK(r.code == want && starts_with(r.out, says) && !has_error_line(r.err),
          "[%s] exit %d, stdout '%s' (expected exit %d and '%s...')", label, r.code, r.out, want,
          says);
    run_free(&r);
}

void test_compare(void)
{
    const char *q = IN("q.npy"), *k = IN("k.npy"), *v = IN("v.npy");
    const char *one = join(g_out_dir, "one.npy"), *two = join(g_out_dir, "two.npy");
    clear_dir(g_out_dir);
    run_ok("compare: attn 1 thread", NULL,
           ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", one, "--reproducible", "--threads", "1"));
    run_ok("compare: attn 2 threads", NULL,
           ARGV("attn", "-q", q, "-k", k, "-v", v, "-o", two, "--reproducible", "--threads", "2"));
    compare_says("1 and 2 threads", one, two, 0,
                 "identical: [1, 37, 4, 16] float32, 2368 elements");

    fxa_npy a;
    if (read_output("compare: read back", one, 4, g_qshape, &a)) {
        float *x = a.data;
        x[5 * PHQ * PD + 2 * PD + 7] += 1.0f; /* token 5, head 2, dim 7 */
        const char *changed = join(g_out_dir, "changed.npy");
        write_f32(changed, 4, g_qshape, x);
        compare_says("one element changed", one, changed, 1,
                     "different: 1 of 2368 elements; the first at [0, 5, 2, 7]");
        fxa_npy_free(&a);
    }
    compare_says("other shapes", one, k, 1, "different: shapes [1, 37, 4, 16] and [1, 53, 2, 16]");
    static const uint16_t half[4] = {0x3c00, 0x3c00, 0x3c00, 0x3c00};
    static const float ones[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    const int64_t shape[1] = {4};
    const char *f16 = join(g_out_dir, "f16.npy"), *f32 = join(g_out_dir, "f32.npy");
    write_f16(f16, 1, shape, half, 4);
    write_f32(f32, 1, shape, ones);
    compare_says("other dtypes", f32, f16, 1, "different: dtypes float32 and float16");
    run_expect("compare: a missing file", 2, "no_such.npy", 30.0, NULL,
               ARGV("compare", one, IN("no_such.npy")));
    run_expect("compare: one file", 2, "compare A.npy B.npy", 30.0, NULL, ARGV("compare", one));
    clear_dir(g_out_dir);
}
