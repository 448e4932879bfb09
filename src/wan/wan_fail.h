/* The Wan libraries' failure messages: the message into a caller's buffer
 * (printf style), the status returned. */
#ifndef FXA_WAN_FAIL_H
#define FXA_WAN_FAIL_H

#include <stdarg.h>
#include <stdio.h>

#include "fxattn.h"

static inline fxa_status fxa_wan_failf(char *err, size_t errlen, fxa_status st, const char *fmt,
                                       ...) __attribute__((format(printf, 4, 5)));
static inline fxa_status fxa_wan_failf(char *err, size_t errlen, fxa_status st, const char *fmt,
                                       ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return st;
}

#endif
