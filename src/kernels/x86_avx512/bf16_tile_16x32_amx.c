/*
 * AMX attention tile for FXA_COMPUTE_BF16 (contract: fxa_attn_tile_bf16 in
 * kernels.h). Built with the AVX-512 flags, -mavx512bf16, -mamx-tile and
 * -mamx-bf16 (per file); run only where the OS granted this process the AMX
 * tile data (base/cpu.c asks once, ARCH_REQ_XCOMP_PERM).
 *
 * The tile's rows go in blocks of 32 (then 16, then the last 1-15), each
 * block all the way through while its scores and P stay in L1 (the blocks
 * of 32 software-pipelined: full_blocks below):
 *   scores  tdpbf16ps on 16 x 16 fp32 accumulator tiles, 2 x 2 of them (32
 *           rows x 32 keys): A = 16 query rows x 16 pairs read in place
 *           from q, B = 16 pairs x 16 keys read in place from a K panel
 *           (the pair panels of the vdpbf16ps tile are AMX's B layout). The
 *           raw dot products s are stored; keys past n_kv in the last group
 *           of 16 compute garbage that nothing reads.
 *   softmax the AVX-512 pass (bf16_softmax_avx512.h, raw scores): z = lambda
 *           (s - center), P rounded to bf16, l sums the rounded P.
 *   P.V     tdpbf16ps, 2 x 2 accumulator tiles (32 rows x 32 columns of o,
 *           loaded from o and stored back) over whole chunks of 32 keys: A =
 *           16 rows x 16 key pairs of P, B = 16 key pairs x 16 columns of the
 *           V pair rows, both read in place. The keys after the last whole
 *           chunk go through vdpbf16ps, in order, so that nothing reads a P
 *           or V element past the contract's.
 * Summation: each accumulator element sums its pairs in the hardware's own
 * order within one tdpbf16ps (not the reference's sequential one) and the
 * instructions in increasing key (or dimension) order, so a row's result
 * does not depend on its place in the tile. Subnormal inputs and results
 * are flushed, as with vdpbf16ps. Head dims that are not a multiple of 32
 * (16 pairs, one A tile's width) go to the vdpbf16ps tile.
 */
#include <assert.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../kernels.h"
#include "../../base/amx_tiles.h"
#define FXA_BF16_RAW_SCORES 1 /* the accumulator tiles store s */
#include "bf16_softmax_avx512.h"
#include "rows_avx512.h"

#define ALWAYS_INLINE inline __attribute__((always_inline))

#define PAIRS_PER_TILE 16 /* an A tile's 64 bytes per row: 16 bf16 pairs */
#define KEYS_PER_TILE 16  /* a B (or accumulator) tile's 16 fp32 columns */
#define ROW_BLOCK 32      /* two A tiles of 16 rows */

/* Raw scores s of rows [i0, i0 + 16 (1 + rows2)) x keys [j0, j0 + 16 (1 + keys2)). */
static ALWAYS_INLINE void scores_group(const fxa_attn_tile_bf16 *t, size_t i0, size_t j0,
                                       const int rows2, const int keys2)
{
    const size_t pairs = t->d / 2;
    const size_t q_stride = t->ldq * sizeof(uint16_t);
    const size_t k_stride = t->kp_panel * 2 * sizeof(uint16_t);
    const size_t s_stride = t->ld_scores * sizeof(float);
    const uint16_t *q0 = t->q + i0 * t->ldq;
    const uint16_t *q1 = q0 + 16 * t->ldq;
    _tile_zero(C00);
    if (keys2)
        _tile_zero(C01);
    if (rows2)
        _tile_zero(C10);
    if (rows2 && keys2)
        _tile_zero(C11);
    for (size_t c = 0; c < pairs; c += PAIRS_PER_TILE) {
        _tile_loadd(A0, q0 + 2 * c, q_stride);
        if (rows2)
            _tile_loadd(A1, q1 + 2 * c, q_stride);
        _tile_loadd(B0, t->kp + 2 * fxa_kt_offset(t->kp_panel, pairs, c, j0), k_stride);
        if (keys2)
            _tile_loadd(B1, t->kp + 2 * fxa_kt_offset(t->kp_panel, pairs, c, j0 + 16), k_stride);
        _tile_dpbf16ps(C00, A0, B0);
        if (keys2)
            _tile_dpbf16ps(C01, A0, B1);
        if (rows2)
            _tile_dpbf16ps(C10, A1, B0);
        if (rows2 && keys2)
            _tile_dpbf16ps(C11, A1, B1);
    }
    float *s0 = t->scores + i0 * t->ld_scores + j0;
    float *s1 = s0 + 16 * t->ld_scores;
    _tile_stored(C00, s0, s_stride);
    if (keys2)
        _tile_stored(C01, s0 + 16, s_stride);
    if (rows2)
        _tile_stored(C10, s1, s_stride);
    if (rows2 && keys2)
        _tile_stored(C11, s1 + 16, s_stride);
}

/* The key groups of one row block's scores: 32 keys each, the last one
 * 16 wide when at most 16 keys are left. */
static size_t score_groups(const fxa_attn_tile_bf16 *t)
{
    return (t->n_kv + 2 * KEYS_PER_TILE - 1) / (2 * KEYS_PER_TILE);
}

static ALWAYS_INLINE void scores_group_at(const fxa_attn_tile_bf16 *t, size_t i0, size_t g,
                                          const int rows2)
{
    const size_t j0 = g * 2 * KEYS_PER_TILE;
    if (j0 + KEYS_PER_TILE < t->n_kv)
        scores_group(t, i0, j0, rows2, 1);
    else
        scores_group(t, i0, j0, rows2, 0);
}

static ALWAYS_INLINE void scores_block(const fxa_attn_tile_bf16 *t, size_t i0, const int rows2)
{
    for (size_t g = 0; g < score_groups(t); g++)
        scores_group_at(t, i0, g, rows2);
}

/* o[rows [i0, i0 + 16 (1 + rows2)), columns [c0, c0 + 32)] += P V over the
 * first `chunks` chunks of 32 keys. */
static ALWAYS_INLINE void pv_group(const fxa_attn_tile_bf16 *t, size_t i0, size_t c0, size_t chunks,
                                   const int rows2)
{
    const size_t o_stride = t->ldo * sizeof(float);
    const size_t p_stride = t->ld_scores * sizeof(uint16_t);
    const size_t v_stride = t->ldvp * 2 * sizeof(uint16_t);
    float *o0 = t->o + i0 * t->ldo + c0;
    float *o1 = o0 + 16 * t->ldo;
    const uint16_t *p0 = t->p16 + i0 * t->ld_scores;
    const uint16_t *p1 = p0 + 16 * t->ld_scores;
    _tile_loadd(C00, o0, o_stride);
    _tile_loadd(C01, o0 + 16, o_stride);
    if (rows2) {
        _tile_loadd(C10, o1, o_stride);
        _tile_loadd(C11, o1 + 16, o_stride);
    }
    for (size_t kc = 0; kc < chunks; kc++) {
        const uint16_t *v = t->vp + 2 * (kc * PAIRS_PER_TILE * t->ldvp + c0);
        _tile_loadd(A0, p0 + 2 * PAIRS_PER_TILE * kc, p_stride);
        if (rows2)
            _tile_loadd(A1, p1 + 2 * PAIRS_PER_TILE * kc, p_stride);
        _tile_loadd(B0, v, v_stride);
        _tile_loadd(B1, v + 2 * 16, v_stride);
        _tile_dpbf16ps(C00, A0, B0);
        _tile_dpbf16ps(C01, A0, B1);
        if (rows2) {
            _tile_dpbf16ps(C10, A1, B0);
            _tile_dpbf16ps(C11, A1, B1);
        }
    }
    _tile_stored(C00, o0, o_stride);
    _tile_stored(C01, o0 + 16, o_stride);
    if (rows2) {
        _tile_stored(C10, o1, o_stride);
        _tile_stored(C11, o1 + 16, o_stride);
    }
}

/* The key pairs [pair0, ceil(n_kv / 2)) of rows [i0, i0 + n) on vdpbf16ps,
 * 128 columns at a time, after the tile accumulators were stored. */
static void pv_tail(const fxa_attn_tile_bf16 *t, size_t i0, size_t n, size_t pair0)
{
    const size_t pair_end = (t->n_kv + 1) / 2;
    for (size_t i = i0; i < i0 + n; i++) {
        const uint16_t *p = t->p16 + i * t->ld_scores;
        for (size_t c0 = 0; c0 < t->d; c0 += 128) {
            const size_t nv = t->d - c0 < 128 ? (t->d - c0) / 16 : 8;
            float *o = t->o + i * t->ldo + c0;
            __m512 acc[8];
            for (size_t v = 0; v < nv; v++)
                acc[v] = _mm512_loadu_ps(o + 16 * v);
            for (size_t j = pair0; j < pair_end; j++) {
                int32_t bits;
                memcpy(&bits, p + 2 * j, sizeof bits);
                const __m512bh pb = (__m512bh)_mm512_set1_epi32(bits);
                const uint16_t *vj = t->vp + 2 * (j * t->ldvp + c0);
                for (size_t v = 0; v < nv; v++)
                    acc[v] =
                        _mm512_dpbf16_ps(acc[v], pb, (__m512bh)_mm512_loadu_si512(vj + 32 * v));
            }
            for (size_t v = 0; v < nv; v++)
                _mm512_storeu_ps(o + 16 * v, acc[v]);
        }
    }
}

static ALWAYS_INLINE void pv_block(const fxa_attn_tile_bf16 *t, size_t i0, size_t n,
                                   const int rows2)
{
    const size_t chunks = t->n_kv / (2 * PAIRS_PER_TILE);
    if (chunks)
        for (size_t c0 = 0; c0 < t->d; c0 += 2 * KEYS_PER_TILE)
            pv_group(t, i0, c0, chunks, rows2);
    if (chunks * 2 * PAIRS_PER_TILE < t->n_kv)
        pv_tail(t, i0, n, chunks * PAIRS_PER_TILE);
}

/* Rows [i0, i0 + n), n = 32 (rows2) or up to 16, through scores, softmax
 * and P.V. */
static ALWAYS_INLINE void row_block(const fxa_attn_tile_bf16 *t, size_t i0, size_t n,
                                    const int rows2)
{
    scores_block(t, i0, rows2);
    softmax_rows(t, i0, n);
    pv_block(t, i0, n, rows2);
}

/* The software pipeline of the full 32-row blocks: the row loop of block
 * b's softmax (AVX-512) carries the tile work of its neighbours between its
 * rows, block b - 1's P.V (its P is complete) and block b + 1's scores, a
 * unit (one P.V column group or one score key group) every few rows, so
 * that the out-of-order core can overlap the two. On the Xeon of
 * bench/RESULTS.md this gains 3% (S 4096, 40 heads, bf16 compute): the two
 * overlap little there (a finer interleave, one tdpbf16ps step every 64
 * scores, measured 1%). Each unit reads and writes only its own block's
 * rows, so every result is the one the plain order (scores, softmax, P.V per
 * block) gives, bit for bit. */
typedef struct pipe {
    size_t pv_i0;    /* the block whose P.V is pending */
    size_t pv_units; /* its column groups of 32 (0 when none) */
    size_t sc_i0;    /* the block whose scores are pending */
    size_t sc_units; /* its key groups (0 when none) */
    size_t issued;   /* units issued so far: P.V ones first */
} pipe;

static ALWAYS_INLINE void pipe_issue(const fxa_attn_tile_bf16 *t, pipe *pp, size_t upto)
{
    const size_t chunks = t->n_kv / (2 * PAIRS_PER_TILE);
    for (; pp->issued < upto; pp->issued++) {
        if (pp->issued < pp->pv_units)
            pv_group(t, pp->pv_i0, pp->issued * 2 * KEYS_PER_TILE, chunks, 1);
        else
            scores_group_at(t, pp->sc_i0, pp->issued - pp->pv_units, 1);
    }
}

static void full_blocks(const fxa_attn_tile_bf16 *t, size_t blocks)
{
    const size_t chunks = t->n_kv / (2 * PAIRS_PER_TILE);
    scores_block(t, 0, 1);
    for (size_t b = 0; b < blocks; b++) {
        const size_t i0 = b * ROW_BLOCK;
        pipe pp = {
            .pv_i0 = b > 0 ? i0 - ROW_BLOCK : 0,
            .pv_units = b > 0 && chunks ? t->d / (2 * KEYS_PER_TILE) : 0,
            .sc_i0 = i0 + ROW_BLOCK,
            .sc_units = b + 1 < blocks ? score_groups(t) : 0,
        };
        const size_t units = pp.pv_units + pp.sc_units;
        for (size_t r = 0; r < ROW_BLOCK; r++) {
            softmax_rows(t, i0 + r, 1);
            pipe_issue(t, &pp, (r + 1) * units / ROW_BLOCK);
        }
        if (b > 0 && chunks * 2 * PAIRS_PER_TILE < t->n_kv)
            pv_tail(t, i0 - ROW_BLOCK, ROW_BLOCK, chunks * PAIRS_PER_TILE);
    }
    pv_block(t, (blocks - 1) * ROW_BLOCK, ROW_BLOCK, 1);
}

void fxa_bf16_tile_16x32__amx(const fxa_attn_tile_bf16 *t)
{
    assert(t->n_q > 0 && t->n_kv > 0 && t->d > 0);
    if (t->d % (2 * PAIRS_PER_TILE) != 0) {
        fxa_bf16_tile_6x64__avx512bf16(t);
        return;
    }
    assert(t->kp_panel % KEYS_PER_TILE == 0 && t->ldvp >= t->d &&
           t->ld_scores >= t->n_kv + t->n_kv % 2 && t->ld_scores % 16 == 0);
    fxa_amx_configure(16);
    const size_t blocks = t->n_q / ROW_BLOCK;
    if (blocks)
        full_blocks(t, blocks);
    size_t i0 = blocks * ROW_BLOCK;
    if (i0 + 16 <= t->n_q) {
        row_block(t, i0, 16, 0);
        i0 += 16;
    }
    if (i0 < t->n_q) {
        fxa_amx_configure(t->n_q - i0);
        row_block(t, i0, t->n_q - i0, 0);
    }
    _tile_release();
}
