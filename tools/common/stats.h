/* Timing for the tools, benchmarks and tests: a clock and the median of
 * repeated runs (one copy of each). */
#ifndef FXT_STATS_H
#define FXT_STATS_H

#include <stddef.h>

/* Monotonic wall clock in seconds. */
double fxt_now(void);

/* The median of x[0..n): x sorted in place (ascending), then x[n / 2] (the
 * upper median for even n); 0 for n == 0. */
double fxt_median(double *x, size_t n);

#endif
