/* Hashes compared across ranks: of the options (fxt_world_agree_options)
 * and of the bytes ranks read (fxt_world_agree_hashes), so that copies of
 * one input that differ between hosts are refused instead of mixed into
 * one result. */
#ifndef FXT_INPUT_HASH_H
#define FXT_INPUT_HASH_H

#include <stddef.h>
#include <stdint.h>

#define FXT_HASH_SEED 0xcbf29ce484222325ull

/* A cheap 64-bit hash of the n bytes at p (8 at a time), chained from h. */
uint64_t fxt_hash_bytes(uint64_t h, const void *p, size_t n);

/* *h = the hash of every byte of the .npy array at path as stored (its
 * dtype, then its data), read as `len` tokens along `axis` in pieces of at
 * most 16 MiB (token_bytes: one token's bytes, to size the pieces). 0 or
 * an exit code, the message led by `what`. */
int fxt_hash_npy(const char *path, const char *what, int axis, int64_t len, int64_t token_bytes,
                 uint64_t *h);

#endif
