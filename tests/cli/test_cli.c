/*
 * End-to-end tests of the fxattn command line (README.md, "Command line").
 *
 *   test_cli /path/to/fxattn
 *
 * Works in a fresh folder made with mkdtemp under /tmp, runs the binary
 * with posix_spawn (no shell; cli_harness.h) and checks, one topic a file:
 *  A. good runs of attn, check and help (cli_attn.c);
 *  B. bad input and bad usage (cli_bad_input.c), and C. output failures
 *     (cli_output_fail.c): exit status, an "fxattn: error: " line, and the
 *     output folder exactly as before the run (cli_fail.h);
 *  hostile inputs and sizes beyond memory (cli_hostile.c), bench and info
 *  (cli_bench.c);
 *  D. option values (cli_options.c) and outputs checked before any write
 *     (cli_outputs.c); compare (cli_compare.c).
 * The temporary folder is removed at the end unless a check failed.
 */
#include <stdio.h>

#include "cli_fail.h"
#include "cli_harness.h"
#include "cli_tests.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s /path/to/fxattn\n", argv[0]);
        return 2;
    }
    cli_setup(argv[1]);
    const double t0 = now_s();
    test_good_runs();
    test_bad_input();
    test_output_failures();
    test_hostile();
    test_bench();
    test_empty_values();
    test_outputs_checked_first();
    test_number_messages();
    test_compare();
    printf("test_cli: %.1f s\n", now_s() - t0);
    fail_free_old_files();
    return cli_finish();
}
