/* Loading attention inputs for the CLI (inputs.h). */
#include "inputs.h"

#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Shard `part` of `parts` of the file's sequence axis as fxa_canonical_shard
 * splits it: its length from a read of no tokens, then the slice. */
static fxa_status read_canonical(const char *path, int seq_axis, int parts, int part, fxa_npy *a,
                                 char *err, size_t cap)
{
    fxa_status st = fxa_npy_read_slice(path, seq_axis, 0, 0, a, err, cap);
    if (st != FXA_OK)
        return st;
    int64_t start, len;
    fxa_canonical_shard(a->shape[seq_axis], parts, part, &start, &len);
    fxa_npy_free(a);
    return fxa_npy_read_slice(path, seq_axis, start, len, a, err, cap);
}

/* The whole file (parts 0) or shard `part` of `parts` along the sequence
 * axis of the layout (canonical: fxa_canonical_shard's, else fxa_mpi_shard's). */
static int read_tensor(const char *path, const char *what, fxa_layout layout, int parts, int part,
                       int canonical, fxa_npy *a)
{
    char err[512];
    const int seq_axis = layout == FXA_LAYOUT_BSHD ? 1 : 2;
    fxa_status st = parts == 0 ? fxa_npy_read(path, a, err, sizeof err)
                    : canonical
                        ? read_canonical(path, seq_axis, parts, part, a, err, sizeof err)
                        : fxa_npy_read_shard(path, seq_axis, parts, part, a, err, sizeof err);
    /* A missing or unreadable input is bad input too (exit 2); only running
     * out of memory is a failure of fxattn itself. */
    if (st != FXA_OK)
        return fxt_fail(st == FXA_ERR_NO_MEMORY ? FXT_EXIT_FAILURE : FXT_EXIT_BAD_INPUT, "%s: %s",
                        what, err);
    if (a->ndim != 4)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: %s has %d dimensions, expected 4", what, path,
                        a->ndim);
    return 0;
}

/* Convert a read tensor (f32 or f16 on disk) to dtype; returns an owned
 * buffer (the file's own when no conversion is needed) or NULL with an
 * error printed (*code set). */
static void *convert_tensor(fxa_npy *a, fxa_dtype dtype, const char *what, int *code)
{
    const size_t n = (size_t)a->count;
    const size_t elem = dtype == FXA_F32 ? 4 : 2;
    void *out;
    float *wide = NULL;
    const float *src = a->data;
    if (a->dtype == dtype) { /* take the file's buffer as it is */
        out = a->data;
        a->data = NULL;
        return out;
    }
    out = malloc(n ? n * elem : 1);
    if (!out)
        goto out_of_memory;
    if (a->dtype == FXA_F16) { /* widen first: exact */
        wide = malloc(n ? n * sizeof(float) : 1);
        if (!wide)
            goto out_of_memory;
        for (size_t i = 0; i < n; i++)
            wide[i] = fxa_f16_to_f32(((const uint16_t *)a->data)[i]);
        src = wide;
    }
    if (fxa_convert_f32(src, dtype, out, n) != FXA_OK) {
        free(wide);
        free(out);
        *code = fxt_fail(FXT_EXIT_BAD_INPUT, "%s has a value too large for %s", what,
                         fxt_dtype_name(dtype));
        return NULL;
    }
    free(wide);
    return out;
out_of_memory:
    free(out);
    *code = fxt_fail(FXT_EXIT_FAILURE, "out of memory converting %s", what);
    return NULL;
}

static int settle_dtype(const fxa_npy *q, const fxa_npy *k, const fxa_npy *v, int has_v,
                        const char *dtype_opt, fxa_dtype *out)
{
    if (dtype_opt)
        return fxt_parse_dtype(dtype_opt, out);
    if (q->dtype != k->dtype || (has_v && v->dtype != q->dtype))
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "Q, K and V files have different dtypes (<f4 and <f2); pass --dtype");
    *out = q->dtype; /* FXA_F32 for <f4, FXA_F16 for <f2 */
    return 0;
}

static int check_shapes(const fxa_npy *q, const fxa_npy *k, const fxa_npy *v, int has_v,
                        fxa_layout layout, fxa_attn_desc *d)
{
    const int seq_axis = layout == FXA_LAYOUT_BSHD ? 1 : 2;
    const int head_axis = layout == FXA_LAYOUT_BSHD ? 2 : 1;
    if (has_v && memcmp(k->shape, v->shape, sizeof k->shape) != 0)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "K and V shapes differ: [%lld,%lld,%lld,%lld] vs "
                        "[%lld,%lld,%lld,%lld]",
                        (long long)k->shape[0], (long long)k->shape[1], (long long)k->shape[2],
                        (long long)k->shape[3], (long long)v->shape[0], (long long)v->shape[1],
                        (long long)v->shape[2], (long long)v->shape[3]);
    if (q->shape[0] != k->shape[0])
        return fxt_fail(FXT_EXIT_BAD_INPUT, "batch sizes differ: Q has %lld, K has %lld",
                        (long long)q->shape[0], (long long)k->shape[0]);
    if (q->shape[3] != k->shape[3])
        return fxt_fail(FXT_EXIT_BAD_INPUT, "head dims differ: Q has %lld, K has %lld",
                        (long long)q->shape[3], (long long)k->shape[3]);
    fxa_attn_desc_init(d);
    d->batch = q->shape[0];
    d->seq_q = q->shape[seq_axis];
    d->heads_q = q->shape[head_axis];
    d->seq_kv = k->shape[seq_axis];
    d->heads_kv = k->shape[head_axis];
    d->head_dim = q->shape[3];
    d->layout = layout;
    if (d->batch < 1 || d->seq_q < 1 || d->heads_q < 1 || d->seq_kv < 1 || d->heads_kv < 1 ||
        d->head_dim < 1)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "empty tensor: every dimension must be >= 1");
    if (d->heads_q % d->heads_kv != 0)
        return fxt_fail(FXT_EXIT_BAD_INPUT,
                        "Q has %lld heads, not a multiple of K's %lld (wrong --layout?)",
                        (long long)d->heads_q, (long long)d->heads_kv);
    return 0;
}

int fxt_inputs_load(const char *q_path, const char *k_path, const char *v_path, fxa_layout layout,
                    const char *dtype_opt, fxt_inputs *in)
{
    return fxt_inputs_load_shard(q_path, k_path, v_path, layout, dtype_opt, 0, 0, 0, in);
}

int fxt_inputs_load_shard(const char *q_path, const char *k_path, const char *v_path,
                          fxa_layout layout, const char *dtype_opt, int parts, int part,
                          int canonical, fxt_inputs *in)
{
    fxa_npy q = {0};
    fxa_npy k = {0};
    fxa_npy v = {0};
    int code;
    memset(in, 0, sizeof *in);
    if ((code = read_tensor(q_path, "Q", layout, parts, part, canonical, &q)) ||
        (code = read_tensor(k_path, "K", layout, parts, part, canonical, &k)) ||
        (v_path && (code = read_tensor(v_path, "V", layout, parts, part, canonical, &v))))
        goto out;
    if ((code = check_shapes(&q, &k, &v, v_path != NULL, layout, &in->d)))
        goto out;
    if ((code = settle_dtype(&q, &k, &v, v_path != NULL, dtype_opt, &in->d.dtype)))
        goto out;
    in->nq = q.count;
    in->nkv = k.count;
    in->q_start = parts > 0 ? q.slice_start : 0;
    in->q_len = parts > 0 ? q.slice_len : in->d.seq_q;
    in->kv_start = parts > 0 ? k.slice_start : 0;
    in->kv_len = parts > 0 ? k.slice_len : in->d.seq_kv;
    code = 0;
    if (!(in->q = convert_tensor(&q, in->d.dtype, "Q", &code)) ||
        !(in->k = convert_tensor(&k, in->d.dtype, "K", &code)))
        goto out;
    if (v_path) {
        if (!(in->v = convert_tensor(&v, in->d.dtype, "V", &code)))
            goto out;
    } else if (!(in->v = calloc((size_t)in->nkv ? (size_t)in->nkv : 1, 4))) {
        code = fxt_fail(FXT_EXIT_FAILURE, "out of memory");
        goto out;
    }
out:
    fxa_npy_free(&q);
    fxa_npy_free(&k);
    fxa_npy_free(&v);
    if (code)
        fxt_inputs_free(in);
    return code;
}

void fxt_inputs_free(fxt_inputs *in)
{
    free(in->q);
    free(in->k);
    free(in->v);
    in->q = in->k = in->v = NULL;
}

float *fxt_inputs_widen(const fxt_inputs *in, char which)
{
    const void *src = which == 'q' ? in->q : (which == 'k' ? in->k : in->v);
    const size_t n = (size_t)(which == 'q' ? in->nq : in->nkv);
    float *out = malloc(n ? n * sizeof(float) : 1);
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        if (in->d.dtype == FXA_F32)
            out[i] = ((const float *)src)[i];
        else if (in->d.dtype == FXA_BF16)
            out[i] = fxa_bf16_to_f32(((const uint16_t *)src)[i]);
        else
            out[i] = fxa_f16_to_f32(((const uint16_t *)src)[i]);
    }
    return out;
}
