/* `fxattn compare A.npy B.npy`: whether two arrays are the same bytes (the
 * outputs of two runs, say one process and an MPI grid with --reproducible),
 * and where they differ when they do. Exit 0: identical; 1: different
 * (shapes, dtypes or values); 2: bad usage or an unreadable file. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "fxattn_npy.h"

static const char *dtype_name(fxa_dtype t)
{
    return t == FXA_F16 ? "float16" : "float32";
}

static void print_shape(const fxa_npy *a)
{
    printf("[");
    for (int i = 0; i < a->ndim; i++)
        printf("%s%lld", i ? ", " : "", (long long)a->shape[i]);
    printf("]");
}

static double value_at(const fxa_npy *a, int64_t i)
{
    return a->dtype == FXA_F16 ? (double)fxa_f16_to_f32(((const uint16_t *)a->data)[i])
                               : (double)((const float *)a->data)[i];
}

/* The index of flat element i in a's shape, printed as [i0, i1, ...]. */
static void print_index(const fxa_npy *a, int64_t i)
{
    int64_t idx[FXA_NPY_MAX_DIMS];
    for (int d = a->ndim - 1; d >= 0; d--) {
        idx[d] = a->shape[d] ? i % a->shape[d] : 0;
        i = a->shape[d] ? i / a->shape[d] : 0;
    }
    printf("[");
    for (int d = 0; d < a->ndim; d++)
        printf("%s%lld", d ? ", " : "", (long long)idx[d]);
    printf("]");
}

/* Same shapes and dtypes: 0 when every byte agrees, else 1 after naming how
 * many elements differ, the first and the largest difference. */
static int compare_values(const fxa_npy *a, const fxa_npy *b)
{
    const size_t elem = a->dtype == FXA_F16 ? 2 : 4;
    const char *x = a->data, *y = b->data;
    int64_t n_diff = 0, first = -1;
    double worst = 0.0;
    for (int64_t i = 0; i < a->count; i++) {
        if (memcmp(x + (size_t)i * elem, y + (size_t)i * elem, elem) == 0)
            continue;
        first = first < 0 ? i : first;
        n_diff++;
        const double d = fabs(value_at(a, i) - value_at(b, i));
        worst = d > worst || isnan(d) ? d : worst;
    }
    if (n_diff == 0) {
        printf("identical: ");
        print_shape(a);
        printf(" %s, %lld elements\n", dtype_name(a->dtype), (long long)a->count);
        return FXT_EXIT_OK;
    }
    printf("different: %lld of %lld elements; the first at ", (long long)n_diff,
           (long long)a->count);
    print_index(a, first);
    printf(" (%.9g and %.9g); the largest |difference| %.3g\n", value_at(a, first),
           value_at(b, first), worst);
    return FXT_EXIT_FAILURE;
}

int fxt_cmd_compare(int argc, char **argv)
{
    if (argc != 4 || argv[2][0] == '-' || argv[3][0] == '-')
        return fxt_fail(FXT_EXIT_BAD_INPUT, "compare needs two .npy files: compare A.npy B.npy");
    fxa_npy a = {0}, b = {0};
    char err[512];
    int code = FXT_EXIT_OK;
    fxa_status st = fxa_npy_read(argv[2], &a, err, sizeof err);
    if (st == FXA_OK) {
        st = fxa_npy_read(argv[3], &b, err, sizeof err);
    }
    if (st != FXA_OK) {
        code = fxt_fail(st == FXA_ERR_NO_MEMORY ? FXT_EXIT_FAILURE : FXT_EXIT_BAD_INPUT, "%s", err);
    } else if (a.ndim != b.ndim || memcmp(a.shape, b.shape, (size_t)a.ndim * sizeof a.shape[0])) {
        printf("different: shapes ");
        print_shape(&a);
        printf(" and ");
        print_shape(&b);
        printf("\n");
        code = FXT_EXIT_FAILURE;
    } else if (a.dtype != b.dtype) {
        printf("different: dtypes %s and %s\n", dtype_name(a.dtype), dtype_name(b.dtype));
        code = FXT_EXIT_FAILURE;
    } else {
        code = compare_values(&a, &b);
    }
    fxa_npy_free(&a);
    fxa_npy_free(&b);
    return code;
}
