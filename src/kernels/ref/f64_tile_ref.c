/* The fp64 forward tile (fxa_attn_tile_f64): the only one; every kernel set
 * runs it. */
#include <math.h>

#include "../kernels.h"
#include "f64_dot_ref.h"

/* Row i's scores into z[0..n_kv); returns their largest (-INFINITY when
 * every key is masked). */
static double row_scores(const fxa_attn_tile_f64 *t, size_t i, double *z)
{
    fxa_f64_dots(t->q + i * t->ldq, t->k, t->ldk, t->n_kv, t->d, z);
    const double *bias = t->bias ? t->bias + i * t->ld_bias : NULL;
    double zmax = -INFINITY;
    for (size_t j = 0; j < t->n_kv; j++) {
        double x = t->tau * (z[j] - t->center[i]);
        if (bias)
            x += bias[j];
        z[j] = x;
        zmax = x > zmax ? x : zmax;
    }
    return zmax;
}

void fxa_f64_tile__ref(const fxa_attn_tile_f64 *t)
{
    double *z = t->scores;
    for (size_t i = 0; i < t->n_q; i++) {
        const double zmax = row_scores(t, i, z);
        if (zmax == -INFINITY)
            continue; /* every key of the tile masked: adds nothing */
        double *o = t->o + i * t->ldo;
        double m = t->m[i], l = t->l[i];
        if (t->online[i] && zmax > m) {
            const double a = exp(m - zmax); /* 0 for the row's first keys */
            l *= a;
            for (size_t c = 0; c < t->d; c++)
                o[c] *= a;
            m = zmax;
            t->m[i] = m;
        }
        for (size_t j = 0; j < t->n_kv; j++) {
            if (z[j] == -INFINITY)
                continue;
            const double p = exp(z[j] - m);
            l += p;
            fxa_f64_axpy(p, t->v + (int64_t)j * t->ldv, t->d, o);
        }
        t->l[i] = l;
    }
}
