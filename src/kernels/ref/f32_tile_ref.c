/*
 * Reference attention tile (contract: fxa_attn_tile in kernels.h).
 * Portable C, the executable spec, built without fast-math and without FP
 * contraction, so its arithmetic is exactly what the source says:
 *   scores  z_ij = lambda * (sum_c q_ic kt_cj - qk_center_i), sum in c order;
 *   softmax per row: the fixed shift, or the online update (integer shift);
 *   P.V     o_ic += sum_j p_ij v_jc, in j order.
 * The two products are register-blocked (ROWS x COLS accumulators, inner
 * loops over contiguous columns) so that compilers vectorise them for any
 * ISA; blocking does not change any element's summation order, and edges
 * run the same order through the generic loops.
 */
#include <assert.h>

#include "../kernels.h"
#include "exp2_ref.h"
#include "rows_ref.h"

#define ROWS 4
#define COLS 16

/* Full ROWS x COLS block of scores at (i0, j0). */
static void scores_block(const fxa_attn_tile *t, size_t i0, size_t j0)
{
    float a0[COLS] = {0.0f};
    float a1[COLS] = {0.0f};
    float a2[COLS] = {0.0f};
    float a3[COLS] = {0.0f};
    const float *q0 = t->q + i0 * t->ldq;
    const float *q1 = q0 + t->ldq;
    const float *q2 = q1 + t->ldq;
    const float *q3 = q2 + t->ldq;
    for (size_t c = 0; c < t->d; c++) {
        const float *kc = t->kt + fxa_kt_offset(t->kt_panel, t->d, c, j0);
        for (size_t jj = 0; jj < COLS; jj++) {
            a0[jj] += q0[c] * kc[jj];
            a1[jj] += q1[c] * kc[jj];
            a2[jj] += q2[c] * kc[jj];
            a3[jj] += q3[c] * kc[jj];
        }
    }
    float *const acc[ROWS] = {a0, a1, a2, a3};
    for (size_t r = 0; r < ROWS; r++) {
        float *z = t->scores + (i0 + r) * t->ld_scores + j0;
        for (size_t jj = 0; jj < COLS; jj++)
            z[jj] = t->lambda * (acc[r][jj] - t->qk_center[i0 + r]);
    }
}

/* Any block (edges): the same per-element order as scores_block. */
static void scores_generic(const fxa_attn_tile *t, size_t i0, size_t ni, size_t j0, size_t nj)
{
    for (size_t r = 0; r < ni; r++) {
        const float *q = t->q + (i0 + r) * t->ldq;
        float *z = t->scores + (i0 + r) * t->ld_scores + j0;
        for (size_t jj = 0; jj < nj; jj++) {
            float s = 0.0f;
            for (size_t c = 0; c < t->d; c++)
                s += q[c] * t->kt[fxa_kt_offset(t->kt_panel, t->d, c, j0 + jj)];
            z[jj] = t->lambda * (s - t->qk_center[i0 + r]);
        }
    }
}

/* Full ROWS x COLS block of o at (i0, c0): o += P V over all keys. */
static void pv_block(const fxa_attn_tile *t, size_t i0, size_t c0)
{
    float a0[COLS];
    float a1[COLS];
    float a2[COLS];
    float a3[COLS];
    float *const o0 = t->o + i0 * t->ldo + c0;
    float *const o1 = o0 + t->ldo;
    float *const o2 = o1 + t->ldo;
    float *const o3 = o2 + t->ldo;
    const float *p0 = t->scores + i0 * t->ld_scores;
    const float *p1 = p0 + t->ld_scores;
    const float *p2 = p1 + t->ld_scores;
    const float *p3 = p2 + t->ld_scores;
    for (size_t cc = 0; cc < COLS; cc++) {
        a0[cc] = o0[cc];
        a1[cc] = o1[cc];
        a2[cc] = o2[cc];
        a3[cc] = o3[cc];
    }
    for (size_t j = 0; j < t->n_kv; j++) {
        const float *vj = t->v + j * t->ldv + c0;
        for (size_t cc = 0; cc < COLS; cc++) {
            a0[cc] += p0[j] * vj[cc];
            a1[cc] += p1[j] * vj[cc];
            a2[cc] += p2[j] * vj[cc];
            a3[cc] += p3[j] * vj[cc];
        }
    }
    for (size_t cc = 0; cc < COLS; cc++) {
        o0[cc] = a0[cc];
        o1[cc] = a1[cc];
        o2[cc] = a2[cc];
        o3[cc] = a3[cc];
    }
}

static void pv_generic(const fxa_attn_tile *t, size_t i0, size_t ni, size_t c0, size_t nc)
{
    for (size_t r = 0; r < ni; r++) {
        float *o = t->o + (i0 + r) * t->ldo + c0;
        const float *p = t->scores + (i0 + r) * t->ld_scores;
        for (size_t j = 0; j < t->n_kv; j++) {
            const float *vj = t->v + j * t->ldv + c0;
            for (size_t cc = 0; cc < nc; cc++)
                o[cc] += p[j] * vj[cc];
        }
    }
}

/* The ROWS x COLS blocks of n_q rows by cols columns: full ones to block, the edges to edge
 * (for the scores, columns are keys; for P.V, columns of o). */
static inline __attribute__((always_inline)) void
by_blocks(const fxa_attn_tile *t, size_t cols, void (*block)(const fxa_attn_tile *, size_t, size_t),
          void (*edge)(const fxa_attn_tile *, size_t, size_t, size_t, size_t))
{
    for (size_t i0 = 0; i0 < t->n_q; i0 += ROWS) {
        const size_t ni = t->n_q - i0 < ROWS ? t->n_q - i0 : ROWS;
        for (size_t c0 = 0; c0 < cols; c0 += COLS) {
            const size_t nc = cols - c0 < COLS ? cols - c0 : COLS;
            if (ni == ROWS && nc == COLS)
                block(t, i0, c0);
            else
                edge(t, i0, ni, c0, nc);
        }
    }
}

/* p_j = exp2(z_j - shift) in place over row i (shift integer-valued); returns their sum
 * (increasing j). Every row takes the flush test. */
static float row_exp2(const fxa_attn_tile *t, size_t i, float shift, int may_flush)
{
    (void)may_flush;
    float *z = t->scores + i * t->ld_scores;
    float sum = 0.0f;
    for (size_t j = 0; j < t->n_kv; j++) {
        z[j] = fxa_exp2_shifted_ref(z[j], shift);
        sum += z[j];
    }
    return sum;
}

#define FXA_SOFTMAX_TILE fxa_attn_tile
#include "../softmax_rows_impl.h"

void fxa_f32_tile__ref(const fxa_attn_tile *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    assert(t->ldq >= t->d && t->kt_panel % COLS == 0 && t->ldv >= t->d && t->ldo >= t->d);
    by_blocks(t, t->n_kv, scores_block, scores_generic);
    softmax_rows(t, 0, t->n_q);
    by_blocks(t, t->d, pv_block, pv_generic);
}
