// The middle tile of the mixed-input GEMM, 128 x 64 x 64, for calls whose experts average 17..64
// routes (257..1024 tokens of a 128-expert top-8 layer). There the 128-row tile's wgmma is half
// to three quarters padding and bounds the kernel (a 128 x 128 x 64 step is 512 tensor-core cycles
// for 4 KB of int4 codes, about 2 TB/s of weights over 132 SMs), while the narrow tile converts
// each weight tile once per 32 rows. Included only by the middle instances' translation units
// (cutlass_mixed_*_n64.cu).
#pragma once

#include "cuda/gemm/cutlass_mixed_kernel.cuh"

namespace qmoe::cuda::cutlass_detail {

using MidTileShape = cute::Shape<cute::_128, cute::_64, cute::_64>;
// The grouped GEMM's epilogue (fp32 column-major D, no C), on the middle tile.
using MidEpilogue = GroupEpilogueFor<MidTileShape>;
constexpr int kMidEpilogueSmem = static_cast<int>(sizeof(MidEpilogue::SharedStorage));

template <>
struct MixedTile<64> {
  using Shape = MidTileShape;
  using Epilogue = MidEpilogue;
  static constexpr int kEpilogueSmem = kMidEpilogueSmem;
};

}  // namespace qmoe::cuda::cutlass_detail
