/* K^T packing, portable C (the spec of pack_kt, fxa_pack_kt_fn in kernels.h):
 * one 32-bit word at a time, key by key, copied as bytes (the words may be
 * fp32 values or bf16 pairs). */
#include <string.h>

#include "../kernels.h"

void fxa_f32_packkt__ref(const void *const *rows, size_t n, size_t d, size_t panel, void *kt)
{
    for (size_t j = 0; j < n; j++) {
        const unsigned char *row = rows[j];
        unsigned char *kj = (unsigned char *)kt + 4 * fxa_kt_offset(panel, d, 0, j);
        for (size_t c = 0; c < d; c++)
            memcpy(kj + 4 * c * panel, row + 4 * c, 4);
    }
}
