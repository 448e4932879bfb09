/*
 * The arguments of a distributed run, checked on the rank that passes them
 * before any communication: the caller's struct (struct_size), pointers,
 * outputs that share memory with inputs, and with U > 1 finiteness.
 */
#include <stdio.h>
#include <string.h>

#include "base/spans.h"
#include "base/struct_size.h"
#include "mpi_internal.h"

/* Whether element i of a tensor of dtype t is finite (bit tests). */
static int finite_at(const void *x, fxa_dtype t, size_t i)
{
    if (t == FXA_F32) {
        uint32_t b;
        memcpy(&b, (const float *)x + i, sizeof b);
        return (b & 0x7f800000u) != 0x7f800000u;
    }
    const uint16_t h = ((const uint16_t *)x)[i];
    return t == FXA_BF16 ? (h & 0x7f80u) != 0x7f80u : (h & 0x7c00u) != 0x7c00u;
}

/* 1 when elements [i0, i1) are all finite: branch-free, vectorised. */
static int span_finite(const void *x, fxa_dtype t, size_t i0, size_t i1)
{
    unsigned bad = 0;
    if (t == FXA_F32) {
        for (size_t i = i0; i < i1; i++) {
            uint32_t b;
            memcpy(&b, (const float *)x + i, sizeof b);
            bad |= (b & 0x7f800000u) == 0x7f800000u;
        }
    } else {
        const uint16_t *h = x;
        const uint16_t mask = t == FXA_BF16 ? 0x7f80u : 0x7c00u;
        for (size_t i = i0; i < i1; i++)
            bad |= (h[i] & mask) == mask;
    }
    return !bad;
}

static float value_at(const void *x, fxa_dtype t, size_t i)
{
    if (t == FXA_F32)
        return ((const float *)x)[i];
    const uint16_t h = ((const uint16_t *)x)[i];
    return t == FXA_BF16 ? fxa_bf16_to_f32(h) : fxa_f16_to_f32(h);
}

/* The first non-finite element of a shard of n tokens starting at global
 * token t0, reported in global coordinates (before any exchange moves it). */
static int report_non_finite(const fxa_mpi_attn_plan *p, const void *x, char name, int64_t heads,
                             int64_t t0, int64_t n, char *msg, size_t cap)
{
    const fxa_attn_desc *d = &p->d;
    const size_t total = (size_t)(d->batch * heads * n * d->head_dim);
    size_t first = total;
    for (size_t i0 = 0; i0 < total && first == total; i0 += 4096) {
        const size_t i1 = i0 + 4096 < total ? i0 + 4096 : total;
        if (span_finite(x, d->dtype, i0, i1))
            continue;
        for (first = i0; finite_at(x, d->dtype, first); first++)
            ;
    }
    for (size_t i = first; i < total; i++) {
        const int64_t c = (int64_t)i % d->head_dim;
        const int64_t r = (int64_t)i / d->head_dim;
        int64_t b;
        int64_t h;
        int64_t t;
        if (d->layout == FXA_LAYOUT_BSHD) {
            h = r % heads;
            t = r / heads % n;
            b = r / heads / n;
        } else {
            t = r % n;
            h = r / n % heads;
            b = r / n / heads;
        }
        snprintf(msg, cap,
                 "%c has a non-finite value (%g) at batch %lld, token %lld, head %lld, dim %lld",
                 name, (double)value_at(x, d->dtype, i), (long long)b, (long long)(t0 + t),
                 (long long)h, (long long)c);
        return 1;
    }
    return 0;
}

/* The first non-finite input of this rank's shards, in global coordinates. */
int fxa_mpi_find_non_finite(const fxa_mpi_attn_plan *p, const fxa_attn_args *a, char *msg,
                            size_t cap)
{
    int64_t q0;
    int64_t k0;
    int64_t n;
    fxa_mpi_shard_of(&p->d, p->d.seq_q, p->m->size, p->m->rank, &q0, &n);
    fxa_mpi_shard_of(&p->d, p->d.seq_kv, p->m->size, p->m->rank, &k0, &n);
    return report_non_finite(p, a->q, 'Q', p->d.heads_q, q0, p->q_len, msg, cap) ||
           report_non_finite(p, a->k, 'K', p->d.heads_kv, k0, p->kv_len, msg, cap) ||
           report_non_finite(p, a->v, 'V', p->d.heads_kv, k0, p->kv_len, msg, cap);
}

/* The outputs of this rank's shard share no byte with its inputs or with
 * each other (whatever the grid: the Ulysses way back and the ring's
 * normalisation write them after every input has been read, so an overlap
 * would otherwise pass there and not on one rank). */
static fxa_status check_disjoint(const fxa_mpi_attn_plan *p, const fxa_attn_args *a, char *msg,
                                 size_t cap)
{
    const fxa_attn_desc *d = &p->d;
    const size_t rows = (size_t)(d->batch * d->heads_q * p->q_len);
    const size_t keys = (size_t)(d->batch * d->heads_kv * p->kv_len * d->head_dim) * p->es;
    const fxa_span in[3] = {
        {"Q", a->q, rows * (size_t)d->head_dim * p->es}, {"K", a->k, keys}, {"V", a->v, keys}};
    const fxa_span out[5] = {{"out", a->out, rows * (size_t)d->head_dim * sizeof(float)},
                             {"lse", a->lse, rows * sizeof(float)},
                             {"lse_parts", a->lse_parts, 3 * rows * sizeof(float)},
                             {"row_fallback", a->row_fallback, rows},
                             {"row_bound", a->row_bound, rows * sizeof(float)}};
    const fxa_span *x, *y;
    if (fxa_spans_clash(out, 5, in, 3, &x, &y)) {
        snprintf(msg, cap,
                 "%s overlaps %s: the outputs must not share memory with the inputs or with "
                 "each other",
                 x->name, y->name);
        return FXA_ERR_INVALID_ARG;
    }
    return FXA_OK;
}

fxa_status fxa_mpi_take_args(const fxa_mpi_attn_plan *p, const fxa_attn_args *user,
                             fxa_attn_args *a, char *msg, size_t cap)
{
    memset(a, 0, sizeof *a);
    a->struct_size = sizeof *a;
    if (!user) {
        snprintf(msg, cap, "NULL attention args");
        return FXA_ERR_INVALID_ARG;
    }
    const fxa_status st =
        fxa_struct_in(a, sizeof *a, user, FXA_ATTN_ARGS_SIZE_0_1, "fxa_attn_args", msg, cap);
    if (st != FXA_OK)
        return st;
    if ((p->q_len > 0 && (!a->q || !a->out)) || (p->kv_len > 0 && (!a->k || !a->v))) {
        snprintf(msg, cap, "q, k, v and out must not be NULL");
        return FXA_ERR_INVALID_ARG;
    }
    if (check_disjoint(p, a, msg, cap) != FXA_OK)
        return FXA_ERR_INVALID_ARG;
    if (p->m->ulysses > 1 && fxa_mpi_find_non_finite(p, a, msg, cap))
        return FXA_ERR_INVALID_ARG;
    return FXA_OK;
}
