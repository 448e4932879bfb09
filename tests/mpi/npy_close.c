/*
 * npy_close A.npy B.npy REL: compare two .npy files of the same shape
 * (tests/mpi/layer_mpi.sh). Prints max|a - b| / max|a| and exits 0 when it
 * is at most REL and every value is finite, 1 when not (a non-finite value
 * is named: fmax would hide it from the ratio), 2 on bad usage or a file
 * that cannot be read or whose shape differs.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fxattn_npy.h"

static float value(const fxa_npy *a, int64_t i)
{
    return a->dtype == FXA_F16 ? fxa_f16_to_f32(((const uint16_t *)a->data)[i])
                               : ((const float *)a->data)[i];
}

int main(int argc, char **argv)
{
    char err[600];
    fxa_npy a, b;
    char *end = NULL;
    const double rel = argc == 4 ? strtod(argv[3], &end) : -1.0;
    if (argc != 4 || !end || *end || !(rel >= 0.0)) {
        fprintf(stderr, "usage: npy_close A.npy B.npy REL\n");
        return 2;
    }
    if (fxa_npy_read(argv[1], &a, err, sizeof err) != FXA_OK) {
        fprintf(stderr, "npy_close: %s\n", err);
        return 2;
    }
    if (fxa_npy_read(argv[2], &b, err, sizeof err) != FXA_OK) {
        fprintf(stderr, "npy_close: %s\n", err);
        fxa_npy_free(&a);
        return 2;
    }
    int code = 2;
    if (a.ndim == b.ndim && memcmp(a.shape, b.shape, (size_t)a.ndim * sizeof a.shape[0]) == 0) {
        double amax = 0.0, diff = 0.0;
        int64_t non_finite = 0, first = -1;
        for (int64_t i = 0; i < a.count; i++) {
            const double x = value(&a, i), y = value(&b, i);
            if (!isfinite(x) || !isfinite(y)) {
                if (non_finite++ == 0)
                    first = i;
                continue;
            }
            amax = fmax(amax, fabs(x));
            diff = fmax(diff, fabs(x - y));
        }
        const double ratio = amax > 0.0 ? diff / amax : diff;
        printf("npy_close: max|a - b| = %.3g of max|a| (limit %.3g)\n", ratio, rel);
        if (non_finite)
            printf("npy_close: %lld non-finite values, the first at element %lld (%g vs %g)\n",
                   (long long)non_finite, (long long)first, value(&a, first), value(&b, first));
        code = !non_finite && ratio <= rel ? 0 : 1;
    } else {
        fprintf(stderr, "npy_close: %s and %s have different shapes\n", argv[1], argv[2]);
    }
    fxa_npy_free(&a);
    fxa_npy_free(&b);
    return code;
}
