/*
 * Kernel contracts and kernel sets.
 *
 * Drivers (src/attn) reach kernels only through fxa_kernels. A kernel set is
 * built the BLIS way: fxa_kernels_init_<isa> first fills in the portable
 * reference set (kernels/ref, the executable spec), then overrides the
 * entries its ISA has a kernel for; a faster kernel must match the reference
 * within fp32 reordering, and bit for bit across thread counts. An ISA's
 * folder never calls into another's: what ISAs share lives in a header here
 * (row_stats_impl.h, softmax_rows_impl.h, tile_blocks_impl.h, packkt_impl.h),
 * in ref/, or in a file here.
 *
 * Names (XNNPACK style): fxa_<type>_<op>[_<shape>]__<isa>
 *   type   f32 (fp32 compute or data), bf16 (bf16 compute)
 *   op     tile (a whole fxa_attn_tile: score, softmax, pv), score, pv,
 *          packkt (fxa_pack_kt_fn), rowstats (an fxa_row_stats table),
 *          bwd_dkdv / bwd_dq (an fxa_attn_bwd_tile or fxa_attn_bwd_tile_bf16)
 *   shape  the micro-kernel's rows x columns (MRxNR): for a tile the score
 *          kernel's, then P.V's where it differs; for packkt the register
 *          transpose; absent in the reference, whose blocking is a
 *          vectorisation hint, not a contract
 *   isa    the instruction set the function needs: ref (portable C), avx2
 *          (AVX2+FMA), avx512 (F, VL, BW, DQ), avx512bf16, amx (AMX-TILE and
 *          AMX-BF16 with AVX512-BF16)
 * e.g. fxa_f32_tile_4x24_6x16__avx2, fxa_bf16_tile_6x64__avx512bf16. Source
 * files are named alike, without the double underscore. The fp16 widening
 * keeps its older names (fxa_widen_f16_ref, fxa_widen_f16_f16c), which
 * tests/unit/test_convert.c calls.
 */
#ifndef FXA_KERNELS_H
#define FXA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Row kinds (fxa_attn_tile.online). */
#define FXA_ROW_FIXED 0           /* fixed shift, strict gate: no term flushes */
#define FXA_ROW_ONLINE 1          /* online softmax */
#define FXA_ROW_FIXED_MAY_FLUSH 2 /* fixed shift, centred gate: small terms may flush */

/*
 * One attention tile: n_q query rows of one head against n_kv keys.
 *
 * Scores are base-2 and virtually centred:
 *     z_ij = lambda * (q_i . k_j - qk_center_i)
 * (qk_center_i = q_i . kbar, or 0 without centring). Row i then updates its
 * unnormalised state (m_i, l_i, o_i); shifts m_i are always integers, so the
 * exponent argument z - m is formed exactly and rescales are powers of two:
 *   fixed row (online[i] != FXA_ROW_ONLINE): m_i is the constant shift from
 *       the bound; p_ij = exp2(z_ij - m_i), l_i += sum_j p_ij,
 *       o_i += sum_j p_ij v_j. For FXA_ROW_FIXED the bound proves that no
 *       term flushes (z_ij - m_i >= -125), so a kernel may skip the flush
 *       test; FXA_ROW_FIXED_MAY_FLUSH rows (the centred gate) need it.
 *   online row (online[i] == FXA_ROW_ONLINE): m_i is the running shift
 *       (-INFINITY before the first tile); m' = max(m_i, ceil(max_j z_ij)), a = exp2(m_i - m'),
 *       l_i = a l_i + sum_j exp2(z_ij - m'), o_i = a o_i + sum_j exp2(z_ij - m') v_j.
 * exp2 flushes results below 2^-126 to zero (the gate's derivation assumes
 * exactly that). Accumulation is fp32, in increasing j within a tile.
 * Layout, row-major: q [n_q, ldq], v [n_kv, ldv], o [n_q, ldo]; kt = K
 * transposed in panels of kt_panel keys (a multiple of 16), each panel
 * [d][kt_panel]: k[j][c] at kt[fxa_kt_offset(kt_panel, d, c, j)], so that a
 * micro-kernel as wide as a panel streams it contiguously (keys past n_kv in
 * the last panel are not initialised: kernels never use them). scores is
 * scratch of n_q rows of ld_scores floats (ld_scores >= n_kv rounded up to
 * 16, a multiple of 16). Every
 * score is the dot product summed in increasing c from 0.0f, every o element
 * sums in increasing j: a kernel may block and vectorise, but a row's result
 * must not depend on its position in the tile (tiles of any n_q give the
 * same bits). No aliasing.
 *
 * Bias (attention masks and causal, optional): with bias != NULL, row i's
 * scores become z_ij + bias[i ld_bias + j] (one fp32 addition, before the row
 * update), in base-2 units; -INFINITY masks a key: its p is exactly 0. Every
 * row then takes the flush test, and an online row whose keys so far are all
 * masked keeps m_i = -INFINITY, l_i = 0, o_i = 0. With bias NULL the scores
 * are used as they are.
 */
/* The fields of both forward tiles (fxa_attn_tile, fxa_attn_tile_bf16). */
#define FXA_ATTN_TILE_SHARED                                                                       \
    size_t n_q;                                                                                    \
    size_t n_kv;                                                                                   \
    size_t d;                                                                                      \
    float lambda;                                                                                  \
    const float *qk_center;                                                                        \
    const uint8_t *online;                                                                         \
    float *m;                                                                                      \
    float *l;                                                                                      \
    float *o;                                                                                      \
    size_t ldo;                                                                                    \
    float *scores;                                                                                 \
    size_t ld_scores;                                                                              \
    const float *bias; /* [n_q][ld_bias] or NULL */                                                \
    size_t ld_bias;

typedef struct fxa_attn_tile {
    FXA_ATTN_TILE_SHARED
    const float *q;
    size_t ldq;
    const float *kt;
    size_t kt_panel;
    const float *v;
    size_t ldv;
} fxa_attn_tile;

typedef void fxa_attn_tile_fn(const fxa_attn_tile *t);

/* Where k[j][c] lies in a panelled K^T (fxa_attn_tile.kt). */
static inline size_t fxa_kt_offset(size_t kt_panel, size_t d, size_t c, size_t j)
{
    return (j / kt_panel) * kt_panel * d + c * kt_panel + j % kt_panel;
}

/*
 * The same tile with bf16 compute (FXA_COMPUTE_BF16). Inputs are bf16 bits,
 * packed in pairs as vdpbf16ps reads them (d_pairs = ceil(d / 2); every pad
 * element is zero):
 *   q  [n_q][ldq]             ldq >= 2 d_pairs
 *   kp in panels of kp_panel keys (a multiple of 16), each [d_pairs][kp_panel][2]:
 *                             (k[j][2c], k[j][2c+1]) at kp + 2 fxa_kt_offset(kp_panel, d_pairs, c, j)
 *   vp [ceil(n_kv/2)][ldvp][2] (v[2j][c], v[2j+1][c]) at vp + 2 (j ldvp + c)
 * Scores: s_ij = sum over pairs c of (s + q[2c+1] k[j][2c+1]) + q[2c] k[j][2c]
 * in fp32 (each bf16 product is exact in fp32), then z = lambda (s - center)
 * and the fixed or online row update of fxa_attn_tile, with one change: p is
 * rounded to bf16 (nearest even) and l sums the rounded values, so that l and
 * P.V see the same weights. P.V sums pairs of keys the same way. A bias is
 * added to z as in fxa_attn_tile.
 * p16 is scratch of n_q rows of ld_scores bf16 (pad columns are zeroed).
 */
typedef struct fxa_attn_tile_bf16 {
    FXA_ATTN_TILE_SHARED
    const uint16_t *q;
    size_t ldq;
    const uint16_t *kp;
    size_t kp_panel;
    const uint16_t *vp;
    size_t ldvp;
    uint16_t *p16;
} fxa_attn_tile_bf16;

typedef void fxa_attn_tile_bf16_fn(const fxa_attn_tile_bf16 *t);

/*
 * One backward tile (attention's gradients, fp32): n_q query rows of one
 * head against n_kv keys. Both kernels first recompute, for i < n_q, j < n_kv,
 *     s_ij  = q_i . k_j             (fp32, summed in increasing c from 0.0f)
 *     p_ij  = exp2(z_ij - lse2_i) inv_sum_i, z_ij = lambda (s_ij - center_i)
 *             rounded to fp32 as the forward forms it (fxa_attn_tile's
 *             scores), z_ij - lse2_i rounded once (lse2_i the forward's
 *             base-2 shift of the row, inv_sum_i 1 / its shifted sum, up to
 *             a power of two moved into lse2_i): the forward's P with its
 *             scores' rounding; results below 2^-126 flush to 0 as in every
 *             exp2 here)
 *     dp_ij = dout_i . v_j          (fp32, increasing c)
 *     ds_ij = p_ij (dp_ij - delta_i)
 * into the scratch p and ds ([n_q][ld_p], ld_p >= n_kv rounded up to kt_panel;
 * entries past n_kv unspecified), then accumulate, unscaled (the driver
 * multiplies dq and dk by tau once):
 *   fxa_attn_bwd_dkdv_fn: dv_j += sum_i p_ij dout_i,  dk_j += sum_i ds_ij q_i
 *                         (dk, dv [n_kv][ldg]; sums in increasing i)
 *   fxa_attn_bwd_dq_fn:   dq_i += sum_j ds_ij k_j     (dq [n_q][ldg]; increasing j);
 *                         with p_ds_given, p and ds already hold this tile's
 *                         values (the dkdv kernel's, on the same tile) and are
 *                         used as they are
 * Layout: q, dout [n_q][ldq]; kt and vt are K and V transposed in panels of
 * kt_panel keys (fxa_kt_offset; keys past n_kv in the last panel are zero);
 * k [n_kv][ldk] row-major (the dq kernel only). A kernel may block and
 * vectorise: a row's result must not depend on its place in the tile. No
 * aliasing.
 *
 * Bias (masks and causal, optional): with bias != NULL ([n_q][ld_p], base-2
 * units as in fxa_attn_tile, every entry up to n_kv rounded up to kt_panel
 * set), z_ij + bias_ij, the sum rounded to fp32 as the forward adds a
 * bias; -INFINITY masks a key (p = ds = 0), and a bias of 0
 * gives the unbiased bits. lse2_i = +INFINITY (a row with every key masked)
 * makes the row's p and ds 0.
 */
/* The fields of both backward tiles (fxa_attn_bwd_tile, fxa_attn_bwd_tile_bf16). */
#define FXA_ATTN_BWD_TILE_SHARED                                                                   \
    size_t n_q;                                                                                    \
    size_t n_kv;                                                                                   \
    size_t d;                                                                                      \
    float lambda;         /* tau log2(e) */                                                        \
    const float *lse2;    /* [n_q] */                                                              \
    const float *inv_sum; /* [n_q] */                                                              \
    const float *center;  /* [n_q] */                                                              \
    const float *delta;   /* [n_q] */                                                              \
    size_t kt_panel;                                                                               \
    size_t ld_p;                                                                                   \
    const float *bias; /* [n_q][ld_p] or NULL */                                                   \
    float *dq;                                                                                     \
    float *dk;                                                                                     \
    float *dv;                                                                                     \
    size_t ldg;                                                                                    \
    int p_ds_given;

typedef struct fxa_attn_bwd_tile {
    FXA_ATTN_BWD_TILE_SHARED
    const float *q;
    const float *dout;
    size_t ldq;
    const float *kt;
    const float *vt;
    const float *k;
    size_t ldk;
    float *p;
    float *ds;
} fxa_attn_bwd_tile;

typedef void fxa_attn_bwd_fn(const fxa_attn_bwd_tile *t);

/*
 * The same backward tile with bf16 compute (FXA_COMPUTE_BF16): every
 * product has bf16 operands and accumulates in fp32, taken in pairs as
 * vdpbf16ps takes them (acc = (acc + a1 b1) + a0 b0 per pair, pairs in
 * increasing order). With d_pairs = ceil(d / 2), q_pairs = ceil(n_q / 2),
 * kv_pairs = ceil(n_kv / 2) and every pad element zero, the inputs are bf16
 * bits in these layouts:
 *   q, dout  [n_q][ldq] rows (ldq >= 2 d_pairs): pairs along c
 *   qp, doutp [q_pairs][ldqp][2] (ldqp >= d): (x[2i][c], x[2i+1][c]) at
 *            2 (i ldqp + c): pairs along the query rows
 *   kt, vt   K and V in panels of kt_panel keys, each [d_pairs][kt_panel][2]:
 *            (k[j][2c], k[j][2c+1]) at 2 fxa_kt_offset(kt_panel, d_pairs, c, j)
 *            (keys past n_kv in the last panel zero)
 *   kp       [kv_pairs][ldkp][2] (ldkp >= d): (k[2j][c], k[2j+1][c])
 * s_ij and dp_ij are the pair sums over c; p_ij (the bias included) and
 * ds_ij follow in fp32 as in fxa_attn_bwd_tile and are stored rounded to
 * bf16 (nearest even) into the scratch
 *   pt, dst  [q_pairs][ld_p][2]: P and dS in query-row pairs (a pad row of an
 *            odd n_q is zero);
 *   ds       [n_q][ld_p]: dS rows (column n_kv of an odd n_kv is zero);
 * then the sums of fxa_attn_bwd_tile accumulate in fp32, dK and dV over the
 * query-row pairs in increasing order, dQ over the key pairs (p_ds_given:
 * pt, dst and ds hold this tile's values already).
 */
typedef struct fxa_attn_bwd_tile_bf16 {
    FXA_ATTN_BWD_TILE_SHARED
    const uint16_t *q;
    const uint16_t *dout;
    size_t ldq;
    const uint16_t *qp;
    const uint16_t *doutp;
    size_t ldqp;
    const uint16_t *kt;
    const uint16_t *vt;
    const uint16_t *kp;
    size_t ldkp;
    uint16_t *pt;
    uint16_t *dst;
    uint16_t *ds;
} fxa_attn_bwd_tile_bf16;

typedef void fxa_attn_bwd_bf16_fn(const fxa_attn_bwd_tile_bf16 *t);

/*
 * fp64 attention (FXA_COMPUTE_FP64): the forward tile in double. Row i
 * (q_i at q + i ldq) meets keys j < n_kv (k_j at k + j ldk, v_j at
 * v + j ldv, rows of d doubles) with natural-log scores
 *     z_ij = tau (q_i . k_j - center_i) + bias_ij
 * (the dot product summed in increasing c from 0.0; bias NULL: no bias,
 * else [n_q][ld_bias] with -INFINITY masking a key) and updates its
 * unnormalised state (m_i, l_i, o_i):
 *   fixed row (online[i] == 0): p_ij = exp(z_ij - m_i), m_i the constant
 *       shift from the fp64 bound; l_i += p_ij, o_i += p_ij v_j.
 *   online row: m' = max(m_i, max_j z_ij) (m_i = -INFINITY before the
 *       first key), a = exp(m_i - m'), l_i = a l_i + sum_j exp(z_ij - m'),
 *       o_i likewise; a row whose keys so far are all masked keeps
 *       m_i = -INFINITY, l_i = 0, o_i = 0.
 * Sums run in increasing j; a row's result does not depend on the other
 * rows of the tile. scores: scratch of n_kv doubles. No aliasing.
 */
typedef struct fxa_attn_tile_f64 {
    size_t n_q;
    size_t n_kv;
    size_t d;
    double tau;
    const double *q;
    size_t ldq;
    const double *k;
    int64_t ldk;
    const double *v;
    int64_t ldv;
    const double *center;
    const uint8_t *online;
    double *m;
    double *l;
    double *o;
    size_t ldo;
    double *scores;
    const double *bias;
    size_t ld_bias;
} fxa_attn_tile_f64;

typedef void fxa_attn_tile_f64_fn(const fxa_attn_tile_f64 *t);

/*
 * fp64 backward tile: rows i < n_q of one query head (q_i and dout_i at
 * q + i ldq and dout + i ld_dout; the row's softmax shift m_i and sum l_i,
 * from fxa_attn_tile_f64 run online over every key with center 0, and
 * delta_i = dout_i . out_i) against keys j < n_kv (k_j, v_j as in
 * fxa_attn_tile_f64):
 *     P_ij = exp(tau q_i . k_j + bias_ij - m_i) / l_i,
 *     dS_ij = P_ij (dout_i . v_j - delta_i)
 * (dot products summed in increasing c from 0.0; a masked P_ij, bias
 * -INFINITY, is 0). The dq kernel adds tau dS_ij k_j to dq_i (at
 * dq + i ld_dq) in increasing j; the dkdv kernel adds P_ij dout_i to dv_j
 * and tau dS_ij q_i to dk_j (at dk + j ld_dk, dv + j ld_dv) in increasing
 * i. No aliasing.
 */
typedef struct fxa_attn_bwd_tile_f64 {
    size_t n_q;
    size_t n_kv;
    size_t d;
    double tau;
    const double *q;
    int64_t ldq;
    const double *dout;
    int64_t ld_dout;
    const double *k;
    int64_t ldk;
    const double *v;
    int64_t ldv;
    const double *m;
    const double *l;
    const double *delta;
    const double *bias; /* [n_q][ld_bias] or NULL */
    size_t ld_bias;
    double *dq;
    int64_t ld_dq;
    double *dk;
    int64_t ld_dk;
    double *dv;
    int64_t ld_dv;
} fxa_attn_bwd_tile_f64;

typedef void fxa_attn_bwd_f64_fn(const fxa_attn_bwd_tile_f64 *t);

/* dst[i] = fp16 bits src[i] widened to fp32 (exact), i < n. */
typedef void fxa_widen_f16_fn(const uint16_t *src, float *dst, size_t n);

/*
 * K^T packing for the tiles, on 32-bit words: rows[j] holds key j's d words
 * (fp32 values for fxa_attn_tile, bf16 pairs for fxa_attn_tile_bf16; j < n,
 * rows 4-byte aligned anywhere, not aliasing kt); writes word c of rows[j]
 * to word fxa_kt_offset(panel, d, c, j) of kt for every c < d, j < n (panel
 * a multiple of 16). An exact copy of the bits, whatever they are; nothing
 * else in kt is written (keys past n in the last panel keep their contents),
 * so a caller may pack a group of keys starting at a multiple of 16 by
 * passing kt + fxa_kt_offset(panel, d, 0, j0) words.
 */
typedef void fxa_pack_kt_fn(const void *const *rows, size_t n, size_t d, size_t panel, void *kt);

/*
 * Row statistics for the bound pass and the row setup, on rows of d fp32
 * values or bf16 bits (norm2_dot: n rows per call). Sums are in double in a fixed order
 * (row_stats_impl.h), so every ISA's build returns the same bits. A
 * non-finite x_c makes norm2_add, distance2 (finite center) and abs_max
 * non-finite, and nothing else does (fp32 squares stay far inside fp64):
 * the bound pass's finiteness test.
 */
typedef struct fxa_row_stats {
    double (*norm2_add)(const float *x, size_t d, double *sum);         /* ||x||^2; sum[c] += x_c */
    double (*distance2)(const float *x, const float *center, size_t d); /* ||x - center||^2 */
    float (*abs_max)(const float *x, size_t d); /* max_c |x_c|; Inf or NaN if some x_c is */
    /* xx[j] = ||x_j||^2 and xy[j] = x_j . y for j < n, row x_j at x + j ldx;
     * each row's bits are those it gets alone */
    void (*norm2_dot)(const float *x, size_t ldx, size_t n, const float *y, size_t d, double *xx,
                      double *xy);
    /* The same on rows of bf16 bits, giving the fp32 forms' bits on the
     * rows' fp32 widening (ldx in elements; d <= FXA_MAX_HEAD_DIM) */
    double (*norm2_add_bf16)(const uint16_t *x, size_t d, double *sum);
    double (*distance2_bf16)(const uint16_t *x, const float *center, size_t d);
    float (*abs_max_bf16)(const uint16_t *x, size_t d);
    void (*norm2_dot_bf16)(const uint16_t *x, size_t ldx, size_t n, const float *y, size_t d,
                           double *xx, double *xy);
} fxa_row_stats;
extern const fxa_row_stats fxa_f32_rowstats__ref;
extern const fxa_row_stats fxa_f32_rowstats__avx2;
extern const fxa_row_stats fxa_f32_rowstats__avx512;

typedef struct fxa_kernels {
    const char *isa_name;
    const char *description; /* which tile kernels, for logs and `fxattn info` */
    size_t kv_tile;  /* keys per tile the driver hands to attn_tile (multiple of kt_panel) */
    size_t kt_panel; /* keys per K^T panel attn_tile reads (multiple of 16) */
    fxa_attn_tile_fn *attn_tile;
    fxa_attn_tile_bf16_fn *attn_tile_bf16;
    fxa_widen_f16_fn *widen_f16; /* used while packing and in the bound pass */
    fxa_pack_kt_fn *pack_kt;     /* K^T panels (K pairs for bf16 compute) */
    const fxa_row_stats *row_stats;
    /* The backward (fxa_attn_bwd_tile): keys per K^T / V^T panel it reads
     * (a multiple of 16), and its two kernels. */
    size_t bwd_kt_panel;
    fxa_attn_bwd_fn *attn_bwd_dkdv;
    fxa_attn_bwd_fn *attn_bwd_dq;
    /* The backward with bf16 compute (fxa_attn_bwd_tile_bf16, same panels). */
    fxa_attn_bwd_bf16_fn *attn_bwd_dkdv_bf16;
    fxa_attn_bwd_bf16_fn *attn_bwd_dq_bf16;
    /* fp64 compute: the portable kernels of every set. */
    fxa_attn_tile_f64_fn *attn_tile_f64;
    fxa_attn_bwd_f64_fn *attn_bwd_dq_f64;
    fxa_attn_bwd_f64_fn *attn_bwd_dkdv_f64;
} fxa_kernels;

/* The CPU's features (base/cpu.h). */
struct fxa_cpu;

/* Kernel sets. Each fills in every entry of *k; ISA sets start from
 * fxa_kernels_init_ref. Plain C (no ISA flags): callable on any CPU, though
 * a set's kernels run only where its ISA is present. */
void fxa_kernels_init_ref(fxa_kernels *k);
/* AVX2+FMA+F16C fp32 kernels (x86_avx2/); bf16 compute stays portable. */
void fxa_kernels_init_avx2(fxa_kernels *k);
/* AVX-512F (+VL, BW, DQ) fp32 kernels (x86_avx512/), with the AVX512-BF16
 * tile for FXA_COMPUTE_BF16 where cpu->avx512bf16. */
void fxa_kernels_init_avx512(fxa_kernels *k, const struct fxa_cpu *cpu);
/* The AVX-512 set with the AMX tile for FXA_COMPUTE_BF16 (x86_avx512/), for
 * CPUs with AVX512-BF16 and AMX-BF16 granted (cpu->amx_bf16). */
void fxa_kernels_init_amx(fxa_kernels *k, const struct fxa_cpu *cpu);

/* Reference kernels (ref/): the spec of each entry. */
void fxa_f32_tile__ref(const fxa_attn_tile *t);
void fxa_bf16_tile__ref(const fxa_attn_tile_bf16 *t);
void fxa_f32_packkt__ref(const void *const *rows, size_t n, size_t d, size_t panel, void *kt);
void fxa_widen_f16_ref(const uint16_t *src, float *dst, size_t n);
void fxa_f32_bwd_dkdv__ref(const fxa_attn_bwd_tile *t);
void fxa_f32_bwd_dq__ref(const fxa_attn_bwd_tile *t);
void fxa_bf16_bwd_dkdv__ref(const fxa_attn_bwd_tile_bf16 *t);
void fxa_bf16_bwd_dq__ref(const fxa_attn_bwd_tile_bf16 *t);
void fxa_f64_tile__ref(const fxa_attn_tile_f64 *t);
void fxa_f64_bwd_dq__ref(const fxa_attn_bwd_tile_f64 *t);
void fxa_f64_bwd_dkdv__ref(const fxa_attn_bwd_tile_f64 *t);

/* x86 kernels (built only on x86-64). F16C widening, 8 values per
 * instruction, shared by the AVX2 and AVX-512 sets (f16_widen_f16c.c). */
void fxa_widen_f16_f16c(const uint16_t *src, float *dst, size_t n);
/* AVX2: 4x24 scores and 6x16 P.V on ymm FMA; K^T in one panel per tile. */
void fxa_f32_tile_4x24_6x16__avx2(const fxa_attn_tile *t);
void fxa_f32_packkt_8x8__avx2(const void *const *rows, size_t n, size_t d, size_t panel, void *kt);
/* AVX2 backward: 6x16 blocks (P, dS against 16-key K^T / V^T panels;
 * gradients 6 rows x 16 columns). */
void fxa_f32_bwd_dkdv_6x16__avx2(const fxa_attn_bwd_tile *t);
void fxa_f32_bwd_dq_6x16__avx2(const fxa_attn_bwd_tile *t);
/* AVX-512: 6x64 scores and P.V on zmm FMA; K^T (bf16: K pairs) in panels of
 * FXA_AVX512_KT_PANEL keys. */
#define FXA_AVX512_KT_PANEL 64
void fxa_f32_tile_6x64__avx512(const fxa_attn_tile *t);
void fxa_bf16_tile_6x64__avx512bf16(const fxa_attn_tile_bf16 *t);
/* AMX: 2 x 2 tiles of 16 x 16 (32 rows x 32 keys, then 32 columns of o)
 * on tdpbf16ps; head dims not a multiple of 32 take the 6x64 tile. */
void fxa_bf16_tile_16x32__amx(const fxa_attn_tile_bf16 *t);
void fxa_f32_packkt_16x16__avx512(const void *const *rows, size_t n, size_t d, size_t panel,
                                  void *kt);
/* AVX-512 backward: 6x64 blocks (scores and dP against K^T / V^T panels of
 * FXA_AVX512_KT_PANEL keys; gradients 6 rows x 64 columns). */
void fxa_f32_bwd_dkdv_6x64__avx512(const fxa_attn_bwd_tile *t);
void fxa_f32_bwd_dq_6x64__avx512(const fxa_attn_bwd_tile *t);
/* AVX512-BF16 backward for bf16 compute: 6x64 blocks on vdpbf16ps (P, dS
 * against K / V pair panels of FXA_AVX512_KT_PANEL keys; gradients 6 rows x
 * 64 columns over query-row or key pairs). */
void fxa_bf16_bwd_dkdv_6x64__avx512bf16(const fxa_attn_bwd_tile_bf16 *t);
void fxa_bf16_bwd_dq_6x64__avx512bf16(const fxa_attn_bwd_tile_bf16 *t);

#endif
