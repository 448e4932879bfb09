/*
 * The P, dS step of the reference backward tiles (fxa_attn_bwd_tile and
 * fxa_attn_bwd_tile_bf16, kernels.h), shared by both computes: for every
 * i < n_q, j < n_kv of the tile t, DOTS(t, i, j, &s, &dp) gives the score
 * s_ij and dp_ij, then p = exp2(lambda s - shift) (shift lse2_i - bias_ij
 * rounded once to fp32 with a bias, else lse2_i) and ds = p (dp - delta_i)
 * go to STORE(t, i, j, p, ds).
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
                const float shift =                                                                \
                    (t)->bias ? (t)->lse2[i] - (t)->bias[i * (t)->ld_p + j] : (t)->lse2[i];        \
                const float p = fxa_exp2_shifted_ref((t)->lambda * s - shift, 0.0f);               \
                STORE((t), i, j, p, p *(dp - (t)->delta[i]));                                      \
            }                                                                                      \
        }                                                                                          \
    } while (0)

#endif
