/*
 * Q, K, V from .npy files for the subcommands: read, check shapes against
 * the layout, settle the compute dtype (--dtype, or the files' own: <f2
 * implies f16; mixed file dtypes need --dtype), and convert (RNE) to it.
 * Errors print "fxattn: error: ..." and return the CLI exit code.
 */
#ifndef FXT_INPUTS_H
#define FXT_INPUTS_H

#include "fxattn.h"
#include "fxattn_npy.h"

typedef struct fxt_inputs {
    fxa_attn_desc d; /* shapes, layout and dtype filled in */
    void *q;         /* data in d.dtype */
    void *k;
    void *v;
    int64_t nq; /* elements held */
    int64_t nkv;
    /* Tokens held: everything, or this rank's shard (fxt_inputs_load_shard). */
    int64_t q_start, q_len;
    int64_t kv_start, kv_len;
} fxt_inputs;

/* v_path may be NULL: V is then zeros (Vmax taken as 1). dtype_opt may be
 * NULL (use the files' dtype). Returns 0 or an exit code. */
int fxt_inputs_load(const char *q_path, const char *k_path, const char *v_path, fxa_layout layout,
                    const char *dtype_opt, fxt_inputs *in);
/* The same checks on the whole files' shapes (in->d is the global problem),
 * but only shard `part` of `parts` of the sequence axis is read: whole
 * canonical groups (fxa_canonical_shard) when canonical, else
 * fxa_mpi_shard's split. */
int fxt_inputs_load_shard(const char *q_path, const char *k_path, const char *v_path,
                          fxa_layout layout, const char *dtype_opt, int parts, int part,
                          int canonical, fxt_inputs *in);
void fxt_inputs_free(fxt_inputs *in);

/* fp32 values of one tensor ('q', 'k' or 'v') exactly as the kernels see
 * them (bf16/f16 widened). Caller frees. NULL when out of memory. */
float *fxt_inputs_widen(const fxt_inputs *in, char which);

#endif
