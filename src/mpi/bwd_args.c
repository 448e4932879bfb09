/*
 * The arguments of a distributed backward, checked on the rank that passes
 * them before any communication: the caller's struct (struct_size), the
 * pointers, fp32 gradients (grad_dtype FXA_F32), and finiteness (a
 * non-finite value is found, and named in global coordinates, on the rank
 * that owns it, before an exchange or the ring moves it).
 */
#include <stdio.h>
#include <string.h>

#include "base/struct_size.h"
#include "bwd.h"

/* Element i of x (dtype t) as a float. */
static float value_at(const void *x, fxa_dtype t, size_t i)
{
    if (t == FXA_F32)
        return ((const float *)x)[i];
    const uint16_t h = ((const uint16_t *)x)[i];
    return t == FXA_BF16 ? fxa_bf16_to_f32(h) : fxa_f16_to_f32(h);
}

/* 1 when x (a shard of n tokens from global token t0 of a [B, heads, n,
 * dim] tensor in layout l, dtype t) holds a non-finite value; msg names
 * the first. */
static int non_finite(const void *x, fxa_dtype t, fxa_layout l, int64_t batch, int64_t heads,
                      int64_t n, int64_t dim, int64_t t0, const char *name, char *msg, size_t cap)
{
    const int64_t total = batch * heads * n * dim;
    for (int64_t i = 0; i < total; i++) {
        const float f = value_at(x, t, (size_t)i);
        if (f - f == 0.0f)
            continue;
        const int64_t c = i % dim;
        const int64_t r = i / dim;
        const int64_t h = l == FXA_LAYOUT_BSHD ? r % heads : r / n % heads;
        const int64_t tok = l == FXA_LAYOUT_BSHD ? r / heads % n : r % n;
        const int64_t b = l == FXA_LAYOUT_BSHD ? r / heads / n : r / n / heads;
        snprintf(msg, cap,
                 "%s has a non-finite value (%g) at batch %lld, token %lld, head %lld, dim %lld",
                 name, (double)f, (long long)b, (long long)(t0 + tok), (long long)h, (long long)c);
        return 1;
    }
    return 0;
}

fxa_status fxa_bwd_take_args(const fxa_mpi_attn_bwd_plan *p, const fxa_attn_bwd_args *user,
                             fxa_attn_bwd_args *a, char *msg, size_t cap)
{
    if (!user) {
        snprintf(msg, cap, "NULL args");
        return FXA_ERR_INVALID_ARG;
    }
    fxa_status st = fxa_struct_in(a, sizeof *a, user, FXA_ATTN_BWD_ARGS_SIZE_0_3,
                                  "fxa_attn_bwd_args", msg, cap);
    if (st != FXA_OK)
        return st;
    /* An empty shard (a sequence shorter than the ranks) may pass NULL for
     * its tensors, as the forward's may. */
    const int q_null = !a->q || !a->out || !a->dout || !a->lse || !a->dq;
    const int kv_null = !a->k || !a->v || !a->dk || !a->dv;
    if ((p->q_len > 0 && q_null) || (p->kv_len > 0 && kv_null)) {
        snprintf(msg, cap,
                 "NULL tensor in fxa_attn_bwd_args (q, k, v, out, dout, lse, dq, dk and "
                 "dv are required where this rank's shard is not empty)");
        return FXA_ERR_INVALID_ARG;
    }
    if (a->grad_dtype != FXA_F32) {
        const int known = a->grad_dtype == FXA_BF16 || a->grad_dtype == FXA_F16;
        snprintf(msg, cap,
                 known ? "grad_dtype %d: the distributed backward writes fp32 gradients "
                         "(FXA_F32)"
                       : "grad_dtype %d is not FXA_F32, FXA_BF16 or FXA_F16",
                 (int)a->grad_dtype);
        return known ? FXA_ERR_UNSUPPORTED : FXA_ERR_INVALID_ARG;
    }
    const fxa_attn_desc *d = &p->d;
    const int r = p->m->rank;
    const int64_t qn = p->q_len;
    const int64_t kn = p->kv_len;
    const int64_t b = d->batch;
    const int64_t dim = d->head_dim;
    const fxa_layout l = d->layout;
    const int bad =
        non_finite(a->q, d->dtype, l, b, d->heads_q, qn, dim, p->tq[r], "Q", msg, cap) ||
        non_finite(a->k, d->dtype, l, b, d->heads_kv, kn, dim, p->tk[r], "K", msg, cap) ||
        non_finite(a->v, d->dtype, l, b, d->heads_kv, kn, dim, p->tk[r], "V", msg, cap) ||
        non_finite(a->out, FXA_F32, l, b, d->heads_q, qn, dim, p->tq[r], "out", msg, cap) ||
        non_finite(a->dout, FXA_F32, l, b, d->heads_q, qn, dim, p->tq[r], "dout", msg, cap) ||
        non_finite(a->lse, FXA_F32, FXA_LAYOUT_BHSD, b, d->heads_q, qn, 1, p->tq[r], "lse", msg,
                   cap);
    return bad ? FXA_ERR_INVALID_ARG : FXA_OK;
}
