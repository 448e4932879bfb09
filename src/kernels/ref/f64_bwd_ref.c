/* The fp64 backward tiles (fxa_attn_bwd_tile_f64): the only ones; every
 * kernel set runs them. */
#include <math.h>

#include "../kernels.h"
#include "f64_dot_ref.h"

/* Keys per pass over a row (the scratch of scores on the stack). */
#define F64_BWD_KEYS 64

/* Row i against keys [j0, j0 + n): p[j] = P_ij and ds[j] = dS_ij. */
static void row_p_ds(const fxa_attn_bwd_tile_f64 *t, size_t i, size_t j0, size_t n, double *p,
                     double *ds)
{
    const double *q = t->q + (int64_t)i * t->ldq, *dout = t->dout + (int64_t)i * t->ld_dout;
    const double *bias = t->bias ? t->bias + i * t->ld_bias + j0 : NULL;
    fxa_f64_dots(q, t->k + (int64_t)j0 * t->ldk, t->ldk, n, t->d, p);
    fxa_f64_dots(dout, t->v + (int64_t)j0 * t->ldv, t->ldv, n, t->d, ds);
    for (size_t j = 0; j < n; j++) {
        const double b = bias ? bias[j] : 0.0;
        p[j] = b == -INFINITY ? 0.0 : exp(t->tau * p[j] + b - t->m[i]) / t->l[i];
        ds[j] = p[j] * (ds[j] - t->delta[i]);
    }
}

void fxa_f64_bwd_dq__ref(const fxa_attn_bwd_tile_f64 *t)
{
    double p[F64_BWD_KEYS], ds[F64_BWD_KEYS];
    for (size_t i = 0; i < t->n_q; i++) {
        double *dq = t->dq + (int64_t)i * t->ld_dq;
        for (size_t j0 = 0; j0 < t->n_kv; j0 += F64_BWD_KEYS) {
            const size_t n = t->n_kv - j0 < F64_BWD_KEYS ? t->n_kv - j0 : F64_BWD_KEYS;
            row_p_ds(t, i, j0, n, p, ds);
            for (size_t j = 0; j < n; j++)
                fxa_f64_axpy(t->tau * ds[j], t->k + (int64_t)(j0 + j) * t->ldk, t->d, dq);
        }
    }
}

void fxa_f64_bwd_dkdv__ref(const fxa_attn_bwd_tile_f64 *t)
{
    double p[F64_BWD_KEYS], ds[F64_BWD_KEYS];
    for (size_t j0 = 0; j0 < t->n_kv; j0 += F64_BWD_KEYS) {
        const size_t n = t->n_kv - j0 < F64_BWD_KEYS ? t->n_kv - j0 : F64_BWD_KEYS;
        for (size_t i = 0; i < t->n_q; i++) {
            row_p_ds(t, i, j0, n, p, ds);
            const double *q = t->q + (int64_t)i * t->ldq;
            const double *dout = t->dout + (int64_t)i * t->ld_dout;
            for (size_t j = 0; j < n; j++) {
                fxa_f64_axpy(p[j], dout, t->d, t->dv + (int64_t)(j0 + j) * t->ld_dv);
                fxa_f64_axpy(t->tau * ds[j], q, t->d, t->dk + (int64_t)(j0 + j) * t->ld_dk);
            }
        }
    }
}
