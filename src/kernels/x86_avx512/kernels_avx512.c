/* The AVX-512 set: the reference set with the AVX-512 fp32 tile, K^T packing,
 * row statistics and backward tiles, and F16C widening; with AVX512-BF16, also the
 * vdpbf16ps tile and backward tiles for bf16 compute. The AMX set is the same with the AMX tile
 * for bf16 compute. */
#include "../../base/cpu.h"
#include "../kernels.h"

void fxa_kernels_init_avx512(fxa_kernels *k, const fxa_cpu *cpu)
{
    fxa_kernels_init_ref(k);
    k->isa_name = "avx512";
    k->description = "AVX-512 fp32 tile (6x64 scores, 6x64 P.V); bf16 compute: portable tile "
                     "(no AVX512-BF16)";
    k->kt_panel = FXA_AVX512_KT_PANEL;
    k->attn_tile = fxa_f32_tile_6x64__avx512;
    k->widen_f16 = fxa_widen_f16_f16c;
    k->pack_kt = fxa_f32_packkt_16x16__avx512;
    k->row_stats = &fxa_f32_rowstats__avx512;
    k->bwd_kt_panel = FXA_AVX512_KT_PANEL;
    k->attn_bwd_dkdv = fxa_f32_bwd_dkdv_6x64__avx512;
    k->attn_bwd_dq = fxa_f32_bwd_dq_6x64__avx512;
    if (cpu->avx512bf16) {
        k->description = "AVX-512 fp32 tile (6x64 scores, 6x64 P.V); bf16 compute: vdpbf16ps "
                         "tile (6x64, 6x64), vdpbf16ps backward (6x64)";
        k->attn_tile_bf16 = fxa_bf16_tile_6x64__avx512bf16;
        k->attn_bwd_dkdv_bf16 = fxa_bf16_bwd_dkdv_6x64__avx512bf16;
        k->attn_bwd_dq_bf16 = fxa_bf16_bwd_dq_6x64__avx512bf16;
    }
}

#if defined(FXA_HAVE_AMX_KERNELS)
void fxa_kernels_init_amx(fxa_kernels *k, const fxa_cpu *cpu)
{
    fxa_kernels_init_avx512(k, cpu);
    k->isa_name = "amx";
    k->description = "AVX-512 fp32 tile (6x64 scores, 6x64 P.V); bf16 compute: AMX tdpbf16ps "
                     "tile (2x2 tiles of 16x16; head dims not a multiple of 32: vdpbf16ps 6x64)";
    k->attn_tile_bf16 = fxa_bf16_tile_16x32__amx;
}
#endif
