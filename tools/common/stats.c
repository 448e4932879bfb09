/* Clock and medians (stats.h). */
#include "stats.h"

#include <stdlib.h>
#include <time.h>

double fxt_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *x, const void *y)
{
    const double a = *(const double *)x;
    const double b = *(const double *)y;
    return (a > b) - (a < b);
}

double fxt_median(double *x, size_t n)
{
    if (!n)
        return 0.0;
    qsort(x, n, sizeof *x, cmp_double);
    return x[n / 2];
}
