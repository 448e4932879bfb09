/*
 * Fixed-max constants and gates. Notation as in docs/numerics.md:
 * z_ij are base-2 scores, U_i >= |z_ij| the row's bound, N the keys the row
 * attends to, m_i = ceil(U_i) - C the shift, e_ij = z_ij - m_i.
 *
 * C(N) = 127 - ceil(log2 N) - ceil(log2 max(Vmax, 1)): e_ij <= C, so
 * sum_j 2^e_ij |v_jd| <= N 2^C Vmax <= 2^127 and no fp32 accumulator
 * overflows.
 *
 * Strict gate, sound for every row: if ceil(U) <= floor(W/2), W = C + 125,
 * then e_ij >= C - ceil(U) - U >= C - 2 floor(W/2) >= -125: no term flushes.
 *
 * Centred gate, for rows whose keys are virtually centred (k - kbar, kbar the
 * mean key) with a per-row bound. Derivation:
 *  1. sum_j z'_ij = lambda q_i . sum_j (k_j - kbar) = 0 in exact arithmetic,
 *     so max_j z'_ij >= 0. In fp32 the scores and kbar carry rounding errors;
 *     the driver accepts a row here only when the bound's rounding allowance
 *     eps_i (the part of U_i that covers those errors, see attn_run.c) is at
 *     most 1, so the computed max_j z'_ij >= -1.
 *  2. The largest term is then >= 2^(-1 - m_i) = 2^(C - ceil(U_i) - 1), and
 *     a sum of non-negative fp32 terms is never below its largest term:
 *     l_i >= 2^(C - ceil(U_i) - 1).
 *  3. A flushed term is < 2^-126 and at most N terms flush, so the lost mass
 *     is < N 2^-126 <= 2^(ceil(log2 N) - 126).
 *  4. Relative loss < 2^(ceil(log2 N) - 126 - C + ceil(U_i) + 1) <= 2^-24
 *     (half an ulp of fp32, below the rounding of the sum itself) exactly
 *     when ceil(U_i) <= C + 101 - ceil(log2 N). The same bound holds for the
 *     numerator relative to Vmax, so the output error grows by at most
 *     2^-23 Vmax: the size of fp32 rounding in the P.V sum.
 *  Overflow needs no gate: e_ij <= C holds for every row.
 *  The gate is never tighter than the strict one. tests/numerics/
 *  test_attn_gates.c attacks it with rows on both sides of it.
 *
 * Masks (fxa_attn_desc.mask_kind, causal) add a bias b_ij to the scores
 * (base 2; -inf masks a key, whose term is exactly 0: the tiles take the
 * flush test on every masked row). B_i = max finite b_ij of the row.
 *  - Boolean masks and causal: every unmasked b_ij = 0, so the unmasked
 *    terms are those of an unmasked row and the strict gate proves that
 *    none flushes. The centred gate does not apply (its zero sum runs over
 *    every key).
 *  - Additive masks, masked gate: the shift is m_i = ceil(U_i + B_i) - C,
 *    so e_ij <= C (+ 2^-7 for the rounding of z + b, |B_i| <= 2^16: still
 *    no overflow). The key j* with b = B_i has z + b >= B_i - U_i, so the
 *    largest term has e > C - 2 ceil(U_i) - 1 - 2^-7. Terms with smaller
 *    biases may flush, at most N of them, each < 2^-126: the loss is below
 *    2^-24 of the row total when 2 ceil(U_i) <= C + 99 - ceil(log2 N), the
 *    masked gate (FXA_ROW_FIXED_MAY_FLUSH rows). Other rows, and rows with
 *    |B_i| > 2^16, run online softmax.
 *  - A row with every key masked has l_i = 0: output 0, LSE -inf.
 */
#include "fxattn_diag.h"
#include "bound.h"

#include <limits.h>
#include <math.h>

int fxa_ceil_log2_i64(int64_t n)
{
    int k = 0;
    while (k < 63 && ((int64_t)1 << k) < n)
        k++;
    return k;
}

int fxa_ceil_log2_vmax(double x)
{
    int e;
    if (!(x > 1.0))
        return 0;
    double f = frexp(x, &e); /* x = f 2^e, f in [0.5, 1) */
    return f == 0.5 ? e - 1 : e;
}

int fxa_fixed_m_c(int64_t n_keys, double vmax)
{
    return 127 - fxa_ceil_log2_i64(n_keys < 1 ? 1 : n_keys) - fxa_ceil_log2_vmax(vmax);
}

/* floor(w / 2); exact in int for any w from an int plus a small constant. */
static int floor_half(int64_t w)
{
    return (int)(w >= 0 ? w / 2 : -((-w + 1) / 2));
}

int fxa_fixed_m_gate_strict(int c)
{
    return floor_half((int64_t)c + 125);
}

int fxa_fixed_m_gate_masked(int c, int64_t n_keys)
{
    return floor_half((int64_t)c + 99 - fxa_ceil_log2_i64(n_keys < 1 ? 1 : n_keys));
}

int fxa_fixed_m_gate_centered(int c, int64_t n_keys)
{
    const int strict = fxa_fixed_m_gate_strict(c);
    const int64_t loose = (int64_t)c + 101 - fxa_ceil_log2_i64(n_keys < 1 ? 1 : n_keys);
    return loose > strict ? (loose < INT_MAX ? (int)loose : INT_MAX) : strict;
}
