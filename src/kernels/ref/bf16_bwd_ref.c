/* The reference bf16-compute backward tiles (fxa_attn_bwd_tile_bf16,
 * kernels.h): the executable spec, plain loops in the contract's order and
 * pairs. */
#include "../../base/convert_inline.h"
#include "../kernels.h"
#include "bf16_pair_ref.h"
#include "bwd_p_ds_ref.h"

static float bf(uint16_t h)
{
    return fxa_bf16_bits_to_f32(h);
}

/* Element (i, j) of a [pairs][ld][2] layout paired along i. */
static size_t paired(size_t ld, size_t i, size_t j)
{
    return 2 * ((i / 2) * ld + j) + i % 2;
}

/* s_ij and dp_ij: the pair sums over c, pairs in increasing order. */
static void dots(const fxa_attn_bwd_tile_bf16 *t, size_t i, size_t j, float *s_out, float *dp_out)
{
    const size_t pairs = (t->d + 1) / 2;
    const uint16_t *q = t->q + i * t->ldq;
    const uint16_t *dout = t->dout + i * t->ldq;
    float s = 0.0f;
    float dp = 0.0f;
    for (size_t c = 0; c < pairs; c++) {
        const size_t at = 2 * fxa_kt_offset(t->kt_panel, pairs, c, j);
        s = fxa_bf16_pair_dot(s, q + 2 * c, t->kt + at);
        dp = fxa_bf16_pair_dot(dp, dout + 2 * c, t->vt + at);
    }
    *s_out = s;
    *dp_out = dp;
}

/* p and ds rounded to bf16 into pt, dst and ds. */
static void store(const fxa_attn_bwd_tile_bf16 *t, size_t i, size_t j, float p, float ds)
{
    const uint16_t ds16 = fxa_f32_to_bf16_bits(ds);
    t->pt[paired(t->ld_p, i, j)] = fxa_f32_to_bf16_bits(p);
    t->dst[paired(t->ld_p, i, j)] = ds16;
    t->ds[i * t->ld_p + j] = ds16;
}

/* p and ds of the tile, pads zeroed. */
static void p_ds(const fxa_attn_bwd_tile_bf16 *t)
{
    BWD_P_DS_REF(t, dots, store);
    for (size_t i = 0; t->n_kv % 2 && i < t->n_q; i++)
        t->ds[i * t->ld_p + t->n_kv] = 0;
    if (t->n_q % 2) {
        for (size_t j = 0; j < t->n_kv; j++) {
            t->pt[paired(t->ld_p, t->n_q, j)] = 0;
            t->dst[paired(t->ld_p, t->n_q, j)] = 0;
        }
    }
}

void fxa_bf16_bwd_dkdv__ref(const fxa_attn_bwd_tile_bf16 *t)
{
    p_ds(t);
    const size_t q_pairs = (t->n_q + 1) / 2;
    for (size_t j = 0; j < t->n_kv; j++) {
        float *dk = t->dk + j * t->ldg;
        float *dv = t->dv + j * t->ldg;
        for (size_t i = 0; i < q_pairs; i++) {
            const uint16_t *p = t->pt + 2 * (i * t->ld_p + j);
            const uint16_t *ds = t->dst + 2 * (i * t->ld_p + j);
            const uint16_t *q = t->qp + 2 * i * t->ldqp;
            const uint16_t *dout = t->doutp + 2 * i * t->ldqp;
            for (size_t c = 0; c < t->d; c++) {
                dv[c] = (dv[c] + bf(p[1]) * bf(dout[2 * c + 1])) + bf(p[0]) * bf(dout[2 * c]);
                dk[c] = (dk[c] + bf(ds[1]) * bf(q[2 * c + 1])) + bf(ds[0]) * bf(q[2 * c]);
            }
        }
    }
}

void fxa_bf16_bwd_dq__ref(const fxa_attn_bwd_tile_bf16 *t)
{
    if (!t->p_ds_given)
        p_ds(t);
    const size_t kv_pairs = (t->n_kv + 1) / 2;
    for (size_t i = 0; i < t->n_q; i++) {
        float *dq = t->dq + i * t->ldg;
        for (size_t j = 0; j < kv_pairs; j++) {
            const uint16_t *ds = t->ds + i * t->ld_p + 2 * j;
            const uint16_t *k = t->kp + 2 * j * t->ldkp;
            for (size_t c = 0; c < t->d; c++)
                dq[c] = (dq[c] + bf(ds[1]) * bf(k[2 * c + 1])) + bf(ds[0]) * bf(k[2 * c]);
        }
    }
}
