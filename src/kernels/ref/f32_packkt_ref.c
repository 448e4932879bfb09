/* K^T packing, portable C (the spec of pack_kt, fxa_pack_kt_fn in kernels.h):
 * one scalar store per element, key by key. */
#include "../kernels.h"

void fxa_f32_packkt__ref(const float *const *rows, size_t n, size_t d, size_t panel, float *kt)
{
    for (size_t j = 0; j < n; j++) {
        float *kj = kt + fxa_kt_offset(panel, d, 0, j);
        for (size_t c = 0; c < d; c++)
            kj[c * panel] = rows[j][c];
    }
}
