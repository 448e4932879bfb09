/* The libraries' wall clock (stage timings in stats): monotonic seconds. */
#ifndef FXA_CLOCK_H
#define FXA_CLOCK_H

#include <time.h>

static inline double fxa_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#endif
