// The tall tile of the mixed-input GEMM, 256 x 128 x 64: two m64 wgmma atoms per consumer
// warpgroup, so each warp converts two independent k-blocks' codes between waits (the 128-row
// tile's single chain leaves the tensor cores idle while it waits on its own latency). The same
// codes per multiply-add as 128 x 128. The 128-row N tile of bf16 kInt4, kInt8 and kE4m3
// (cutlass_mixed_{int4,int8,e4m3}.cu).
#pragma once

#include "cuda/gemm/cutlass_mixed_kernel.cuh"

namespace qmoe::cuda::cutlass_detail {

using TallTileShape = cute::Shape<cute::_256, cute::_128, cute::_64>;
// The grouped GEMM's epilogues (column-major D, no C) on the tall tile: fp32 rows (f16
// layers) and bf16 rows (bf16 layers; mixed_out_dtype).
using TallEpilogue = GroupEpilogueFor<TallTileShape>;
constexpr int kTallEpilogueSmem = static_cast<int>(sizeof(TallEpilogue::SharedStorage));
using TallEpilogueBf16 =
    GroupEpilogueFor<TallTileShape, GroupClusterShape, cutlass::bfloat16_t>;
constexpr int kTallEpilogueBf16Smem =
    static_cast<int>(sizeof(TallEpilogueBf16::SharedStorage));

template <>
struct MixedTile<256, 128>
    : MixedTileOf<TallTileShape, TallEpilogue, kTallEpilogueSmem, TallEpilogueBf16,
                  kTallEpilogueBf16Smem> {};

}  // namespace qmoe::cuda::cutlass_detail
