/*
 * Rotary position embedding for the projection's epilogue: Wan2.2's 3-D
 * tables in the rotate-half convention, and the converter that turns a
 * checkpoint trained with interleaved pairs into rotate-half by permuting
 * Q/K output channels (see fxattn_proj.h).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../base/struct_size.h"
#include "fxattn_proj.h"

void fxa_wan_rope_bands(int64_t head_dim, int64_t *t_pairs, int64_t *h_pairs, int64_t *w_pairs)
{
    const int64_t pairs = head_dim / 2;
    *h_pairs = pairs / 3;
    *w_pairs = pairs / 3;
    *t_pairs = pairs - 2 * (pairs / 3);
}

fxa_status fxa_wan_rope_tables(int64_t frames, int64_t height, int64_t width, int64_t head_dim,
                               double theta, float *cos_out, float *sin_out)
{
    if (!cos_out || !sin_out || frames < 1 || height < 1 || width < 1 || head_dim < 6 ||
        head_dim % 2 || head_dim > FXA_MAX_HEAD_DIM || !(theta > 1.0) || !isfinite(theta))
        return FXA_ERR_INVALID_ARG;
    /* The tables, tokens x head_dim floats each, must be addressable. */
    const int64_t max_tokens = (int64_t)(PTRDIFF_MAX / (FXA_MAX_HEAD_DIM * sizeof(float)));
    if (frames > max_tokens / height || frames * height > max_tokens / width)
        return FXA_ERR_INVALID_ARG;
    int64_t n[3];
    fxa_wan_rope_bands(head_dim, &n[0], &n[1], &n[2]);
    const int64_t half = head_dim / 2;
    for (int64_t f = 0; f < frames; f++)
        for (int64_t h = 0; h < height; h++)
            for (int64_t w = 0; w < width; w++) {
                const int64_t pos[3] = {f, h, w};
                const int64_t token = (f * height + h) * width + w;
                float *c = cos_out + token * head_dim;
                float *s = sin_out + token * head_dim;
                int64_t pair = 0;
                for (int b = 0; b < 3; b++) {
                    for (int64_t j = 0; j < n[b]; j++, pair++) {
                        /* Pair j of a band of n pairs turns by pos * theta^(-j/n)
                         * (= theta^(-2j/band_dim)), in double, rounded once. */
                        const double angle = (double)pos[b] * pow(theta, -(double)j / (double)n[b]);
                        c[pair] = c[pair + half] = (float)cos(angle);
                        s[pair] = s[pair + half] = (float)sin(angle);
                    }
                }
            }
    return FXA_OK;
}

/* Output channel permutation of one head: rotate-half lane i takes the
 * interleaved lane perm[i] = 2i (i < d/2) or 2(i - d/2) + 1. */
static int64_t interleaved_lane(int64_t i, int64_t d)
{
    return i < d / 2 ? 2 * i : 2 * (i - d / 2) + 1;
}

/* Permute the rows [row0, row0 + heads*d) of a [rows][row_bytes] array in
 * place, head by head. */
static fxa_status permute_rows(unsigned char *base, size_t row_bytes, int64_t row0, int64_t heads,
                               int64_t d)
{
    if (!base || heads == 0)
        return FXA_OK;
    unsigned char *tmp = malloc((size_t)d * row_bytes);
    if (!tmp)
        return FXA_ERR_NO_MEMORY;
    for (int64_t h = 0; h < heads; h++) {
        unsigned char *head = base + (size_t)(row0 + h * d) * row_bytes;
        for (int64_t i = 0; i < d; i++)
            memcpy(tmp + (size_t)i * row_bytes, head + (size_t)interleaved_lane(i, d) * row_bytes,
                   row_bytes);
        memcpy(head, tmp, (size_t)d * row_bytes);
    }
    free(tmp);
    return FXA_OK;
}

fxa_status fxa_rope_interleaved_to_half(const fxa_proj_desc *desc, void *w, float *w_scales,
                                        float *bias, float *gamma_q, float *gamma_k)
{
    fxa_proj_desc full;
    fxa_proj_desc_init(&full);
    char msg[160];
    if (!desc || fxa_struct_in(&full, sizeof full, desc, FXA_PROJ_DESC_SIZE_0_1, "fxa_proj_desc",
                               msg, sizeof msg) != FXA_OK)
        return FXA_ERR_INVALID_ARG;
    const fxa_proj_desc *d = &full;
    if (d->head_dim < 2 || d->head_dim % 2 || d->head_dim > FXA_MAX_HEAD_DIM || d->heads_q < 0 ||
        d->heads_kv < 0 || d->in_features < 1 || (unsigned)d->w_format > FXA_PROJ_W_E4M3)
        return FXA_ERR_INVALID_ARG;
    /* w's (Hq + 2 Hkv) d rows of in_features elements must be addressable. */
    const int64_t max_heads = PTRDIFF_MAX / 3 / (4 * FXA_MAX_HEAD_DIM);
    if (d->heads_q > max_heads || d->heads_kv > max_heads)
        return FXA_ERR_INVALID_ARG;
    const int64_t rows = (d->heads_q + 2 * d->heads_kv) * d->head_dim;
    if (rows > 0 && d->in_features > PTRDIFF_MAX / 4 / rows)
        return FXA_ERR_INVALID_ARG;
    const int64_t dim = d->head_dim;
    const size_t es = d->w_format == FXA_PROJ_W_F32 ? 4 : d->w_format == FXA_PROJ_W_BF16 ? 2 : 1;
    const size_t w_row = (size_t)d->in_features * es;
    /* Q rows [0, Hq d), K rows [Hq d, (Hq + Hkv) d); V untouched. A single
     * segment call (heads_kv = 0) permutes its only segment. */
    const int64_t k0 = d->heads_q * dim;
    fxa_status st = permute_rows(w, w_row, 0, d->heads_q, dim);
    if (st == FXA_OK)
        st = permute_rows(w, w_row, k0, d->heads_kv, dim);
    if (st == FXA_OK)
        st = permute_rows((unsigned char *)w_scales, sizeof(float), 0, d->heads_q, dim);
    if (st == FXA_OK)
        st = permute_rows((unsigned char *)w_scales, sizeof(float), k0, d->heads_kv, dim);
    if (st == FXA_OK)
        st = permute_rows((unsigned char *)bias, sizeof(float), 0, d->heads_q, dim);
    if (st == FXA_OK)
        st = permute_rows((unsigned char *)bias, sizeof(float), k0, d->heads_kv, dim);
    if (st == FXA_OK)
        st = permute_rows((unsigned char *)gamma_q, sizeof(float), 0, d->heads_q, dim);
    if (st == FXA_OK)
        st = permute_rows((unsigned char *)gamma_k, sizeof(float), 0, d->heads_kv, dim);
    return st;
}
