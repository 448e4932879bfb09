/* Shards of whole canonical groups (fxa_canonical_shard in fxattn.h). */
#include "fxattn.h"

void fxa_canonical_shard(int64_t seq, int parts, int part, int64_t *start, int64_t *len)
{
    *start = 0;
    *len = 0;
    if (parts < 1 || part < 0 || part >= parts || seq <= 0)
        return;
    const int64_t groups = (seq + FXA_CANONICAL_KEYS - 1) / FXA_CANONICAL_KEYS;
    const int64_t base = groups / parts;
    const int64_t extra = groups % parts;
    const int64_t lo = (int64_t)part * base + (part < extra ? part : extra);
    const int64_t hi = lo + base + (part < extra ? 1 : 0);
    *start = lo * FXA_CANONICAL_KEYS < seq ? lo * FXA_CANONICAL_KEYS : seq;
    *len = (hi * FXA_CANONICAL_KEYS < seq ? hi * FXA_CANONICAL_KEYS : seq) - *start;
}
