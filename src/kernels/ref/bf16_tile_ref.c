/*
 * Reference bf16-compute attention tile (contract: fxa_attn_tile_bf16 in
 * kernels.h). Scalar C, the executable spec of FXA_COMPUTE_BF16: bf16
 * products in fp32 taken in key-dimension pairs as vdpbf16ps takes them, P
 * rounded to bf16 before P.V and before it is summed into l.
 */
#include <assert.h>
#include <string.h>

#include "../../base/convert_inline.h"
#include "../kernels.h"
#include "bf16_pair_ref.h"
#include "exp2_ref.h"
#include "fxattn.h"
#include "rows_ref.h"

static float bf(uint16_t h)
{
    return fxa_bf16_bits_to_f32(h);
}

static void fxa_bf16_score__ref(const fxa_attn_tile_bf16 *t)
{
    const size_t pairs = (t->d + 1) / 2;
    for (size_t i = 0; i < t->n_q; i++) {
        const uint16_t *q = t->q + i * t->ldq;
        float *z = t->scores + i * t->ld_scores;
        for (size_t j = 0; j < t->n_kv; j++) {
            float s = 0.0f;
            for (size_t c = 0; c < pairs; c++) {
                const uint16_t *k = t->kp + 2 * fxa_kt_offset(t->kp_panel, pairs, c, j);
                s = fxa_bf16_pair_dot(s, q + 2 * c, k);
            }
            z[j] = t->lambda * (s - t->qk_center[i]);
        }
    }
}

/* Row i: p = bf16(exp2(z - shift)) into p16 (pad column zeroed); returns the sum of the
 * rounded values. Every row takes the flush test. */
static float row_exp2(const fxa_attn_tile_bf16 *t, size_t i, float shift, int may_flush)
{
    (void)may_flush;
    const float *z = t->scores + i * t->ld_scores;
    uint16_t *p16 = t->p16 + i * t->ld_scores;
    const size_t n = t->n_kv;
    float sum = 0.0f;
    for (size_t j = 0; j < n; j++) {
        p16[j] = fxa_f32_to_bf16_bits(fxa_exp2_shifted_bf16_ref(z[j], shift));
        sum += bf(p16[j]);
    }
    if (n % 2)
        p16[n] = 0;
    return sum;
}

#define FXA_SOFTMAX_TILE fxa_attn_tile_bf16
#include "../softmax_rows_impl.h"

static void fxa_bf16_pv__ref(const fxa_attn_tile_bf16 *t)
{
    const size_t key_pairs = (t->n_kv + 1) / 2;
    for (size_t i = 0; i < t->n_q; i++) {
        const uint16_t *p = t->p16 + i * t->ld_scores;
        float *o = t->o + i * t->ldo;
        for (size_t j = 0; j < key_pairs; j++) {
            const float p0 = bf(p[2 * j]);
            const float p1 = bf(p[2 * j + 1]);
            const uint16_t *v = t->vp + 2 * j * t->ldvp;
            for (size_t c = 0; c < t->d; c++)
                o[c] = (o[c] + p1 * bf(v[2 * c + 1])) + p0 * bf(v[2 * c]);
        }
    }
}

void fxa_bf16_tile__ref(const fxa_attn_tile_bf16 *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    assert(t->kp_panel % 16 == 0 && t->ldvp >= t->d && t->ld_scores >= t->n_kv + t->n_kv % 2);
    fxa_bf16_score__ref(t);
    softmax_rows(t, 0, t->n_q);
    fxa_bf16_pv__ref(t);
}
