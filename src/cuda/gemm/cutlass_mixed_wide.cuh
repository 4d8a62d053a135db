// The wide tile of the mixed-input GEMM, 128 x 256 x 64, for calls whose experts hold many rows.
// Each K tile's weights are converted once per tile, so a tile twice as wide along the group's
// rows halves the conversions per multiply-add: the conversion, not the wgmma, bounds the 128-row
// tile at prefill sizes. Each consumer warpgroup then holds 64 x 256 fp32 accumulators (128
// registers a thread). Included only by the wide instances' translation units
// (cutlass_mixed_*_n256.cu).
#pragma once

#include "cuda/gemm/cutlass_mixed_kernel.cuh"

namespace qmoe::cuda::cutlass_detail {

using WideTileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
// The grouped GEMM's epilogue (fp32 column-major D, no C), on the wide tile.
using WideEpilogue = GroupEpilogueFor<WideTileShape>;
constexpr int kWideEpilogueSmem = static_cast<int>(sizeof(WideEpilogue::SharedStorage));

template <>
struct MixedTile<128, 256> {
  using Shape = WideTileShape;
  using Epilogue = WideEpilogue;
  static constexpr int kEpilogueSmem = kWideEpilogueSmem;
};

}  // namespace qmoe::cuda::cutlass_detail
