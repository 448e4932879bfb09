/* fp64 reference attention (see fp64_attn.h). */
#include "fp64_attn.h"

#include <math.h>
#include <stdlib.h>

int64_t fxt_row_offset(const fxa_attn_desc *d, int64_t heads, int64_t seq, int64_t b, int64_t h,
                       int64_t s)
{
    if (d->layout == FXA_LAYOUT_BSHD)
        return ((b * seq + s) * heads + h) * d->head_dim;
    return ((b * heads + h) * seq + s) * d->head_dim;
}

void fxt_fp64_attn_row(const fxa_attn_desc *d, const float *q, const float *k, const float *v,
                       int64_t b, int64_t h, int64_t i, double *out, double *lse)
{
    const int64_t dim = d->head_dim;
    const int64_t kvh = h / (d->heads_q / d->heads_kv);
    const double tau = d->scale != 0.0 ? d->scale : 1.0 / sqrt((double)dim);
    const float *qi = q + fxt_row_offset(d, d->heads_q, d->seq_q, b, h, i);
    double *s = malloc((size_t)d->seq_kv * sizeof *s);
    double mx = -INFINITY;
    double sum = 0.0;
    if (!s)
        abort(); /* test and tool support only: a few KiB */
    for (int64_t j = 0; j < d->seq_kv; j++) {
        const float *kj = k + fxt_row_offset(d, d->heads_kv, d->seq_kv, b, kvh, j);
        double dot = 0.0;
        for (int64_t c = 0; c < dim; c++)
            dot += (double)qi[c] * (double)kj[c];
        s[j] = tau * dot;
        mx = s[j] > mx ? s[j] : mx;
    }
    for (int64_t c = 0; c < dim; c++)
        out[c] = 0.0;
    for (int64_t j = 0; j < d->seq_kv; j++) {
        const float *vj = v + fxt_row_offset(d, d->heads_kv, d->seq_kv, b, kvh, j);
        const double p = exp(s[j] - mx);
        sum += p;
        for (int64_t c = 0; c < dim; c++)
            out[c] += p * (double)vj[c];
    }
    for (int64_t c = 0; c < dim; c++)
        out[c] /= sum;
    if (lse)
        *lse = mx + log(sum);
    free(s);
}
