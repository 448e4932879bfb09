/* The reference backward tiles (fxa_attn_bwd_tile, kernels.h): the
 * executable spec, plain loops in the contract's order. */
#include "../kernels.h"
#include "bwd_p_ds_ref.h"

/* s_ij = q_i . k_j and dp_ij = dout_i . v_j, summed in increasing c. */
static void dots(const fxa_attn_bwd_tile *t, size_t i, size_t j, float *s_out, float *dp_out)
{
    const float *q = t->q + i * t->ldq;
    const float *dout = t->dout + i * t->ldq;
    float s = 0.0f;
    float dp = 0.0f;
    for (size_t c = 0; c < t->d; c++) {
        const size_t at = fxa_kt_offset(t->kt_panel, t->d, c, j);
        s += q[c] * t->kt[at];
        dp += dout[c] * t->vt[at];
    }
    *s_out = s;
    *dp_out = dp;
}

static void store(const fxa_attn_bwd_tile *t, size_t i, size_t j, float p, float ds)
{
    t->p[i * t->ld_p + j] = p;
    t->ds[i * t->ld_p + j] = ds;
}

/* p and ds of the tile. */
static void p_ds(const fxa_attn_bwd_tile *t)
{
    BWD_P_DS_REF(t, dots, store);
}

void fxa_f32_bwd_dkdv__ref(const fxa_attn_bwd_tile *t)
{
    p_ds(t);
    for (size_t j = 0; j < t->n_kv; j++) {
        float *dk = t->dk + j * t->ldg;
        float *dv = t->dv + j * t->ldg;
        for (size_t i = 0; i < t->n_q; i++) {
            const float p = t->p[i * t->ld_p + j];
            const float ds = t->ds[i * t->ld_p + j];
            const float *q = t->q + i * t->ldq;
            const float *dout = t->dout + i * t->ldq;
            for (size_t c = 0; c < t->d; c++) {
                dv[c] += p * dout[c];
                dk[c] += ds * q[c];
            }
        }
    }
}

void fxa_f32_bwd_dq__ref(const fxa_attn_bwd_tile *t)
{
    if (!t->p_ds_given)
        p_ds(t);
    for (size_t i = 0; i < t->n_q; i++) {
        float *dq = t->dq + i * t->ldg;
        for (size_t j = 0; j < t->n_kv; j++) {
            const float ds = t->ds[i * t->ld_p + j];
            const float *k = t->k + j * t->ldk;
            for (size_t c = 0; c < t->d; c++)
                dq[c] += ds * k[c];
        }
    }
}
