/*
 * fxattn_checkpoint.h (libfxattn_io): Hugging Face checkpoints, one .safetensors file or
 * sharded (read only).
 *
 * A sharded checkpoint is an index, e.g. diffusion_pytorch_model.safetensors.index.json or
 * model.safetensors.index.json,
 *     {"metadata": {"total_size": 123}, "weight_map": {"blocks.0.attn1.to_q.weight":
 *      "diffusion_pytorch_model-00001-of-00003.safetensors", ...}}
 * next to the shards it names: .safetensors files (fxattn_safetensors.h).
 *
 * Contract
 *  - fxa_ckpt_open takes a .safetensors file, an index (any path ending in ".json"), or a
 *    folder. A folder must hold exactly one *.safetensors.index.json, else exactly one
 *    *.safetensors (names are matched, then the file is opened as usual); anything else is
 *    an error that names the candidates. Only the index, or the single file's header, is read
 *    at open; a shard is opened the first time fxa_ckpt_find needs one of its tensors and
 *    stays open (one descriptor each) until fxa_ckpt_close.
 *  - The index is treated as hostile: at most FXA_CKPT_MAX_INDEX_LEN bytes, strict JSON
 *    (RFC 8259, the parser of fxattn_safetensors.h, nesting at most FXA_ST_MAX_DEPTH deep), a
 *    top-level object with a "weight_map" object of string values (at least one entry, at
 *    most FXA_CKPT_MAX_TENSORS) and optionally a "metadata" object, whose content is not
 *    used; other top-level keys are ignored, and a repeated "weight_map" or "metadata" is
 *    refused. Tensor names follow the safetensors rules (at most FXA_ST_MAX_NAME_LEN bytes,
 *    no U+0000, no duplicates). A shard name must be a plain file name in the index's folder:
 *    not empty, not "." or "..", no '/', no U+0000, at most 255 bytes.
 *  - When a shard is opened every tensor it holds that the index lists must be listed under
 *    that shard (a tensor in two shards is refused), and the shard must hold the tensor that
 *    was asked for (an index that points at a shard without it is refused).
 *  - Errors: on failure *out (fxa_ckpt_open) or *file and *t (fxa_ckpt_find) are NULL and err
 *    holds one line that starts with the path given to fxa_ckpt_open (the folder's index or
 *    file for a folder); for a shard the shard's own message follows, starting with the
 *    shard's path. Status: FXA_ERR_INVALID_ARG for bad content or arguments, FXA_ERR_IO when
 *    a file cannot be opened or read (a missing shard included), FXA_ERR_NO_MEMORY. err may
 *    be NULL or errlen 0; messages are truncated to errlen - 1 bytes, text from files quoted
 *    as fxattn_safetensors.h quotes it. Nothing is printed, nothing aborts.
 *  - An empty path is FXA_ERR_INVALID_ARG. An index that changes while it is read is refused
 *    (FXA_ERR_IO), as fxattn_safetensors.h refuses a shard that changes.
 *  - fxa_ckpt_find may open a shard: one thread at a time per checkpoint. The file objects it
 *    returns are read as fxattn_safetensors.h says (several threads may read one at once).
 */
#ifndef FXATTN_CHECKPOINT_H
#define FXATTN_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "fxattn.h"
#include "fxattn_safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FXA_CKPT_MAX_INDEX_LEN (64 * 1024 * 1024) /* bytes of an index file */
#define FXA_CKPT_MAX_TENSORS (1 << 22)            /* entries of a weight_map */

typedef struct fxa_ckpt fxa_ckpt;

/* Open a checkpoint: a .safetensors file, an index (.json) or a folder (see above). */
FXA_API fxa_status fxa_ckpt_open(const char *path, fxa_ckpt **out, char *err, size_t errlen);

/*
 * Look tensor name up, opening its shard on first use. Found: FXA_OK, *file is the shard that
 * holds it and *t its tensor there, both valid until fxa_ckpt_close (read it with fxa_st_read
 * and friends). Not in the checkpoint: FXA_OK with *file and *t NULL and err holding
 * "<path>: no tensor '<name>'", so that a caller can try another name. Other failures as in
 * the contract above (a shard that cannot be opened or that does not hold name).
 */
FXA_API fxa_status fxa_ckpt_find(fxa_ckpt *c, const char *name, const fxa_st_file **file,
                                 const fxa_st_tensor **t, char *err, size_t errlen);

/* Number of shards: the distinct file names of the weight_map, 1 for a single file (0 for
 * NULL). */
FXA_API int64_t fxa_ckpt_shard_count(const fxa_ckpt *c);

/* File name of shard i (shards in byte order of their names; a single file's own name), or
 * NULL when i is out of range. */
FXA_API const char *fxa_ckpt_shard_name(const fxa_ckpt *c, int64_t i);

/* Number of shards opened so far (a single file counts as opened at fxa_ckpt_open). */
FXA_API int64_t fxa_ckpt_shards_opened(const fxa_ckpt *c);

/* Close every open shard and free everything. NULL-safe. */
FXA_API void fxa_ckpt_close(fxa_ckpt *c);

#ifdef __cplusplus
}
#endif

#endif /* FXATTN_CHECKPOINT_H */
