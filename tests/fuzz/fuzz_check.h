/*
 * The contract checks of the fuzz targets (tests/fuzz/fuzz_*.c). The includer defines
 * FUZZ_NAME (its name, a string literal) first.
 *
 * CHECK(cond): a violation prints "<FUZZ_NAME>: contract violated at FILE:LINE: cond" to
 * g_fuzz_report (stderr unless the target points it elsewhere) and stops the run with
 * __builtin_trap, which libFuzzer reports as a crash with its input.
 */
#ifndef FXA_FUZZ_CHECK_H
#define FXA_FUZZ_CHECK_H

#include <stdio.h>
#include <string.h>

#ifndef FUZZ_NAME
#error "define FUZZ_NAME before including fuzz_check.h"
#endif

static FILE *g_fuzz_report; /* where violations are printed; NULL: stderr */

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(g_fuzz_report ? g_fuzz_report : stderr,                                        \
                    FUZZ_NAME ": contract violated at %s:%d: %s\n", __FILE__, __LINE__, #cond);    \
            __builtin_trap();                                                                      \
        }                                                                                          \
    } while (0)

/* err (errlen bytes offered) holds a failure message about `who` (who_len bytes):
 * "<who>: <reason>", one line, shorter than errlen. */
static inline void check_message(const char *err, size_t errlen, const char *who, size_t who_len)
{
    const size_t len = strnlen(err, errlen);
    CHECK(len < errlen);
    CHECK(len > who_len + 2);
    CHECK(memcmp(err, who, who_len) == 0);
    CHECK(err[who_len] == ':' && err[who_len + 1] == ' ');
    CHECK(strchr(err, '\n') == NULL);
}

/* After a call offered cap bytes of small (small_size bytes, filled with 0x5a before), or NULL
 * and 0 when use_null: no byte past what was offered is written, and what was written is a
 * prefix of full (the message the call gives with room). */
static inline void check_small_message(const char *small, size_t small_size, size_t cap,
                                       int use_null, const char *full)
{
    for (size_t i = use_null ? 0 : cap; i < small_size; i++) {
        CHECK(small[i] == 0x5a);
    }
    if (!use_null && cap > 0) {
        const size_t len = strnlen(small, cap);
        CHECK(len < cap);
        CHECK(strncmp(small, full, len) == 0);
    }
}

#endif
