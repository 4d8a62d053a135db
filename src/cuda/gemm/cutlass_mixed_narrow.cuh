// The narrow tile of the mixed-input GEMM, 256 x 32 x 64, for calls whose experts hold few rows
// (an average of at most kMixedNarrowRoutes routes per expert, dispatch.h: up to 384 tokens of a
// 128-expert top-8 layer). The 128-row N tile pads a group of 8 rows to 128, so at 128 tokens 94%
// of every wgmma was padding and the kernel, not the weights' bytes, set the time; 32 rows keep
// the wgmma m64n32k16 busy on real rows while each weight tile is still read once per group.
// 256 weight rows give each consumer warpgroup two m64 atoms: two independent conversion chains
// per k-block, which took qwen3-30b-a3b INT4 at 256 tokens from 247.0 to 194.7 us against 128
// rows (bench/results/2026-12-02-h200-mid-tile.md). bf16 kInt4, kInt8 and kE4m3 (and f16
// kE4m3) have it.
//
// In two residencies: one CTA per SM (the kind units), and two (cutlass_two_ctas.cuh, the unit
// cutlass_mixed_narrow.cu): the tile's consumers are bound by their conversion chain's latency at
// two warps per scheduler and fit in 96 registers (32 accumulators a thread), so a second CTA
// gives each scheduler four consumer warps, each CTA with half the SM's shared memory for its
// stages. Where an FC has fewer tiles than two CTAs per SM (mixed_ctas_per_sm) the SMs would hold
// one CTA with half the stages, so such FCs take the one-CTA form.
#pragma once

#include "cuda/gemm/cutlass_mixed_kernel.cuh"

namespace qmoe::cuda::cutlass_detail {

using NarrowTileShape = cute::Shape<cute::_256, cute::_32, cute::_64>;
static_assert(cute::size<0>(NarrowTileShape{}) == kMixedNarrowTileM, "cutlass_mixed.h's M");
// The grouped GEMM's epilogues (column-major D, no C) on the narrow tile: fp32 rows (f16
// layers) and bf16 rows (bf16 layers; mixed_out_dtype).
using NarrowEpilogue = GroupEpilogueFor<NarrowTileShape>;
constexpr int kNarrowEpilogueSmem = static_cast<int>(sizeof(NarrowEpilogue::SharedStorage));
using NarrowEpilogueBf16 =
    GroupEpilogueFor<NarrowTileShape, GroupClusterShape, cutlass::bfloat16_t>;
constexpr int kNarrowEpilogueBf16Smem =
    static_cast<int>(sizeof(NarrowEpilogueBf16::SharedStorage));

template <int kCtas>
struct MixedTile<256, 32, kCtas> : MixedTileOf<NarrowTileShape, NarrowEpilogue, kNarrowEpilogueSmem,
                                               NarrowEpilogueBf16, kNarrowEpilogueBf16Smem, kCtas> {
};

}  // namespace qmoe::cuda::cutlass_detail
