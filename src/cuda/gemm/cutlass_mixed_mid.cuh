// The middle tile of the mixed-input GEMM, 256 x 64 x 64, for calls whose experts average up to
// kMixedMidRoutes routes past the narrow tile's (dispatch.h: 385..768 tokens of a 128-expert
// top-8 layer). There the 128-row N tile's wgmma is half to three quarters padding (a
// 128 x 128 x 64 step is 512 tensor-core cycles for 4 KB of int4 codes, about 2 TB/s of weights
// over 132 SMs), while the narrow tile converts each weight tile once per 32 rows. Two m64 atoms
// per consumer warpgroup, as the narrow tile's. bf16 kInt4 and kE4m3 have it
// (cutlass_mixed_int4.cu, cutlass_mixed_e4m3.cu; dispatch.h says where each takes it).
#pragma once

#include "cuda/gemm/cutlass_mixed_kernel.cuh"

namespace qmoe::cuda::cutlass_detail {

using MidTileShape = cute::Shape<cute::_256, cute::_64, cute::_64>;
// The grouped GEMM's epilogues (column-major D, no C) on the middle tile: fp32 rows (f16
// layers) and bf16 rows (bf16 layers; mixed_out_dtype).
using MidEpilogue = GroupEpilogueFor<MidTileShape>;
constexpr int kMidEpilogueSmem = static_cast<int>(sizeof(MidEpilogue::SharedStorage));
using MidEpilogueBf16 =
    GroupEpilogueFor<MidTileShape, GroupClusterShape, cutlass::bfloat16_t>;
constexpr int kMidEpilogueBf16Smem =
    static_cast<int>(sizeof(MidEpilogueBf16::SharedStorage));

template <>
struct MixedTile<256, 64>
    : MixedTileOf<MidTileShape, MidEpilogue, kMidEpilogueSmem, MidEpilogueBf16,
                  kMidEpilogueBf16Smem> {};

}  // namespace qmoe::cuda::cutlass_detail
