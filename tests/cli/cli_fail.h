/* Failed runs of test_cli: the exit status, an ERR_PREFIX line on stderr,
 * and the output folder exactly as before the run (nothing new, old files
 * unchanged byte for byte, no "*.tmp.*" leftovers), each case run with and
 * without old output files in place. */
#ifndef FXA_CLI_FAIL_H
#define FXA_CLI_FAIL_H

#include <stddef.h>

#include "cli_harness.h"

typedef struct fail_case {
    const char *label;
    int want;             /* 2, or -1 for "any non-zero" */
    const char *mention;  /* word the error must mention, or NULL */
    const char *make_dir; /* a folder to create in out/ before the run, or NULL */
} fail_case;

/* The old out.npy and lse.npy put in place before the failure cases (taken
 * over, freed by fail_free_old_files); NULL: stand-in text files. */
void fail_set_old_files(unsigned char *out, size_t out_len, unsigned char *lse, size_t lse_len);
void fail_free_old_files(void);

/* Run args twice (empty out/, then old output files in place) and check
 * that each run fails as fc says and leaves out/ as it was. */
void expect_fail(const fail_case *fc, const char *const *args);

/* A bad command line: exit 2, the error mentioning `mention` (or NULL). */
#define BAD(label, mention, ...)                                                                   \
    expect_fail(&(const fail_case){(label), 2, (mention), NULL}, ARGV(__VA_ARGS__))

#endif
