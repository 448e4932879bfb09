/* The portable reference set: every entry is the spec (ref/). */
#include "../kernels.h"

void fxa_kernels_init_ref(fxa_kernels *k)
{
    k->isa_name = "ref";
    k->description = "portable C tiles (fp32, bf16 and fp64 compute), compiler-vectorised";
    k->kv_tile = 256;
    k->kt_panel = 16; /* the narrowest panel: the spec walks the general layout */
    k->attn_tile = fxa_f32_tile__ref;
    k->attn_tile_bf16 = fxa_bf16_tile__ref;
    k->widen_f16 = fxa_widen_f16_ref;
    k->pack_kt = fxa_f32_packkt__ref;
    k->row_stats = &fxa_f32_rowstats__ref;
    k->bwd_kt_panel = 16;
    k->attn_bwd_dkdv = fxa_f32_bwd_dkdv__ref;
    k->attn_bwd_dq = fxa_f32_bwd_dq__ref;
    k->attn_bwd_dkdv_bf16 = fxa_bf16_bwd_dkdv__ref;
    k->attn_bwd_dq_bf16 = fxa_bf16_bwd_dq__ref;
    k->attn_tile_f64 = fxa_f64_tile__ref;
    k->attn_bwd_dq_f64 = fxa_f64_bwd_dq__ref;
    k->attn_bwd_dkdv_f64 = fxa_f64_bwd_dkdv__ref;
}
