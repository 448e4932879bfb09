/* Hashes compared across ranks (input_hash.h). */
#include "input_hash.h"

#include <string.h>

#include "cli.h"
#include "fxattn_npy.h"

uint64_t fxt_hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t v;
        memcpy(&v, b + i, 8);
        h = (h ^ v) * 0x9e3779b97f4a7c15ull;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

int fxt_hash_npy(const char *path, const char *what, int axis, int64_t len, int64_t token_bytes,
                 uint64_t *h)
{
    const int64_t piece = (int64_t)16 << 20;
    const int64_t step = token_bytes > 0 && token_bytes < piece ? piece / token_bytes : 1;
    *h = FXT_HASH_SEED;
    for (int64_t t0 = 0; t0 < len; t0 += step) {
        const int64_t n = len - t0 < step ? len - t0 : step;
        char err[600];
        fxa_npy a;
        const fxa_status st = fxa_npy_read_slice(path, axis, t0, n, &a, err, sizeof err);
        if (st != FXA_OK)
            return fxt_fail(st == FXA_ERR_NO_MEMORY ? FXT_EXIT_FAILURE : FXT_EXIT_BAD_INPUT,
                            "%s: %s", what, err);
        *h = fxt_hash_bytes(*h, &a.dtype, sizeof a.dtype);
        *h = fxt_hash_bytes(*h, a.data, (size_t)a.count * (a.dtype == FXA_F32 ? 4 : 2));
        fxa_npy_free(&a);
    }
    return 0;
}
