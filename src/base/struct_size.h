/*
 * Versioned public structs (fxattn.h, "Conventions"): every one starts with
 * size_t struct_size, and the library accepts any size from the first
 * released version's to the current one. One set of helpers for all of
 * them (fxa_ctx_params, fxa_attn_desc, fxa_attn_args, fxa_attn_stats, fxa_check_desc,
 * fxa_check_head, and the other libraries' structs):
 *  - copy-in: the caller's first struct_size bytes over a struct that holds
 *    the defaults, so fields a smaller (older) struct lacks keep them;
 *  - copy-out: only the caller's first struct_size bytes are written (its
 *    struct_size itself is left as it is).
 * A struct_size below the first version's size or above the current one is
 * refused with FXA_ERR_INVALID_ARG and a message.
 */
#ifndef FXA_STRUCT_SIZE_H
#define FXA_STRUCT_SIZE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "fxattn.h"

/* Sizes of the first released version (0.1) of each struct. Each later
 * field starts at or after these, so these bytes never change meaning. */
#define FXA_CTX_PARAMS_SIZE_0_1 sizeof(fxa_ctx_params)
#define FXA_ATTN_ARGS_SIZE_0_1 offsetof(fxa_attn_args, mask)
#define FXA_ATTN_DESC_SIZE_0_1 offsetof(fxa_attn_desc, q_strides)
#define FXA_ATTN_STATS_SIZE_0_1 offsetof(fxa_attn_stats, keys)
/* (fxa_mpi_stats: fxattn_mpi.h, which this header does not include.) */
#define FXA_MPI_STATS_SIZE_0_1 offsetof(fxa_mpi_stats, compute)
/* Structs added later: their first version's size. (fxa_check_head and
 * fxa_check_desc: fxattn_diag.h, new in 0.2 and 0.3.) */
#define FXA_CHECK_HEAD_SIZE_0_2 sizeof(fxa_check_head)
#define FXA_CHECK_DESC_SIZE_0_3 sizeof(fxa_check_desc)
/* (fxa_grid_model and fxa_grid_time: fxattn_grid.h, new in 0.3.) */
#define FXA_GRID_MODEL_SIZE_0_3 sizeof(fxa_grid_model)
#define FXA_GRID_TIME_SIZE_0_3 sizeof(fxa_grid_time)
/* (fxa_attn_bwd_args and fxa_attn_bwd_stats: new in 0.3; the args' first
 * form ends at dv, mask came after.) */
#define FXA_ATTN_BWD_ARGS_SIZE_0_3 offsetof(fxa_attn_bwd_args, mask)
#define FXA_ATTN_BWD_STATS_SIZE_0_3 sizeof(fxa_attn_bwd_stats)
/* (fxa_compute_choice: new in 0.3.) */
#define FXA_COMPUTE_CHOICE_SIZE_0_3 sizeof(fxa_compute_choice)

/* The caller's struct_size (the first member of every versioned struct). */
static inline size_t fxa_struct_size_of(const void *s)
{
    size_t n;
    memcpy(&n, s, sizeof n);
    return n;
}

/* FXA_OK when size lies in [min_size, cur_size]; else FXA_ERR_INVALID_ARG
 * and a sentence naming the struct (`name`) in msg. */
static inline fxa_status fxa_struct_size_check(size_t size, size_t min_size, size_t cur_size,
                                               const char *name, char *msg, size_t cap)
{
    if (size >= min_size && size <= cur_size)
        return FXA_OK;
    snprintf(msg, cap,
             "%s.struct_size is %zu: this library accepts %zu (its first version) to %zu "
             "(sizeof(%s) now)",
             name, size, min_size, cur_size, name);
    return FXA_ERR_INVALID_ARG;
}

/* An optional output struct (stats): FXA_OK for NULL, else its struct_size
 * checked as by fxa_struct_size_check. */
static inline fxa_status fxa_struct_out_check(const void *out, size_t min_size, size_t cur_size,
                                              const char *name, char *msg, size_t cap)
{
    return out ? fxa_struct_size_check(fxa_struct_size_of(out), min_size, cur_size, name, msg, cap)
               : FXA_OK;
}

/* Copy-in: dst (cur_size bytes) holds the defaults; src's first struct_size
 * bytes replace them and dst's struct_size becomes cur_size. Nothing is
 * read from src past its struct_size. */
static inline fxa_status fxa_struct_in(void *dst, size_t cur_size, const void *src, size_t min_size,
                                       const char *name, char *msg, size_t cap)
{
    const size_t n = fxa_struct_size_of(src);
    const fxa_status st = fxa_struct_size_check(n, min_size, cur_size, name, msg, cap);
    if (st != FXA_OK)
        return st;
    memcpy(dst, src, n);
    memcpy(dst, &cur_size, sizeof cur_size);
    return FXA_OK;
}

/* Copy-out: the fields of src (a current struct) that fit in dst's
 * struct_size (already checked with fxa_struct_size_check); dst's
 * struct_size and every byte past it are left untouched. */
static inline void fxa_struct_out(void *dst, const void *src, size_t cur_size)
{
    size_t n = fxa_struct_size_of(dst);
    n = n < cur_size ? n : cur_size;
    if (n > sizeof(size_t))
        memcpy((unsigned char *)dst + sizeof(size_t), (const unsigned char *)src + sizeof(size_t),
               n - sizeof(size_t));
}

#endif
