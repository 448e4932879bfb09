/* The topics of test_cli, run in this order by its main (test_cli.c). */
#ifndef FXA_CLI_TESTS_H
#define FXA_CLI_TESTS_H

/* A. Good runs of attn, check and help (cli_attn.c); also makes the old
 * output files of the failure cases. */
void test_good_runs(void);
/* B. Bad input files and bad usage (cli_bad_input.c). */
void test_bad_input(void);
/* C. Output failures: missing folders, /dev/full (cli_output_fail.c). */
void test_output_failures(void);
/* Hostile finite inputs, one file under two names, FIFOs, sizes beyond
 * memory (cli_hostile.c). */
void test_hostile(void);
/* bench's JSON lines, its --backward, --causal, --seq-kv and compute
 * choices, and info (cli_bench.c). */
void test_bench(void);
/* D1-D3, D11-D21: empty option values, refused numbers (cli_options.c). */
void test_empty_values(void);
void test_number_messages(void);
/* D4-D10, D22-D24: outputs checked before any write (cli_outputs.c). */
void test_outputs_checked_first(void);
/* compare: identical runs, a changed element, other shapes and dtypes, bad
 * usage (cli_compare.c). */
void test_compare(void);

#endif
