/*
 * Reference attention tile (contract: fxa_attn_tile in kernels.h).
 * Scalar C, the executable spec: scores as sequential fp32 dot products,
 * then per row either the fixed-shift sum or the online-softmax update.
 * Written so that compilers vectorise the inner loops; built without
 * fast-math so that its arithmetic is exactly what the source says.
 */
#include <assert.h>
#include <math.h>

#include "../kernels.h"
#include "exp2_ref.h"

static void scores_ref(const fxa_attn_tile *t)
{
    for (size_t i = 0; i < t->n_q; i++) {
        const float *q = t->q + i * t->ldq;
        float *z = t->scores + i * t->n_kv;
        for (size_t j = 0; j < t->n_kv; j++) {
            const float *k = t->k + j * t->ldk;
            float s = 0.0f;
            for (size_t c = 0; c < t->d; c++)
                s += q[c] * k[c];
            z[j] = t->lambda * (s - t->qk_center[i]);
        }
    }
}

/* p_j = exp2(z_j - shift) in place (shift integer-valued); returns their
 * sum (increasing j). */
static float exp2_row_sum(float *z, size_t n, float shift)
{
    float sum = 0.0f;
    for (size_t j = 0; j < n; j++) {
        z[j] = fxa_exp2_shifted_ref(z[j], shift);
        sum += z[j];
    }
    return sum;
}

/* o += sum_j p_j v_j, in increasing j. */
static void accumulate_pv(float *o, const float *p, const float *v, size_t ldv, size_t n_kv,
                          size_t d)
{
    for (size_t j = 0; j < n_kv; j++) {
        const float pj = p[j];
        const float *vj = v + j * ldv;
        for (size_t c = 0; c < d; c++)
            o[c] += pj * vj[c];
    }
}

static float row_max(const float *z, size_t n)
{
    float mx = -INFINITY;
    for (size_t j = 0; j < n; j++)
        mx = z[j] > mx ? z[j] : mx;
    return mx;
}

static void fxa_attn_tile_ref(const fxa_attn_tile *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    assert(t->ldq >= t->d && t->ldk >= t->d && t->ldv >= t->d && t->ldo >= t->d);
    scores_ref(t);
    for (size_t i = 0; i < t->n_q; i++) {
        float *z = t->scores + i * t->n_kv;
        float *o = t->o + i * t->ldo;
        if (!t->online[i]) {
            t->l[i] += exp2_row_sum(z, t->n_kv, t->m[i]);
        } else {
            /* Integer running shift: the rescale factor is an exact power of
             * two and the largest term lies in (1/2, 1]. */
            float m_new = fmaxf(t->m[i], ceilf(row_max(z, t->n_kv)));
            float alpha = fxa_exp2_shifted_ref(t->m[i], m_new);
            float sum = exp2_row_sum(z, t->n_kv, m_new);
            if (alpha != 1.0f) {
                for (size_t c = 0; c < t->d; c++)
                    o[c] *= alpha;
            }
            t->l[i] = t->l[i] * alpha + sum;
            t->m[i] = m_new;
        }
        accumulate_pv(o, z, t->v, t->ldv, t->n_kv, t->d);
    }
}

const fxa_kernels fxa_kernels_ref = {
    .isa_name = "ref",
    .kv_tile = 256,
    .attn_tile = fxa_attn_tile_ref,
};
