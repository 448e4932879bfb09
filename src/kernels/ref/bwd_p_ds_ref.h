/*
 * The P, dS step of the reference backward tiles (fxa_attn_bwd_tile and
 * fxa_attn_bwd_tile_bf16, kernels.h), shared by both computes: for every
 * i < n_q, j < n_kv of the tile t, DOTS(t, i, j, &s, &dp) gives the score
 * s_ij and dp_ij, then p = exp2((lambda (s - center_i) + bias_ij) - lse2_i) inv_sum_i
 * (each step rounded to fp32; no bias term without a bias) and
 * ds = p (dp - delta_i) go to STORE(t, i, j, p, ds).
 */
#ifndef FXA_BWD_P_DS_REF_H
#define FXA_BWD_P_DS_REF_H

#include "exp2_ref.h"

#define BWD_P_DS_REF(t, DOTS, STORE)                                                               \
    do {                                                                                           \
        for (size_t i = 0; i < (t)->n_q; i++) {                                                    \
            for (size_t j = 0; j < (t)->n_kv; j++) {                                               \
                float s, dp;                                                                       \
                DOTS((t), i, j, &s, &dp);                                                          \
                const float z = (t)->lambda * (s - (t)->center[i]);                                \
                const float zb = (t)->bias ? z + (t)->bias[i * (t)->ld_p + j] : z;                 \
                const float p = fxa_exp2_shifted_ref(zb - (t)->lse2[i], 0.0f) * (t)->inv_sum[i];   \
                STORE((t), i, j, p, p *(dp - (t)->delta[i]));                                      \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#endif
