/*
 * synth_wan: Wan2.2-like synthetic Q/K/V (contract in synth_wan.h).
 *
 * Recipe per token at grid position (f, h, w), C = heads*head_dim channels:
 *   z_m        = sqrt(2) cos(2 pi (a_m f/F + b_m h/H + c_m w/W) + phi_m), m < SW_WAVES,
 *                wave numbers in [-1.5, 1.5] cycles per grid extent (slowly varying);
 *   q_raw[c]   = oq[c] + sum_m Aq[m][c] z_m + 0.5 n,   oq ~ 0.4 N  (small offset),
 *   k_raw[c]   = ok[c] + sum_m Ak[m][c] z_m + 0.5 n,   ok ~ 1.5 N  (large common offset),
 *                Aq ~ N / sqrt(SW_WAVES), Ak = 0.8 Aq + 0.6 B (so q_i.k_j is larger when
 *                tokens i and j are close on the grid);
 *   q, k       = RoPE(RMSNorm(raw, gamma)), gamma[c] = exp(0.5 N) * head factor U[0.6, 1.8]
 *              (doubled for every eighth head),
 *                separate gammas for q and k;
 *   v[c]       = sv[c] n,  sv[c] = 0.7 exp(0.3 N).
 * N and n are the PRNG's approximate standard normals: the Irwin-Hall sum of four 16-bit
 * uniforms from one xoshiro256** draw, scaled to variance 1 (integer arithmetic and one exact
 * fp32 multiply, so identical bits everywhere; tails stop at +-sqrt(12), so |v| < 7).
 * The PRNG is rng.h's (xoshiro256** seeded through splitmix64).
 * Values are drawn in a fixed order: parameters, then per token q noise, k noise, v.
 */
#include "synth_wan.h"
#include "rng.h"

#include <math.h>
#include <stdlib.h>

#define SW_WAVES 16
#define SW_TWO_PI 6.283185307179586476925286766559
#define SW_SQRT2 1.4142135623730950488016887242097
#define SW_THETA 10000.0
#define SW_EPS 1e-6f

void fxt_wan_synth_defaults(fxt_wan_synth *p)
{
    p->frames = 4;
    p->height = 32;
    p->width = 32;
    p->heads = 40;
    p->head_dim = 128;
    p->seed = 1;
}

void fxt_rmsnorm_row(const float *x, const float *gamma, size_t n, float eps, float *y)
{
    double acc = 0.0;
    for (size_t i = 0; i < n; i++)
        acc += (double)x[i] * (double)x[i];
    float mean = (float)(acc / (double)n);
    float r = 1.0f / sqrtf(mean + eps);
    for (size_t i = 0; i < n; i++)
        y[i] = x[i] * (r * gamma[i]);
}

void fxt_wan_rope_bands(int head_dim, int *t_pairs, int *h_pairs, int *w_pairs)
{
    int pairs = head_dim / 2;
    *h_pairs = pairs / 3;
    *w_pairs = pairs / 3;
    *t_pairs = pairs - 2 * (pairs / 3);
}

/* cos/sin of pair j of a band of n pairs at position pos. */
static void sw_rope_cs(int pos, int j, int n, float *c, float *s)
{
    double angle = (double)pos * pow(SW_THETA, -(double)j / (double)n);
    *c = (float)cos(angle);
    *s = (float)sin(angle);
}

static void sw_rotate_pair(float *x2, float c, float s)
{
    float x0 = x2[0], x1 = x2[1];
    x2[0] = x0 * c - x1 * s;
    x2[1] = x0 * s + x1 * c;
}

void fxt_wan_rope_apply(float *x, int head_dim, int pos_t, int pos_h, int pos_w)
{
    int n[3], pos[3] = {pos_t, pos_h, pos_w};
    fxt_wan_rope_bands(head_dim, &n[0], &n[1], &n[2]);
    float *pair = x;
    for (int b = 0; b < 3; b++) {
        for (int j = 0; j < n[b]; j++, pair += 2) {
            float c, s;
            sw_rope_cs(pos[b], j, n[b], &c, &s);
            sw_rotate_pair(pair, c, s);
        }
    }
}

/* cos/sin table [extent][n] of one axis band. */
static void sw_axis_table(int extent, int n, float *cs, float *sn)
{
    for (int p = 0; p < extent; p++)
        for (int j = 0; j < n; j++)
            sw_rope_cs(p, j, n, &cs[(size_t)p * (size_t)n + (size_t)j],
                       &sn[(size_t)p * (size_t)n + (size_t)j]);
}

/* Channel parameters, each array [C] (mixes [SW_WAVES][C]), and the wave set. */
typedef struct sw_params {
    float *aq, *ak;           /* content mixes */
    float *oq, *ok;           /* common offsets */
    float *gq, *gk;           /* RMSNorm gains */
    float *sv;                /* V scales */
    double wave[SW_WAVES][4]; /* cycles per extent along f, h, w; phase */
} sw_params;

static void sw_draw_params(fxt_rng *r, int heads, int head_dim, sw_params *pr)
{
    size_t d = (size_t)head_dim, ch = (size_t)heads * d;
    float amix = 1.0f / sqrtf((float)SW_WAVES);
    for (int m = 0; m < SW_WAVES; m++) {
        for (int a = 0; a < 3; a++)
            pr->wave[m][a] = 3.0 * (double)fxt_rng_uniform24(r) - 1.5;
        pr->wave[m][3] = SW_TWO_PI * (double)fxt_rng_uniform24(r);
    }
    for (size_t i = 0; i < (size_t)SW_WAVES * ch; i++) {
        pr->aq[i] = amix * fxt_rng_gauss4(r);
        pr->ak[i] = 0.8f * pr->aq[i] + 0.6f * amix * fxt_rng_gauss4(r);
    }
    for (size_t c = 0; c < ch; c++) {
        pr->oq[c] = 0.4f * fxt_rng_gauss4(r);
        pr->ok[c] = 1.5f * fxt_rng_gauss4(r);
        pr->sv[c] = 0.7f * expf(0.3f * fxt_rng_gauss4(r));
    }
    float *gains[2] = {pr->gq, pr->gk};
    for (int g = 0; g < 2; g++) {
        for (int h = 0; h < heads; h++) {
            /* Every eighth head is hot (2x gain on q and k), as some heads of
             * real DiT layers are: its sharpest rows exceed the fixed-max
             * gates and exercise the fallback. */
            float hot = (0.6f + 1.2f * fxt_rng_uniform24(r)) * (h % 8 == 5 ? 2.0f : 1.0f);
            float *gh = gains[g] + (size_t)h * d;
            for (size_t i = 0; i < d; i++)
                gh[i] = expf(0.5f * fxt_rng_gauss4(r)) * hot;
        }
    }
}

/* Raw q or k row: offset + noise + content mix of the token's waves z. */
static void sw_raw_row(fxt_rng *r, const float *off, const float *mix, const float *z, size_t ch,
                       float *row)
{
    for (size_t c = 0; c < ch; c++)
        row[c] = off[c] + 0.5f * fxt_rng_gauss4(r);
    for (int m = 0; m < SW_WAVES; m++) {
        const float *mm = mix + (size_t)m * ch;
        for (size_t c = 0; c < ch; c++)
            row[c] += mm[c] * z[m];
    }
}

/* RMSNorm the row with gamma, then RoPE every head with the token's cos/sin. */
static void sw_norm_rope_row(float *row, const float *gamma, size_t ch, int heads, int pairs,
                             const float *cs, const float *sn)
{
    fxt_rmsnorm_row(row, gamma, ch, SW_EPS, row);
    for (int h = 0; h < heads; h++) {
        float *x = row + (size_t)h * (size_t)pairs * 2;
        for (int i = 0; i < pairs; i++)
            sw_rotate_pair(x + 2 * i, cs[i], sn[i]);
    }
}

static int sw_valid(const fxt_wan_synth *p)
{
    if (p->frames <= 0 || p->height <= 0 || p->width <= 0 || p->heads <= 0)
        return 0;
    if (p->head_dim < 6 || p->head_dim % 2 != 0)
        return 0;
    /* S*C floats, with room to spare for the parameter block (2*SW_WAVES + 5 rows of C). */
    size_t lim = SIZE_MAX / sizeof(float) / (4 * (size_t)SW_WAVES);
    size_t s = (size_t)p->frames;
    size_t f[4] = {(size_t)p->height, (size_t)p->width, (size_t)p->heads, (size_t)p->head_dim};
    for (int i = 0; i < 4; i++) {
        if (s > lim / f[i])
            return 0;
        s *= f[i];
    }
    return 1;
}

fxa_status fxt_wan_synth_qkv(const fxt_wan_synth *p, float *q, float *k, float *v)
{
    if (!p || !q || !k || !v || !sw_valid(p))
        return FXA_ERR_INVALID_ARG;
    int nb[3];
    fxt_wan_rope_bands(p->head_dim, &nb[0], &nb[1], &nb[2]);
    int ext[3] = {p->frames, p->height, p->width};
    int pairs = p->head_dim / 2;
    size_t ch = (size_t)p->heads * (size_t)p->head_dim;
    size_t tab[3], ntab = 0;
    for (int b = 0; b < 3; b++) {
        tab[b] = (size_t)ext[b] * (size_t)nb[b];
        ntab += tab[b];
    }
    /* One block: aq, ak [SW_WAVES*ch]; oq, ok, gq, gk, sv [ch]; cos, sin tables; token cs, sn. */
    size_t nparam = 2 * (size_t)SW_WAVES * ch + 5 * ch;
    float *mem = malloc((nparam + 2 * ntab + 2 * (size_t)pairs) * sizeof(float));
    if (!mem)
        return FXA_ERR_NO_MEMORY;
    sw_params pr;
    pr.aq = mem;
    pr.ak = pr.aq + (size_t)SW_WAVES * ch;
    pr.oq = pr.ak + (size_t)SW_WAVES * ch;
    pr.ok = pr.oq + ch;
    pr.gq = pr.ok + ch;
    pr.gk = pr.gq + ch;
    pr.sv = pr.gk + ch;
    float *cos_tab[3], *sin_tab[3];
    float *next = mem + nparam;
    for (int b = 0; b < 3; b++) {
        cos_tab[b] = next;
        sin_tab[b] = next + tab[b];
        next += 2 * tab[b];
        sw_axis_table(ext[b], nb[b], cos_tab[b], sin_tab[b]);
    }
    float *cs = next, *sn = next + pairs;

    fxt_rng rng;
    fxt_rng_seed(&rng, p->seed);
    sw_draw_params(&rng, p->heads, p->head_dim, &pr);

    size_t tok = 0;
    for (int f = 0; f < p->frames; f++) {
        for (int h = 0; h < p->height; h++) {
            for (int w = 0; w < p->width; w++, tok++) {
                int pos[3] = {f, h, w};
                float z[SW_WAVES];
                for (int m = 0; m < SW_WAVES; m++) {
                    double ph = pr.wave[m][3];
                    for (int a = 0; a < 3; a++)
                        ph += SW_TWO_PI * pr.wave[m][a] * (double)pos[a] / (double)ext[a];
                    z[m] = (float)(SW_SQRT2 * cos(ph));
                }
                int i = 0;
                for (int b = 0; b < 3; b++) {
                    const float *ct = cos_tab[b] + (size_t)pos[b] * (size_t)nb[b];
                    const float *st = sin_tab[b] + (size_t)pos[b] * (size_t)nb[b];
                    for (int j = 0; j < nb[b]; j++, i++) {
                        cs[i] = ct[j];
                        sn[i] = st[j];
                    }
                }
                float *qr = q + tok * ch, *kr = k + tok * ch, *vr = v + tok * ch;
                sw_raw_row(&rng, pr.oq, pr.aq, z, ch, qr);
                sw_raw_row(&rng, pr.ok, pr.ak, z, ch, kr);
                for (size_t c = 0; c < ch; c++)
                    vr[c] = pr.sv[c] * fxt_rng_gauss4(&rng);
                sw_norm_rope_row(qr, pr.gq, ch, p->heads, pairs, cs, sn);
                sw_norm_rope_row(kr, pr.gk, ch, p->heads, pairs, cs, sn);
            }
        }
    }
    free(mem);
    return FXA_OK;
}
