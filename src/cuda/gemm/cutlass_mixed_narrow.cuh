// The narrow tile of the mixed-input GEMM, 256 x 32 x 64, for calls whose experts hold few rows
// (an average of at most kMixedNarrowRoutes routes per expert, dispatch.h: up to 384 tokens of a
// 128-expert top-8 layer). The 128-row N tile pads a group of 8 rows to 128, so at 128 tokens 94%
// of every wgmma was padding and the kernel, not the weights' bytes, set the time; 32 rows keep
// the wgmma m64n32k16 busy on real rows while each weight tile is still read once per group.
// 256 weight rows give each consumer warpgroup two m64 atoms: two independent conversion chains
// per k-block, which took qwen3-30b-a3b INT4 at 256 tokens from 247.0 to 194.7 us against 128
// rows (bench/results/2026-12-02-h200-mid-tile.md). bf16 kInt4, kInt8 and kE4m3 (and f16
// kE4m3) have it, all in cutlass_mixed_narrow.cu, the one unit that includes this header.
//
// Two CTAs per SM (cutlass_two_ctas.cuh): the tile's consumers are bound by their conversion
// chain's latency at two warps per scheduler, and fit in 96 registers (32 accumulators a thread),
// so a second CTA gives each scheduler four consumer warps; each CTA's stages take half the SM's
// shared memory.
#pragma once

#ifndef QMOE_CUTLASS_TWO_CTAS_PER_SM
#error "cutlass_mixed_narrow.cuh: include cuda/gemm/cutlass_two_ctas.cuh first (two CTAs per SM)"
#endif

#include "cuda/gemm/cutlass_mixed_kernel.cuh"

namespace qmoe::cuda::cutlass_detail {

using NarrowTileShape = cute::Shape<cute::_256, cute::_32, cute::_64>;
// The grouped GEMM's epilogues (column-major D, no C) on the narrow tile: fp32 rows (f16
// layers) and bf16 rows (bf16 layers; mixed_out_dtype).
using NarrowEpilogue = GroupEpilogueFor<NarrowTileShape>;
constexpr int kNarrowEpilogueSmem = static_cast<int>(sizeof(NarrowEpilogue::SharedStorage));
using NarrowEpilogueBf16 =
    GroupEpilogueFor<NarrowTileShape, GroupClusterShape, cutlass::bfloat16_t>;
constexpr int kNarrowEpilogueBf16Smem =
    static_cast<int>(sizeof(NarrowEpilogueBf16::SharedStorage));

template <>
struct MixedTile<256, 32> : MixedTileOf<NarrowTileShape, NarrowEpilogue, kNarrowEpilogueSmem,
                                        NarrowEpilogueBf16, kNarrowEpilogueBf16Smem, 2> {};

}  // namespace qmoe::cuda::cutlass_detail
