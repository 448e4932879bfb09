/* Sampled comparison against the fp64 reference (verify.h). */
#include "verify.h"

#include <math.h>
#include <string.h>

#include "fp64_attn.h"

void fxt_verify(const fxa_attn_desc *d, const float *q, const float *k, const float *v,
                const float *out, const float *lse, int64_t rows_per_head, fxt_verify_result *res)
{
    double ref[FXA_MAX_HEAD_DIM];
    double vmax = 0.0;
    const int64_t nkv = d->batch * d->heads_kv * d->seq_kv * d->head_dim;
    const int64_t n_rows = rows_per_head < d->seq_q ? rows_per_head : d->seq_q;
    memset(res, 0, sizeof *res);
    for (int64_t i = 0; i < nkv; i++)
        vmax = fmax(vmax, fabs((double)v[i]));
    for (int64_t b = 0; b < d->batch; b++) {
        for (int64_t h = 0; h < d->heads_q; h++) {
            for (int64_t r = 0; r < n_rows; r++) {
                const int64_t i = n_rows > 1 ? r * (d->seq_q - 1) / (n_rows - 1) : 0;
                const int64_t off = fxt_row_offset(d, d->heads_q, d->seq_q, b, h, i);
                double ref_lse;
                fxt_fp64_attn_row(d, q, k, v, b, h, i, ref, &ref_lse);
                for (int64_t c = 0; c < d->head_dim; c++) {
                    const double err = fabs((double)out[off + c] - ref[c]);
                    res->max_abs_err = isnan(err) ? INFINITY : fmax(res->max_abs_err, err);
                }
                if (lse) {
                    const double err =
                        fabs((double)lse[(b * d->heads_q + h) * d->seq_q + i] - ref_lse);
                    res->max_lse_err = isnan(err) ? INFINITY : fmax(res->max_lse_err, err);
                    const double rel = err / fmax(1.0, fabs(ref_lse));
                    res->max_lse_rel = isnan(rel) ? INFINITY : fmax(res->max_lse_rel, rel);
                }
                res->rows++;
            }
        }
    }
    res->max_rel_err = res->max_abs_err / fmax(vmax, 1e-300);
}
