/* The AVX2 set: the reference set with the AVX2+FMA fp32 tile, K^T packing,
 * row statistics and backward tiles, and F16C widening; bf16 compute stays portable. */
#include "../kernels.h"

void fxa_kernels_init_avx2(fxa_kernels *k)
{
    fxa_kernels_init_ref(k);
    k->isa_name = "avx2";
    k->description = "AVX2+FMA fp32 tile (4x24 scores, 6x16 P.V); bf16 compute: portable tile";
    k->kt_panel = 256; /* one panel per tile: 24-key blocks never straddle panels */
    k->attn_tile = fxa_f32_tile_4x24_6x16__avx2;
    k->widen_f16 = fxa_widen_f16_f16c;
    k->pack_kt = fxa_f32_packkt_8x8__avx2;
    k->row_stats = &fxa_f32_rowstats__avx2;
    k->bwd_kt_panel = 16;
    k->attn_bwd_dkdv = fxa_f32_bwd_dkdv_6x16__avx2;
    k->attn_bwd_dq = fxa_f32_bwd_dq_6x16__avx2;
}
