/* Dropout's keep decisions (fxa_dropout_kept) and their tile biases. */
#include "dropout.h"

#include <math.h>

#include "../base/philox.h"

/* floor(p 2^32): a word u keeps its weight when u >= it. */
static uint32_t threshold(double p)
{
    return (uint32_t)ldexp(p, 32);
}

/* Word element % 4 of the element's Philox block. */
static uint32_t word_of(uint64_t seed, uint64_t offset, uint64_t element)
{
    const uint64_t block = element >> 2;
    const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)offset,
                             (uint32_t)(offset >> 32)};
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    fxa_philox4x32_10(ctr, key, out);
    return out[element & 3];
}

int fxa_dropout_kept(uint64_t seed, uint64_t offset, double p, uint64_t element)
{
    if (!(p >= 0.0 && p < 1.0))
        return 0;
    return word_of(seed, offset, element) >= threshold(p);
}

fxa_tile_use fxa_dropout_bias(const fxa_attn_plan *p, const fxa_drop_stream *stream, int64_t b,
                              int64_t h, int64_t i0, size_t n, int64_t j0, size_t n_kv, size_t ld,
                              const float *from, float *bias, fxa_drop_pass pass)
{
    const uint32_t t = threshold(p->d.dropout_p);
    const uint64_t seed = stream->seed, offset = stream->offset;
    const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    size_t stays = 0;
    for (size_t r = 0; r < n; r++) {
        const uint64_t e0 =
            (uint64_t)(((b * p->d.heads_q + h) * p->d.seq_q + i0 + (int64_t)r) * p->d.seq_kv + j0);
        uint32_t words[4] = {0, 0, 0, 0};
        uint64_t block = UINT64_MAX;
        for (size_t j = 0; j < n_kv; j++) {
            const uint64_t e = e0 + j;
            if (!stream->keep && e >> 2 != block) {
                block = e >> 2;
                const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)offset,
                                         (uint32_t)(offset >> 32)};
                fxa_philox4x32_10(ctr, key, words);
            }
            const int kept = stream->keep ? stream->keep[e] != 0 : words[e & 3] >= t;
            const float x = from ? from[r * ld + j] : 0.0f;
            const int stay = (pass == FXA_DROP_KEEP) == kept;
            bias[r * ld + j] = stay ? x : -INFINITY;
            stays += stay && x != -INFINITY;
        }
    }
    return stays ? FXA_TILE_BIAS : FXA_TILE_SKIP;
}
